"""Model-based test of the exchange's publisher path (exchange/sessions.py), driven the way
exchange/ingest.py drives it.

Publishers own ids derived from secret tokens; they say hello (right or wrong token, any from_seq)
on any of a few connections and move between them; they send batches in order, replayed,
overlapping, jumping ahead or far ahead, some with messages the forwarder rejects one by one; they
say bye. A hostile connection knows every id but no token but its own: it says hello with wrong
tokens, sends batches and byes claiming the others' ids. A fake clock moves on and the exchange
prunes. After a batch that is not refused, the model does what the forwarder does: forward (or
reject) the messages from `skip` on, `advance(publisher, first + count - 1)`, ack the result.

What is asserted, for every publisher:
1. Every ack, welcome and resend point covers only what was handled: each sequence number up to
   the acked one was forwarded (or rejected one by one), or lies below the from_seq of a hello
   that proved the token (its owner declared it handled elsewhere).
2. A batch's messages skipped as duplicates were all handled before (by that definition).
3. No sequence number is handled twice while the exchange remembers the publisher. (Once it has
   been forgotten after `ttl` unseen, a hello starts afresh from its from_seq: the ttl is longer
   than any publisher's replay window, so nothing it could resend is mistaken for new.)
4. Frames from a connection that does not own an id (the hostile one, or an owner's old
   connection) change nothing of that id's session, and are refused with resend point 0.
5. `by_route` is exactly the inverse of the sessions' routes, and within the limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from exchange.sessions import PRUNE_INTERVAL, PublisherSessions, Session
from roq import protocol
from tests.profiles import examples

TOKENS = {name: name.encode() * 16 for name in ("alice", "bob", "carol", "mallory")}
IDS = {name: protocol.publisher_id_for(token) for name, token in TOKENS.items()}
NAMES = ["alice", "bob", "mallory"]  # carol only in the unit tests below
ROUTES = [b"conn-1", b"conn-2"]  # the honest publishers' connections (they move between them)
HOSTILE = b"conn-evil"  # mallory's connection: it knows every id, and only its own token
TTL = 60.0
MAX_PER_CONNECTION = 2
MAX_PUBLISHERS = 2


def batch_of(publisher: str, first_seq: int, count: int, rejected: set[int]) -> protocol.Batch:
    """`rejected`: offsets of messages the forwarder refuses one by one (an invalid topic)."""
    flat: list[bytes] = []
    for i in range(count):
        flat += [b"\x00bad" if i in rejected else b"t", b"x"]
    return protocol.Batch(publisher, first_seq, 0, flat)


@dataclass
class Handled:
    declared: int = 0  # highest from_seq - 1 of a hello with the right token
    epoch: int = 0  # times the exchange forgot the publisher
    seqs: dict[int, int] = field(default_factory=dict)  # sequence number → epoch it was handled in

    def covers(self, seq: int) -> bool:
        return seq <= self.declared or seq in self.seqs


class SessionsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.sessions = PublisherSessions(ttl=TTL, max_publishers=MAX_PUBLISHERS,
                                          max_per_connection=MAX_PER_CONNECTION)
        self.handled = {IDS[name]: Handled() for name in NAMES}
        self.known: set[str] = set()  # ids the exchange had a session for after the last step

    # ------------------------------------------------------------ helpers

    def _forgotten(self) -> None:
        """Sessions that disappeared (ttl) start a new epoch: old sequence numbers may come again."""
        alive = set(self.sessions.sessions)
        for pid in self.known - alive:
            self.handled[pid].epoch += 1
        self.known = alive

    def _covered(self, pid: str, upto: int, what: str) -> None:
        h = self.handled[pid]
        missing = [s for s in range(h.declared + 1, upto + 1) if s not in h.seqs]
        assert not missing, f"{what} {upto} for {pid} covers {missing[:5]}, never handled"

    def _snapshot(self, pid: str) -> tuple[Session | None, frozenset[str]]:
        s = self.sessions.sessions.get(pid)
        copy = Session(s.last, s.route, s.seen) if s is not None else None
        return copy, frozenset(self.sessions.by_route.get(HOSTILE, ()))

    def _owns(self, route: bytes, pid: str) -> bool:
        s = self.sessions.sessions.get(pid)
        return s is not None and s.route == route

    # ------------------------------------------------------------ rules

    def _route(self, name: str, via: str) -> bytes:
        """The connection a frame comes on: mallory's own, or for the others the one that owns
        their id ("owner"), one of theirs, or mallory's (claiming an id it does not own)."""
        if name == "mallory" or via == "hostile":
            return HOSTILE
        if via == "owner":
            session = self.sessions.sessions.get(IDS[name])
            return session.route if session is not None and session.route else ROUTES[0]
        return ROUTES[int(via)]

    @rule(name=st.sampled_from(NAMES), via=st.sampled_from(["owner", "0", "1", "hostile"]),
          wrong_token=st.integers(0, 3), start=st.sampled_from(["next", "lower", "higher", "max"]),
          offset=st.integers(0, 6))
    def hello(self, name: str, via: str, wrong_token: int, start: str, offset: int) -> None:
        """A hello with the right token (three times in four, never from mallory for another id)
        or a wrong one; from_seq continues, goes back (a replay after a move), jumps ahead, or is
        the largest there is."""
        pid, route = IDS[name], self._route(name, via)
        right_token = wrong_token != 0 and (route != HOSTILE or name == "mallory")
        token = TOKENS[name] if right_token else TOKENS["carol"]
        expected = self.sessions.last(pid) + 1
        from_seq = {"next": expected, "lower": max(1, expected - offset), "higher": expected + offset,
                    "max": protocol.MAX_SEQ}[start]
        owner_before, before = self._owns(route, pid), self._snapshot(pid)
        last, refusal = self.sessions.hello(route, protocol.Hello(pid, token, from_seq), now=self.now)
        self._forgotten()
        if not right_token:
            assert refusal and last == 0
            assert self._snapshot(pid) == before, "a hello with a wrong token changed the session"
            return
        if refusal:
            assert last == 0 and not owner_before and not self._owns(route, pid)
            event(f"hello refused: {refusal.split(' ')[0]}")
            return
        h = self.handled[pid]
        h.declared = max(h.declared, from_seq - 1)
        assert self._owns(route, pid) and last == max(expected - 1 if before[0] else 0, from_seq - 1)
        self._covered(pid, last, "welcome")

    @rule(name=st.sampled_from(NAMES), via=st.sampled_from(["owner", "owner", "0", "1", "hostile"]),
          start=st.sampled_from(["next", "replay", "ahead", "far", "absolute"]), offset=st.integers(0, 6),
          count=st.integers(1, 5), rejected=st.sets(st.integers(0, 4), max_size=2))
    def batch(self, name: str, via: str, start: str, offset: int, count: int, rejected: set[int]) -> None:
        """A batch in order, replayed (overlapping what was handled, or all of it), jumping ahead
        (a little, or far), or at any small sequence number; some messages the forwarder
        rejects one by one."""
        pid, route = IDS[name], self._route(name, via)
        expected = self.sessions.last(pid) + 1
        first = {"next": expected, "replay": max(1, expected - offset), "ahead": expected + 1 + offset,
                 "far": expected + 1_000_000, "absolute": offset + 1}[start]
        owner = self._owns(route, pid)
        before = self._snapshot(pid)
        verdict = self.sessions.batch(route, batch_of(pid, first, count, rejected), self.now)
        self._forgotten()
        if not owner:
            assert verdict.refused and verdict.code == protocol.HELLO_REQUIRED and verdict.resend == 0
            assert self._snapshot(pid) == before, "a batch from a connection not owning the id changed its session"
            return
        if verdict.refused:
            assert verdict.code == protocol.OUT_OF_ORDER and first > expected and verdict.resend == expected
            self._covered(pid, verdict.resend - 1, "resend point")
            return
        h = self.handled[pid]
        assert verdict.skip == min(max(expected - first, 0), count)
        for seq in range(first, first + verdict.skip):
            assert h.covers(seq), f"{pid}: {seq} dropped as a duplicate, never handled"
        # The forwarder: each message from `skip` on is forwarded or rejected, once.
        for seq in range(first + verdict.skip, first + count):
            assert h.seqs.get(seq) != h.epoch, f"{pid}: {seq} handled twice"
            h.seqs[seq] = h.epoch
        acked = self.sessions.advance(pid, first + count - 1)
        assert acked == max(expected - 1, first + count - 1)
        self._covered(pid, acked, "ack")
        event("batch forwarded" if verdict.skip < count else "batch of duplicates only")

    @rule(name=st.sampled_from(NAMES), via=st.sampled_from(["owner", "0", "1", "hostile"]))
    def malformed_batch(self, name: str, via: str) -> None:
        """A batch the decoder refuses as a whole: resend from the point refusal_point names."""
        pid, route = IDS[name], self._route(name, via)
        point = self.sessions.refusal_point(route, pid)
        if not self._owns(route, pid):
            assert point == 0
        else:
            self._covered(pid, point - 1, "resend point")

    @rule(name=st.sampled_from(NAMES), via=st.sampled_from(["owner", "0", "1", "hostile"]))
    def bye(self, name: str, via: str) -> None:
        pid, route = IDS[name], self._route(name, via)
        owner = self._owns(route, pid)
        before = self._snapshot(pid)
        assert self.sessions.bye(route, pid) == owner
        if not owner:
            assert self._snapshot(pid) == before, "a bye from a connection not owning the id changed its session"
        else:  # the connection is free of it; what the exchange holds of it stays until the ttl
            assert before[0] is not None and self.sessions.last(pid) == before[0].last
            assert not self._owns(route, pid)

    @rule(seconds=st.sampled_from([0.5, PRUNE_INTERVAL, TTL / 2, TTL + 1]), force=st.booleans())
    def time_passes(self, seconds: float, force: bool) -> None:
        self.now += seconds
        self.sessions.prune(self.now, force=force)
        self._forgotten()
        for pid, s in self.sessions.sessions.items():
            assert s.seen >= self.now - TTL - PRUNE_INTERVAL, f"{pid} unseen for longer than ttl and the interval"

    @invariant()
    def routes_are_consistent(self) -> None:
        sessions = self.sessions
        inverse: dict[bytes, set[str]] = {}
        for pid, s in sessions.sessions.items():
            if s.route:
                inverse.setdefault(s.route, set()).add(pid)
        assert sessions.by_route == inverse
        assert len(sessions.sessions) <= MAX_PUBLISHERS
        assert all(len(ids) <= MAX_PER_CONNECTION for ids in inverse.values())


