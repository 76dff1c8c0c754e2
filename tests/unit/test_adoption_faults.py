"""A paged adoption (protocol section 7.6) under faults: a replica silent for a while, pages lost,
repeated, reordered or lying, the adopting exchange restarted mid-way. Every group ends adopted
with exactly the cursor its earlier incarnation left: an adoption under way never ends before its
last page. Real replicas and exchanges on real ZeroMQ sockets; the faults are made by holding,
dropping, repeating and reordering the replica's answers as they come off the exchange's socket."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest
import zmq
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import exchange.group_adopt as group_adopt
import exchange.replica_adoption as replica_adoption
from exchange.forwarder import Forwarder
from exchange.parts import Site
from exchange.replica import Replica
from roq import protocol
from roq.config import ExchangeConfig
from tests.profiles import examples
from tests.unit.test_group_adoption import MESSAGES, ON_DISK, PREFETCH, TOKEN, Member, ctx, turn
from tests.unit.test_replication import TOPIC, WAIT, X, batch, config, copy, dealer, follow, frames, proof, vouch

GROUPS = ("g0", "g1", "g2")


__all__ = ["ctx"]  # a fixture of these tests


@pytest.fixture
def fast_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of one frame, asked again after 10 ms (30 ms at most between two asks)."""
    monkeypatch.setattr(replica_adoption, "PAGE_BYTES", 1)
    monkeypatch.setattr(group_adopt, "PAGE_TIMEOUT", 0.01)
    monkeypatch.setattr(group_adopt, "MAX_PAGE_WAIT", 0.03, raising=False)


class GroupMember(Member):
    """A member of group `group` (Member's, of another group)."""

    def __init__(self, ctx: zmq.Context, fw: Forwarder, processed: Counter[int], group: str) -> None:
        self.fw, self.processed, self.group = fw, processed, group
        self.sock = dealer(ctx, fw.work_endpoint)
        self.sock.send(protocol.encode_join(group, [TOPIC], PREFETCH, 30_000, 5, b"dead", True))

    def ack(self, ranges: list[list[int]]) -> None:
        self.sock.send(protocol.encode_settle(protocol.ACK, self.group, self.fw.incarnation, ranges))


def pending_seqs(fw: Forwarder) -> dict[str, Counter[int]]:
    """Each group's cursor as the messages (sequence numbers) it still holds, each with its count."""
    out: dict[str, Counter[int]] = {}
    for record in fw.groups.records(fw.retention.next_pos):
        held = out.setdefault(record.name, Counter())
        for pos, idx, count, _ in record.pending:
            body = fw.retention.entries(pos, 1)[0][1]
            assert isinstance(body, bytes)
            held.update(protocol.decode_delivery(body).seqs[idx:idx + count])
        for pos in range(record.upto, fw.retention.next_pos):
            entry = fw.retention.entries(pos, 1)
            if entry and record.is_pending_whole(pos) and bytes(entry[0][0]).startswith(record.prefixes):
                held.update(protocol.decode_delivery(bytes(entry[0][1])).seqs)
    return out


def starting(ctx: zmq.Context, replica: Replica) -> Forwarder:
    """A replicated exchange's new incarnation pointed at `replica`, its adoption not begun."""
    fw = Forwarder.open(ctx, ExchangeConfig(), Site(X, "127.0.0.1", "127.0.0.1", replicas=2,
                                                    cluster_config=config()))
    replica.learn_primary({"incarnation": fw.incarnation, "copy_digest": protocol.copy_digest(fw.copy_secret)})
    replica._take_news()
    assert fw.link is not None
    fw.link.point_to(replica.repl_endpoint)
    return fw


def adopted(fw: Forwarder, replica: Replica) -> None:
    deadline = time.monotonic() + WAIT
    while fw.group_sync.adopting:
        assert time.monotonic() < deadline, "the adoption did not end"
        turn(fw, replica)


