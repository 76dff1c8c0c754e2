"""Replication: the replica process's store and server (exchange/replica.py) and the
primary's side (exchange/replication.py), with real ZeroMQ sockets on 127.0.0.1 in this process.

The Replica is driven by calling its drains (`_drain_primary`, `replay.drain`) rather than its
run loop, and every wait is a poll with a deadline, so each test is deterministic. The model-based
test at the end puts the wire between a ReplicaLink and a Replica in the test's hands (frames
dropped, duplicated, reordered; the replica restarted; retention evicting) and checks what `held`
promises: every position below it is in the current replica's copy with the very body the primary
forwarded, or was acknowledged by an earlier replica; and that the confirm gate releases an ack
only once everything it covers is held.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from unittest import mock

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from exchange import replica as replica_module
from exchange import replication
from exchange.confirms import ConfirmGate
from exchange.forwarder import Forwarder
from exchange.parts import Site
from exchange.replica import MAX_COPIES, Replica
from exchange.replication import RESYNC_AFTER, ReplicaLink
from exchange.retention import Retention
from roq import protocol
from roq.config import Config, ExchangeConfig
from tests.profiles import examples

X = "x1"
INC = "x1.aaaa"
INC2 = "x1.bbbb"
TOPIC = b"orders"
WAIT = 5.0  # seconds any single expected answer may take on loopback


def proof(inc: str) -> bytes:
    """A test incarnation's copy secret (a real primary draws its own at random)."""
    return hashlib.sha256(inc.encode()).digest()


def vouch(r: Replica, *incs: str, running: str | None = None) -> None:
    """What the replica's HCM writes (protocol 6.1): each incarnation's copy digest as it ran, then
    the one running now (None: none, so every copy may be sealed)."""
    for inc in (*incs, running):
        r.learn_primary({"incarnation": inc, "copy_digest": protocol.copy_digest(proof(inc))} if inc else None)
    r._take_news()


def make_replica(ctx: zmq.Context, cfg: Config | None = None) -> Replica:
    """A replica that knows the copy digests of INC and INC2, neither running."""
    r = Replica(ctx, cfg or config(), X, "127.0.0.1", "127.0.0.1")
    vouch(r, INC, INC2)
    return r


def config(**exchange: object) -> Config:
    return dataclasses.replace(Config(), exchange=ExchangeConfig(**exchange))  # type: ignore[arg-type]


def body(inc: str, pos: int, size: int = 0) -> bytes:
    """A delivery body as the primary's forwarder encodes it."""
    return protocol.encode_delivery(X, inc, pos, [], "p-1", 0, [pos], [b"m%d" % pos + b"." * size])


def frames(inc: str, first: int, count: int, size: int = 0) -> list[list[object]]:
    return [[TOPIC, body(inc, pos, size), 1] for pos in range(first, first + count)]


def held_bodies(copy: Retention) -> dict[int, bytes]:
    return {copy.oldest + i: entry[1] for i, entry in enumerate(copy.entries(copy.oldest, 1 << 40))}  # type: ignore[misc]


def snapshot(r: Replica) -> tuple[object, ...]:
    """Everything a frame from the primary could change."""
    return ({inc: (c.oldest, c.next_pos, held_bodies(c)) for inc, c in r.copies.items()},
            set(r.sealed))


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def replica(ctx: zmq.Context) -> Iterator[Replica]:
    r = make_replica(ctx)
    yield r
    r.close()


def dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def serve_until_answer(r: Replica, sock: zmq.Socket) -> bytes:
    """Let the replica handle what reaches its `repl` socket until `sock` gets an answer."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if r.repl.poll(10):
            r._drain_primary()
        if sock.poll(0):
            return sock.recv()
    raise AssertionError("the replica did not answer in time")


def ask(r: Replica, sock: zmq.Socket, payload: bytes) -> protocol.ReplicaReply:
    sock.send(payload)
    return protocol.decode_replica_reply(serve_until_answer(r, sock))


def follow(r: Replica, sock: zmq.Socket, inc: str = INC) -> protocol.ReplicaReply:
    """A follow with the incarnation's proof; the replica is told its digest first if need be."""
    if inc not in r.digests:
        vouch(r, inc)
    return ask(r, sock, protocol.encode_follow(inc, X, proof(inc)))


def copy(r: Replica, sock: zmq.Socket, first: int, entries: list[list[object]], inc: str = INC,
         jump: bool = False) -> protocol.ReplicaReply:
    if inc not in r.digests:
        vouch(r, inc)
    return ask(r, sock, protocol.encode_copy(inc, first, entries, proof(inc), jump=jump))


def replay_ask(r: Replica, sock: zmq.Socket, payload: bytes) -> protocol.Frames | protocol.StreamPosition:
    """A subscriber's request on the replica's replay socket (raises ReplayRefused on an error)."""
    sock.send(payload)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if r.replay.sock.poll(10):
            r.replay.drain()
        if sock.poll(0):
            return protocol.decode_replay_reply(sock.recv(), 1 << 30)
    raise AssertionError("the replica's replay socket did not answer in time")


def kind(reply: protocol.ReplicaReply) -> tuple[str, int]:
    return reply.kind, reply.next_pos


# ---------------------------------------------------------------- the replica: from the primary


def test_follow_then_consecutive_copies_are_acknowledged_cumulatively(ctx: zmq.Context, replica: Replica) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    assert kind(follow(replica, primary)) == (protocol.FOLLOWING, 0)
    assert kind(copy(replica, primary, 1, frames(INC, 1, 3))) == (protocol.COPIED, 4)
    assert kind(copy(replica, primary, 4, frames(INC, 4, 2))) == (protocol.COPIED, 6)
    assert held_bodies(replica.copies[INC]) == {p: body(INC, p) for p in range(1, 6)}
    # A follow again (a resync) names where the copy ends.
    assert kind(follow(replica, primary)) == (protocol.FOLLOWING, 6)


def test_overlapping_and_duplicate_copies_are_skipped_never_overwritten(ctx: zmq.Context, replica: Replica) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 3))
    forged = [[TOPIC, b"not what was stored", 1]] * 3
    assert kind(copy(replica, primary, 1, forged)) == (protocol.COPIED, 4)  # all duplicates
    assert kind(copy(replica, primary, 2, forged[:2] + frames(INC, 4, 2))) == (protocol.COPIED, 6)
    assert held_bodies(replica.copies[INC]) == {p: body(INC, p) for p in range(1, 6)}
    assert kind(copy(replica, primary, 3, [])) == (protocol.COPIED, 6)  # an empty page changes nothing


def test_a_gap_is_answered_following_next_pos_and_stores_nothing(ctx: zmq.Context, replica: Replica) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 3))
    before = snapshot(replica)
    assert kind(copy(replica, primary, 6, frames(INC, 6, 2))) == (protocol.FOLLOWING, 4)
    assert snapshot(replica) == before


def test_a_jump_starts_a_fresh_copy_at_its_first_position(ctx: zmq.Context, replica: Replica) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 3))
    assert kind(copy(replica, primary, 10, frames(INC, 10, 2), jump=True)) == (protocol.COPIED, 12)
    stored = replica.copies[INC]
    assert (stored.oldest, stored.next_pos) == (10, 12)
    assert held_bodies(stored) == {10: body(INC, 10), 11: body(INC, 11)}
    # A jump that does not lie beyond what is held is an ordinary (overlapping) copy.
    assert kind(copy(replica, primary, 11, frames(INC, 11, 2), jump=True)) == (protocol.COPIED, 13)
    assert replica.copies[INC].oldest == 10


