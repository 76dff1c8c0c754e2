"""A replica's copies on its own disk (exchange/replica_disk.py), with real ZeroMQ sockets.

The replica's memory tail is made tiny, its storage policy on disk: a copy of many memory tails
is still served whole from position 1 (the segment store below the memory), a jump or a dropped
copy replaces or deletes its store, a full store takes no page, and no incarnation name a peer
sends makes the replica write outside its root.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange import replication, tiered
from exchange.replica import MAX_COPIES, Replica, stored
from exchange.replica_disk import MAX_ADOPTED, ReplicaDisk, safe_dir_name
from exchange.replica_health import GIVE_UP_AFTER
from exchange.replication import ReplicaLink
from exchange.retention import Retention
from exchange.segment_store import SegmentStore, StoreLimits
from exchange.store_hooks import stored_frame
from roq import protocol
from roq.errors import ProtocolError
from roq.storage_policy import StoragePolicy
from tests.profiles import examples
from tests.support.helpers import wait_until
from tests.unit import test_replication
from tests.unit.test_replication import (
    INC,
    INC2,
    TOPIC,
    X,
    body,
    config,
    copy,
    dealer,
    follow,
    frames,
    proof,
    replay_ask,
    vouch,
)

ON_DISK = StoragePolicy(retention=3_600.0)
ctx = test_replication.ctx  # the zmq.Context fixture


@pytest.fixture
def replica(ctx: zmq.Context, tmp_path: Path) -> Iterator[Replica]:
    r = Replica(ctx, config(retention_bytes=4_000), X, "127.0.0.1", "127.0.0.1", store_root=tmp_path / "x1~r")
    r.disk.start(ON_DISK)
    vouch(r, INC, INC2)
    yield r
    r.close()


def fetch_all(r: Replica, sock: zmq.Socket, inc: str) -> list[bytes]:
    """Every body of `inc`'s copy from position 1, page by page, as a subscriber fetches it."""
    bodies: list[bytes] = []
    after = 0
    for request_id in range(1, 1_000):
        answer = replay_ask(r, sock, protocol.encode_fetch(request_id, inc, after, 0, [], 16_000))
        assert isinstance(answer, protocol.Frames)
        assert answer.lost == 0, "nothing the copy acknowledged may be lost"
        bodies += [frame_body for _, frame_body in answer.frames]
        after = answer.scanned_to
        if answer.done:
            return bodies
    raise AssertionError("the fetch never ended")


def test_a_copy_of_many_memory_tails_is_served_whole_from_its_store(ctx: zmq.Context, replica: Replica) -> None:
    primary, subscriber = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.replay_endpoint)
    follow(replica, primary)
    for first in range(1, 201, 20):
        assert copy(replica, primary, first, frames(INC, first, 20, size=200)).next_pos == first + 20
    replica.copies[INC].trim()
    assert replica.copies[INC].served_from > 100, "the memory tail really was left behind"
    assert fetch_all(replica, subscriber, INC) == [body(INC, pos, 200) for pos in range(1, 201)]
    replica.disk.tick()
    assert replica.report()["stored_bytes"] > 200 * 200


def test_a_jump_replaces_the_store_and_a_dropped_copy_deletes_it(ctx: zmq.Context, replica: Replica,
                                                                tmp_path: Path) -> None:
    primary, subscriber = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.replay_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 3))
    assert copy(replica, primary, 50, frames(INC, 50, 2), jump=True).next_pos == 52
    store = replica.disk.store_of(INC)
    assert store is not None and (store.first_pos, store.end_pos) == (50, 52)
    assert fetch_all(replica, subscriber, INC) == [body(INC, 50), body(INC, 51)]
    incs = [f"{X}.c{i}" for i in range(MAX_COPIES)]
    for inc in incs:  # each follow of a new incarnation is a new copy: the oldest go
        follow(replica, primary, inc)
    assert replica.disk.store_of(INC) is None
    assert not (tmp_path / "x1~r" / INC).exists()


def restarted(ctx: zmq.Context, root: Path, policy: StoragePolicy = ON_DISK) -> Replica:
    """A new replica process on the data directory an earlier one wrote (its host restarted)."""
    r = Replica(ctx, config(retention_bytes=4_000), X, "127.0.0.1", "127.0.0.1", store_root=root)
    r.disk.start(policy)
    return r


def test_a_restarted_replica_adopts_its_stores_and_serves_them_as_stored_incarnations(
        ctx: zmq.Context, replica: Replica, tmp_path: Path) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    for first in range(1, 101, 20):
        copy(replica, primary, first, frames(INC, first, 20, size=200))
    replica.disk.tick()
    (tmp_path / "x1~r" / (INC2 + "~base")).mkdir()  # an unfinished transfer: never served
    replica.close()
    again = restarted(ctx, tmp_path / "x1~r")
    try:
        vouch(again, INC, INC2, running=INC2)  # INC ended with the whole cluster; INC2 runs
        assert set(again.disk.adopted) == {INC} and again.report()["adopted"] == 1
        assert not (tmp_path / "x1~r" / (INC2 + "~base")).exists()
        subscriber = dealer(ctx, again.replay_endpoint)
        answer = replay_ask(again, subscriber, protocol.encode_position_request(1, [TOPIC], INC))
        assert isinstance(answer, protocol.StreamPosition) and (answer.oldest, answer.next_pos) == (1, 101)
        assert fetch_all(again, subscriber, INC) == [body(INC, pos, 200) for pos in range(1, 101)]
        assert follow(again, dealer(ctx, again.repl_endpoint), INC).kind == protocol.SEALED, \
            "a stored incarnation a subscriber read is sealed, as a copy is"
    finally:
        again.close()