def left_behind(ctx: zmq.Context, replica: Replica) -> tuple[dict[str, Counter[int]], zmq.Socket]:
    """An incarnation whose three groups each acked part of a 12-frame backlog and hold a prefetch in
    flight, then gone once the replica holds it all: each group's cursor, and the publisher."""
    processed: Counter[int] = Counter()
    old = starting(ctx, replica)
    adopted(old, replica)
    members = [GroupMember(ctx, old, processed, group) for group in GROUPS]
    publisher = dealer(ctx, old.pub_endpoint)
    publisher.send(protocol.encode_hello(protocol.publisher_id_for(TOKEN), TOKEN, 1))
    pid = SimpleNamespace(pid=protocol.publisher_id_for(TOKEN))
    for first in range(1, MESSAGES + 1, 5):  # one frame each
        publisher.send(batch(pid, first, 5))  # type: ignore[arg-type]
    step = lambda: turn(old, replica)  # noqa: E731
    for times, member in enumerate(members):  # group gN acked N prefetches, holds the next in flight
        for _ in range(times):
            member.ack(member.take(step))
        assert member.take(step)
    deadline = time.monotonic() + WAIT
    while old.link is not None and old.link.marked < old.link.marks_sent or old.retention.next_pos <= MESSAGES // 5:
        assert time.monotonic() < deadline, "the replica to hold the acks and the backlog"
        step()
    for _ in range(3):  # the last state copied
        step()
    cursors = pending_seqs(old)
    assert set(cursors) == set(GROUPS) and len({sum(c.values()) for c in cursors.values()}) == 3
    old.close()
    for member in members:
        member.close()
    return cursors, publisher


class Wire:
    """The replica's answers to an exchange, taken off its socket and held: handed over in any
    order, repeated, or dropped."""

    def __init__(self, fw: Forwarder, replica: Replica) -> None:
        self.fw, self.replica, self.silent = fw, replica, False
        self.held: list[bytes] = []

    def replica_turn(self) -> None:
        if not self.silent:
            if self.replica.repl.poll(0):
                self.replica._drain_primary()
            self.replica.groups.turn(self.replica._answer)

    def take(self) -> None:
        """Answers that are not adoption pages pass at once; pages are held."""
        sock = self.fw.link.sock if self.fw.link is not None else None
        while sock is not None and sock.poll(0):
            frame = sock.recv()
            if isinstance(protocol.decode_replica_reply(frame), protocol.Adoption):
                self.held.append(frame)
            else:
                assert self.fw.link is not None
                self.fw.link.on_reply(frame)

    def hand(self, index: int, keep: bool = False) -> None:
        if self.held:
            frame = self.held[index % len(self.held)] if keep else self.held.pop(index % len(self.held))
            assert self.fw.link is not None
            self.fw.link.on_reply(frame)

    def pages(self, count: int) -> None:
        """Turn both, answers handed over as they come, until `count` pages were taken."""
        deadline = time.monotonic() + WAIT
        while self.fw.group_sync.adoption.pages < count:
            assert time.monotonic() < deadline
            self.replica_turn(), self.take(), self.hand(0), self.exchange_turn()

    def exchange_turn(self) -> None:
        if self.fw.group_sync.adopting:
            self.fw.group_sync.adoption_step()


def test_a_replica_silent_mid_adoption_loses_no_group(ctx: zmq.Context, fast_pages: None) -> None:
    """The replica answers two pages, then is silent for far longer than the exchange asks again
    (before: 40 asks, then the adoption ended and the groups not reached lost their backlog): the
    exchange waits, asking with backoff, and every group ends with exactly its cursor."""
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    cursors, publisher = left_behind(ctx, replica)
    new = starting(ctx, replica)
    wire = Wire(new, replica)
    wire.pages(2)
    wire.silent, silent_until = True, time.monotonic() + 1.5
    while time.monotonic() < silent_until:
        wire.replica_turn(), wire.take(), wire.exchange_turn()
    assert new.group_sync.adopting, "the adoption ended while the replica was silent"
    assert new.report().adopting_groups > 0 and new.report().adoption_stalled_s >= 1.0
    wire.silent = False
    adopted(new, replica)
    assert pending_seqs(new) == cursors
    assert new.report().adopting_groups == 0
    new.close()
    publisher.close()
    replica.close()


def test_the_adopting_exchange_restarted_mid_adoption_adopts_everything_again(
        ctx: zmq.Context, fast_pages: None) -> None:
    """An incarnation killed after a few pages sent no state of its own: the next one adopts the
    same groups whole from the same replica."""
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    cursors, publisher = left_behind(ctx, replica)
    first = starting(ctx, replica)
    deadline = time.monotonic() + WAIT
    while first.group_sync.adoption.pages < 3:
        assert time.monotonic() < deadline
        turn(first, replica)
    first.close()
    second = starting(ctx, replica)
    adopted(second, replica)
    assert pending_seqs(second) == cursors
    second.close()
    publisher.close()
    replica.close()


