"""What a restarted exchange adopts of its groups (protocol section 7.6): the replica's arithmetic
on a group's state, and the engine's records of it."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.forwarder import Forwarder
from exchange.groups import Groups, GroupSettings
from exchange.parts import Site
from exchange.replica import Replica
from exchange.replica_adoption import _final, _minus
from roq import protocol
from roq.config import ExchangeConfig
from roq.errors import ProtocolError
from roq.storage_policy import StoragePolicy
from tests.profiles import examples
from tests.unit.test_replication import INC, TOPIC, WAIT, X, batch, config, dealer, follow, make_replica, proof

SETTINGS = GroupSettings((b"jobs",), 30.0, 5, b"dead")
ON_DISK = StoragePolicy(retention=3600.0)


def record(upto: int, pending: list[tuple[int, int, int, int]]) -> protocol.GroupRecord:
    return protocol.GroupRecord("workers", (b"jobs",), 30_000, 5, b"dead", upto, pending)


@given(st.tuples(st.integers(0, 50), st.integers(0, 50)),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=6))
def test_minus_keeps_exactly_the_points_outside_the_holes(span, holes) -> None:
    span = (min(span), max(span))
    holes = sorted((min(h), max(h)) for h in holes)
    kept = _minus(span, holes)
    points = {p for lo, hi in kept for p in range(lo, hi)}
    expected = {p for p in range(*span) if not any(lo <= p < hi for lo, hi in holes)}
    assert points == expected
    assert all(lo < hi for lo, hi in kept)


def test_the_adopted_state_lists_every_pending_message_and_nothing_done() -> None:
    # Frames 1-4 of 3 messages each; the state was taken at position 3 with frame 1 partly pending.
    frames = [(1, b"jobs", 3), (2, b"jobs", 3), (3, b"jobs", 3), (4, b"other", 3), (5, b"jobs.x", 3)]
    state = record(3, [(1, 1, 2, 1)])
    done = [(1, 2, 1), (3, 0, 1), (5, 0, 3)]  # acked since: one of frame 1, the first of 3, all of 5
    final = _final(state, done, frames, next_pos=6)
    assert final.upto == 6
    assert sorted(final.pending) == [(1, 1, 1, 1), (3, 1, 2, 0)]  # frame 2 was done, 4 is not ours


def test_records_list_ready_delayed_and_in_flight_units_with_their_deliveries() -> None:
    now = [100.0]
    groups = Groups(clock=lambda: now[0], wall=lambda: 1_000.0)
    group, _ = groups.join("workers", b"m1", SETTINGS, prefetch=2)
    assert group is not None
    groups.offer(1, b"jobs", "p-a", 0, [1, 2, 3], [b"a", b"b", b"c"])
    groups.offer(2, b"jobs", "p-a", 0, [4], [b"d"], [(0, 0, 2_000_000, b"")])  # not before 2,000 s
    sent = [u for _, units in groups.dispatch(group) for u in units]
    assert [(u.pos, u.idx, u.count) for u in sent] == [(1, 0, 2)]
    groups.ack("workers", b"m1", [(1, 0, 1)])
    (state,) = groups.records(upto=3)
    assert sorted(state.pending) == [(1, 1, 1, 1), (1, 2, 1, 0), (2, 0, 1, 0)]
    assert groups.take_done() == {"workers": [(1, 0, 1)]} and groups.take_done() == {}


@settings(max_examples=examples(50))
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 9), st.integers(1, 9), st.integers(0, 5)), max_size=8))
def test_group_records_survive_the_wire(pending) -> None:
    rec = record(10, pending)
    decoded = protocol.decode_replica_request(protocol.encode_groups("x1.ab", [rec], b"s" * 32))
    assert isinstance(decoded, protocol.GroupState) and decoded.groups == [rec]
    adoption = protocol.decode_replica_reply(protocol.encode_adoption("x1.cd", "x1.ab", [rec], {"p-a": 7},
                                                                      [(3, b"jobs", b"body")]))
    assert isinstance(adoption, protocol.Adoption)
    assert (adoption.ended, adoption.groups, adoption.high, adoption.frames) == \
        ("x1.ab", [rec], {"p-a": 7}, [(3, b"jobs", b"body")])


def test_a_work_entry_whose_items_lie_is_refused() -> None:
    good = [3, 0, 1, b"t", "p-a", 5, [1], [b"x"], 0, b"k"]
    assert protocol.decode_work_reply(protocol.encode_work("w", "x1.a", [good]), 1 << 20).entries == [good]
    for index, lie in ((6, ["one"]), (6, [0]), (7, [7]), (9, b"k" * 300), (3, b""), (3, b"t" * 256)):
        entry = list(good)
        entry[index] = lie
        with pytest.raises(ProtocolError):
            protocol.decode_work_reply(protocol.encode_work("w", "x1.a", [entry]), 1 << 20)


# ---------------------------------------------------------------- a member's acks across a failover (real sockets)

GROUP, PREFETCH, MESSAGES = "workers", 10, 60
TOKEN = b"t" * 16


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_a_mark_is_answered_once_the_replica_holds_a_state_of_its_incarnation(ctx: zmq.Context) -> None:
    replica = make_replica(ctx)
    sock = dealer(ctx, replica.repl_endpoint)
    try:
        assert follow(replica, sock).kind == protocol.FOLLOWING

        def answers(*frames: bytes) -> list[object]:
            for frame in frames:
                sock.send(frame)
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                if replica.repl.poll(10):
                    replica._drain_primary()
            out = []
            while sock.poll(0):
                out.append(protocol.decode_replica_reply(sock.recv()))
            return out

        # No state yet: the acks before it would be lost with it, so no answer.
        assert answers(protocol.encode_done(INC, {"workers": [(1, 0, 1)]}, proof(INC)),
                       protocol.encode_mark(INC, 1, proof(INC))) == []
        state = protocol.encode_groups(INC, [record(1, [(1, 0, 3, 1)])], proof(INC))
        done = protocol.encode_done(INC, {"workers": [(1, 1, 1)]}, proof(INC))
        assert answers(state, done, protocol.encode_mark(INC, 2, proof(INC))) == [protocol.Marked(INC, 2)]
        assert replica.group_done[INC] == {"workers": [(1, 1, 1)]}
        assert answers(protocol.encode_mark(INC, 3, b"f" * 32)) == []  # without the copy secret: dropped
    finally:
        sock.close(linger=0)
        replica.close()


class Member:
    """A group member's DEALER on an exchange's `work` socket, speaking protocol section 7, counting
    each message (by sequence number) it processed."""

    def __init__(self, ctx: zmq.Context, fw: Forwarder, processed: Counter[int]) -> None:
        self.fw, self.processed = fw, processed
        self.sock = dealer(ctx, fw.work_endpoint)
        self.sock.send(protocol.encode_join(GROUP, [TOPIC], PREFETCH, 30_000, 5, b"dead", True))

    def take(self, turn: Callable[[], None], wait: float = WAIT) -> list[list[int]]:
        """Turn the loop until work comes (at most `wait` s): process it, and return its ranges to ack."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            turn()
            while self.sock.poll(1):
                reply = protocol.decode_work_reply(self.sock.recv(), 1 << 24)
                if reply.kind == protocol.WORK:
                    ranges = []
                    for entry in reply.entries or ():
                        self.processed.update(entry[6])
                        ranges.append([entry[0], entry[1], len(entry[6])])
                    return ranges
        return []

    def ack(self, ranges: list[list[int]]) -> None:
        self.sock.send(protocol.encode_settle(protocol.ACK, GROUP, self.fw.incarnation, ranges))

    def close(self) -> None:
        self.sock.close(linger=0)