def test_the_first_page_of_a_fresh_copy_must_say_jump_to_start_past_position_1(
        ctx: zmq.Context, replica: Replica) -> None:
    """The primary marks every page that does not continue what the replica holds with `jump`
    (replication.py: jump = start > sent); a page from position 3 without it, on a fresh copy,
    means page 1-2 was lost on the way. Taking it as the copy's start makes the replica answer
    `copied 5`, and the primary then counts positions 1 and 2 as held (and stops protecting them
    from eviction, and confirms them) though no replica has them."""
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    reply = copy(replica, primary, 3, frames(INC, 3, 2), jump=False)
    assert reply.kind == protocol.FOLLOWING and reply.next_pos in (0, 1), \
        f"the replica took a page from position 3 as the start of a fresh copy: {kind(reply)}"
    assert replica.copies[INC].next_pos == 1


def test_a_copy_of_an_incarnation_nobody_followed_is_refused_and_any_connection_may_continue_one(
        ctx: zmq.Context, replica: Replica) -> None:
    primary, other = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.repl_endpoint)
    # Nothing followed yet: no copy is made for an incarnation nobody followed.
    assert kind(copy(replica, other, 1, frames(INC, 1, 2))) == (protocol.FOLLOWING, 0)
    assert replica.copies == {}
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 2))
    before = snapshot(replica)
    # A reconnected DEALER has a new routing id: it continues the copy if the positions continue.
    assert kind(copy(replica, other, 50, frames(INC, 50, 2))) == (protocol.FOLLOWING, 3)
    assert snapshot(replica) == before
    assert kind(copy(replica, other, 3, frames(INC, 3, 1))) == (protocol.COPIED, 4)
    assert kind(copy(replica, primary, 4, frames(INC, 4, 1))) == (protocol.COPIED, 5)


def test_a_sealed_incarnation_refuses_copies_and_follows(ctx: zmq.Context, replica: Replica) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 3))
    replica.seal(INC)
    before = snapshot(replica)
    assert copy(replica, primary, 4, frames(INC, 4, 1)).kind == protocol.SEALED
    assert follow(replica, primary).kind == protocol.SEALED
    assert copy(replica, primary, 99, frames(INC, 99, 1), jump=True).kind == protocol.SEALED
    assert snapshot(replica) == before
    assert held_bodies(replica.copies[INC]) == {p: body(INC, p) for p in range(1, 4)}  # still served


def test_a_follow_of_a_new_incarnation_seals_the_older_ones(ctx: zmq.Context, replica: Replica) -> None:
    old, new = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.repl_endpoint)
    follow(replica, old)
    copy(replica, old, 1, frames(INC, 1, 2))
    assert kind(follow(replica, new, INC2)) == (protocol.FOLLOWING, 0)
    assert copy(replica, old, 3, frames(INC, 3, 1)).kind == protocol.SEALED
    assert follow(replica, old).kind == protocol.SEALED
    assert kind(copy(replica, new, 1, frames(INC2, 1, 1), inc=INC2)) == (protocol.COPIED, 2)
    assert set(replica.copies) == {INC, INC2} and INC in replica.sealed and INC2 not in replica.sealed


def test_a_follow_of_another_exchanges_incarnation_is_refused(ctx: zmq.Context, replica: Replica) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    before = snapshot(replica)
    for other in ("x2.aaaa", "x10.aaaa", "x.aaaa", "y1.aaaa", "x1x.aaaa"):
        vouch(replica, other)  # even with a digest (another exchange's primary): not ours to copy
        assert follow(replica, primary, other).kind == protocol.SEALED, other
        assert copy(replica, primary, 1, frames(other, 1, 1), inc=other).kind != protocol.COPIED
    assert snapshot(replica) == before


def test_frames_without_the_copy_secret_are_dropped_unanswered_and_change_nothing(
        ctx: zmq.Context, replica: Replica) -> None:
    """A peer that reached `repl` once could follow the running incarnation and send one copy with
    `jump`, and the replica threw its copy away for the attacker's. Every frame must carry the
    incarnation's copy secret now: another incarnation's secret, or any other bytes, will not do."""
    primary, attacker = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 3))
    before = (snapshot(replica), dict(replica.group_state))
    forged = [[TOPIC, b"forged", 1]] * 3
    record = protocol.GroupRecord("g", (TOPIC,), 1000, 5, b"dead", 1, [])
    for secret in (b"w" * 32, proof(INC2), proof(INC)[:16], proof(INC) + b"!"):
        for frame in (protocol.encode_follow(INC, X, secret), protocol.encode_copy(INC, 4, forged, secret),
                      protocol.encode_copy(INC, 9, forged, secret, jump=True),
                      protocol.encode_copy(INC, 1, forged, secret, jump=True),
                      protocol.encode_groups(INC, [record], secret),
                      protocol.encode_done(INC, {"g": [(1, 0, 9)]}, secret), protocol.encode_adopt(INC, X, secret)):
            attacker.send(frame)
    serve_for(replica, 0.3)
    assert not attacker.poll(0), "a frame without the copy secret was answered"
    assert (snapshot(replica), dict(replica.group_state)) == before
    assert replica.counters["refused_copies"] == 4 * 7
    # The primary goes on as if nothing happened.
    assert kind(copy(replica, primary, 4, frames(INC, 4, 1))) == (protocol.COPIED, 5)


def serve_for(r: Replica, seconds: float) -> None:
    """Let the replica handle what reaches `repl` for a while (frames that get no answer)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if r.repl.poll(10):
            r._drain_primary()


def test_a_follow_waits_for_its_incarnations_digest_and_is_answered_when_it_comes(ctx: zmq.Context) -> None:
    """A primary usually follows before its live znode (with the digest) is written: its follow is
    held and answered once the replica's HCM passes the digest on; a wrong one is dropped then."""
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    try:
        primary, attacker = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.repl_endpoint)
        inc = "x1.0f0f0f0f"
        attacker.send(protocol.encode_follow("x1.eeee", X, b"w" * 32))  # another incarnation's, never vouched
        primary.send(protocol.encode_follow(inc, X, proof(inc)))
        serve_for(replica, 0.2)
        assert not primary.poll(0) and not replica.copies
        vouch(replica, running=inc)
        assert kind(protocol.decode_replica_reply(serve_until_answer(replica, primary))) == (protocol.FOLLOWING, 0)
        assert list(replica.copies) == [inc] and not attacker.poll(0)
    finally:
        replica.close()


def test_only_an_ended_incarnation_is_sealed_by_a_position_request(ctx: zmq.Context) -> None:
    """Any subscriber's `position` naming the running incarnation once sealed it, and the
    exchange restarted (six times in 22 s made it FAILED). The replica's HCM says which one runs:
    that one is refused `running`; once it ended (or another runs), the request seals it."""
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    try:
        primary, subscriber = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.replay_endpoint)
        vouch(replica, INC, running=INC)
        follow(replica, primary)
        copy(replica, primary, 1, frames(INC, 1, 2))
        for rid in range(1, 7):
            with pytest.raises(protocol.ReplayRefused) as refused:
                replay_ask(replica, subscriber, protocol.encode_position_request(rid, [TOPIC], INC))
            assert refused.value.refusal == "running"
        assert not replica.sealed and replica.counters["refused_seals"] == 6
        assert kind(copy(replica, primary, 3, frames(INC, 3, 1))) == (protocol.COPIED, 4)
        vouch(replica)  # its live znode is gone: the cluster saw it end
        answer = replay_ask(replica, subscriber, protocol.encode_position_request(9, [TOPIC], INC))
        assert answer == protocol.StreamPosition(9, INC, 1, 4, [3]) and INC in replica.sealed
        assert copy(replica, primary, 4, frames(INC, 4, 1)).kind == protocol.SEALED
    finally:
        replica.close()