@pytest.mark.timeout(60)
def test_sessions_model() -> None:
    run_state_machine_as_test(SessionsModel, settings=settings(
        max_examples=examples(400), stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


# ---------------------------------------------------------------- limits


def hello(sessions: PublisherSessions, route: bytes, name: str, now: float = 0.0, from_seq: int = 1) -> str:
    return sessions.hello(route, protocol.Hello(IDS[name], TOKENS[name], from_seq), now=now)[1]


def test_a_connection_owns_at_most_max_per_connection_ids() -> None:
    sessions = PublisherSessions(max_per_connection=2)
    assert not hello(sessions, b"c1", "alice") and not hello(sessions, b"c1", "bob")
    assert "at most 2 ids" in hello(sessions, b"c1", "carol")
    assert not hello(sessions, b"c1", "alice")  # saying hello again on the same connection is no new id
    assert not hello(sessions, b"c2", "carol")
    assert "at most 2 ids" in hello(sessions, b"c1", "carol")  # nor may a full connection take one over
    assert sessions.sessions[IDS["carol"]].route == b"c2"
    sessions.bye(b"c1", IDS["bob"])
    assert not hello(sessions, b"c1", "carol")  # the bye freed a slot
    assert sessions.by_route == {b"c1": {IDS["alice"], IDS["carol"]}}


def test_the_exchange_serves_at_most_max_publishers_until_some_expire() -> None:
    sessions = PublisherSessions(ttl=10.0, max_publishers=2)
    assert not hello(sessions, b"c1", "alice", now=0.0) and not hello(sessions, b"c2", "bob", now=5.0)
    assert "2 publishers already" in hello(sessions, b"c3", "carol", now=9.0)
    assert not hello(sessions, b"c1", "alice", now=9.0)  # a known publisher is always welcome
    # At 15.5 bob (seen at 5) has expired: the full exchange prunes at once, whatever the interval.
    assert not hello(sessions, b"c3", "carol", now=15.5)
    assert set(sessions.sessions) == {IDS["alice"], IDS["carol"]} and sessions.expired == 1


def test_publishers_unseen_for_ttl_are_forgotten_and_must_say_hello_again() -> None:
    sessions = PublisherSessions(ttl=10.0)
    assert not hello(sessions, b"c1", "alice", now=0.0)
    assert not sessions.batch(b"c1", batch_of(IDS["alice"], 1, 3, set()), now=8.0).refused
    assert sessions.advance(IDS["alice"], 3) == 3
    sessions.prune(now=17.0)  # seen at 8: not yet expired
    assert sessions.last(IDS["alice"]) == 3
    sessions.prune(now=18.5)  # expired, but the last sweep was less than PRUNE_INTERVAL ago
    assert sessions.last(IDS["alice"]) == 3
    sessions.prune(now=17.0 + PRUNE_INTERVAL)
    assert sessions.last(IDS["alice"]) == 0 and sessions.expired == 1 and not sessions.by_route
    verdict = sessions.batch(b"c1", batch_of(IDS["alice"], 4, 1, set()), now=30.0)
    assert verdict.refused and verdict.code == protocol.HELLO_REQUIRED
    last, refusal = sessions.hello(b"c1", protocol.Hello(IDS["alice"], TOKENS["alice"], 4), now=30.0)
    assert (last, refusal) == (3, "")
