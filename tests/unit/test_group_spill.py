"""A disk-retained queue's groups read their backlog from the segment store (exchange/group_spill.py),
and find it again after a restart from their cursor files (exchange/group_restore.py).

Real segment store on a temporary directory, the exchange's own retention, feed and groups; the
frames are numbered, retained, stored and offered as exchange/fanout.py does.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.disk_tail import DiskTail
from exchange.group_cursor import GroupCursor
from exchange.group_feed import GroupFeed
from exchange.group_restore import GroupCursors
from exchange.group_spill import GroupSpill
from exchange.groups import Groups, GroupSettings
from exchange.retention import Retention
from roq import protocol
from roq.storage_policy import StoragePolicy
from tests.profiles import examples

SETTINGS = GroupSettings((b"jobs",), 30.0, 5, b"")
MAX_BYTES = 20_000


class Stream:
    """An exchange's frames path: retention (a tiny memory tail), its store, the groups."""

    def __init__(self, root: Path, on_disk: bool = True, incarnation: str = "x1.00000001",
                 policy_late: bool = False) -> None:
        self.retention = Retention(3600.0, 5_000)
        self.incarnation = incarnation
        self.disk = DiskTail(root, incarnation, "q/x1")
        self.disk.start(None if policy_late else StoragePolicy(retention=3600.0 if on_disk else 0.0))
        self.groups = Groups(group_ttl=60.0)
        self.feed = GroupFeed(self.groups)
        self.spill = GroupSpill(self.groups, self.feed, self.retention, self.disk, MAX_BYTES)
        self.feed.before_live = self.spill.mark
        self.cursors = GroupCursors(self.groups, self.retention, self.disk, incarnation)
        self.groups.on_done = self.cursors.left
        self.spill.backlog = self.cursors.read_backlog  # as exchange/parts.py wires them
        self.cursors.restore()  # as Forwarder.restore_groups
        self.next_id = 1  # sequence numbers start at 1

    def publish(self, messages: int, size: int, topic: bytes = b"jobs") -> None:
        ids = list(range(self.next_id, self.next_id + messages))
        self.next_id += messages
        payloads = [i.to_bytes(4, "big") + b"x" * size for i in ids]
        self.send(topic, "p", 0, ids, payloads, 0)

    def send(self, topic: bytes, pub: str, sent_ns: int, seqs: list[int], payloads: list[bytes], size: int,
             attrs: object = None, offer: bool = True, topics: list[bytes] | None = None) -> int:
        """exchange/fanout.py's Fanout.send without the sockets."""
        pos = self.retention.next_pos
        body = protocol.encode_delivery("x1", self.incarnation, pos, [], pub, sent_ns, seqs, payloads, None, topics)
        self.retention.add(topic, body, len(seqs))
        self.disk.append(pos, topic, body, len(seqs), None)
        self.disk.flush(0.0)
        if offer:
            self.feed.offer(pos, topic, pub, sent_ns, seqs, payloads, None, topics=topics)
        self.cursors.turn()
        return pos

    def work(self, route: bytes, rounds: int = 10_000) -> list[int]:
        return self.work_of("g", route, rounds)

    def work_of(self, name: str, route: bytes, rounds: int = 10_000) -> list[int]:
        """`route` takes and acks everything group `name` has, read-aheads included."""
        got: list[int] = []
        group = self.groups.groups[name]
        for _ in range(rounds):
            self.spill.turn()
            served = self.groups.dispatch(group)
            if not served and not group.spilled_from and not group.ready:
                break
            for _, units in served:
                for unit in units:
                    got += [int.from_bytes(p[:4], "big") for p in unit.payloads[unit.idx:unit.idx + unit.count]]
                    self.groups.ack(name, route, [(unit.pos, unit.idx, unit.count)])
                    self.cursors.turn()
        return got


@settings(max_examples=examples(25), deadline=None)
@given(frames=st.lists(st.tuples(st.integers(1, 20), st.integers(10, 3_000)), min_size=1, max_size=120),
       prefetch=st.integers(1, 50))
def test_a_group_with_no_member_keeps_its_backlog_on_disk_and_hands_out_each_message_once(frames, prefetch):
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        stream.groups.join("g", b"m1", SETTINGS, prefetch)
        stream.groups.leave("g", b"m1")
        most, spilled = 0, False
        for messages, size in frames:
            stream.publish(messages, size)
            spilled = spilled or bool(stream.groups.groups["g"].spilled_from)
            stream.spill.turn()
            stream.groups.tick()
            most = max(most, stream.groups.held_bytes)
        # The bound, give or take the one frame that crossed it.
        assert most <= MAX_BYTES + max(m * (s + 4) for m, s in frames)
        assert "g" in stream.groups.groups, "never dropped with its messages"
        assert spilled or sum(m * (s + 4) for m, s in frames) <= MAX_BYTES + 3_004 * 20
        stream.groups.join("g", b"m2", SETTINGS, prefetch)
        got = stream.work(b"m2")
        assert Counter(got) == Counter(range(1, stream.next_id)), "every message once"
        assert got == sorted(got), "in order (one member, no redelivery)"
        assert stream.groups.held_bytes == 0
        stream.disk.close()


