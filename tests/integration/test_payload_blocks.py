"""Two-part batches at a real exchange (protocol 3.2): the payload block is passed on to
subscribers as it came, yet every rule of a one-frame batch still holds: a bad block is refused
whole and changes nothing, duplicates are dropped, an oversize payload is rejected alone, more
parts than two are refused, and a subscriber decodes exactly what was published."""

from __future__ import annotations

import itertools

import msgpack
import pytest
import zmq

from roq import protocol
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from tests.integration.conftest import create
from tests.integration.test_adversarial import advertise, answer, dealer, hello, lone  # noqa: F401
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def subscriber_socket(endpoint: str, topic: bytes) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    return sub


def deliveries(sub: zmq.Socket, until_seq: int, timeout_ms: int = 5000) -> list[tuple[int, bytes]]:
    """(seq, payload) of every message delivered, until `until_seq` arrives."""
    got: list[tuple[int, bytes]] = []
    while not got or got[-1][0] < until_seq:
        assert sub.poll(timeout_ms), f"no delivery up to {until_seq}; got {got}"
        _, body = sub.recv_multipart()
        d = protocol.decode_delivery(body)
        got += zip(d.seqs, d.payloads)
    return got


def send_parts(sock: zmq.Socket, pid: str, first: int, topic: bytes, block: bytes) -> None:
    head, _ = protocol.encode_batch_parts(pid, first, 0, topic, [])
    sock.send_multipart([head, block])


def test_bad_blocks_change_nothing_and_good_ones_arrive_exactly(lone):  # noqa: F811
    config, proc, ready = lone
    sock = dealer(ready["pub"])
    sub = subscriber_socket(ready["sub"], b"blocks")
    try:
        pid = hello(sock)
        primes = itertools.count(1)  # a new seq each try: a repeated one is a duplicate, never delivered
        wait_until(lambda: _primed(sock, sub, pid, next(primes)), timeout=10, message="the subscription to be live")
        first = next(primes)
        for bad in (b"\xc1", msgpack.packb([b"ok", "text"]), msgpack.packb([b"ok"]) + b"x", msgpack.packb([])):
            send_parts(sock, pid, first, b"blocks", bad)
            refused = answer(sock)
            assert (refused.kind, refused.seq, refused.code) == ("resend", first, "malformed")
        sock.send_multipart([protocol.encode_hello(pid, b"t" * 16, 1), msgpack.packb([b"x"])])
        assert answer(sock).kind == "error"  # only a batch has two parts
        head, block = protocol.encode_batch_parts(pid, first, 0, b"blocks", [b"a"])
        sock.send_multipart([head, block, b"third"])
        assert answer(sock).code == "malformed"  # three parts: refused, nothing taken
        # Good blocks: the first repeats the last one's seq (a resend): only the new one goes on.
        payloads = [bytes([n % 256]) * n for n in (0, 1, 255, 256, 3000)]
        head, block = protocol.encode_batch_parts(pid, first, 0, b"blocks", payloads)
        sock.send_multipart([head, block])
        assert answer(sock).seq == first + len(payloads) - 1
        head, block = protocol.encode_batch_parts(pid, first + 4, 0, b"blocks", [b"again", b"new"])
        sock.send_multipart([head, block])
        assert answer(sock).seq == first + 5
        got = deliveries(sub, first + 5)
        assert got == list(zip(range(first, first + 6), payloads + [b"new"]))
    finally:
        sock.close()
        sub.close()
    assert proc.poll() is None


def _primed(sock: zmq.Socket, sub: zmq.Socket, pid: str, seq: int) -> bool:
    """Seq `seq` through the exchange until the SUB socket sees it (its subscription is then live;
    a late delivery of an earlier try is read and dropped here)."""
    head, block = protocol.encode_batch_parts(pid, seq, 0, b"blocks", [b"prime"])
    sock.send_multipart([head, block])
    answer(sock)
    while sub.poll(200):
        _, body = sub.recv_multipart()
        if seq in protocol.decode_delivery(body).seqs:
            return True
    return False


def test_an_oversize_payload_in_a_block_is_rejected_alone(lone):  # noqa: F811
    config, proc, ready = lone
    limit = config.exchange.max_message_bytes
    sock = dealer(ready["pub"])
    sub = subscriber_socket(ready["sub"], b"big")
    try:
        pid = hello(sock)
        head, block = protocol.encode_batch_parts(pid, 1, 0, b"big", [b"small", b"x" * (limit + 1), b"tail"])
        sock.send_multipart([head, block])
        reject, ack = answer(sock), answer(sock)
        assert (reject.kind, reject.seq, reject.code) == ("reject", 2, "too_large")
        assert (ack.kind, ack.seq) == ("ack", 3)
    finally:
        sock.close()
        sub.close()
    assert proc.poll() is None


PROTOTYPES = {"max_batch_bytes": 1 << 20, "zero_copy_send_bytes": 0, "socket_buffer_bytes": 1 << 20}


def test_the_client_sends_blocks_and_one_frame_batches_alike(config, zk, paths, cluster):
    """Publisher with payload blocks on and off, one topic and mixed topics: a subscriber gets
    every message once, in order, the same either way."""
    queue = "blocks"
    create(config, zk, paths, queue, 1)
    got: list[tuple[str, bytes]] = []
    sub = Subscriber(queue, config, topics=["a", "b"], callback=lambda m: got.append((m.topic, m.payload)))
    sub.wait_connected(timeout=30)
    sent: list[tuple[str, bytes]] = []
    try:
        # The last: the batch API's prototypes of issue 34 item 5 (bench/prototypes_large.py),
        # 1000 B payloads in frames of up to 1 MiB, copied into libzmq, bigger socket buffers.
        for blocks, knobs in ((True, {}), (False, {}), (True, PROTOTYPES)):
            pub = Publisher(queue, config.replace(client={"payload_blocks": blocks, **knobs}))
            try:
                pad = b"." * 990 if knobs else b""
                one = [b"%d-%d" % (blocks, i) + pad for i in range(1500 if knobs else 500)]
                pub.publish_many("a", one)
                sent += [("a", p) for p in one]
                for i in range(50):  # interleaved topics: one-frame batches either way
                    topic = "ab"[i % 2]
                    pub.publish(topic, b"mixed-%d-%d" % (blocks, i))
                    sent.append((topic, b"mixed-%d-%d" % (blocks, i)))
                pub.flush(30)
            finally:
                pub.close()
        wait_until(lambda: len(got) >= len(sent), timeout=30, message="every message")
    finally:
        sub.close()
    assert got == sent