def test_an_adopted_store_of_the_running_incarnation_is_copied_afresh_and_memory_only_drops_them(
        ctx: zmq.Context, replica: Replica, tmp_path: Path) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 5))
    replica.disk.tick()
    replica.close()
    again = restarted(ctx, tmp_path / "x1~r")
    try:
        vouch(again, INC, running=INC)  # only the replica restarted: its primary runs on
        assert follow(again, dealer(ctx, again.repl_endpoint), INC).next_pos == 0, "the primary sends it again"
        store = again.disk.store_of(INC)
        assert store is not None and store.end_pos == 1 and not again.disk.adopted
    finally:
        again.close()
    gone = restarted(ctx, tmp_path / "x1~r", StoragePolicy())
    gone.close()
    assert not any((tmp_path / "x1~r").iterdir()), "a queue made memory only keeps no store"


def test_a_restart_adopts_at_most_the_newest_stores(tmp_path: Path) -> None:
    """Stores left by many earlier lives: the MAX_ADOPTED most recently written are adopted, the
    others deleted (retention would have; an operator's restarts must not pile them up)."""
    root = tmp_path / "x1~r"
    names = [f"{X}.old{i}" for i in range(MAX_ADOPTED + 3)]
    for age, name in enumerate(reversed(names)):  # names[-1] written last
        store = SegmentStore(root / name, StoreLimits())
        store.append(stored_frame(1, time.time(), TOPIC, body(name, 1), 1))
        assert store.flush()
        store.close()
        os.utime(root / name, (time.time() - 60 * age, time.time() - 60 * age))
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    try:
        assert set(disk.adopted) == set(names[-MAX_ADOPTED:])
        assert sorted(p.name for p in root.iterdir()) == sorted(names[-MAX_ADOPTED:])
    finally:
        disk.close()


def copy_until_the_disk_refuses(r: Replica, primary: zmq.Socket) -> None:
    """Follow INC and copy pages of 10 frames of 2 KB until the replica's store refuses one."""
    follow(r, primary)
    first = 1
    while r.disk.accepts(INC) and first < 2_000:
        primary.send(protocol.encode_copy(INC, first, frames(INC, first, 10, size=2_000), proof(INC)))
        first += 10
        serve_a_while(r)
        while primary.poll(0):
            primary.recv()


def test_a_store_whose_disk_refuses_writes_takes_no_page_until_it_has_room(ctx: zmq.Context, small_disk) -> None:
    disk = small_disk("replica", 1 << 20)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (900 << 10))
    r = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1", store_root=disk / "x1~r")
    r.disk.start(ON_DISK)
    vouch(r, INC)
    try:
        primary = dealer(ctx, r.repl_endpoint)
        copy_until_the_disk_refuses(r, primary)
        assert not r.disk.accepts(INC) and r.report()["storage_full"] == 1
        held = r.copies[INC].next_pos
        primary.send(protocol.encode_copy(INC, held, frames(INC, held, 10), proof(INC)))
        serve_a_while(r)
        assert primary.poll(0), "a page the store cannot take is answered"
        answer = protocol.decode_replica_reply(primary.recv())
        assert isinstance(answer, protocol.Broken) and "refusing writes" in answer.reason, answer
        assert "No space left" in answer.reason
        assert r.copies[INC].next_pos == held, "nothing taken while the store refuses writes"
        filler.unlink()
        wait_until(lambda: r.disk.accepts(INC), timeout=5, message="the store to write again")  # retried every 0.5 s
        assert copy(r, primary, held, frames(INC, held, 10)).next_pos == held + 10
    finally:
        r.close()


def test_with_store_sync_confirm_a_page_is_answered_after_its_fsync_one_per_turn(
        ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`exchange.store_sync = confirm`: every `copied next_pos` the primary gets covers only frames
    the replica's store had fsync'ed, and a loop turn that took many pages fsync'ed once (a group
    commit), not once per page. Bursts of pages are sent until some turn took several."""
    r = Replica(ctx, config(store_sync="confirm"), X, "127.0.0.1", "127.0.0.1", store_root=tmp_path / "x1~r")
    r.disk.start(ON_DISK)
    vouch(r, INC)
    synced_through = [0]  # the copy's next_pos at the store's last fdatasync
    turn_syncs = [0]  # fdatasyncs in the current loop turn
    real_fdatasync = os.fdatasync

    def observed(fd: int) -> None:
        real_fdatasync(fd)
        synced_through[0] = r.copies[INC].next_pos
        turn_syncs[0] += 1
    monkeypatch.setattr(os, "fdatasync", observed)
    try:
        primary = dealer(ctx, r.repl_endpoint)
        follow(r, primary)
        first, most_pages_in_a_turn, answers = 1, 0, 0
        deadline = time.monotonic() + 30
        while most_pages_in_a_turn < 4:
            assert time.monotonic() < deadline, "no loop turn ever took several pages"
            for _ in range(16):
                primary.send(protocol.encode_copy(INC, first, frames(INC, first, 5), proof(INC)))
                first += 5
            while r.copies[INC].next_pos < first:
                assert r.repl.poll(int(test_replication.WAIT * 1000)), "the pages never reached the replica"
                taken_from, turn_syncs[0] = r.copies[INC].next_pos, 0
                r._drain_primary()
                pages = (r.copies[INC].next_pos - taken_from) // 5
                most_pages_in_a_turn = max(most_pages_in_a_turn, pages)
                assert pages == 0 or 1 <= turn_syncs[0] <= 2, \
                    f"{pages} pages took {turn_syncs[0]} fdatasyncs (the segment and its index once)"
            while answers < (first - 1) // 5:
                assert primary.poll(int(test_replication.WAIT * 1000)), "a page was not answered"
                reply = protocol.decode_replica_reply(primary.recv())
                assert isinstance(reply, protocol.ReplicaReply) and reply.kind == protocol.COPIED
                assert reply.next_pos <= synced_through[0], "copied answered before the store fsync'ed it"
                answers += 1
        assert r.disk.syncs < answers, "one fsync per turn, not per page"
    finally:
        r.close()


def serve_a_while(r: Replica) -> None:
    """Handle what reached the replica's `repl` socket within 200 ms (a page is on loopback)."""
    while r.repl.poll(200):
        r._drain_primary()