def test_a_page_that_lies_is_dropped_with_a_clear_line_and_changes_nothing(
        ctx: zmq.Context, fast_pages: None, caplog: pytest.LogCaptureFixture) -> None:
    """Pages whose next page goes back or past the group's end, or whose frames are not the group's
    pending messages: each logged and dropped; the true pages then adopt every cursor exactly."""
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    cursors, publisher = left_behind(ctx, replica)
    new = starting(ctx, replica)
    wire = Wire(new, replica)
    wire.pages(2)
    asked = new.group_sync.adoption._asked
    assert asked is not None
    first = new.group_sync.adoption._under_way.first  # type: ignore[union-attr]
    end = first.groups[asked[0]].upto
    frame = (0, b"jobs", protocol.encode_delivery(X, new.incarnation, 1, [], "p-1", 0, [1], [b"x"]))
    lies = [(asked[0], asked[1], asked[0], asked[1], []),  # no progress: asked again for ever
            (asked[0], asked[1], asked[0], end + 10, []),  # the next page beyond the group's end
            (asked[0], asked[1], len(GROUPS) + 1, 0, []),  # beyond the groups
            (asked[0], asked[1], len(GROUPS), 0, [(end + 5, frame[1], frame[2])]),  # beyond the store's end
            (asked[0], asked[1], len(GROUPS), 0, [(asked[1], frame[1], frame[2])])]  # not above `after`
    with caplog.at_level(logging.WARNING, logger="exchange.group_adopt"):
        for g, after, ng, na, frames in lies:
            before = (new.retention.next_pos, new.group_sync.adoption.pages)
            assert new.link is not None
            new.link.on_reply(protocol.encode_adoption(new.incarnation, first.ended, [], {}, frames, (),
                                                       (g, after, ng, na)))
            new.group_sync.adoption_step()
            assert (new.retention.next_pos, new.group_sync.adoption.pages) == before, "a lie changed something"
            assert new.group_sync.adopting
    assert sum("lies" in r.getMessage() for r in caplog.records) == len(lies)
    negative = msgpack.packb(["adoption", protocol.DATA_VERSION, new.incarnation, first.ended, [], [], [], [],
                              [asked[0], asked[1], asked[0], -5]])
    with caplog.at_level(logging.WARNING, logger="exchange.replication"):
        new.link.on_reply(negative)  # refused by the wire's rules: a negative count is no position
        new.group_sync.adoption_step()
    assert any("bad reply" in r.getMessage() for r in caplog.records) and new.group_sync.adopting
    adopted(new, replica)
    assert pending_seqs(new) == cursors
    new.close()
    publisher.close()
    replica.close()


def with_a_frame_not_pending(frame: bytes, first: protocol.Adoption) -> bytes:
    """A page with one frame more, within its range but of no message pending in `first` (what a
    replica restarted on group files older than its first answer sends), or unchanged if none fits."""
    reply = protocol.decode_replica_reply(frame)
    assert isinstance(reply, protocol.Adoption) and reply.page is not None
    group, after, next_group, next_after = reply.page
    if group >= len(first.groups):
        return frame
    record = first.groups[group]
    last = next_after if next_group == group else record.upto - 1
    taken = {p[0] for p in record.pending} | {pos for pos, _, _ in reply.frames}
    free = [pos for pos in range(after + 1, last + 1) if pos not in taken and not record.is_pending_whole(pos)]
    if not free:
        return frame
    body = protocol.encode_delivery(X, "x1.gone", 1, [], "p-9", 0, [999], [b"acked"])
    frames = sorted([*reply.frames, (free[0], TOPIC, body)])
    return protocol.encode_adoption(reply.incarnation, reply.ended, reply.groups, reply.high, frames,
                                    reply.applied, reply.page)


def test_pages_holding_messages_acked_since_the_first_answer_adopt_every_cursor(
        ctx: zmq.Context, fast_pages: None, caplog: pytest.LogCaptureFixture) -> None:
    """Every page after the first holds, as well, a frame of a message its group had acked when the
    replica answered first (its group files synced on its tick, its host crashed mid-adoption): the
    frame is left out with a line, the rest taken (before: the whole page was dropped as a lie, and
    the same page came back on every ask: the adoption never ended)."""
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    cursors, publisher = left_behind(ctx, replica)
    new = starting(ctx, replica)
    wire = Wire(new, replica)
    wire.pages(1)
    first = new.group_sync.adoption._under_way.first  # type: ignore[union-attr]
    tampered = 0
    deadline = time.monotonic() + WAIT
    with caplog.at_level(logging.WARNING, logger="exchange.group_adopt"):
        while new.group_sync.adopting:
            assert time.monotonic() < deadline, "the adoption stalled on pages holding acked messages"
            wire.replica_turn(), wire.take()
            if wire.held:
                page = wire.held.pop(0)
                changed = with_a_frame_not_pending(page, first)
                tampered += changed != page
                assert new.link is not None
                new.link.on_reply(changed)
            wire.exchange_turn()
    assert tampered > 0, "no page had room for a frame not pending"
    assert pending_seqs(new) == cursors
    assert any("no pending message" in r.getMessage() for r in caplog.records)
    new.close()
    publisher.close()
    replica.close()