def turn(fw: Forwarder, replica: Replica, *, killed_after_pump: bool = False) -> None:
    """One turn of Forwarder.run's loop, in its order, with the replica's. `killed_after_pump`: the
    turn of an exchange killed right after its pump (it handed out work, and its replica has nothing
    of this turn's acks)."""
    if replica.repl.poll(0):
        replica._drain_primary()
    replica.groups.turn(replica._answer)
    assert fw.link is not None
    if fw.link.sock is not None and fw.link.sock.poll(0):
        fw.durability.drain_replica(fw.link.sock)
    if fw.group_sync.adopting:
        fw.group_sync.adoption_step()
        return
    if fw.front.poll(0):
        fw.ingest.drain()
    if fw.work.sock.poll(0):
        fw.work.drain()
    fw.groups.tick()
    fw.parts.spill.turn()
    fw.group_sync.settle_acks()
    fw.work.pump()
    if not killed_after_pump:
        now = time.monotonic()
        fw.group_sync.replicate(now)
        fw.durability.make_durable(now)


def incarnation(ctx: zmq.Context, replica: Replica, store_root: Path | None = None) -> Forwarder:
    """A replicated exchange's new incarnation, following `replica`, having adopted what the
    previous one left there (as its HCM and run loop would do). `store_root`: it keeps its frames
    on disk there (a disk storage policy), its groups 300 bytes of memory."""
    limits = ExchangeConfig(group_max_bytes=300) if store_root is not None else ExchangeConfig()
    fw = Forwarder.open(ctx, limits, Site(X, "127.0.0.1", "127.0.0.1", replicas=2, cluster_config=config(),
                                          store_root=str(store_root) if store_root is not None else None))
    if store_root is not None:
        fw.parts.disk.start(ON_DISK)
    replica.learn_primary({"incarnation": fw.incarnation, "copy_digest": protocol.copy_digest(fw.copy_secret)})
    replica._take_news()
    assert fw.link is not None
    fw.link.point_to(replica.repl_endpoint)
    deadline = time.monotonic() + WAIT
    while fw.group_sync.adopting:
        assert time.monotonic() < deadline, "the replica did not answer the adoption"
        turn(fw, replica)
    return fw