@settings(max_examples=examples(100), deadline=None)
@given(st.text(max_size=60))
def test_no_incarnation_name_leads_outside_the_root(name: str) -> None:
    root = Path("/nonexistent/root")
    if safe_dir_name(name):
        assert (root / name).resolve().parent == root.resolve()
        assert "/" not in name and "\x00" not in name and name not in (".", "..")


@settings(max_examples=examples(50), deadline=None)
@given(st.sampled_from(["..", "../x1.a", "/etc/x", "x1.a/../../b", "", ".hidden", "a\x00b", "x" * 300]))
def test_hostile_incarnation_names_get_no_store(name: str) -> None:
    disk = ReplicaDisk(Path("/nonexistent/root"))
    disk.start(ON_DISK)
    disk.open(name)
    assert disk.store_of(name) is None


# ---------------------------------------------------------------- state transfer (protocol 6.5)


class Primary:
    """A primary's segment store of `count` frames, its memory tail holding only the newest, and
    its ReplicaLink to a real replica over loopback; `cycle` moves one turn of each loop."""

    def __init__(self, ctx: zmq.Context, directory: Path, replica: Replica, count: int, inc: str = INC) -> None:
        self.store = SegmentStore(directory, StoreLimits(segment_bytes=16 << 10, index_every=1 << 10))
        self.retention = Retention(60.0, 8_000)
        self.inc = inc
        self.publish(count)
        assert self.retention.oldest > count // 2, "the memory tail holds only the newest frames"
        self.replica = replica
        self.link = ReplicaLink(ctx, config(), self.retention, inc, X, proof(inc))
        self.link.page_bytes = self.link.transfer.page_bytes = 4_000
        self.link.transfer.store_of = lambda: self.store
        self.link.point_to(replica.repl_endpoint)

    def publish(self, count: int) -> None:
        for _ in range(count):
            pos = self.retention.next_pos
            frame_body = body(self.inc, pos, 200)
            self.store.append(stored_frame(pos, time.time(), TOPIC, frame_body, 1))
            self.retention.add(TOPIC, frame_body, 1)
        assert self.store.flush()

    def cycle(self) -> None:
        self.link.pump(time.monotonic())
        if self.replica.repl.poll(10):
            self.replica._drain_primary()
        sock = self.link.sock
        assert sock is not None
        while sock.poll(10):
            self.link.on_reply(sock.recv())


def test_a_late_replica_gets_the_primary_disk_by_transfer_while_confirms_go_on(ctx: zmq.Context, replica: Replica,
                                                                              tmp_path: Path) -> None:
    primary = Primary(ctx, tmp_path / "primary", replica, 300)
    caught_up_at = synced_at = None
    deadline = time.monotonic() + 20
    for turn in range(100_000):
        assert time.monotonic() < deadline, "the transfer did not complete in time"
        primary.cycle()
        if turn % 5 == 0:
            primary.publish(1)  # confirms must keep going while the transfer runs
        if caught_up_at is None and primary.link.held == primary.retention.next_pos:
            caught_up_at = turn
        jumped = replica.disk.starts.get(INC, 0) > 1  # the copy started at the primary's memory tail
        if jumped and primary.link.transfer.in_sync and INC in replica.disk.in_sync:
            synced_at = turn
            break
    assert caught_up_at is not None and synced_at is not None and caught_up_at < synced_at, \
        "the copy (what confirms wait for) caught up before the transfer ended"
    end = primary.retention.next_pos
    while primary.link.held < end:
        primary.cycle()
    stored = replica.disk.store_of(INC)
    assert stored is not None and stored.first_pos == 1, "the transfer joined the copy's store"
    subscriber = dealer(ctx, replica.replay_endpoint)
    assert fetch_all(replica, subscriber, INC) == [body(INC, pos, 200) for pos in range(1, end)]
    assert not list((tmp_path / "x1~r").glob("*~base")), "the transfer's own store is gone"


def fill_requests() -> st.SearchStrategy[protocol.Fill]:
    frame = st.tuples(st.integers(0, protocol.MAX_STORED_AT_US), st.binary(max_size=8), st.binary(max_size=64),
                      st.integers(0, 5))
    return st.builds(protocol.Fill, st.sampled_from([INC, INC2, "x1.zz", "x2.a"]), st.integers(1, 60),
                     st.integers(2, 80), st.lists(frame, max_size=8), st.booleans(),
                     st.sampled_from([proof(INC), proof(INC2), b"\0" * 32]),
                     st.sampled_from(["", "", "x1.old", "x2.old", INC, "x1.a/../..", "../x1.b", "x1." + "o" * 250]))