class FaultyAdoption(RuleBasedStateMachine):
    """One adoption, its pages lost, repeated, reordered, the replica silent for a while: at the
    end every group holds exactly its cursor. Built anew for each example."""

    def __init__(self) -> None:
        super().__init__()
        self.ctx = zmq.Context()
        self.replica = Replica(self.ctx, config(), X, "127.0.0.1", "127.0.0.1")
        self.cursors, self.publisher = left_behind(self.ctx, self.replica)
        self.new = starting(self.ctx, self.replica)
        self.wire = Wire(self.new, self.replica)

    @initialize()
    def begin(self) -> None:
        self.wire.replica_turn()

    @rule()
    def replica_turn(self) -> None:
        self.wire.replica_turn()
        self.wire.take()

    @rule(index=st.integers(0, 7))
    def hand_over(self, index: int) -> None:  # index > 0: out of order
        self.wire.hand(index)
        self.wire.exchange_turn()

    @rule(index=st.integers(0, 7))
    def repeat(self, index: int) -> None:
        self.wire.hand(index, keep=True)
        self.wire.exchange_turn()

    @rule(index=st.integers(0, 7))
    def lose(self, index: int) -> None:
        if self.wire.held:
            self.wire.held.pop(index % len(self.wire.held))

    @rule(silent=st.booleans())
    def replica_silent(self, silent: bool) -> None:
        self.wire.silent = silent

    @rule(seconds=st.sampled_from([0.0, 0.02, 0.1]))
    def time_passes(self, seconds: float) -> None:  # the exchange asks again meanwhile
        deadline = time.monotonic() + seconds
        while True:
            self.wire.exchange_turn()
            if time.monotonic() >= deadline:
                break
            self.wire.replica_turn()
            self.wire.take()

    @invariant()
    def adopting_until_the_last_page(self) -> None:
        if self.new.group_sync.adopting:
            return
        assert pending_seqs(self.new) == self.cursors, "ended before every group had its cursor"

    def teardown(self) -> None:
        try:
            self.wire.silent = False
            deadline = time.monotonic() + WAIT
            while self.new.group_sync.adopting:
                assert time.monotonic() < deadline, "the adoption did not end once the faults stopped"
                self.wire.replica_turn(), self.wire.take(), self.wire.hand(0), self.wire.exchange_turn()
            assert pending_seqs(self.new) == self.cursors
        finally:
            self.new.close()
            self.publisher.close()
            self.replica.close()
            self.ctx.destroy(linger=0)


def test_an_adoption_under_lost_repeated_reordered_pages_and_silences_ends_with_every_cursor(
        fast_pages: None) -> None:
    run_state_machine_as_test(FaultyAdoption, settings=settings(max_examples=examples(15), stateful_step_count=40,
                                                                deadline=None))