def test_before_its_hcm_said_anything_a_replica_seals_nothing(ctx: zmq.Context) -> None:
    replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
    try:
        replica._follow(b"r", protocol.Follow(INC, X, proof(INC)))
        subscriber = dealer(ctx, replica.replay_endpoint)
        with pytest.raises(protocol.ReplayRefused) as refused:
            replay_ask(replica, subscriber, protocol.encode_position_request(1, [TOPIC], INC))
        assert refused.value.refusal == "running" and not replica.sealed
    finally:
        replica.close()


def bad_frames() -> list[list[bytes]]:
    """Multipart messages a peer may send to `repl`: each must be refused and change nothing."""
    big = (1 << 63) - 1
    good_entry = [TOPIC, b"body", 1]
    lists: list[object] = [
        [],
        ["follow"],
        ["follow", 1, INC, X],  # old version
        ["follow", 3, INC, X],
        ["follow", "2", INC, X],
        ["follow", 3, INC],
        ["follow", 3, INC, X, "extra"],
        ["follow", 3, "", X],
        ["follow", 3, "x1." + "a" * 300, X],
        ["follow", 3, 7, X],
        ["follow", 3, INC.encode(), X],
        ["copy", 3, INC, 0, [good_entry], False],  # positions start at 1
        ["copy", 3, INC, -1, [good_entry], False],
        ["copy", 3, INC, big, [good_entry], False],  # big + 1 frame overflows
        ["copy", 3, INC, big + 1, [good_entry], True],
        ["copy", 3, INC, (1 << 64) - 1, [good_entry], True],
        ["copy", 3, INC, big - 1, [good_entry] * 2, True],
        ["copy", 3, INC, 1.0, [good_entry], False],
        ["copy", 3, INC, True, [good_entry], False],
        ["copy", 3, INC, 1, [good_entry], 1],  # jump must be a bool
        ["copy", 3, INC, 1, [good_entry]],  # no jump
        ["copy", 3, INC, 1, good_entry, False],
        ["copy", 3, INC, 1, [[TOPIC, b"b"]], False],
        ["copy", 3, INC, 1, [[TOPIC, b"b", 1, 2]], False],
        ["copy", 3, INC, 1, [["orders", b"b", 1]], False],
        ["copy", 3, INC, 1, [[b"", b"b", 1]], False],
        ["copy", 3, INC, 1, [[b"t" * 256, b"b", 1]], False],
        ["copy", 3, INC, 1, [[TOPIC, "b", 1]], False],
        ["copy", 3, INC, 1, [[TOPIC, b"b", -1]], False],
        ["copy", 3, INC, 1, [[TOPIC, b"b", True]], False],
        ["copy", 3, INC, 1, [[TOPIC, b"b", big + 1]], False],
        ["copy", 3, INC, 1, [good_entry, None], False],
        ["copied", 3, INC, 3],  # a reply kind, not a request
        ["sealed", 3, INC],
        {"copy": 2},
    ]
    packed = [[msgpack.packb(m, use_bin_type=True)] for m in lists]
    return packed + [
        [b""], [b"\xc1"], [b"\x93\xa4copy"], [b"\xff" * 64], [msgpack.packb("copy")],
        [b"a", b"b"],  # more parts than one
        [protocol.encode_follow(INC, X, proof(INC)), b""],
        [b"", protocol.encode_copy(INC, 1, frames(INC, 1, 1), proof(INC))],
    ]


def test_malformed_frames_never_raise_get_no_answer_and_change_nothing(ctx: zmq.Context, replica: Replica) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 3))
    before = snapshot(replica)
    sent = bad_frames()
    for parts in sent:
        primary.send_multipart(parts)
    # A follow after them all: its answer is the first one (the bad frames got none).
    primary.send(protocol.encode_follow(INC, X, proof(INC)))
    answer = protocol.decode_replica_reply(serve_until_answer(replica, primary))
    assert kind(answer) == (protocol.FOLLOWING, 4)
    assert not primary.poll(50)
    assert snapshot(replica) == before
    assert replica.counters.get("malformed") == len(sent)
    assert "internal_errors" not in replica.counters


def test_at_most_max_copies_incarnations_are_kept_and_a_dropped_one_stays_refused(
        ctx: zmq.Context, replica: Replica) -> None:
    primary = dealer(ctx, replica.repl_endpoint)
    incarnations = [f"x1.{i:04x}" for i in range(MAX_COPIES + 3)]
    for inc in incarnations:
        assert follow(replica, primary, inc).kind == protocol.FOLLOWING
        assert kind(copy(replica, primary, 1, frames(inc, 1, 1), inc=inc)) == (protocol.COPIED, 2)
        assert len(replica.copies) <= MAX_COPIES
    assert list(replica.copies) == incarnations[-MAX_COPIES:]
    for dropped in incarnations[:3]:
        assert follow(replica, primary, dropped).kind == protocol.SEALED
        assert copy(replica, primary, 2, frames(dropped, 2, 1), inc=dropped).kind == protocol.SEALED
    assert list(replica.copies) == incarnations[-MAX_COPIES:]


def test_a_long_dropped_incarnation_stays_refused_however_many_incarnations_followed(
        ctx: zmq.Context, replica: Replica) -> None:
    """`seal` prunes `sealed` to the copies still kept once it holds more than 16 * MAX_COPIES
    incarnations: an incarnation dropped long ago (a cut-off primary that is still running) is
    then followed afresh, which seals the copy of the incarnation that runs now (and that
    primary exits), and its copies are acknowledged again: it can confirm what no subscriber
    will ever drain."""
    primary = dealer(ctx, replica.repl_endpoint)
    zombie = "x1.zombie"
    follow(replica, primary, zombie)
    for i in range(16 * MAX_COPIES + 2):
        replica._follow(b"route", protocol.Follow(f"x1.{i:04x}", X, proof(f"x1.{i:04x}")))
    current = f"x1.{16 * MAX_COPIES + 1:04x}"
    assert follow(replica, primary, zombie).kind == protocol.SEALED, \
        "an incarnation dropped long ago was followed afresh"
    assert current not in replica.sealed


# ---------------------------------------------------------------- the replica: to subscribers