def stored_state(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(fill_requests(), min_size=1, max_size=6))
def test_hostile_fills_never_crash_nor_write_outside_nor_touch_the_served_copy(fills: list[protocol.Fill]) -> None:
    """A copy of INC that jumped to 40 (positions 40-44 held): whatever fill frames come, decoded
    from the wire as a peer may send them, the replica answers or drops them, writes only under its
    root, never below-the-copy data at or past 40, never for another incarnation, nor unproven."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp, zmq.Context() as context:
        root = Path(tmp) / "x1~r"
        r = Replica(context, config(), X, "127.0.0.1", "127.0.0.1", store_root=root)
        try:
            r.disk.start(ON_DISK)
            vouch(r, INC, INC2)
            r.handle(b"p", protocol.Follow(INC, X, proof(INC)))
            r.handle(b"p", protocol.Copy(INC, 40, [(TOPIC, body(INC, p), 1) for p in range(40, 45)], True, proof(INC)))
            served = replay_copy(r)
            for fill in fills:
                wire = protocol.encode_fill(fill.incarnation, fill.first_pos, fill.end_pos,
                                            [list(f) for f in fill.frames], fill.proof, fill.jump, fill.ended)
                try:
                    request = protocol.decode_replica_request(wire)
                except ProtocolError:  # the only rules a builder may break
                    assert fill.first_pos + len(fill.frames) > fill.end_pos or fill.ended == fill.incarnation
                    continue
                before = stored_state(root)
                if not r.proof_holds(b"p", request):
                    assert stored_state(root) == before, "an unproven fill wrote nothing"
                    continue
                answer = r.handle(b"p", request)
                assert answer is None or isinstance(protocol.decode_replica_reply(answer), protocol.Filled)
                written = {name.split("/")[0] for name in set(stored_state(root)) - set(before)}
                if request.ended:  # an earlier incarnation of our exchange only, in its own directories
                    assert (request.incarnation == INC and request.ended == "x1.old") or not written, written
                    assert written <= {"x1.old~base", "x1.old"}, written
                elif request.incarnation != INC or request.end_pos != 40:
                    assert stored_state(root) == before, "a fill toward nothing this replica started wrote nothing"
            assert all(path.resolve().is_relative_to(root.resolve()) for path in Path(tmp).rglob("*")
                       if path.is_file()), "nothing outside the replica's root"
            base = r.disk.bases.get(INC)
            assert base is None or base.end_pos <= 40
            assert replay_copy(r)[-5:] == served[-5:], "the served copy kept its frames"
        finally:
            r.close()


def replay_copy(r: Replica) -> list[bytes]:
    """What the replica serves of INC's copy, read as its replay server reads it."""
    memory, incarnation = r.replay._store(INC)
    assert memory is not None
    page = tiered.read(memory, r.disk.store_of(incarnation), 0, memory.next_pos, [], 1 << 20)
    return [frame_body for _, frame_body in page.frames]


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=7).filter(lambda lost: not all(lost)))
def test_lost_fill_pages_are_sent_again_and_the_transfer_completes_whole(lost: list[bool]) -> None:
    """`fill` frames lost on the way in a pattern that repeats (every third, one in two, all but
    one in seven...): the replica answers the next page with where it is (a gap), or the primary
    hears nothing and sends again after RESEND_AFTER; nothing is skipped and the transfer ends,
    even when the pattern's period matches the pages a window resends (CI found that livelock)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp, zmq.Context() as context:
        r = Replica(context, config(retention_bytes=4_000), X, "127.0.0.1", "127.0.0.1", store_root=Path(tmp) / "x1~r")
        try:
            r.disk.start(ON_DISK)
            vouch(r, INC, INC2)
            transfer_through_loss(context, r, Path(tmp) / "primary", lost)
        finally:
            r.close()


def transfer_through_loss(ctx: zmq.Context, replica: Replica, directory: Path, lost: list[bool]) -> None:
    primary = Primary(ctx, directory, replica, 300)
    send = primary.link._send
    fills = [0]

    def lossy(frame: bytes) -> bool:
        if frame[1:6] == b"\xa4fill":  # msgpack: an array, then the str "fill"
            fills[0] += 1
            if lost[fills[0] % len(lost)]:
                return True  # lost on the way
        return send(frame)
    primary.link._send = lossy  # type: ignore[method-assign]
    clock = time.monotonic()
    for _ in range(5_000):  # turns, not seconds: a slow machine takes longer, a livelock never ends
        if replica.disk.starts.get(INC, 0) > 1 and INC in replica.disk.in_sync and primary.link.transfer.in_sync:
            break
        clock += 0.5  # time passes for the primary: silences end in resends
        primary.link.pump(clock)
        if replica.repl.poll(2):
            replica._drain_primary()
        sock = primary.link.sock
        assert sock is not None
        while sock.poll(2):
            primary.link.on_reply(sock.recv())
    else:
        raise AssertionError(f"the transfer did not complete: {vars(primary.link.transfer)}")
    assert fills[0] >= 3, "fill frames went on the way"
    subscriber = dealer(ctx, replica.replay_endpoint)
    end = primary.retention.next_pos
    assert fetch_all(replica, subscriber, INC) == [body(INC, pos, 200) for pos in range(1, end)]


def damage(store_dir: Path, positions: list[int]) -> None:
    """Flip one byte of each of these frames' records in the store's files (a CRC mismatch)."""
    for path in store_dir.glob("*.seg"):
        data = bytearray(path.read_bytes())
        for pos in positions:
            at = data.find(b"m%d." % pos)
            if at >= 0:
                data[at] ^= 0xFF
        path.write_bytes(bytes(data))


def test_a_transfer_across_many_damaged_stretches_ends_with_everything_after_the_last(
        ctx: zmq.Context, replica: Replica, tmp_path: Path) -> None:
    """The primary's store has a damaged record every 10 positions below its memory tail: each
    gap restarts the transfer at the replica (a store holds consecutive positions), and the frames
    right after each gap are sent, not skipped, so the replica's store ends up holding every
    position from the last damaged stretch's end, served whole."""
    primary = Primary(ctx, tmp_path / "primary", replica, 300)
    damaged_positions = list(range(10, primary.retention.oldest - 20, 10))
    damage(tmp_path / "primary", damaged_positions)
    stretches = primary.store.read(1, primary.retention.oldest, 1 << 30).damaged
    assert len(stretches) == len(damaged_positions) > 20, "every damaged record is a stretch of its own"
    primary.link.page_bytes = primary.link.transfer.page_bytes = 1_500  # a few frames a page: gaps inside pages
    deadline = time.monotonic() + 30
    while not (replica.disk.starts.get(INC, 0) > 1 and INC in replica.disk.in_sync and primary.link.transfer.in_sync):
        assert time.monotonic() < deadline, "the transfer did not complete"
        primary.cycle()
    stored = replica.disk.store_of(INC)
    first_whole = stretches[-1][1]
    assert stored is not None and stored.first_pos == first_whole, \
        f"the replica holds from {stored and stored.first_pos}, the primary from {first_whole} without a gap"
    end = primary.retention.next_pos
    assert replay_copy(replica) == [body(INC, pos, 200) for pos in range(first_whole, end)]