def test_a_plan_over_many_groups_is_worked_out_in_steps_while_the_replica_answers_copies(
        ctx: zmq.Context, fast_pages: None) -> None:
    """The replica's loop works an adoption plan out a step per turn (a group's state, or a read of
    its store): a `copy` sent right after the `adopt`, on the same connection, is answered `copied`
    before the adoption's first page (before: the plan of 1,000 groups was worked out in one go,
    the loop answering nothing meanwhile)."""
    old, new = "x1.aaaa", "x1.bbbb"
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    vouch(replica, old)
    sock = dealer(ctx, replica.repl_endpoint)
    stop = threading.Event()
    loop = threading.Thread(target=replica.run, args=(stop.is_set, lambda: None), daemon=True)
    try:
        assert follow(replica, sock, old).kind == protocol.FOLLOWING
        assert copy(replica, sock, 1, frames(old, 1, 1000), old).kind == protocol.COPIED
        names = [f"group-{i:04d}" for i in range(1000)]  # the most a state holds
        pending = [(pos, 0, 1, 1) for pos in range(1, 300)]
        state = [protocol.GroupRecord(name, (TOPIC,), 30_000, 5, b"dead", 900, pending) for name in names]
        sock.send(protocol.encode_groups(old, state, proof(old)))
        assert follow(replica, sock, new).kind == protocol.FOLLOWING  # after the state: held when it answers
        loop.start()
        sock.send(protocol.encode_adopt(new, X, proof(new), (0, 0)))
        sock.send(protocol.encode_copy(new, 1, frames(new, 1, 1), proof(new)))
        replies = []
        deadline = time.monotonic() + 4 * WAIT
        while not any(isinstance(r, protocol.Adoption) for r in replies):
            assert time.monotonic() < deadline, f"no adoption answered: {replies}"
            if sock.poll(50):
                replies.append(protocol.decode_replica_reply(sock.recv()))
        assert [r.kind for r in replies[:1]] == [protocol.COPIED], "the copy waited for the plan"
        adoption = replies[-1]
        assert isinstance(adoption, protocol.Adoption) and adoption.ended == old
        assert [g.name for g in adoption.groups] == names
    finally:
        stop.set()
        if loop.is_alive():
            loop.join(WAIT)
        sock.close(linger=0)
        replica.close()


def followed_anew(ctx: zmq.Context, fw: Forwarder, store_root: Path,
                  made: Callable[[Replica], Replica] = lambda replica: replica) -> Replica:
    """A replica started again on the disk at `store_root` (`made` as it is), followed by `fw`."""
    again = made(Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1", store_root=store_root))
    again.disk.start(ON_DISK)
    again.learn_primary({"incarnation": fw.incarnation, "copy_digest": protocol.copy_digest(fw.copy_secret)})
    again._take_news()
    assert fw.link is not None
    fw.link.point_to(again.repl_endpoint)
    return again


def test_a_replica_restarted_on_its_disk_mid_adoption_answers_the_page_asked(
        ctx: zmq.Context, fast_pages: None, tmp_path: Path) -> None:
    """The replica's process dies after two pages and a new one starts on its disk (its copies'
    stores and group files): the exchange follows it anew, asks the page it waited for, and every
    group ends with exactly its cursor."""
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1", store_root=tmp_path)
    replica.disk.start(ON_DISK)
    cursors, publisher = left_behind(ctx, replica)
    new = starting(ctx, replica)
    Wire(new, replica).pages(2)
    replica.close()
    again = followed_anew(ctx, new, tmp_path)
    adopted(new, again)
    assert pending_seqs(new) == cursors
    new.close()
    publisher.close()
    again.close()


def test_a_replica_of_before_pages_restarted_after_the_whole_ask_is_asked_whole_again(
        ctx: zmq.Context, fast_pages: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica of before pages (here: a real replica that answers only an unpaged `adopt`)
    restarts on its disk after the exchange asked for the whole adoption, the answer lost: the
    exchange asks whole again once it follows the new one, and every group ends with exactly its
    cursor (before: the whole ask was sent once only, every paged ask dropped, the adoption never
    ended: the replica follows, so the exchange never gave up)."""
    monkeypatch.setattr(group_adopt, "ADOPT_TIMEOUT", 10 * WAIT)  # no giving up while the replica restarts

    def of_before_pages(replica: Replica) -> Replica:
        answer = replica.groups.answer
        monkeypatch.setattr(replica.groups, "answer",
                            lambda adopt, *held, **kw: answer(adopt, *held, **kw) if adopt.page is None else None)
        return replica

    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1", store_root=tmp_path)
    replica.disk.start(ON_DISK)
    cursors, publisher = left_behind(ctx, replica)
    new = starting(ctx, of_before_pages(replica))
    wire = Wire(new, replica)
    deadline = time.monotonic() + WAIT
    while not wire.held:  # the whole answer, lost with the replica's restart
        assert time.monotonic() < deadline, "no whole adoption answered"
        wire.replica_turn(), wire.take(), wire.exchange_turn()
    reply = protocol.decode_replica_reply(wire.held[0])
    assert isinstance(reply, protocol.Adoption) and reply.page is None
    replica.close()
    again = followed_anew(ctx, new, tmp_path, of_before_pages)
    adopted(new, again)
    assert new.group_sync.adoption.pages == 0, "taken whole"
    assert pending_seqs(new) == cursors
    new.close()
    publisher.close()
    again.close()