def test_a_memory_only_queue_keeps_todays_bound() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp), on_disk=False)
        stream.groups.join("g", b"m1", SETTINGS, 10)
        stream.groups.leave("g", b"m1")
        for _ in range(40):
            stream.publish(1, 1_000)
        assert not stream.spill.enabled
        assert stream.groups.held_bytes > MAX_BYTES, "nothing spilled: the exchange holds publishers or sheds"
        assert not stream.groups.groups["g"].spilled_from


def test_a_reset_drops_what_waits_on_disk_too() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        stream.groups.join("g", b"m1", SETTINGS, 10)
        stream.groups.leave("g", b"m1")
        for _ in range(60):
            stream.publish(1, 1_000)
        assert stream.groups.groups["g"].spilled_from
        stream.groups.reset("g")
        stream.groups.join("g", b"m2", SETTINGS, 10)
        stream.publish(1, 10)
        assert stream.work(b"m2") == [stream.next_id - 1]


def test_an_idle_spilled_group_lives_as_long_as_the_queue_retention() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        stream.spill.turn()
        assert stream.groups.group_ttl == 3600.0


def test_a_restarted_exchange_finds_its_groups_backlog_and_acks_again() -> None:
    """Two groups, one half acked, the other not; a new incarnation over the same disk restores both:
    each gets exactly what it had not acked, and then the new stream's frames."""
    other = GroupSettings((b"jobs",), 30.0, 5, b"dl")
    with tempfile.TemporaryDirectory() as tmp:
        first = Stream(Path(tmp))
        first.groups.join("g", b"m1", SETTINGS, 10)
        first.groups.join("h", b"m9", other, 10)
        first.groups.leave("h", b"m9")
        for _ in range(30):
            first.publish(3, 1_000)
        taken = first.work(b"m1", rounds=5)  # acks 5 rounds of 10, then it is gone (a crash)
        assert 0 < len(taken) < first.next_id - 1
        first.cursors.tick()
        first.disk.tick()
        first.disk.close()
        first.cursors.close()

        second = Stream(Path(tmp), incarnation="x1.00000002")
        assert "x1.00000001" in second.disk.archived
        second.cursors.restore()
        assert set(second.groups.groups) == {"g", "h"}
        second.next_id = first.next_id
        second.publish(2, 10)  # the new stream's own
        second.groups.join("g", b"m2", SETTINGS, 10)
        got = second.work(b"m2")
        assert Counter(got) == Counter(set(range(1, second.next_id)) - set(taken)), "what was acked stays acked"
        second.groups.join("h", b"m3", other, 10)
        got_h = second.work_of("h", b"m3")
        assert Counter(got_h) == Counter(range(1, second.next_id)), "the other group's whole backlog, once"


def unacked_backlog(root: Path) -> int:
    """A first incarnation whose group "g" got 90 messages and acked none; its files synced."""
    first = Stream(root)
    first.groups.join("g", b"m1", SETTINGS, 10)
    first.groups.leave("g", b"m1")
    for _ in range(30):
        first.publish(3, 1_000)
    first.cursors.tick()
    first.disk.tick()
    first.disk.close()
    first.cursors.close()
    return first.next_id - 1


def cursor_incarnation(stream: Stream, name: str = "g") -> str:
    path = stream.cursors._path(name)
    cursor = GroupCursor(path)
    state = cursor.recover()
    cursor.close()
    return state.incarnation