def test_fetches_from_the_replay_socket_return_the_copied_bodies_at_their_positions(
        ctx: zmq.Context, replica: Replica) -> None:
    primary, subscriber = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.replay_endpoint)
    follow(replica, primary)
    sent = [[TOPIC if p % 2 else b"other", body(INC, p), 1] for p in range(1, 9)]
    copy(replica, primary, 1, sent[:5])
    copy(replica, primary, 6, sent[5:])
    page = replay_ask(replica, subscriber, protocol.encode_fetch(1, INC, 0, 0, [], 0))
    assert isinstance(page, protocol.Frames) and page.done
    assert (page.request_id, page.incarnation, page.oldest, page.lost, page.lost_exact) == (1, INC, 1, 0, True)
    assert page.frames == [(e[0], e[1]) for e in sent]
    assert [protocol.decode_delivery(b).pos for _, b in page.frames] == list(range(1, 9))
    page = replay_ask(replica, subscriber, protocol.encode_fetch(2, INC, 2, 7, [TOPIC], 0))
    assert isinstance(page, protocol.Frames)
    assert [protocol.decode_delivery(b).pos for _, b in page.frames] == [3, 5]
    # Paged: one frame per page at the smallest limit, scanned_to moving on.
    page = replay_ask(replica, subscriber, protocol.encode_fetch(3, INC, 0, 0, [], 1))
    assert isinstance(page, protocol.Frames) and not page.done and len(page.frames) == 1
    # Neither the running incarnation ("") nor an unknown one is held here.
    for inc in ("", "x1.nope"):
        with pytest.raises(protocol.ReplayRefused) as refused:
            replay_ask(replica, subscriber, protocol.encode_fetch(4, inc, 0, 0, [], 0))
        assert refused.value.refusal == "unknown_incarnation"


def test_fetches_after_a_jump_report_the_range_before_the_copy_as_unknown_loss(
        ctx: zmq.Context, replica: Replica) -> None:
    primary, subscriber = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.replay_endpoint)
    follow(replica, primary)
    copy(replica, primary, 5, frames(INC, 5, 2), jump=True)
    page = replay_ask(replica, subscriber, protocol.encode_fetch(1, INC, 0, 0, [], 0))
    assert isinstance(page, protocol.Frames)
    assert page.oldest == 5 and [protocol.decode_delivery(b).pos for _, b in page.frames] == [5, 6]
    assert not page.lost_exact  # positions 1-4 were never here: their loss cannot be counted


def test_a_position_request_naming_an_incarnation_answers_where_its_copy_ends_and_seals_it(
        ctx: zmq.Context, replica: Replica) -> None:
    primary, subscriber = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.replay_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 4))
    answer = replay_ask(replica, subscriber, protocol.encode_position_request(7, [TOPIC, b"x"], INC))
    assert answer == protocol.StreamPosition(7, INC, 1, 5, [4, 4])
    assert INC in replica.sealed
    assert copy(replica, primary, 5, frames(INC, 5, 1)).kind == protocol.SEALED
    assert follow(replica, primary).kind == protocol.SEALED
    again = replay_ask(replica, subscriber, protocol.encode_position_request(8, [], INC))
    assert again == protocol.StreamPosition(8, INC, 1, 5, [])
    page = replay_ask(replica, subscriber, protocol.encode_fetch(9, INC, 0, 0, [], 0))
    assert isinstance(page, protocol.Frames) and len(page.frames) == 4  # sealed, still served


def test_a_position_request_for_an_unknown_or_no_incarnation_seals_nothing(
        ctx: zmq.Context, replica: Replica) -> None:
    primary, subscriber = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.replay_endpoint)
    for rid, inc in ((1, INC), (2, "")):
        with pytest.raises(protocol.ReplayRefused) as refused:
            replay_ask(replica, subscriber, protocol.encode_position_request(rid, [TOPIC], inc))
        assert refused.value.refusal == "unknown_incarnation"
    assert not replica.sealed
    # Asked before the primary followed: the primary can still follow it afterwards.
    assert kind(follow(replica, primary)) == (protocol.FOLLOWING, 0)


def test_malformed_replay_requests_get_an_error_and_change_nothing(ctx: zmq.Context, replica: Replica) -> None:
    primary, subscriber = dealer(ctx, replica.repl_endpoint), dealer(ctx, replica.replay_endpoint)
    follow(replica, primary)
    copy(replica, primary, 1, frames(INC, 1, 2))
    before = snapshot(replica)
    for bad in ([protocol.POSITION, 2, 1, [], ""], [protocol.POSITION, 2, 1, [], 5],
                [protocol.POSITION, 2, 1, [], "x" * 257], [protocol.POSITION, 2, 1, [], INC, 1],
                [protocol.POSITION, 1, 1, [], INC], [protocol.FETCH, 2, 1, INC, -1, 0, [], 0]):
        with pytest.raises(protocol.ReplayRefused):
            replay_ask(replica, subscriber, msgpack.packb(bad, use_bin_type=True))
    assert snapshot(replica) == before


# ---------------------------------------------------------------- the primary's link to a real replica