def with_member_and_publisher(ctx: zmq.Context, replica: Replica, processed: Counter[int],
                              store_root: Path | None = None) -> tuple[Forwarder, Member, zmq.Socket]:
    """An incarnation following `replica`, a member of GROUP on it and a publisher that said hello."""
    fw = incarnation(ctx, replica, store_root)
    member = Member(ctx, fw, processed)
    publisher = dealer(ctx, fw.pub_endpoint)
    publisher.send(protocol.encode_hello(protocol.publisher_id_for(TOKEN), TOKEN, 1))
    return fw, member, publisher


def process_all(member: Member, step: Callable[[], None]) -> None:
    """Take and ack work until every message was processed (within WAIT)."""
    deadline = time.monotonic() + WAIT
    while len(member.processed) < MESSAGES:
        assert time.monotonic() < deadline, f"only {len(member.processed)} of {MESSAGES} processed"
        ranges = member.take(step)
        if ranges:
            member.ack(ranges)


def test_work_waits_until_the_replica_holds_the_acks_so_a_failover_repeats_at_most_the_prefetch(
        ctx: zmq.Context) -> None:
    """An exchange takes a member's ack, hands it more work, and is killed before the ack reached
    its replica: the acked messages come again after the failover (to the member that is the same
    as an ack lost on the way). The member must not have been given work on that credit: what a
    failover hands out again of what it processed is then at most its prefetch. (It was twice the
    prefetch: tests/integration/test_work_adoption.py under load.)"""
    processed: Counter[int] = Counter()
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    old = incarnation(ctx, replica)
    member = Member(ctx, old, processed)
    step = lambda: turn(old, replica)  # noqa: E731
    publisher = dealer(ctx, old.pub_endpoint)
    publisher.send(protocol.encode_hello(protocol.publisher_id_for(TOKEN), TOKEN, 1))
    publisher.send(batch(SimpleNamespace(pid=protocol.publisher_id_for(TOKEN)), 1, MESSAGES))  # type: ignore[arg-type]
    first = member.take(step)
    assert sum(r[2] for r in first) == PREFETCH
    member.ack(first)
    second = member.take(step)  # the credit came back once the replica held the ack
    assert second and {r[1] for r in second} == {PREFETCH}
    member.ack(second)
    deadline = time.monotonic() + WAIT
    while old.groups.groups[GROUP].counters.acked < 2 * PREFETCH:  # the exchange took the second ack
        assert time.monotonic() < deadline
        turn(old, replica, killed_after_pump=True)
    late = member.take(lambda: turn(old, replica, killed_after_pump=True), wait=0.3)
    assert not late, "work handed out on credit whose ack the replica did not hold"
    old.close()
    member.close()

    new = incarnation(ctx, replica)
    again = Member(ctx, new, processed)
    process_all(again, lambda: turn(new, replica))
    twice = sorted(seq for seq, n in processed.items() if n > 1)
    assert twice == list(range(PREFETCH + 1, 2 * PREFETCH + 1))  # the second ten: acked, not copied
    again.close()
    new.close()
    publisher.close()
    replica.close()