def test_a_transfer_store_gets_the_queues_retention(tmp_path: Path) -> None:
    """Fill pages of frames stored two hours ago, with a one-hour retention: the stats tick
    deletes them from the transfer's store (`~base`) as from the copy's, before it completes."""
    disk = ReplicaDisk(tmp_path / "x1~r")
    disk.start(ON_DISK)
    disk.open(INC, first_pos=100)
    two_hours_ago = int((time.time() - 7_200) * 1e6)
    old = [[two_hours_ago, TOPIC, body(INC, pos), 1] for pos in range(1, 51)]
    assert disk.fill(protocol.Fill(INC, 1, 100, old, True, proof(INC))) == 51
    base = disk.bases[INC]
    assert (base.first_pos, base.end_pos) == (1, 51)
    disk.tick()
    assert base.first_pos == base.end_pos == 51, "frames older than the retention left the transfer's store"
    recent = [[int(time.time() * 1e6), TOPIC, body(INC, pos), 1] for pos in range(51, 100)]
    assert disk.fill(protocol.Fill(INC, 51, 100, recent, False, proof(INC))) == 100
    disk.close()


def test_an_idle_primary_whose_memory_aged_out_still_transfers_its_disk_to_a_new_replica(
        ctx: zmq.Context, replica: Replica, tmp_path: Path) -> None:
    """Nothing in the primary's memory tail (idle past its retention, frames copied to an earlier
    replica): an empty `copy` page jumps the new replica's copy to the next position, so the
    transfer of the primary's store starts, and the copy is served whole from position 1."""
    primary = Primary(ctx, tmp_path / "primary", replica, 300)
    primary.retention.protect_from = None  # an earlier replica held them: they could age out
    primary.retention.trim(time.monotonic() + 3_600)
    end = primary.retention.next_pos
    assert primary.retention.oldest == end, "the memory tail holds nothing"
    deadline = time.monotonic() + 20
    while not (INC in replica.disk.in_sync and primary.link.transfer.in_sync and primary.link.held == end):
        assert time.monotonic() < deadline, "the idle primary's store never reached the new replica"
        primary.cycle()
    assert replica.disk.starts[INC] == end, "the copy jumped to the primary's next position"
    subscriber = dealer(ctx, replica.replay_endpoint)
    assert fetch_all(replica, subscriber, INC) == [body(INC, pos, 200) for pos in range(1, end)]
    primary.publish(3)  # the copy goes on from there
    while primary.link.held < primary.retention.next_pos:
        assert time.monotonic() < deadline, "later frames were not copied"
        primary.cycle()
    assert fetch_all(replica, subscriber, INC) == [body(INC, pos, 200) for pos in range(1, end + 3)]


def test_the_replica_lists_the_ended_incarnations_it_serves_oldest_first_never_the_running_one(
        ctx: zmq.Context, tmp_path: Path) -> None:
    """`stored` (its znode, protocol section 1): stores adopted (or transferred whole) by their
    newest frame's time, then copies in follow order, without the incarnation listed as running."""
    root = tmp_path / "x1~r"
    for age, name in ((200, f"{X}.older"), (100, f"{X}.old")):
        store = SegmentStore(root / name, StoreLimits())
        store.append(stored_frame(1, time.time() - age, TOPIC, body(name, 1), 1))
        assert store.flush(sync=True)
        store.close()
    os.utime(root / f"{X}.older", (time.time(), time.time()))  # written last: the name order is no clue
    r = restarted(ctx, root)
    try:
        assert stored(r) == [f"{X}.older", f"{X}.old"]
        vouch(r, INC, INC2, running=INC)
        sock = dealer(ctx, r.repl_endpoint)
        follow(r, sock, INC)
        assert stored(r) == [f"{X}.older", f"{X}.old"], "the running incarnation is not ended"
        vouch(r, INC, INC2, running=INC2)
        follow(r, sock, INC2)
        assert stored(r) == [f"{X}.older", f"{X}.old", INC]
    finally:
        r.close()