class Pair:
    """A primary's retention and ReplicaLink, and a Replica, in this process over loopback."""

    def __init__(self, ctx: zmq.Context, max_bytes: int = 1 << 20, seconds: float = 60.0,
                 page_bytes: int = 1 << 16, inc: str = INC) -> None:
        self.ctx = ctx
        self.retention = Retention(seconds, max_bytes)
        self.replica = make_replica(ctx)
        vouch(self.replica, inc)
        self.replicas = [self.replica]
        self.link = ReplicaLink(ctx, config(), self.retention, inc, X, proof(inc))
        self.link.page_bytes = page_bytes
        self.inc = inc
        self.replies: list[protocol.ReplicaReply] = []
        self.link.point_to(self.replica.repl_endpoint)

    def close(self) -> None:
        self.link.close()
        for r in self.replicas:
            r.close()

    def publish(self, count: int, size: int = 0) -> None:
        for _ in range(count):
            pos = self.retention.next_pos
            self.retention.add(TOPIC, body(self.inc, pos, size), 1)

    def replica_drains(self, budget: int = 64, wait_ms: int = 10) -> bool:
        if self.replica.repl.poll(wait_ms):
            self.replica._drain_primary(budget)
            return True
        return False

    def replica_takes(self, count: int) -> None:
        """The replica handles exactly `count` frames of the link's, waiting for each."""
        for _ in range(count):
            assert self.replica.repl.poll(WAIT * 1000), "a frame of the link's did not come"
            self.replica._drain_primary(budget=1)

    def link_takes(self, count: int, drop: bool = False) -> None:
        """The link reads exactly `count` replies (handles them, or loses them: `drop`), waiting for each."""
        sock = self.link.sock
        assert sock is not None
        for _ in range(count):
            assert sock.poll(WAIT * 1000), "a reply of the replica's did not come"
            frame = sock.recv()
            if not drop:
                self._hand_over(frame)

    def link_reads(self, wait_ms: int = 10, drop: bool = False) -> int:
        """The replies that reached the link, handed to it (or thrown away: lost on the way)."""
        sock = self.link.sock
        assert sock is not None
        count = 0
        while sock.poll(wait_ms if not count else 0):
            frame = sock.recv()
            count += 1
            if not drop:
                self._hand_over(frame)
        return count

    def _hand_over(self, frame: bytes) -> None:
        reply = protocol.decode_replica_reply(frame)
        self.replies.append(reply)
        before = self.link.held
        self.link.on_reply(frame)
        self.check_held(reply, before)

    def check_held(self, reply: protocol.ReplicaReply, before: int) -> None:
        """`held` is what the replica said it holds (a `following` the link did not ask for may
        also leave it as it was, until its own follow is answered)."""
        said = min(max(reply.next_pos, 1), self.retention.next_pos)
        if reply.kind == protocol.COPIED:
            assert self.link.held == said
        elif reply.kind == protocol.FOLLOWING:
            assert self.link.held in (said, before)
        assert self.retention.protect_from == self.link.held

    def cycle(self, now: float | None = None) -> None:
        self.link.pump(time.monotonic() if now is None else now)
        self.replica_drains()
        self.link_reads()

    def settle(self, until: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT
        while not until():
            assert time.monotonic() < deadline, "the link did not get there in time"
            self.cycle()

    def caught_up(self) -> bool:
        return self.link.held == self.retention.next_pos


@pytest.fixture
def pair_of(ctx: zmq.Context) -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(**kwargs: object) -> Pair:
        made.append(Pair(ctx, **kwargs))  # type: ignore[arg-type]
        return made[-1]
    yield make
    for p in made:
        p.close()


def test_held_advances_only_as_the_replica_acknowledges(pair_of: Callable[..., Pair]) -> None:
    p = pair_of(page_bytes=30)  # a frame or two per page
    p.publish(10)
    assert p.link.held == 1
    p.link.pump(time.monotonic())  # not following yet: nothing is sent but the follow
    p.replica_drains(budget=1)  # the follow
    assert p.link_reads() == 1 and p.link.following and p.link.held == 1
    p.link.pump(time.monotonic())
    assert p.link.held == 1  # pages are out, none acknowledged
    p.replica_drains(budget=1)  # one page only
    p.link_reads()
    first = p.replies[-1]
    assert first.kind == protocol.COPIED and 1 < first.next_pos < 11 and p.link.held == first.next_pos
    p.settle(p.caught_up)
    assert [r.next_pos for r in p.replies if r.kind == protocol.COPIED] == \
        sorted(r.next_pos for r in p.replies if r.kind == protocol.COPIED)
    assert held_bodies(p.replica.copies[INC]) == {pos: body(INC, pos) for pos in range(1, 11)}
    p.publish(3)
    assert p.link.held == 11  # new frames are not held until acknowledged
    p.settle(p.caught_up)
    assert p.link.held == 14


def test_frames_the_replica_lacks_are_never_evicted_past_the_byte_and_time_bounds(
        pair_of: Callable[..., Pair]) -> None:
    p = pair_of(max_bytes=400, seconds=1.0, page_bytes=150)
    p.publish(20, size=40)  # ~70 bytes a frame: far over the byte bound
    assert p.retention.oldest == 1 and len(p.retention) == 20
    assert p.link.blocked
    p.retention.trim(time.monotonic() + 1e6)  # every frame is past the time bound
    assert p.retention.oldest == 1
    p.link.pump(time.monotonic())
    p.replica_drains(budget=1)
    p.link_reads()  # following
    p.link.pump(time.monotonic())
    p.replica_drains(budget=1)  # the first page only
    p.link_reads()
    held = p.link.held
    assert 1 < held < 21
    p.retention.trim(time.monotonic() + 1e6)
    assert p.retention.oldest == held  # exactly the acknowledged frames went
    assert p.link.blocked
    p.settle(p.caught_up)
    p.retention.trim(time.monotonic())
    assert not p.link.blocked and p.retention.bytes <= p.retention.max_bytes
    assert held_bodies(p.replica.copies[INC]) == {pos: body(INC, pos, 40) for pos in range(1, 21)}


def test_replies_lost_on_the_way_make_the_link_ask_where_the_replica_is(pair_of: Callable[..., Pair]) -> None:
    # Every step hands over exactly the frames it sent: a reply still on the wire when the next
    # step reads would land after the next step's (the flake of a `copied` read after `following`).
    p = pair_of(page_bytes=30)
    p.publish(6)
    p.settle(lambda: p.link.following)
    start = time.monotonic()
    p.link.pump(start)
    pages = len(p.link._pages)
    assert pages >= 2
    p.replica_takes(pages)
    p.link_takes(pages, drop=True)  # every page's answer is lost
    p.publish(2)
    p.link.pump(start + RESYNC_AFTER - 0.2)  # not silent for long enough yet
    assert p.link.following and p.link.held == 1
    more = len(p.link._pages) - pages
    assert more >= 1
    p.replica_takes(more)
    p.link_takes(more, drop=True)
    p.link.pump(start + RESYNC_AFTER + 0.2)
    assert not p.link.following  # it asked again
    p.replica_takes(1)
    p.link_takes(1)
    assert p.replies[-1].kind == protocol.FOLLOWING and p.link.following
    assert p.link.held == p.replica.copies[INC].next_pos == 9
    p.settle(p.caught_up)


def test_pages_lost_on_the_way_are_sent_again_after_the_resync(pair_of: Callable[..., Pair]) -> None:
    p = pair_of(page_bytes=30)
    p.publish(6)
    p.settle(lambda: p.link.following)
    start = time.monotonic()
    p.link.pump(start)
    assert p.replica.repl.poll(WAIT * 1000)
    lost = 0
    while p.replica.repl.poll(100):
        p.replica.repl.recv_multipart()  # the pages never reach the replica
        lost += 1
    assert lost >= 2 and p.link.held == 1
    p.link.pump(start + RESYNC_AFTER + 0.2)
    p.settle(p.caught_up)
    assert held_bodies(p.replica.copies[INC]) == {pos: body(INC, pos) for pos in range(1, 7)}


def test_a_new_replica_starts_from_the_oldest_retained_frame_and_held_counts_only_its_acks(
        ctx: zmq.Context, pair_of: Callable[..., Pair]) -> None:
    p = pair_of(max_bytes=300, page_bytes=100)
    p.publish(12, size=30)
    p.settle(p.caught_up)
    p.retention.trim(time.monotonic())
    oldest = p.retention.oldest
    assert oldest > 1 and p.link.held == 13
    second = make_replica(ctx)
    p.replicas.append(second)
    p.replica = second
    p.link.point_to(second.repl_endpoint)
    p.settle(lambda: p.link.following)
    assert p.link.held == 1  # the new replica holds nothing yet
    p.settle(p.caught_up)
    stored = second.copies[INC]
    assert (stored.oldest, stored.next_pos) == (oldest, 13)
    assert held_bodies(stored) == {pos: body(INC, pos, 30) for pos in range(oldest, 13)}
    p.publish(2, size=30)
    p.settle(p.caught_up)
    assert held_bodies(second.copies[INC])[14] == body(INC, 14, 30)


def test_no_replica_holds_nothing_and_a_replica_seen_again_resumes_where_its_copy_ends(
        pair_of: Callable[..., Pair]) -> None:
    p = pair_of()
    p.publish(3)
    p.settle(p.caught_up)
    endpoint = p.replica.repl_endpoint
    p.link.point_to(None)
    assert p.link.sock is None
    p.publish(2)
    p.link.pump(time.monotonic() + 100)
    assert p.link.held == 4
    p.link.point_to(endpoint)
    p.settle(lambda: p.link.following)
    assert p.link.held == 4 and p.link.sent == 4
    p.settle(p.caught_up)
    assert p.link.held == 6


def test_a_sealed_copy_makes_the_link_sealed_and_it_sends_nothing_more(
        ctx: zmq.Context, pair_of: Callable[..., Pair]) -> None:
    p = pair_of()
    p.publish(3)
    p.settle(p.caught_up)
    subscriber = dealer(ctx, p.replica.replay_endpoint)
    answer = replay_ask(p.replica, subscriber, protocol.encode_position_request(1, [TOPIC], INC))
    assert isinstance(answer, protocol.StreamPosition) and answer.next_pos == 4
    p.publish(2)
    p.settle(lambda: p.link.sealed)
    assert p.link.held == 4  # nothing beyond what the sealed copy holds
    p.publish(2)
    p.link.pump(time.monotonic() + 100)
    assert not p.replica.repl.poll(100)


def test_a_follow_of_the_next_incarnation_seals_the_link_of_the_previous_one(
        ctx: zmq.Context, pair_of: Callable[..., Pair]) -> None:
    p = pair_of()
    p.publish(2)
    p.settle(p.caught_up)
    restarted = ReplicaLink(ctx, config(), Retention(60, 1 << 20), INC2, X, proof(INC2))
    try:
        restarted.point_to(p.replica.repl_endpoint)
        p.replica_drains(wait_ms=200)
        p.publish(1)
        p.settle(lambda: p.link.sealed)
        assert p.link.held == 3
    finally:
        restarted.close()


def rebind(r: Replica) -> None:
    """The replica's `repl` socket, closed and bound again on the same port: to the primary's
    DEALER, a broken TCP connection that it re-establishes by itself (a new routing id)."""
    endpoint = r.repl.getsockopt_string(zmq.LAST_ENDPOINT)
    ctx = r.repl.context
    r.repl.close(linger=0)
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_COPY_FRAME)
    deadline = time.monotonic() + WAIT
    while True:
        try:
            sock.bind(endpoint)
            break
        except zmq.ZMQError:
            assert time.monotonic() < deadline, f"could not bind {endpoint} again"
            time.sleep(0.01)
    r.repl = sock


