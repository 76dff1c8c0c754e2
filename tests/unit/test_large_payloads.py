"""Large payloads as ZeroMQ parts of their own (protocol 3.2.2, 4.2, 5.1, 6.1, 6.4): the wire forms,
their refusals, and a real Forwarder on loopback that passes the parts on as the very Frames it
received (retention holds them; nothing copies them), serves them to a fetch, inlines them for
its journal and its replica."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.forwarder import Forwarder
from exchange.journal_archives import load_archives
from exchange.parts import Site
from roq import protocol
from roq.config import ExchangeConfig
from roq.errors import ProtocolError
from tests.profiles import examples

TOKEN = b"t" * 16
PID = protocol.publisher_id_for(TOKEN)
LARGE = protocol.LARGE_PAYLOAD_BYTES
WAIT = 5.0


def batch_of(payloads: list[bytes], first: int = 1, topics: bytes | list[bytes] = b"t") -> list[bytes]:
    return protocol.encode_batch_message(PID, first, 0, topics, payloads, LARGE)


# ---------------------------------------------------------------- wire forms


@given(st.lists(st.integers(0, 3 * LARGE), min_size=1, max_size=6))
@settings(max_examples=examples(60), deadline=None)
def test_a_batch_with_parts_decodes_to_the_payloads_published(sizes: list[int]) -> None:
    payloads = [bytes([n % 251]) * n for n in sizes]
    head, block, *parts = batch_of(payloads)
    assert len(parts) == sum(n >= LARGE for n in sizes)
    assert all(type(slot) is int for slot in msgpack.unpackb(block) if not isinstance(slot, bytes))
    batch = protocol.decode_publisher_frame(head, 16 << 20, block, parts)
    assert isinstance(batch, protocol.Batch) and batch.payloads == payloads and batch.parts == tuple(parts)


@pytest.mark.parametrize("slots, parts, why", [
    ([b"a", 1], [b"x"], "names part 1"),  # the first integer slot must be 0
    ([0, 0], [b"x", b"y"], "names part 0"),  # each part once, in order
    ([0], [b"x", b"y"], "2 parts follow the block but 1"),  # a part no slot names
    ([0, b"a"], [], "integer slot"),  # an integer slot and no parts
    ([b"a"], [b"x"], "1 parts follow the block but 0"),
    ([True], [b"x"], "array of bin"),  # a bool is not an integer slot
    ([-1], [b"x"], "names part -1"),
])
def test_parts_and_slots_that_do_not_pair_refuse_the_batch_whole(slots, parts, why) -> None:
    head, block = protocol.encode_batch_parts(PID, 4, 0, b"t", slots)
    with pytest.raises(protocol.RefusedBatch, match=why) as refused:
        protocol.decode_publisher_frame(head, 1 << 20, block, parts)
    assert refused.value.first_seq == 4


def test_parts_count_against_the_batch_limit_and_their_number_is_bounded() -> None:
    head, block, part = batch_of([b"y" * LARGE])
    with pytest.raises(protocol.RefusedBatch, match="exceeds exchange.max_batch_bytes"):
        protocol.decode_publisher_frame(head, LARGE + len(head), block, [part])
    many = [b""] * (protocol.MAX_PARTS + 1)
    head, block = protocol.encode_batch_parts(PID, 1, 0, b"t", list(range(len(many))))
    with pytest.raises(protocol.RefusedBatch, match=f"at most {protocol.MAX_PARTS}"):
        protocol.decode_publisher_frame(head, 1 << 30, block, many)
    # The encoder never goes beyond: past MAX_PARTS, large payloads stay in the block.
    slots, parts = protocol.split_large([b"z" * 2] * (protocol.MAX_PARTS + 2), 1)
    assert len(parts) == protocol.MAX_PARTS and slots[-2:] == [b"zz", b"zz"]


def test_only_a_batch_in_parts_may_carry_parts() -> None:
    with pytest.raises(ProtocolError, match="only a batch"):
        protocol.decode_publisher_frame(protocol.encode_hello(PID, TOKEN, 1), 1 << 20, b"\x90", [b"x"])


def test_a_delivery_with_parts_is_the_inline_delivery_once_resolved() -> None:
    big, small = b"B" * (2 * LARGE), b"s"
    body = protocol.encode_delivery("x1", "x1.ab", 3, [], PID, 7, [1, 2, 3], [0, small, 1], None, None)
    large = protocol.LargeBody(body, [big, big + b"!"])
    inline = protocol.encode_delivery("x1", "x1.ab", 3, [], PID, 7, [1, 2, 3], [big, small, big + b"!"])
    assert large.inline() == inline and len(large) == len(body) + 4 * LARGE + 1
    for decoded in (protocol.decode_delivery(body, large.parts), protocol.decode_delivery(large)):
        assert decoded == protocol.decode_delivery(inline)
    for bad in ([big], [big, big, big], []):
        with pytest.raises(ProtocolError):
            protocol.decode_delivery(body, bad)


def test_with_views_a_large_payload_is_a_read_only_view_of_its_received_part() -> None:
    """client.payload_views: no copy into bytes, the same bytes, immutable, valid after the part's
    own name is gone (the view keeps libzmq's message alive)."""
    big, small = b"B" * (2 * LARGE), b"s"
    body = protocol.encode_delivery("x1", "x1.ab", 3, [], PID, 7, [1, 2], [0, small], None, None)
    with pair() as (a, b):
        a.send_multipart([body, big], copy=False)
        received, *parts = b.recv_multipart(copy=False)
    decoded = protocol.decode_delivery(received.buffer, parts, views=True)
    del parts, received
    view, kept = decoded.payloads
    assert isinstance(view, memoryview) and view.readonly and kept == small and type(kept) is bytes
    assert view == big and bytes(view) == big
    with pytest.raises(TypeError):
        view[0] = 0
    assert protocol.decode_delivery(body, [big], views=False).payloads == [big, small]


@pytest.mark.parametrize("zero_copy", [0, 1, LARGE, 64 << 10])
def test_the_publisher_sends_parts_byte_exact_whatever_it_copies(zero_copy: int) -> None:
    """client.zero_copy_send_bytes: 0 copies every part into libzmq, else parts that big go
    without a copy; either way the exchange's side gets the parts as sent."""
    from roq.client.publisher.batches import _send_frame
    payloads = [b"a" * (64 << 10), b"s", b"b" * (LARGE + 1)]
    head, block, *large = batch_of(payloads)
    with pair() as (a, b):
        assert _send_frame(a, head, block, large, zero_copy)
        got = b.recv_multipart()
    assert got == [head, block, *large]
    assert protocol.decode_publisher_frame(got[0], 1 << 30, got[1], got[2:]).payloads == payloads


_PAIRS = itertools.count()


@contextlib.contextmanager
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """Two connected PAIR sockets over inproc, closed after."""
    context = zmq.Context.instance()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    address = f"inproc://large-{next(_PAIRS)}"
    a.bind(address)
    b.connect(address)
    try:
        yield a, b
    finally:
        a.close(linger=0)
        b.close(linger=0)


def test_a_frames_answer_carries_each_frames_parts_after_it_in_order() -> None:
    plain = protocol.encode_delivery("x1", "x1.ab", 1, [], PID, 0, [1], [b"p"])
    parted = protocol.encode_delivery("x1", "x1.ab", 2, [], PID, 0, [2, 3], [0, 1])
    parts = [b"L" * LARGE, b"M" * LARGE]
    found = [(b"t", plain), (b"t", protocol.LargeBody(parted, parts))]
    reply, *sent = protocol.encode_frames_message(9, "x1.ab", 1, found, 2, True, 0, True)
    assert sent == parts
    page = protocol.decode_replay_reply(reply, 1 << 30, sent)
    assert isinstance(page, protocol.Frames) and page.frames == found
    assert [protocol.decode_delivery(b).payloads for _, b in page.frames] == [[b"p"], parts]
    for bad in (sent[:1], sent + [b"x"], []):
        with pytest.raises(ProtocolError, match="parts"):
            protocol.decode_replay_reply(reply, 1 << 30, bad)


# ---------------------------------------------------------------- a real Forwarder


class Loopback:
    """A Forwarder, a publisher DEALER and a SUB of everything, the loop turned by hand."""

    def __init__(self, config: ExchangeConfig, site: Site) -> None:
        self.ctx = zmq.Context.instance()
        self.fw = Forwarder.open(self.ctx, config, site)
        self.pub = self._socket(zmq.DEALER, self.fw.pub_endpoint)
        self.sub = self._socket(zmq.SUB, self.fw.parts.endpoints.sub)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.pub.send(protocol.encode_hello(PID, TOKEN, 1))
        assert self.answer().kind == "welcome"
        self.seq = 1

    def _socket(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.linger = 0
        sock.connect(endpoint)
        return sock

    def close(self) -> None:
        self.pub.close()
        self.sub.close()
        self.fw.close()

    def turn(self) -> None:
        if self.fw.front.poll(0):
            self.fw.ingest.drain()
        self.fw.fanout.drain_subscriptions()

    def answer(self) -> protocol.ExchangeReply:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            self.turn()
            if self.pub.poll(10):
                return protocol.decode_exchange_reply(self.pub.recv())
        raise AssertionError("no answer from the exchange")

    def publish(self, payloads: list[bytes], topic: bytes = b"big") -> protocol.ExchangeReply:
        self.pub.send_multipart(protocol.encode_batch_message(PID, self.seq, 0, topic, payloads, LARGE))
        self.seq += len(payloads)
        return self.answer()

    def live(self) -> list[bytes]:
        """The SUB socket's next delivery, its parts resolved."""
        assert self.sub.poll(int(WAIT * 1000)), "no delivery"
        _, body, *parts = self.sub.recv_multipart()
        return protocol.decode_delivery(body, parts).payloads


@pytest.fixture
def loopback() -> Iterator[Loopback]:
    lb = Loopback(ExchangeConfig(), Site("x1", "127.0.0.1", "127.0.0.1"))
    yield lb
    lb.close()


def primed(lb: Loopback) -> None:
    """Publish until the SUB's subscription is live."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        lb.publish([b"prime"])
        if lb.sub.poll(50):
            lb.sub.recv_multipart()
            while lb.sub.poll(50):
                lb.sub.recv_multipart()
            return
    raise AssertionError("the subscription never went live")


def peak_while_handling(lb: Loopback, payloads: list[bytes]) -> int:
    """The most Python held at once (tracemalloc) while the exchange takes one batch and sends it on."""
    lb.pub.send_multipart(protocol.encode_batch_message(PID, lb.seq, 0, b"big", payloads, LARGE))
    lb.seq += len(payloads)
    assert lb.fw.front.poll(int(WAIT * 1000))  # the whole message is queued once its first part is
    tracemalloc.start()
    try:
        lb.fw.ingest.drain()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lb.answer().kind == "ack"
    return peak


def test_the_exchange_passes_a_64_kib_payload_on_as_the_frame_it_received(loopback: Loopback) -> None:
    """The smoke check of zero copy: taking a batch of four 64 KiB payloads costs Python no more
    than a batch of four tiny ones (msgpack's 256 KiB packing buffer is in both), and retention
    holds the Frames the exchange received."""
    primed(loopback)
    payloads = [bytes([n]) * (64 << 10) for n in range(4)] + [b"small"]
    baseline = peak_while_handling(loopback, [b"t", b"i", b"n", b"y", b"small"])
    assert loopback.live() == [b"t", b"i", b"n", b"y", b"small"]
    peak = peak_while_handling(loopback, payloads)
    assert peak < baseline + (16 << 10), f"the exchange allocated {peak - baseline} bytes more for 256 KiB of large " \
                                         "payloads than for 4 tiny ones: it copied them"
    frames, _, _ = loopback.fw.retention.read(loopback.fw.retention.next_pos - 2, loopback.fw.retention.next_pos,
                                              [b"big"], 1 << 30)
    (_, kept), = frames
    assert isinstance(kept, protocol.LargeBody) and all(type(p) is zmq.Frame for p in kept.parts)
    assert [p.bytes for p in kept.parts] == payloads[:4]
    assert loopback.live() == payloads


def test_a_fetch_is_answered_with_the_retained_parts(loopback: Loopback) -> None:
    primed(loopback)
    payloads = [b"a" * LARGE, b"b", b"c" * (LARGE - 1), b"d" * (LARGE + 1)]
    assert loopback.publish(payloads).kind == "ack"
    pos = loopback.fw.retention.next_pos - 1
    fetcher = loopback._socket(zmq.DEALER, loopback.fw.parts.endpoints.replay)
    try:
        fetcher.send(protocol.encode_fetch(1, "", pos - 1, 0, [b"big"], 0))
        deadline = time.monotonic() + WAIT
        while not fetcher.poll(10):
            assert time.monotonic() < deadline, "no fetch answer"
            loopback.fw.replay.drain()
        reply, *parts = fetcher.recv_multipart()
        assert len(parts) == 2
        page = protocol.decode_replay_reply(reply, 1 << 30, parts)
        assert isinstance(page, protocol.Frames)
        (_, body), = page.frames
        assert protocol.decode_delivery(body).payloads == payloads
    finally:
        fetcher.close()


def test_duplicates_and_attributes_still_carry_large_payloads_as_parts(loopback: Loopback) -> None:
    """A resent batch (its block is packed again) and a batch cut into frames by topic keep the parts."""
    primed(loopback)
    first = loopback.seq
    payloads = [b"1" * LARGE, b"2", b"3" * LARGE]
    assert loopback.publish(payloads).kind == "ack"
    assert loopback.live() == payloads
    loopback.pub.send_multipart(protocol.encode_batch_message(PID, first + 1, 0, b"big", payloads[1:] + [b"4" * LARGE],
                                                              LARGE))
    loopback.seq = first + 4
    assert loopback.answer().seq == first + 3
    assert loopback.live() == [b"4" * LARGE]
    bad = protocol.encode_batch_message(PID, loopback.seq, 0, [b"big", b"\x00no"], [b"5" * LARGE, b"6" * LARGE], LARGE)
    loopback.pub.send_multipart(bad)
    reject, ack = loopback.answer(), loopback.answer()
    seq = loopback.seq
    assert (reject.kind, reject.seq, reject.code, ack.seq) == ("reject", seq + 1, "invalid_name", seq + 1)
    assert loopback.live() == [b"5" * LARGE]


def test_a_malformed_multipart_changes_nothing(loopback: Loopback) -> None:
    primed(loopback)
    next_pos = loopback.fw.retention.next_pos
    head, block = protocol.encode_batch_parts(PID, loopback.seq, 0, b"big", [0, 2])
    loopback.pub.send_multipart([head, block, b"x" * LARGE, b"y" * LARGE])
    refused = loopback.answer()
    assert (refused.kind, refused.seq, refused.code) == ("resend", loopback.seq, "malformed")
    assert loopback.fw.retention.next_pos == next_pos and not loopback.sub.poll(100)
    assert loopback.publish([b"z" * LARGE]).seq == loopback.seq - 1


def test_the_journal_writes_large_payloads_inline(tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    lb = Loopback(ExchangeConfig(journal="async"), Site("x1", "127.0.0.1", "127.0.0.1", journal_dir=str(directory)))
    payloads = [b"j" * (LARGE + 3), b"k"]
    try:
        assert lb.publish(payloads).kind == "ack"
    finally:
        lb.close()
    (archive,) = load_archives(directory, "", 3600, 1 << 30)
    (frame,) = archive.frames
    assert protocol.decode_delivery(frame.body).payloads == payloads


def test_a_replica_copies_large_payloads_inline() -> None:
    """Protocol 6.1: a copy page packs every body, large payloads' bytes included; the replica's
    copy decodes to the payloads published (and is what a subscriber fetches from it, 6.3)."""
    from tests.unit.test_replication import Exchange
    e = Exchange(zmq.Context.instance())
    try:
        pub, welcome = e.publisher(1)
        assert welcome.kind == "welcome" and e.fw.link is not None
        e.fw.link.point_to(e.replica.repl_endpoint)
        payloads = [b"r" * (LARGE + 1), b"s", b"t" * LARGE]
        pub.send_multipart(protocol.encode_batch_message(e.pid, 1, 0, b"big", payloads, LARGE))
        assert e.answer(pub, replicate=True).seq == 3  # acked once the replica holds it
        copy = e.replica.copies[e.fw.incarnation]
        frames, _, _ = copy.read(0, copy.next_pos, [b"big"], 1 << 30)
        (_, body), = frames
        assert isinstance(body, bytes) and protocol.decode_delivery(body).payloads == payloads
        pub.close()
    finally:
        e.close()


def test_the_spark_source_reads_a_page_with_parts(loopback: Loopback) -> None:
    """roq/spark/exchanges.py fetches on its own socket: a page's parts come with it."""
    from roq.spark.exchanges import fetch_deliveries

    payloads = [b"q" * LARGE, b"small", b"w" * (LARGE + 9)]
    assert loopback.publish(payloads).kind == "ack"
    upto = loopback.fw.retention.next_pos - 1
    found: list[Any] = []
    reader = threading.Thread(target=lambda: found.extend(
        fetch_deliveries("x1", loopback.fw.parts.endpoints.replay, loopback.fw.incarnation, 0, upto, (b"big",), {},
                         True)))
    reader.start()
    while reader.is_alive():  # the loop's turn, as the exchange's run loop would take it
        loopback.fw.replay.drain()
        reader.join(0.01)
    assert [d.payloads for _, d in found] == [payloads]