def test_an_earlier_incarnations_store_goes_to_the_replica_whole_and_is_served_there(
        ctx: zmq.Context, replica: Replica, tmp_path: Path) -> None:
    """The primary serves an earlier incarnation's store (it restarted on its host): after its own
    store's transfer, that one goes as `fill_ended` pages, and the replica serves it whole as a
    stored incarnation; a later follow finds it held (answered complete at the first page)."""
    primary = Primary(ctx, tmp_path / "primary", replica, 300)
    earlier = f"{X}.earlier"
    store = SegmentStore(tmp_path / "earlier", StoreLimits(segment_bytes=16 << 10, index_every=1 << 10))
    for pos in range(1, 401):
        store.append(stored_frame(pos, time.time(), TOPIC, body(earlier, pos, 200), 1))
    assert store.flush(sync=True)
    primary.link.ended_stores = lambda: {earlier: store}
    deadline = time.monotonic() + 30
    while earlier not in replica.disk.adopted:
        assert time.monotonic() < deadline, "the earlier incarnation's transfer did not complete"
        primary.cycle()
    assert primary.link.transfer.in_sync, "the running incarnation's own transfer went first"
    subscriber = dealer(ctx, replica.replay_endpoint)
    assert fetch_all(replica, subscriber, earlier) == [body(earlier, pos, 200) for pos in range(1, 401)]
    assert not list((tmp_path / "x1~r").glob("*~base")), "the transfer's own store became the stored one"
    assert (tmp_path / "x1~r" / earlier / f"{1:020d}.seg").exists()
    filled_before = replica.counters.get("filled_frames", 0)
    primary.link.following = False
    primary.link._follow()  # the same replica followed again: offered the earlier store again
    while primary.link.ended_transfer is None or not primary.link.ended_transfer.in_sync:
        assert time.monotonic() < deadline, "the second offer was not answered"
        primary.cycle()
    assert replica.counters.get("filled_frames", 0) - filled_before <= 4_000 // 200, "at most a page again"


def test_a_purge_drops_an_earlier_incarnations_transfer_under_way_and_takes_no_more_of_it(tmp_path: Path) -> None:
    """A purge while an earlier incarnation's store is being transferred: what it wrote goes, and
    pages of it still in flight are answered 0 (not taken), so the purged frames never come back."""
    disk = ReplicaDisk(tmp_path / "x1~r")
    disk.start(ON_DISK)
    disk.open(INC)
    earlier = f"{X}.earlier"
    now_us = int(time.time() * 1e6)

    def page(first: int, count: int, jump: bool) -> protocol.Fill:
        frames = [[now_us, TOPIC, body(earlier, pos), 1] for pos in range(first, first + count)]
        return protocol.Fill(INC, first, 100, frames, jump, proof(INC), earlier)
    assert disk.fill_ended(page(1, 10, True)) == 11
    assert (tmp_path / "x1~r" / f"{earlier}~base").is_dir()
    disk.purge(INC, 1)
    assert not (tmp_path / "x1~r" / f"{earlier}~base").exists(), "the transfer under way went with the purge"
    assert disk.fill_ended(page(11, 89, False)) == 0 and disk.fill_ended(page(1, 99, True)) == 0
    assert earlier not in disk.adopted and not (tmp_path / "x1~r" / earlier).exists()
    disk.close()


def test_an_adopted_store_that_ends_short_of_the_offer_is_transferred_again(tmp_path: Path) -> None:
    """A stored incarnation this replica adopted at start but whose end is short of what the primary
    offers (torn by a power cut after `filled_ended`) is not answered complete: it is taken again,
    whole, and replaces the short one."""
    earlier = f"{X}.earlier"
    short = SegmentStore(tmp_path / "x1~r" / earlier, StoreLimits(segment_bytes=16 << 10, index_every=1 << 10))
    for pos in range(1, 50):
        short.append(stored_frame(pos, time.time(), TOPIC, body(earlier, pos), 1))
    assert short.flush(sync=True)
    short.close()
    disk = ReplicaDisk(tmp_path / "x1~r")
    disk.start(ON_DISK)
    assert disk.adopted[earlier].end_pos == 50
    disk.open(INC)
    now_us = int(time.time() * 1e6)
    frames = [[now_us, TOPIC, body(earlier, pos), 1] for pos in range(1, 100)]
    assert disk.fill_ended(protocol.Fill(INC, 1, 100, frames, True, proof(INC), earlier)) == 100
    assert disk.adopted[earlier].end_pos == 100, "the short store was answered complete"
    disk.close()


# ---------------------------------------------------------------- transfers that did not finish


def transfer_page(inc: str, first: int, count: int, end: int, jump: bool, ended: str = "") -> protocol.Fill:
    now_us = int(time.time() * 1e6)
    frames = [[now_us, TOPIC, body(ended or inc, pos), 1] for pos in range(first, first + count)]
    return protocol.Fill(INC2 if ended else inc, first, end, frames, jump, proof(INC2 if ended else inc), ended)


def jumped_copy(disk: ReplicaDisk, jump: int, count: int) -> None:
    """A copy of INC that started at `jump` (the primary's memory had moved on) and holds `count` frames."""
    disk.open(INC, jump)
    for pos in range(jump, jump + count):
        disk.append(INC, pos, TOPIC, body(INC, pos), 1, {})
    assert disk.flush(INC)


def transfer_ended_whole(disk: ReplicaDisk, end: int, page: int = 7) -> list[int]:
    """The restarted primary (INC2) offers INC's store, positions 1 to end-1, as fill_ended pages the
    way exchange/replica_transfer.py sends them; returns the replica's answers."""
    answers, first, jump = [], 1, True
    for _ in range(1_000):
        held = disk.fill_ended(transfer_page(INC, first, min(page, end - first), end, jump, ended=INC))
        assert held is not None
        answers.append(held)
        if held >= end:
            return answers
        first, jump = (held, False) if held > 1 else (1, True)
    raise AssertionError("the transfer never ended")


