"""What a disk-retained queue's primary sends its replica of a consumer group, and what the replica
makes of it (protocol section 7.6): the group's cursor (its in-memory messages, `upto` where its
backlog on disk starts, the `gap` it skips), then the acks since; the replica's adoption must list
every message the group has not acked, once, and none it has.

The primary is exchange/group_spill.py and exchange/group_restore.py over a real segment store (the
harness of tests/unit/test_group_spill.py); the replica's side is exchange/replica_adoption.py.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.group_feed import GroupFeed
from exchange.groups import Groups, GroupSettings
from exchange.replica_adoption import _final, needed_from, stored_entries
from exchange.tiered import read
from roq import protocol
from roq.errors import ProtocolError
from tests.profiles import examples
from tests.unit.test_group_spill import Stream

PROOF = b"s" * 32
SETTINGS = GroupSettings((b"jobs",), 30.0, 5, b"dl")  # a record carries a dead-letter topic


def stream_frames(stream: Stream) -> dict[int, tuple[bytes, list[int]]]:
    """pos → (topic, sequence numbers) of every frame of the stream, from disk and memory."""
    frames: dict[int, tuple[bytes, list[int]]] = {}
    after = 0
    while after + 1 < stream.retention.next_pos:
        page = read(stream.retention, stream.disk.store, after, stream.retention.next_pos, [], 1 << 20)
        for topic, body in page.frames:
            d = protocol.decode_delivery(body)
            frames[d.pos] = (topic, list(d.seqs))
        if page.scanned_to <= after:
            break
        after = page.scanned_to
    return frames


def over_the_wire(record: protocol.GroupRecord) -> protocol.GroupRecord:
    decoded = protocol.decode_replica_request(protocol.encode_groups("x1.00000009", [record], PROOF))
    assert isinstance(decoded, protocol.GroupState)
    (back,) = decoded.groups
    return back


def adopted_ids(record: protocol.GroupRecord, done: list[tuple[int, int, int]],
                frames: dict[int, tuple[bytes, list[int]]], next_pos: int) -> list[int]:
    """The sequence numbers the replica's adoption lists as the group's pending messages."""
    index = [(pos, topic, len(seqs)) for pos, (topic, seqs) in sorted(frames.items())]
    final = _final(record, done, index, next_pos)
    return [seq for pos, idx, count, _ in final.pending for seq in frames[pos][1][idx:idx + count]]


@settings(max_examples=examples(25), deadline=None)
@given(frames=st.lists(st.tuples(st.integers(1, 8), st.booleans()), min_size=1, max_size=40),
       groups=st.integers(1, 3), rounds=st.lists(st.integers(0, 30), min_size=3, max_size=3),
       later=st.lists(st.integers(0, 8), min_size=3, max_size=3),
       more=st.lists(st.integers(1, 8), max_size=10))
def test_the_cursor_a_replica_holds_lists_exactly_what_each_group_has_not_acked(
        frames, groups, rounds, later, more) -> None:
    """Groups ack part of a backlog far over their memory share (spilled to disk), more frames
    come; the state is taken, sent over the wire, then more acks go as `done`: the replica's
    adoption lists each group's unacked messages exactly once. (A restore from cursor files
    happens only without a replica: exchange/group_restore.py.)"""
    names = ["g", "h", "k"][:groups]
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        for name in names:
            stream.groups.join(name, b"m-" + name.encode(), SETTINGS, 7)
        jobs: set[int] = set()
        for messages, ours in frames:
            first = stream.next_id
            stream.publish(messages, 1_500, b"jobs" if ours else b"other")
            jobs |= set(range(first, stream.next_id)) if ours else set()
        acked = {name: set(stream.work_of(name, b"m-" + name.encode(), rounds=r)) for name, r in zip(names, rounds)}
        for messages in more:
            first = stream.next_id
            stream.publish(messages, 1_500)
            jobs |= set(range(first, stream.next_id))
        stream.groups.keep_done = True  # what a replicated exchange keeps for its replica
        stream.groups.take_done()
        states = {r.name: over_the_wire(r) for r in stream.groups.records(stream.retention.next_pos)}
        for name, r in zip(names, later):  # acks after the state: `done` frames
            acked[name] |= set(stream.work_of(name, b"m-" + name.encode(), rounds=r))
        done = stream.groups.take_done()
        all_frames = stream_frames(stream)
        for name in names:
            ids = adopted_ids(states[name], done.get(name, []), all_frames, stream.retention.next_pos)
            assert Counter(ids) == Counter(jobs - acked[name]), name
            assert needed_from(states[name]) >= 1
        stream.disk.close()


def test_a_group_record_with_a_gap_survives_the_wire_and_an_old_one_has_none() -> None:
    with_gap = protocol.GroupRecord("g", (b"jobs",), 30_000, 5, b"dl", 7, [(2, 0, 1, 1)], (9, 12))
    assert over_the_wire(with_gap) == with_gap
    without = protocol.GroupRecord("g", (b"jobs",), 30_000, 5, b"dl", 7, [])
    assert len(without.wire()) == 7, "a record without a gap is what an older replica reads"
    assert over_the_wire(without).gap == (0, 0)
    assert [with_gap.is_pending_whole(p) for p in (6, 7, 8, 9, 11, 12)] == [False, True, True, False, False, True]


@pytest.mark.parametrize("gap", [
    [5, 5], [9, 3], [3, 9], [0, 9], [9], [9, 12, 13], [9, "12"], [9.0, 12], "9-12", None, [9, 1 << 63],
])
def test_a_group_record_with_a_bad_gap_is_refused(gap) -> None:
    """An empty or reversed gap, one below `upto` (frames the state lists itself), or not two
    positions: the whole frame is refused, naming the groups field (nothing of it is kept)."""
    record = ["g", [b"jobs"], 30_000, 5, b"dl", 7, [], gap]
    frame = protocol.pack([protocol.GROUPS, protocol.DATA_VERSION, "x1.00000009", [record], PROOF])
    with pytest.raises(ProtocolError, match="groups must be"):
        protocol.decode_replica_request(frame)


def test_the_replica_reads_a_backlog_below_its_memory_from_its_store() -> None:
    """stored_entries: what the adoption sends of frames the copy's memory let go."""
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        for _ in range(30):
            stream.publish(2, 1_000)
        stream.disk.flush(0.0, sync=True)
        assert stream.retention.oldest > 10, "the memory tail let the first frames go"
        assert stream.disk.store is not None
        entries = stored_entries(stream.disk.store, 3, stream.retention.oldest)
        assert [pos for pos, *_ in entries] == list(range(3, stream.retention.oldest))
        assert all(messages == 2 and topic == b"jobs" for _, topic, _, messages in entries)
        stream.disk.close()