def test_without_a_replica_acks_free_their_room_at_once(ctx: zmq.Context) -> None:
    """While the exchange has no replica (its znode gone, a new one not yet placed) nothing can hold
    the acks: members go on working, as without replication, and the next replica gets the state."""
    processed: Counter[int] = Counter()
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    fw, member, publisher = with_member_and_publisher(ctx, replica, processed)
    publisher.send(batch(SimpleNamespace(pid=protocol.publisher_id_for(TOKEN)), 1, MESSAGES))  # type: ignore[arg-type]
    member.ack(member.take(lambda: turn(fw, replica)))
    assert fw.link is not None
    fw.link.point_to(None)
    deadline = time.monotonic() + WAIT
    while len(processed) < MESSAGES:
        assert time.monotonic() < deadline, f"only {len(processed)} of {MESSAGES} processed without a replica"
        ranges = member.take(lambda: turn(fw, replica))
        if ranges:
            member.ack(ranges)
    member.close()
    publisher.close()
    fw.close()
    replica.close()


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "disk"])
def test_a_backlog_of_many_pages_is_adopted_page_by_page_every_message_once(
        ctx: zmq.Context, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, on_disk: bool) -> None:
    """The replica answers `adopt` a page at a time (protocol section 7.6): with pages of one frame
    here, a backlog of 12 frames (and a member's prefetch in flight) takes a page per frame; the
    new incarnation hands out every unacked message once, none acked. Before, the whole backlog
    went in one reply (one page). With a disk storage policy the group, over more than one page,
    is not handed its backlog in memory: it reads it back from the new incarnation's store."""
    monkeypatch.setattr("exchange.replica_adoption.PAGE_BYTES", 1)
    processed: Counter[int] = Counter()
    store_root = tmp_path / "exchange" if on_disk else None
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1", store_root=tmp_path / "replica")
    replica.disk.start(ON_DISK if on_disk else None)
    publisher = backlog_then_kill(ctx, replica, processed, store_root)
    new = incarnation(ctx, replica, store_root)
    pages = new.group_sync.adoption.pages
    assert pages >= MESSAGES // 5 - 2, f"a page per frame of the backlog: {pages}"
    assert bool(new.groups.groups[GROUP].spilled_from) == on_disk, "on disk: read back from the store"
    each_unacked_once(ctx, new, replica, processed)
    publisher.close()
    replica.close()