@pytest.mark.parametrize("restarts", ["replica", "primary", "both"])
def test_a_copy_whose_transfer_did_not_finish_takes_what_it_lacks_from_the_restarted_primary(
        tmp_path: Path, restarts: str) -> None:
    """Review finding 5: a copy that jumped to 40 and whose transfer of 1-39 stopped at 15 is not
    answered complete by `fill_ended`: the restarted primary transfers 1-39 to it, in whatever order
    the replica and the primary restarted, and it is then served whole, with no marker left."""
    root = tmp_path / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    jumped_copy(disk, 40, 20)
    assert disk.fill(transfer_page(INC, 1, 14, 40, True)) == 15  # then the link broke
    if restarts in ("replica", "both"):
        disk.close()
        disk = ReplicaDisk(root)
        disk.start(ON_DISK)
    disk.open(INC2)  # the primary's new incarnation follows (INC ended)
    answers = transfer_ended_whole(disk, 60)
    assert answers[0] < 60, "answered complete while positions 1-39 were never transferred"
    stored = disk.store_of(INC)
    assert stored is not None and (stored.first_pos, stored.end_pos) == (1, 60)
    assert [frame.body for frame in stored.read(1, 60, 1 << 20).frames] == [body(INC, pos) for pos in range(1, 60)]
    assert not (root / INC / "transfer.missing").exists() and not list(root.glob("*~base"))
    disk.close()
    again = ReplicaDisk(root)
    again.start(ON_DISK)
    assert again.missing == {} and again.fill_ended(transfer_page(INC, 1, 7, 60, True, ended=INC)) == 60
    again.close()


@pytest.mark.parametrize("content", [b"", b"4", b"\xff\xfe", b"12x", b"-3", b"40"])
def test_a_damaged_transfer_marker_still_says_the_store_lacks_what_lies_below(tmp_path: Path, content: bytes) -> None:
    root = tmp_path / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    jumped_copy(disk, 40, 20)
    disk.close()
    (root / INC / "transfer.missing").write_bytes(content)
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    disk.open(INC2)
    assert transfer_ended_whole(disk, 60)[0] < 60, "a damaged marker was taken as a whole store"
    stored = disk.store_of(INC)
    assert stored is not None and (stored.first_pos, stored.end_pos) == (1, 60)
    disk.close()


def test_a_primary_that_holds_nothing_below_the_jump_leaves_the_copy_as_it_is(tmp_path: Path) -> None:
    root = tmp_path / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    jumped_copy(disk, 40, 20)
    disk.open(INC2)
    assert disk.fill_ended(transfer_page(INC, 45, 7, 60, True, ended=INC)) == 60
    assert not (root / INC / "transfer.missing").exists()
    assert INC in disk.in_sync
    disk.close()


