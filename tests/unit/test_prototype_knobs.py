"""Issue 34's prototype knobs keep the data path's rules: `exchange.send_held_frames` (a drain's
deliveries held, then sent with its acks) and `client.eager_in_flight` (a small batch goes while
few are in flight). Both default to off; bench/prototypes.py measures them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from roq import protocol
from roq.client.publisher.batches import BatchSender
from roq.client.publisher.chunks import ChunkLog
from roq.config import Config, ExchangeConfig
from tests.profiles import examples
from tests.unit.test_large_payloads import PID, WAIT, Loopback, Site, primed

# ---------------------------------------------------------------- exchange.send_held_frames

BAD = b""  # an empty topic: the exchange rejects that one message and forwards the rest


@pytest.fixture(scope="module")
def held_loopback() -> Iterator[Loopback]:
    lb = Loopback(ExchangeConfig(send_held_frames=3), Site("x1", "127.0.0.1", "127.0.0.1"))
    primed(lb)
    yield lb
    lb.close()


def _deliveries(lb: Loopback, count: int) -> list[tuple[int, bytes]]:
    """The next `count` messages the SUB gets, as (position, payload)."""
    got: list[tuple[int, bytes]] = []
    while len(got) < count:
        assert lb.sub.poll(int(WAIT * 1000)), f"only {len(got)} of {count} delivered"
        _, body = lb.sub.recv_multipart()
        delivery = protocol.decode_delivery(body)
        got += [(delivery.pos, p) for p in delivery.payloads]
    return got


@settings(max_examples=examples(25), deadline=None)
@given(held=st.integers(1, 6),
       batches=st.lists(st.lists(st.booleans(), min_size=1, max_size=4), min_size=1, max_size=20))
def test_held_deliveries_leave_in_order_and_every_batch_is_answered(held_loopback: Loopback, held: int,
                                                                    batches: list[list[bool]]) -> None:
    """Batches queued before the drain (so it holds several), some with a bad message: the SUB gets
    every good message once, in order, at consecutive positions; the bad ones are rejected, and
    the last ack covers the last batch."""
    lb = held_loopback
    lb.fw.ingest._held_frames = held  # the Forwarder's config is fixed at open; one per example is slow
    good: list[bytes] = []
    bad: set[int] = set()
    for batch in batches:
        topics = [BAD if is_bad else b"t" for is_bad in batch]
        payloads = [b"%d" % (lb.seq + i) for i in range(len(batch))]
        bad |= {lb.seq + i for i, is_bad in enumerate(batch) if is_bad}
        good += [p for p, is_bad in zip(payloads, batch) if not is_bad]
        lb.pub.send_multipart(protocol.encode_batch_message(PID, lb.seq, 0, topics, payloads, 1 << 20))
        lb.seq += len(batch)
    last, rejected, acks = lb.seq - 1, set(), [0]
    deadline = time.monotonic() + WAIT
    while acks[-1] < last and time.monotonic() < deadline:
        lb.turn()
        while lb.pub.poll(1):
            reply = protocol.decode_exchange_reply(lb.pub.recv())
            if reply.kind == protocol.REJECT:
                rejected.add(reply.seq)
            else:
                assert reply.kind == protocol.ACK, reply
                acks.append(reply.seq)
    assert acks[-1] == last and acks == sorted(acks)
    assert rejected == bad
    got = _deliveries(lb, len(good))
    assert [p for _, p in got] == good
    positions = sorted({pos for pos, _ in got})
    assert positions == list(range(positions[0], positions[0] + len(positions))) if positions else not good
    assert not lb.sub.poll(0) and lb.fw.fanout._held is None  # nothing more, and the hold ended


# ---------------------------------------------------------------- client.eager_in_flight


class Wire:
    """A BatchSender over a real PAIR socket pair; the far end reads what it sent."""

    def __init__(self, eager: int, eager_messages: int = 8) -> None:
        config = Config().replace(client={"eager_in_flight": eager, "eager_batch_messages": eager_messages})
        self.log = ChunkLog(100, 256 << 10, 15.0, 64 << 20)
        self.cond = threading.Condition()
        self.sender = BatchSender(PID, config, self.log, self.cond, lambda: None)
        ctx = zmq.Context.instance()
        self.near, self.far = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        self.far.bind("inproc://eager-%d" % id(self))
        self.near.connect("inproc://eager-%d" % id(self))

    def publish(self, count: int) -> None:
        with self.cond:
            first = self.log.next_seq
            self.log.append([x for i in range(count) for x in (b"t", b"%d" % (first + i))], count)

    def send(self) -> list[int]:
        """Send what may go; the first seq of each batch that went."""
        assert self.sender.send(self.near)
        firsts = []
        while self.far.poll(0):
            head, *rest = self.far.recv_multipart()
            batch = protocol.decode_publisher_frame(head, 1 << 30, rest[0] if rest else None, rest[1:])
            assert isinstance(batch, protocol.Batch)
            firsts.append(batch.first_seq)
        return firsts

    def close(self) -> None:
        self.near.close(0)
        self.far.close(0)


@pytest.mark.parametrize("eager", [0, 1, 4])
def test_a_small_batch_goes_early_only_while_fewer_than_eager_in_flight_are(eager: int) -> None:
    wire = Wire(eager)
    try:
        sent = []
        for _ in range(6):  # one message at a time, never acked
            wire.publish(1)
            sent += wire.send()
        # The first goes (none in flight); then one per send while fewer than `eager` are in flight.
        assert sent == list(range(1, 1 + max(1, eager)))
        assert len(wire.log.in_flight) == max(1, eager)
        with wire.cond:
            wire.log.confirm(max(1, eager), time.monotonic())
        assert wire.send() == [1 + max(1, eager)]  # the acks came: what waited goes, as one batch
    finally:
        wire.close()


def test_a_batch_bigger_than_eager_batch_messages_waits_for_the_acks() -> None:
    wire = Wire(4, eager_messages=3)
    try:
        wire.publish(1)
        assert wire.send() == [1]
        wire.publish(4)  # more than 3: it grows while the first is in flight
        assert wire.send() == []
        with wire.cond:
            wire.log.confirm(1, time.monotonic())
        assert wire.send() == [2]
    finally:
        wire.close()