RECONNECT_BUG = ("bug: a copy from a connection that did not follow is answered `following`, which the link takes "
                 "for a follow's answer; it never says `follow` again (each answer resets its silence timer)")


def test_the_link_recovers_after_its_connection_to_the_replica_was_re_established(
        pair_of: Callable[..., Pair], monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken connection that the DEALER re-establishes reaches the replica's ROUTER under a
    new routing id, and the link does not know: it goes on copying (publishers keep publishing)
    without a `follow`. The replica answers every such copy `following next_pos` (not the
    owner); the link takes that for the answer to a follow and resends from there, which is
    answered `following` again, and so on: every answer also resets its silence timer, so it
    never says `follow` again. `held` never moves again, no publisher gets another confirm, and
    the two spin (with the real RESYNC_AFTER, 150,000 `following` answers in 20 s)."""
    monkeypatch.setattr(replication, "RESYNC_AFTER", 0.2)
    p = pair_of(page_bytes=30)
    p.publish(4)
    p.settle(p.caught_up)
    rebind(p.replica)
    publishing = time.monotonic() + 5 * replication.RESYNC_AFTER
    while time.monotonic() < publishing:  # publishers go on: pages flow on the new connection
        p.publish(1)
        p.cycle()
    deadline = time.monotonic() + 5 * replication.RESYNC_AFTER
    while not p.caught_up() and time.monotonic() < deadline:
        p.cycle()
    following = sum(1 for r in p.replies if r.kind == protocol.FOLLOWING)
    assert p.caught_up(), f"held stuck at {p.link.held} (stream at {p.retention.next_pos}) after " \
        f"{following} `following` answers"


def test_a_replica_restarted_on_the_same_endpoint_gets_the_stream_again(
        ctx: zmq.Context, pair_of: Callable[..., Pair], monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted replica process that happens to bind the port its predecessor had: the HCM's
    stdin line names the same `repl` endpoint (only its incarnation differs, and main.py keys
    `replica_target` on the endpoint alone), so `point_to` changes nothing and the DEALER simply
    reconnects. The new replica, empty, answers the copies `following 0`; the link resends from
    its oldest frame and is answered `following 0` again, forever."""
    monkeypatch.setattr(replication, "RESYNC_AFTER", 0.2)
    p = pair_of(page_bytes=30)
    p.publish(4)
    p.settle(p.caught_up)
    endpoint = p.replica.repl.getsockopt_string(zmq.LAST_ENDPOINT)
    p.replica.close()
    fresh = make_replica(ctx)
    p.replicas.append(fresh)
    p.replica = fresh
    fresh.repl.close(linger=0)
    fresh.repl = ctx.socket(zmq.ROUTER)
    fresh.repl.linger = 0
    deadline = time.monotonic() + WAIT
    while True:
        try:
            fresh.repl.bind(endpoint)
            break
        except zmq.ZMQError:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    p.link.point_to(endpoint)  # what the loop does with the HCM's line: nothing, same endpoint
    publishing = time.monotonic() + 5 * replication.RESYNC_AFTER
    while time.monotonic() < publishing:
        p.publish(1)
        p.cycle()
    deadline = time.monotonic() + 5 * replication.RESYNC_AFTER
    while not p.caught_up() and time.monotonic() < deadline:
        p.cycle()
    assert p.caught_up(), f"held stuck at {p.link.held} (stream at {p.retention.next_pos})"
    assert fresh.copies[INC].next_pos == p.retention.next_pos


# ---------------------------------------------------------------- the forwarder's gated acks


class Exchange:
    """A Forwarder with replicas = 2, its replica and a publisher, driven step by step as its run
    loop would drive them."""

    def __init__(self, ctx: zmq.Context, replicas: int = 2) -> None:
        self.ctx = ctx
        self.fw = Forwarder.open(ctx, ExchangeConfig(), Site(X, "127.0.0.1", "127.0.0.1", replicas=replicas,
                                                             cluster_config=config()))
        self.replica = Replica(ctx, config(), X, "127.0.0.1", "127.0.0.1")
        self.replica.learn_primary({"incarnation": self.fw.incarnation,
                                    "copy_digest": protocol.copy_digest(self.fw.copy_secret)})
        self.replica.learn_primary(None)
        self.replica._take_news()
        self.token = b"t" * 16
        self.pid = protocol.publisher_id_for(self.token)

    def close(self) -> None:
        self.fw.close()
        self.replica.close()

    def publisher(self, from_seq: int) -> tuple[zmq.Socket, protocol.ExchangeReply]:
        sock = dealer(self.ctx, self.fw.pub_endpoint)
        sock.send(protocol.encode_hello(self.pid, self.token, from_seq))
        return sock, self.answer(sock)

    def answer(self, sock: zmq.Socket, replicate: bool = False) -> protocol.ExchangeReply:
        """Turn the loop until `sock` gets an answer (the replica working too, if `replicate`)."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            self.turn(replicate)
            if sock.poll(10):
                return protocol.decode_exchange_reply(sock.recv())
        raise AssertionError("no answer from the exchange")

    def turn(self, replicate: bool) -> None:
        fw = self.fw
        if fw.front.poll(0):
            fw.ingest.drain()
        if replicate:
            if self.replica.repl.poll(0):
                self.replica._drain_primary()
            if fw.link is not None and fw.link.sock is not None and fw.link.sock.poll(0):
                fw.durability.drain_replica(fw.link.sock)
        fw.durability.make_durable(time.monotonic())

    def quiet(self, sock: zmq.Socket, replicate: bool = False, turns: int = 20) -> bool:
        """No answer reaches `sock` while the loop turns a while."""
        for _ in range(turns):
            self.turn(replicate)
            if sock.poll(5):
                return False
        return True


@pytest.fixture
def exchange(ctx: zmq.Context) -> Iterator[Exchange]:
    e = Exchange(ctx)
    yield e
    e.close()


def confirmed_through_the_replica(e: Exchange, count: int) -> zmq.Socket:
    """A publisher whose first batch (`count` messages) the replica held, so it was confirmed."""
    assert e.fw.link is not None
    e.fw.link.point_to(e.replica.repl_endpoint)
    pub, _ = e.publisher(1)
    pub.send(batch(e, 1, count))
    assert e.answer(pub, replicate=True).seq == count
    return pub


def batch(e: Exchange, first: int, count: int) -> bytes:
    flat: list[bytes] = []
    for seq in range(first, first + count):
        flat += [TOPIC, b"m%d" % seq]
    return protocol.encode_batch(e.pid, first, 0, flat)


def test_the_forwarder_acks_a_batch_only_once_the_replica_holds_it(exchange: Exchange) -> None:
    e, fw = exchange, exchange.fw
    pub, welcome = e.publisher(1)
    assert (welcome.kind, welcome.seq) == (protocol.WELCOME, 0)
    pub.send(batch(e, 1, 2))
    assert e.quiet(pub)  # forwarded, no replica yet: held
    assert len(fw.gate) == 1 and fw.retention.next_pos == 2 and fw.durable_pos() == 1
    assert fw.link is not None
    fw.link.point_to(e.replica.repl_endpoint)
    ack = e.answer(pub, replicate=True)
    assert (ack.kind, ack.seq) == (protocol.ACK, 2)
    assert held_bodies(e.replica.copies[fw.incarnation]) == {1: held_bodies(fw.retention)[1]}


def test_a_welcome_names_only_what_was_confirmed_and_a_resent_batch_waits_too(exchange: Exchange) -> None:
    e, fw = exchange, exchange.fw
    pub = confirmed_through_the_replica(e, 2)
    pub.send(batch(e, 3, 2))
    assert e.quiet(pub)  # forwarded (3-4 are in the stream), the replica not asked
    # The publisher reconnects: the welcome must not name 4, which only this process holds.
    pub2, welcome = e.publisher(3)
    assert (welcome.kind, welcome.seq) == (protocol.WELCOME, 2)
    pub2.send(batch(e, 3, 2))  # resent: duplicates, nothing new is forwarded
    assert e.quiet(pub2)
    assert fw.retention.next_pos == 3
    answers = [e.answer(pub2, replicate=True)]
    assert (answers[0].kind, answers[0].seq) == (protocol.ACK, 4)
    _, welcome = e.publisher(5)
    assert welcome.seq == 4


def test_a_sealed_forwarder_confirms_nothing_more(exchange: Exchange) -> None:
    e, fw = exchange, exchange.fw
    pub = confirmed_through_the_replica(e, 1)
    e.replica.seal(fw.incarnation)
    pub.send(batch(e, 2, 1))
    deadline = time.monotonic() + WAIT
    while not fw.sealed:
        assert time.monotonic() < deadline
        e.turn(replicate=True)
    assert e.quiet(pub, replicate=True)
    assert fw.durable_pos() == 2 and len(fw.gate) == 1


# ---------------------------------------------------------------- model: primary + replica, faults on the wire

RETENTION_BYTES = 300  # a handful of frames
RETENTION_SECONDS = 1e9  # only the `evict` rule's clock passes it
# Known bug (test_the_first_page_of_a_fresh_copy_must_say_jump_to_start_past_position_1): a fresh
# copy starts at a page without `jump` when the pages before it were lost. While it stands, the
# model excuses the positions below such a start; set False once fixed.
EXCUSE_FRESH_COPY_WITHOUT_JUMP = False
PAGE_BYTES = 90  # one to three frames per page
SETTLE_ROUNDS = 60


class ReplicationModel(RuleBasedStateMachine):
    """The link's frames and the replica's answers travel through two lists the rules play with;
    the replica handles a frame as `_drain_primary` would (`_follow` / `_copy` with the route of
    the connection). A replica restart is a new Replica the link is pointed to (what the HCM's
    stdin line does); the wire to the old one is gone with it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self._clock = mock.patch.object(replication, "time", SimpleNamespace(monotonic=lambda: self.now))
        self._clock.start()
        self.ctx = zmq.Context()
        self.retention = Retention(RETENTION_SECONDS, RETENTION_BYTES)  # no real clock in here
        self.link = ReplicaLink(self.ctx, config(), self.retention, INC, X, proof(INC))
        self.link.page_bytes = PAGE_BYTES
        self.link._send = self._to_replica  # type: ignore[method-assign]  # the wire is ours
        self.to_replica: list[bytes] = []
        self.to_link: list[bytes] = []
        self.bodies: dict[int, bytes] = {}
        self.gate = ConfirmGate()
        self.seq = 0
        self.acked_earlier = 1  # every position below this was acknowledged by an earlier replica
        self.generation = 0
        self.replica: Replica | None = None
        self.sealed_at: int | None = None  # the current replica's copy end when it was sealed
        self.released = 0  # highest `required` of an ack released
        self.max_held = 1  # highest held checked against the current replica
        self._new_replica()

    def _to_replica(self, frame: bytes) -> bool:
        self.to_replica.append(frame)
        return True

    def _new_replica(self) -> None:
        if self.replica is not None:
            self.replica.close()
            self.acked_earlier = max(self.acked_earlier, self.max_held)
        self.generation += 1
        self.route = b"conn-%d" % self.generation
        self.replica = make_replica(self.ctx, config(retention_bytes=1 << 20))
        self.to_replica.clear()
        self.to_link.clear()
        self.max_held = 1
        self.excused_below = 1  # the known bug: positions below a copy started without `jump`
        self.monotonic_from: int | None = None  # held after this replica's first `following`
        self.sealed_at = None
        # The HCM says there is none, then where the new one is (a new replica may well get the
        # old one's port: the link keys on the endpoint alone, so it must hear of the change).
        self.link.point_to(None)
        self.link.point_to(self.replica.repl_endpoint)

    def teardown(self) -> None:
        try:
            if self.replica is not None and not self.link.sealed:
                self.settle()
        finally:
            self._clock.stop()
            self.link.close()
            if self.replica is not None:
                self.replica.close()
            self.ctx.destroy(linger=0)

    # ------------------------------------------------------------ the primary

    @precondition(lambda self: not self.link.blocked)
    @rule(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=3))
    def publish(self, sizes: list[int]) -> None:
        """A batch: its frames are forwarded and retained, its ack waits in the gate."""
        for size in sizes:
            pos = self.retention.next_pos
            self.bodies[pos] = body(INC, pos, size)
            assert self.retention.add(TOPIC, self.bodies[pos], 1, now=self.now) == pos
        self.seq += 1
        self.gate.hold(self.retention.next_pos, b"pub", "p-1", self.seq)

    @rule()
    def pump(self) -> None:
        self.link.pump(self.now)

    @rule()
    def release(self) -> None:
        """What Durability.make_durable does with the gate."""
        if self.link.sealed:
            return
        durable = min(self.retention.next_pos, self.link.held)
        for ack in self.gate.release(durable):
            assert ack.required <= durable
            self.released = max(self.released, ack.required)

    @rule(later=st.booleans())
    def evict(self, later: bool) -> None:
        """Retention's time bound passes (every unprotected frame goes), or just a trim."""
        self.retention.trim(self.now + (2 * RETENTION_SECONDS if later else 0))

    @rule()
    def time_passes(self) -> None:
        self.now += RESYNC_AFTER + 0.5

    # ------------------------------------------------------------ the wire

    @precondition(lambda self: self.to_replica)
    @rule(what=st.sampled_from(["next", "next", "next", "drop", "duplicate", "overtake"]), index=st.integers(0, 20))
    def wire_to_replica(self, what: str, index: int) -> None:
        index %= len(self.to_replica)
        if what == "next":
            self._replica_handles(self.to_replica.pop(0))
        elif what == "drop":
            del self.to_replica[index]
        elif what == "duplicate":
            self._replica_handles(self.to_replica[index])
        else:
            self._replica_handles(self.to_replica.pop(index))

    @precondition(lambda self: self.to_link)
    @rule(what=st.sampled_from(["next", "next", "next", "drop"]), index=st.integers(0, 20))
    def wire_to_link(self, what: str, index: int) -> None:
        """Answers arrive in order or are lost (a ROUTER drops what a peer does not read; a
        broken connection loses what was in flight). They are never duplicated nor reordered:
        one ZeroMQ connection does not do that, and the link relies on it (a stale `copied`
        would lower `held`, and with no page out it would not ask again)."""
        index %= len(self.to_link)
        if what == "next":
            self._link_handles(self.to_link.pop(0))
        else:
            del self.to_link[index]

    def _replica_handles(self, frame: bytes) -> None:
        assert self.replica is not None
        request = protocol.decode_replica_request(frame)
        assert self.replica.proof_holds(self.route, request), "the primary's own frame was refused"
        if isinstance(request, protocol.Copy):
            stored = self.replica.copies.get(INC)
            if EXCUSE_FRESH_COPY_WITHOUT_JUMP and stored is not None and not len(stored) and stored.next_pos <= 1 \
                    and request.first_pos > 1 and not request.jump and INC not in self.replica.sealed:
                self.excused_below = max(self.excused_below, request.first_pos)
        reply = self.replica.handle(self.route, request)
        assert reply is not None
        self.to_link.append(reply)

    def _link_handles(self, frame: bytes) -> None:
        before = self.link.held
        self.link.on_reply(frame)
        reply = protocol.decode_replica_reply(frame)
        if self.monotonic_from is None:
            if reply.kind == protocol.FOLLOWING:
                self.monotonic_from = self.link.held
        else:
            assert self.link.held >= before, f"held went down from {before} to {self.link.held} ({reply})"

    # ------------------------------------------------------------ the replica

    @rule()
    def replica_restarts(self) -> None:
        """The replica is replaced by a new one, empty (another host, or restarted)."""
        self._new_replica()

    @rule(kind=st.sampled_from(["follow", "copy", "jump", "rewrite", "groups", "done", "adopt"]),
          incarnation=st.sampled_from([INC, INC2, "x1.cccc"]), first=st.integers(1, 40),
          secret=st.sampled_from([b"w" * 32, b"w" * 16, b"x" * 64]))
    def hostile_peer(self, kind: str, incarnation: str, first: int, secret: bytes) -> None:
        """Another connection on `repl`, which read everything in ZooKeeper but not the copy secret:
        whatever it sends is refused unanswered and changes nothing the replica holds."""
        assert self.replica is not None
        forged = [[TOPIC, b"forged", 1]] * 3
        record = protocol.GroupRecord("g", (TOPIC,), 1000, 5, b"dead", first, [])
        frame = {
            "follow": lambda: protocol.encode_follow(incarnation, X, secret),
            "copy": lambda: protocol.encode_copy(incarnation, first, forged, secret),
            "jump": lambda: protocol.encode_copy(incarnation, first, forged, secret, jump=True),
            "rewrite": lambda: protocol.encode_copy(incarnation, 1, forged, secret, jump=True),
            "groups": lambda: protocol.encode_groups(incarnation, [record], secret),
            "done": lambda: protocol.encode_done(incarnation, {"g": [(first, 0, 1000)]}, secret),
            "adopt": lambda: protocol.encode_adopt(incarnation, X, secret),
        }[kind]()
        before = (snapshot(self.replica), dict(self.replica.group_state), dict(self.replica.group_done))
        request = protocol.decode_replica_request(frame)
        assert not self.replica.proof_holds(b"hostile", request)
        assert (snapshot(self.replica), dict(self.replica.group_state), dict(self.replica.group_done)) == before

    @precondition(lambda self: self.sealed_at is None)
    @rule()
    def subscriber_seals(self) -> None:
        """A subscriber that saw this incarnation end asks the replica where its copy ends."""
        assert self.replica is not None
        self.replica.seal(INC)
        stored = self.replica.copies.get(INC)
        self.sealed_at = stored.next_pos if stored is not None else 1

    # ------------------------------------------------------------ what must hold

    @invariant()
    def held_is_held(self) -> None:
        assert self.replica is not None
        held = self.link.held
        stored = self.replica.copies.get(INC)
        start = stored.oldest - stored.evicted if stored is not None else None
        bodies = held_bodies(stored) if stored is not None else {}
        for pos in range(max(self.acked_earlier, self.excused_below), held):
            assert stored is not None and start is not None and start <= pos, \
                f"position {pos} < held {held} is neither in replica {self.generation}'s copy " \
                f"(from {start}) nor was it acknowledged by an earlier replica (below {self.acked_earlier})"
            if pos >= stored.oldest:
                assert bodies[pos] == self.bodies[pos], f"position {pos}: the copy's body differs"
        self.max_held = max(self.max_held, held)
        # Frames no replica acknowledged are all still retained: the replica can still get them.
        assert self.retention.oldest <= max(self.max_held, self.acked_earlier), \
            f"retention evicted up to {self.retention.oldest} but only {self.max_held} was acknowledged"
        assert self.retention.protect_from == held
        if self.sealed_at is not None:
            assert held <= max(self.sealed_at, self.acked_earlier), \
                f"held {held} passed the end of the sealed copy ({self.sealed_at})"
            assert self.released <= max(self.sealed_at, self.acked_earlier)

    def settle(self) -> None:
        """The wire delivers everything in order from now on; the link must catch up."""
        for _ in range(SETTLE_ROUNDS):
            if self.link.sealed or self.link.held == self.retention.next_pos:
                break
            self.link.pump(self.now)
            while self.to_replica:
                self._replica_handles(self.to_replica.pop(0))
            while self.to_link:
                self._link_handles(self.to_link.pop(0))
            self.held_is_held()
            self.now += RESYNC_AFTER / 2
        if self.link.sealed:
            return
        assert self.link.held == self.retention.next_pos, \
            f"held {self.link.held} never caught up with the stream ({self.retention.next_pos})"
        self.release()
        assert len(self.gate) == 0


@pytest.mark.timeout(120)
def test_replication_model() -> None:
    loggers = [logging.getLogger(name) for name in ("exchange.replication", "exchange.replica")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)  # a warning per resync: thousands of them
    try:
        run_state_machine_as_test(ReplicationModel, settings=settings(
            max_examples=examples(200), stateful_step_count=50, deadline=None, derandomize=True, database=None,
            # Shrinking a failure takes half a minute here: add Phase.shrink for a minimal schedule.
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def test_replica_module_bound_is_what_the_tests_assume() -> None:
    assert replica_module.MAX_COPIES == MAX_COPIES >= 2