def test_a_fresh_transfer_store_refuses_a_page_that_does_not_start_the_transfer(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Finding 6, the other half: a page in the middle of a transfer reaching a transfer store that
    holds nothing (the first pages were lost, or the store was dropped) is refused with a log line
    and not written (answered 1: send from your first position); the first page (jump) is taken."""
    root = tmp_path / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    jumped_copy(disk, 40, 5)
    earlier = f"{X}.earlier"
    with caplog.at_level("WARNING", logger="exchange.replica_disk"):
        assert disk.fill(transfer_page(INC, 20, 5, 40, False)) == 1
        assert disk.fill_ended(protocol.Fill(INC, 30, 50, transfer_page(earlier, 30, 5, 50, False).frames, False,
                                             proof(INC), earlier)) == 1
    assert sum("refused a transfer page" in record.getMessage() for record in caplog.records) == 2
    assert not list(root.glob("*~base/*.seg")), "nothing of a refused page is written"
    assert disk.fill(transfer_page(INC, 3, 5, 40, True)) == 8  # the primary's first page (its store starts at 3)
    assert disk.fill(transfer_page(INC, 8, 5, 40, False)) == 13
    disk.close()


def fill_up(path: Path) -> None:
    """Write to `path` until its filesystem is full."""
    with open(path, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_replica_whose_store_refuses_writes_says_broken_and_gives_way_to_a_restart(
        ctx: zmq.Context, small_disk, caplog: pytest.LogCaptureFixture) -> None:
    """Review finding 8: a full disk under the replica's store (a real tmpfs) does not stall its
    primary's confirms in silence. The replica answers `broken` with the reason, the primary logs
    it and confirms nothing more on its strength (held stays), while the disk stays full for
    GIVE_UP_AFTER the replica process ends (exit STORAGE: its HCM starts it again); space freed
    before that: the copy goes on and every frame reaches the replica's store."""
    disk = small_disk("replica", 1 << 20)
    filler = disk / "filler"
    r = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1", store_root=disk / "x1~r")
    r.disk.start(ON_DISK)
    vouch(r, INC)
    retention = Retention(60.0, 16 << 20)
    link = ReplicaLink(ctx, config(), retention, INC, X, proof(INC))
    try:
        link.point_to(r.repl_endpoint)

        def turn(now: float) -> None:
            link.pump(now)
            serve_a_while(r)
            assert link.sock is not None
            while link.sock.poll(50):
                link.on_reply(link.sock.recv())

        def publish(count: int) -> None:
            for _ in range(count):
                retention.add(TOPIC, body(INC, retention.next_pos, 2_000), 1)

        wait_until(lambda: turn(time.monotonic()) or link.following, timeout=5, message="the link to follow")
        publish(20)
        wait_until(lambda: turn(time.monotonic()) or link.held == retention.next_pos, timeout=5,
                   message="the first frames to be held")
        confirmed = link.held
        fill_up(filler)
        with caplog.at_level("ERROR"):
            publish(200)
            wait_until(lambda: turn(time.monotonic()) or bool(link.broken), timeout=10,
                       message="the primary to hear that the replica's store refuses writes")
        assert "No space left" in link.broken and link.held < retention.next_pos
        assert any("cannot store our copy" in record.getMessage() for record in caplog.records)
        assert any("refuses writes" in record.getMessage() for record in caplog.records)
        assert link.held >= confirmed, "nothing confirmed before is taken back"
        stuck = link.held
        now = time.monotonic()
        for step in range(1, 4):  # it asks again every RESYNC_AFTER and is told again
            turn(now + step * (replication.RESYNC_AFTER + 0.1))
        assert link.broken and link.held == stuck
        refusing_since = min(r.health.refusing_since.values())
        assert r.health.give_up(refusing_since + GIVE_UP_AFTER - 1, r.sealed) is None
        assert "No space left" in (r.health.give_up(refusing_since + GIVE_UP_AFTER, r.sealed) or "")
        filler.unlink()  # space freed before the replica gave up: it goes on
        wait_until(lambda: turn(time.monotonic() + 10) or link.held == retention.next_pos, timeout=15,
                   message="the copy to go on once the disk took writes again")
        assert not link.broken and not r.health.refusing_since
        r.disk.tick()
        store = r.disk.store_of(INC)
        assert store is not None and store.end_pos == retention.next_pos
        assert [frame.body for frame in store.read(1, store.end_pos, 1 << 30).frames] == \
            [body(INC, pos, 2_000) for pos in range(1, retention.next_pos)]
    finally:
        link.close()
        r.close()


def test_a_replica_that_gave_up_on_its_store_ends_its_loop_and_says_why(ctx: zmq.Context, small_disk) -> None:
    disk = small_disk("replica", 256 << 10)
    r = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1", store_root=disk / "x1~r")
    r.disk.start(ON_DISK)
    vouch(r, INC)
    try:
        copy_until_the_disk_refuses(r, dealer(ctx, r.repl_endpoint))
        assert not r.disk.accepts(INC) and r.health.refusing_since
        r.health.refusing_since[INC] -= GIVE_UP_AFTER  # refusing for that long already
        ticks: list[int] = []
        r.run(lambda: len(ticks) > 50, lambda: ticks.append(1))
        assert len(ticks) == 1 and "refusing writes" in r.gave_up and INC in r.gave_up
    finally:
        r.close()


def test_a_transfer_cut_by_restarts_of_both_ends_is_completed_by_the_primary_s_next_incarnation(
        ctx: zmq.Context, replica: Replica, tmp_path: Path) -> None:
    """Finding 5 end to end, with the real link on both sides: the replica's copy of INC jumped to
    the primary's memory tail and its transfer of the disk below was cut after a few pages; then the
    replica process and the primary restarted (INC2, serving INC's store as an earlier one). The
    replica's stored INC is transferred whole and served from position 1, not answered complete."""
    root = tmp_path / "x1~r"
    first = Primary(ctx, tmp_path / "primary", replica, 300)
    deadline = time.monotonic() + 20
    while not (INC in replica.disk.bases and replica.disk.bases[INC].end_pos > 20):
        assert time.monotonic() < deadline, "the transfer did not start"
        first.cycle()
    while first.link.held < first.retention.next_pos:
        first.cycle()
    jump = replica.disk.starts[INC]
    assert jump > 100 and INC not in replica.disk.in_sync, "the transfer was cut before it completed"
    first.link.close()
    replica.close()
    again = restarted(ctx, root)
    vouch(again, INC, INC2, running=INC2)
    second = Primary(ctx, tmp_path / "primary2", again, 100, inc=INC2)
    try:
        second.link.ended_stores = lambda: {INC: first.store}
        while second.link.ended_transfer is None or not second.link.ended_transfer.in_sync:
            assert time.monotonic() < deadline + 20, "the earlier incarnation's offer was never answered complete"
            second.cycle()
        stored = again.disk.store_of(INC)
        assert stored is not None and stored.first_pos == 1, "answered complete without positions 1 to the jump"
        assert not (root / INC / "transfer.missing").exists()
        subscriber = dealer(ctx, again.replay_endpoint)
        assert fetch_all(again, subscriber, INC) == [body(INC, pos, 200) for pos in range(1, 301)]
    finally:
        second.link.close()
        again.close()


def test_a_transfer_store_lost_mid_transfer_is_filled_again_from_the_start_not_from_the_middle(
        ctx: zmq.Context, replica: Replica, tmp_path: Path) -> None:
    """Finding 6 with the real link: the replica's transfer store goes while pages are under way
    (here: deleted under it). The next page, from the middle, is refused (not written), the primary
    starts the transfer again at its store's first position, and the copy ends in sync from 1."""
    primary = Primary(ctx, tmp_path / "primary", replica, 300)
    deadline = time.monotonic() + 20
    while not (INC in replica.disk.bases and replica.disk.bases[INC].end_pos > 40):
        assert time.monotonic() < deadline, "the transfer did not start"
        primary.cycle()
    base = replica.disk.bases.pop(INC)
    base.close()
    shutil.rmtree(base.directory)
    while not (primary.link.transfer.in_sync and INC in replica.disk.in_sync):
        assert time.monotonic() < deadline, "the transfer did not complete"
        primary.cycle()
    while primary.link.held < primary.retention.next_pos:
        primary.cycle()
    stored = replica.disk.store_of(INC)
    assert stored is not None and stored.first_pos == 1, "the transfer restarted in the middle"
    subscriber = dealer(ctx, replica.replay_endpoint)
    assert fetch_all(replica, subscriber, INC) == [body(INC, pos, 200) for pos in range(1, 301)]