def test_a_replica_of_before_pages_is_asked_for_the_whole_adoption(ctx: zmq.Context,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica of before pages drops a paged `adopt` as malformed (here: a real replica that
    answers only an unpaged one): the exchange asks for the whole adoption after PAGE_TIMEOUT, and
    takes it in one reply."""
    processed: Counter[int] = Counter()
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    publisher = backlog_then_kill(ctx, replica, processed)
    answer = replica.groups.answer
    monkeypatch.setattr(replica.groups, "answer",
                        lambda adopt, *held: answer(adopt, *held) if adopt.page is None else None)
    new = incarnation(ctx, replica)
    assert new.group_sync.adoption.pages == 0, "no page: the whole adoption at once"
    each_unacked_once(ctx, new, replica, processed)
    publisher.close()
    replica.close()


def backlog_then_kill(ctx: zmq.Context, replica: Replica, processed: Counter[int],
                      store_root: Path | None = None) -> zmq.Socket:
    """An incarnation with 12 frames of backlog; its member acked a prefetch and holds the next
    unacked; the replica holds the acks and the frames; then the incarnation is gone. Its publisher."""
    old, member, publisher = with_member_and_publisher(ctx, replica, processed, store_root)
    pid = SimpleNamespace(pid=protocol.publisher_id_for(TOKEN))
    for first in range(1, MESSAGES + 1, 5):  # one frame each
        publisher.send(batch(pid, first, 5))  # type: ignore[arg-type]
    step = lambda: turn(old, replica)  # noqa: E731
    acked = member.take(step)
    member.ack(acked)
    member.take(step)  # in flight at the kill: comes again
    deadline = time.monotonic() + WAIT
    while old.link is not None and old.link.marked < old.link.marks_sent or old.retention.next_pos <= MESSAGES // 5:
        assert time.monotonic() < deadline, "the replica to hold the acks and the backlog"
        step()
    old.close()
    member.close()
    return publisher


def each_unacked_once(ctx: zmq.Context, new: Forwarder, replica: Replica, processed: Counter[int]) -> None:
    """A member of `new` processes the rest: every message then processed, only the prefetch that
    was in flight at the kill twice."""
    again = Member(ctx, new, processed)
    step = lambda: turn(new, replica)  # noqa: E731
    process_all(again, step)
    assert not again.take(step, wait=0.3), "nothing more"
    twice = sorted(seq for seq, n in processed.items() if n > 1)
    assert twice == list(range(PREFETCH + 1, 2 * PREFETCH + 1)), "only the prefetch in flight at the kill"
    again.close()
    new.close()


def test_an_asker_in_pages_gets_no_whole_adoption_and_its_plan_is_worked_out_once() -> None:
    """The whole ask an exchange sends when its first page is slow (its fallback for a replica of
    before pages) is not answered once that asker asked for pages: no reply the size of the whole
    backlog; a repeated (0, 0) reuses the plan; another asker's whole ask is answered. A paged ask
    is answered by `turn` once its plan is worked out (a step per loop turn)."""
    from exchange.replica_adoption import Adoptions
    adoptions, planned = Adoptions(), []
    import exchange.replica_adoption as module
    real = module.plan_steps

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        planned.append(1)
        return real(*args, **kwargs)
    module.plan_steps = counting  # type: ignore[assignment]
    try:
        paged = protocol.Adopt("x1.000000002", "x1", b"p" * protocol.MIN_PROOF, (0, 0))
        assert adoptions.answer(paged, {}, {}, {}, (), {}, b"route") is None, "answered once worked out"
        answered = adoptions.turn()
        assert answered is not None and answered[0] == b"route"
        assert adoptions.answer(paged, {}, {}, {}, (), {}) is not None
        assert len(planned) == 1, "a repeated (0, 0) worked the plan out again"
        whole = protocol.Adopt("x1.000000002", "x1", b"p" * protocol.MIN_PROOF)
        assert adoptions.answer(whole, {}, {}, {}, (), {}) is None
        other = protocol.Adopt("x1.000000003", "x1", b"p" * protocol.MIN_PROOF)
        assert adoptions.answer(other, {}, {}, {}, (), {}) is not None
    finally:
        module.plan_steps = real