def fill(disk: Path) -> Path:
    """Every free byte of a small filesystem taken by one file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def test_a_restore_on_a_full_disk_loses_nothing(small_disk) -> None:
    """The new cursor file cannot be written (ENOSPC): the earlier one stands as the group's
    backlog; a crash then loses nothing, and the next incarnation hands out every message once."""
    disk = small_disk("groups", 2 << 20)
    n = unacked_backlog(disk)
    filler = fill(disk)
    second = Stream(disk, incarnation="x1.00000002")
    second.cursors.turn()
    second.cursors.tick()
    assert "g" not in second.cursors.cursors, "no new file on a full disk"
    assert [b.path.name for b in second.cursors.backlogs["g"]] == ["67.1.cur"], "the earlier file, numbered"
    second.cursors.close()  # a crash
    filler.unlink()
    third = Stream(disk, incarnation="x1.00000003")
    third.groups.join("g", b"m2", SETTINGS, 10)
    assert Counter(third.work(b"m2")) == Counter(range(1, n + 1)), "every unacked message, once"
    third.disk.close()


def test_a_crash_while_a_backlog_is_read_hands_out_the_rest_once() -> None:
    """Acks of a restored backlog go to its own file: a second crash part way through leaves both
    files, read back in order (the backlog, then what the second incarnation stored)."""
    with tempfile.TemporaryDirectory() as tmp:
        n = unacked_backlog(Path(tmp))
        second = Stream(Path(tmp), incarnation="x1.00000002")
        second.next_id = n + 1
        second.publish(3, 10)  # the second incarnation's own, after the backlog
        second.groups.join("g", b"m2", SETTINGS, 10)
        taken = second.work(b"m2", rounds=3)
        assert taken == list(range(1, len(taken) + 1)) and 10 < len(taken) < n, "the backlog first, in order"
        second.cursors.tick()
        second.disk.tick()
        second.cursors.close()  # a crash
        second.disk.close()
        third = Stream(Path(tmp), incarnation="x1.00000003")
        assert len(third.cursors.backlogs["g"]) == 2
        third.groups.join("g", b"m3", SETTINGS, 10)
        got = third.work(b"m3")
        assert got == sorted(set(range(1, n + 4)) - set(taken)), "the rest once, oldest backlog first"
        third.cursors.tick()
        assert not third.cursors.backlogs and [p.name for p in third.cursors.root.glob("*.cur")] == ["67.cur"], \
            "a backlog whose messages all left goes with its file"
        third.disk.close()


def test_a_spilled_group_waits_for_frames_the_store_has_not_written(small_disk) -> None:
    """A full disk for longer than the memory keeps the frames: the group neither counts them lost
    nor passes over them, and gets each once the store writes them."""
    disk = small_disk("spill", 2 << 20)
    stream = Stream(disk)
    stream.groups.join("g", b"m1", SETTINGS, 10)
    stream.groups.leave("g", b"m1")
    for _ in range(30):
        stream.publish(1, 1_000)
    assert stream.groups.groups["g"].spilled_from
    filler = fill(disk)
    for _ in range(20):  # appended, refused, and gone from the 5 KB memory tail
        stream.publish(1, 1_000)
    assert stream.disk.full and stream.disk.store is not None and stream.disk.store.pending_bytes
    stream.groups.join("g", b"m2", SETTINGS, 10)
    got = stream.work(b"m2", rounds=200)
    assert stream.spill.lost == 0 and stream.groups.groups["g"].spilled_from, "it waits"
    filler.unlink()
    stream.disk.flush(time.monotonic(), sync=True)
    got += stream.work(b"m2")
    assert got == list(range(1, stream.next_id)), "every message once, in order"
    stream.disk.close()


def test_a_restore_forwards_nothing_and_new_frames_come_after_the_backlog() -> None:
    """The restore reads only the cursor files: the new stream is empty (nothing forwarded, so
    nothing for publishers to wait for), new frames are stored at once, and the group reads its
    backlog from the earlier store a read-ahead at a time, within its memory share, before them."""
    with tempfile.TemporaryDirectory() as tmp:
        n = unacked_backlog(Path(tmp))
        second = Stream(Path(tmp), incarnation="x1.00000002")
        assert second.cursors.restored and second.retention.next_pos == 1, "nothing forwarded"
        second.next_id = n + 1
        for _ in range(20):
            second.publish(2, 1_000)  # offered live to no restored group: it reads its backlog first
            second.spill.turn()
            assert second.groups.held_bytes <= MAX_BYTES + 3_100, "its share, give or take a frame"
        assert second.retention.next_pos == 21, "the publisher's frames only"
        second.groups.join("g", b"m2", SETTINGS, 10)
        assert second.work(b"m2") == list(range(1, second.next_id)), "backlog, then new, each once, in order"
        second.disk.close()


def test_a_storage_policy_that_comes_late_restores_the_groups_before_any_cursor_file_is_written() -> None:
    """The policy line came after POLICY_WAIT: no cursor file is replaced before the restore runs
    (on the stats tick that applies the policy), and a member that joined meanwhile gets the backlog."""
    with tempfile.TemporaryDirectory() as tmp:
        n = unacked_backlog(Path(tmp))
        second = Stream(Path(tmp), incarnation="x1.00000002", policy_late=True)
        assert not second.cursors.restored
        second.groups.join("g", b"m2", SETTINGS, 10)
        second.cursors.turn()
        second.cursors.tick()
        assert cursor_incarnation(second) == "x1.00000001", "the earlier file stands"
        second.disk.apply(StoragePolicy(retention=3600.0))  # the line, applied on a stats tick ...
        second.cursors.tick()  # ... and the groups' tick right after it begins the restore
        second.cursors.turn()  # the new file, after the restore
        assert second.cursors.restored and cursor_incarnation(second) == "x1.00000002"
        assert Counter(second.work(b"m2")) == Counter(range(1, n + 1))
        second.disk.close()


def test_a_replicated_queue_spills_too_and_keeps_no_cursor_files() -> None:
    """The replica writes the same frames to its own store and holds the groups' cursors (protocol
    section 7.6): a replicated queue's backlog waits on disk too; the replica's adoption, not cursor
    files, brings the groups to the next incarnation."""
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        stream.cursors.replicated = True
        stream.groups.join("g", b"m1", SETTINGS, 10)
        stream.groups.leave("g", b"m1")
        for _ in range(40):
            stream.publish(1, 1_000)
        assert stream.groups.held_bytes <= MAX_BYTES + 1_004 and stream.groups.groups["g"].spilled_from
        assert stream.cursors.root is not None and not stream.cursors.root.exists(), "no cursor files"


@settings(max_examples=examples(20), deadline=None)
@given(frames=st.lists(st.integers(1, 8), min_size=1, max_size=40), groups=st.integers(1, 3),
       rounds=st.lists(st.integers(0, 30), min_size=3, max_size=3), restarts=st.integers(1, 2))
def test_restarts_hand_out_exactly_what_no_member_acked(frames, groups, rounds, restarts) -> None:
    """Groups that each ack some of a backlog, then restarts (cursors synced): each group gets every
    message it had not acked once, and nothing it had; a second restart in a row changes nothing."""
    names = ["g", "h", "k"][:groups]
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        for name in names:
            stream.groups.join(name, b"m-" + name.encode(), SETTINGS, 7)
        for messages in frames:
            stream.publish(messages, 1_500)
        acked = {name: stream.work_of(name, b"m-" + name.encode(), rounds=r) for name, r in zip(names, rounds)}
        published = stream.next_id
        for n in range(restarts):
            stream.cursors.tick()
            stream.disk.tick()
            stream.disk.close()
            stream.cursors.close()
            stream = Stream(Path(tmp), incarnation=f"x1.{n + 2:08d}")
            stream.cursors.restore()
            assert set(stream.groups.groups) == set(names)
        for name in names:
            stream.groups.join(name, b"again", SETTINGS, 7)
            got = stream.work_of(name, b"again")
            assert Counter(got) == Counter(set(range(1, published)) - set(acked[name])), name


def test_a_queue_made_memory_only_forgets_its_cursor_files() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        stream.groups.join("g", b"m1", SETTINGS, 10)
        stream.publish(1, 10)
        assert stream.cursors.root is not None and list(stream.cursors.root.glob("*.cur"))
        stream.disk.apply(StoragePolicy())
        stream.cursors.turn()
        assert not list(stream.cursors.root.glob("*.cur")), "a later restart must not bring the group back"


def test_a_reset_of_a_restored_group_drops_its_backlog_and_its_file() -> None:
    """`roq group reset` of a group still reading a backlog: what it had not read goes too, and the
    backlog's file with it once nothing of it is held (a later restart must not bring it back)."""
    with tempfile.TemporaryDirectory() as tmp:
        unacked_backlog(Path(tmp))
        second = Stream(Path(tmp), incarnation="x1.00000002")
        second.spill.turn()  # a read-ahead of the backlog
        assert second.groups.groups["g"].held_bytes and second.cursors.backlogs["g"]
        second.groups.reset("g")
        second.cursors.tick()
        assert not second.cursors.backlogs
        assert second.cursors.root is not None and [p.name for p in second.cursors.root.glob("*.cur")] == ["67.cur"]
        second.publish(1, 10)
        second.groups.join("g", b"m2", SETTINGS, 10)
        assert second.work(b"m2") == [second.next_id - 1], "only what came after the reset"
        second.disk.close()


def test_a_purge_while_a_backlog_is_read_drops_the_rest_of_it() -> None:
    """`roq queue purge` removes the earlier incarnations' stores: a group reading a backlog there
    takes what it had read already, nothing more, and does not fail on the store gone."""
    with tempfile.TemporaryDirectory() as tmp:
        unacked_backlog(Path(tmp))
        second = Stream(Path(tmp), incarnation="x1.00000002")
        second.spill.turn()  # a read-ahead of the backlog
        held = second.groups.groups["g"].ready
        assert 0 < held < 90
        second.disk.purge(second.retention.next_pos)
        second.groups.join("g", b"m2", SETTINGS, 10)
        assert len(second.work(b"m2")) == held
        second.cursors.tick()
        assert not second.cursors.backlogs
        second.disk.close()