def test_resends_after_an_adoption_are_left_out_by_position_also_when_read_back_later() -> None:
    """exchange/group_feed.py: frames retained from `live_from` on lose a publisher's messages up to
    its adopted highest sequence number while the resend window is open, also when a spilled group
    reads them back from disk after it closed; the backlog forwarded again below `live_from` never."""
    groups = Groups(group_ttl=60.0)
    live, _ = groups.join("g", b"m1", SETTINGS, 100)
    spilled, _ = groups.join("h", b"m2", SETTINGS, 100)
    assert live is not None and spilled is not None
    spilled.spilled_from = 10  # it reads frames from 10 on back from disk
    feed = GroupFeed(groups)
    now = time.monotonic()
    feed.adopted({"p": 5}, now + 60.0, live_from=10)
    feed.offer(4, b"jobs", "p", 0, [1, 2], [b"a", b"b"], None, only=live)  # forwarded again: kept
    feed.offer(10, b"jobs", "p", 0, [4, 5, 6], [b"c", b"d", b"e"], None)  # two resends and a new one
    feed._adopted_until = now - 1.0  # the resend window closed
    feed.offer(11, b"jobs", "p", 0, [3, 7], [b"f", b"g"], None)  # live after it: new
    assert feed.closed_at == 11
    for pos, seqs in ((10, [4, 5, 6]), (11, [3, 7])):  # read back later
        feed.offer(pos, b"jobs", "p", 0, seqs, [b"x"] * len(seqs), None, only=spilled)
    assert sorted((u.pos, u.idx, u.count) for u in live.waiting()) == [(4, 0, 2), (10, 2, 1), (11, 0, 2)]
    assert sorted((u.pos, u.idx, u.count) for u in spilled.waiting()) == [(10, 2, 1), (11, 0, 2)]
