"""Large payloads as ZeroMQ parts of their own (docs/protocol.md 3.2.2, 4.2, 5.1), through a real
exchange process.

Batches mixing small payloads and large ones (sizes around the threshold, which is drawn too) are
published raw; a subscriber that reads as they come must get every payload byte for byte, and
one that reads nothing until the end (XPUB drops frames for it: `exchange.sub_hwm` is tiny) must
get the frames it lost from retention fetches, their parts with them. A client Publisher and
Subscriber do the same with the library's own threshold. (The journal and replica paths, which
write such frames inline, are checked with a real Forwarder and Replica in
tests/unit/test_large_payloads.py.)
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roq import protocol
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from tests.integration.conftest import create
from tests.profiles import examples
from tests.support.helpers import fast_config, lone_exchange, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SUB_HWM = 4  # frames XPUB queues per subscriber before it drops for it
LARGE = protocol.LARGE_PAYLOAD_BYTES


@pytest.fixture(scope="module")
def exchange(zookeeper) -> Iterator[dict[str, Any]]:
    cfg = fast_config(zookeeper.connect_string).replace(exchange={
        "sub_hwm": SUB_HWM, "retention_seconds": 3600, "retention_bytes": 1 << 30})
    with lone_exchange(cfg, "large") as ready:
        yield ready


def socket(context: zmq.Context, kind: int, endpoint: str, hwm: int = 0) -> zmq.Socket:
    sock = context.socket(kind)
    sock.linger = 0
    if hwm:
        sock.rcvhwm = hwm
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"large/")
    sock.connect(endpoint)
    return sock


def publisher(context: zmq.Context, ready: dict[str, Any]) -> tuple[zmq.Socket, str]:
    sock = socket(context, zmq.DEALER, ready["pub"])
    token = uuid.uuid4().bytes
    pid = protocol.publisher_id_for(token)
    sock.send(protocol.encode_hello(pid, token, 1))
    assert sock.poll(5000) and protocol.decode_exchange_reply(sock.recv()).kind == "welcome"
    return sock, pid


def live(sub: zmq.Socket, pid: str, want: int) -> dict[int, bytes]:
    """{seq: payload} of `pid`'s messages as they arrive, until `want` of them came."""
    got: dict[int, bytes] = {}
    while len(got) < want:
        assert sub.poll(5000), f"{len(got)} of {want} messages came live"
        _, body, *parts = sub.recv_multipart()
        d = protocol.decode_delivery(body, parts)
        if d.publisher == pid:
            got.update(zip(d.seqs, d.payloads))
    return got


def fetched(replay: zmq.Socket, ids: Iterator[int], after: int, pid: str) -> dict[int, bytes]:
    """{seq: payload} of `pid`'s messages in every retained frame after `after`, page by page."""
    got: dict[int, bytes] = {}
    while True:
        request_id = next(ids)
        replay.send(protocol.encode_fetch(request_id, "", after, 0, [b"large/"], 1 << 17))
        assert replay.poll(5000), "no answer to a fetch"
        reply, *parts = replay.recv_multipart()
        page = protocol.decode_replay_reply(reply, 1 << 30, parts)
        assert isinstance(page, protocol.Frames) and page.request_id == request_id and page.lost == 0
        for _, body in page.frames:
            d = protocol.decode_delivery(body)
            if d.publisher == pid:
                got.update(zip(d.seqs, d.payloads))
        if page.done:
            return got
        after = page.scanned_to


def next_pos(replay: zmq.Socket, ids: Iterator[int]) -> int:
    replay.send(protocol.encode_position_request(next(ids), []))
    assert replay.poll(5000)
    answer = protocol.decode_replay_reply(replay.recv(), 1 << 20)
    assert isinstance(answer, protocol.StreamPosition)
    return answer.next_pos


SIZES = st.one_of(st.integers(0, 64), st.integers(LARGE - 2, LARGE + 2), st.integers(LARGE, 3 * LARGE))
BATCHES = st.lists(st.lists(st.tuples(st.sampled_from([b"large/a", b"large/b"]), SIZES), min_size=1, max_size=8),
                   min_size=1, max_size=6)


@given(batches=BATCHES, threshold=st.sampled_from([LARGE, LARGE + 1, 1, 0]))
@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_small_and_large_payloads_arrive_byte_for_byte_live_and_fetched(exchange, batches, threshold) -> None:
    context = zmq.Context.instance()
    pub, pid = publisher(context, exchange)
    reader = socket(context, zmq.SUB, exchange["sub"])
    # Reads nothing until the end: XPUB queues SUB_HWM frames for it and drops the rest.
    idle = socket(context, zmq.SUB, exchange["sub"], hwm=1)
    replay = socket(context, zmq.DEALER, exchange["replay"])
    ids = itertools.count(1)
    try:
        primes = itertools.count(1)
        wait_until(lambda: _primed(pub, pid, next(primes), reader), timeout=10, message="the subscription to be live")
        start = next_pos(replay, ids)
        sent: dict[int, bytes] = {}
        seq = next(primes)
        for n, batch in enumerate(batches):
            topics = [topic for topic, _ in batch]
            payloads = [bytes([(n + i) % 256]) * size for i, (_, size) in enumerate(batch)]
            pub.send_multipart(protocol.encode_batch_message(pid, seq, 0, topics, payloads, threshold))
            assert pub.poll(5000), "no ack"
            reply = protocol.decode_exchange_reply(pub.recv())
            assert (reply.kind, reply.seq) == ("ack", seq + len(batch) - 1), reply
            sent.update(zip(range(seq, seq + len(batch)), payloads))
            seq += len(batch)
        assert live(reader, pid, len(sent)) == sent
        everything = fetched(replay, ids, start - 1, pid)
        assert everything == sent
        # The idle subscriber kept what XPUB queued for it; the rest it would fetch, parts and all.
        kept: dict[int, bytes] = {}
        while idle.poll(200):
            _, body, *parts = idle.recv_multipart()
            d = protocol.decode_delivery(body, parts)
            if d.publisher == pid:
                kept.update((s, p) for s, p in zip(d.seqs, d.payloads) if s in sent)
        assert all(sent[s] == p for s, p in kept.items())
        assert {s: everything[s] for s in sent.keys() - kept.keys()} == {s: sent[s] for s in sent.keys() - kept.keys()}
    finally:
        for sock in (pub, reader, idle, replay):
            sock.close()


def _primed(pub: zmq.Socket, pid: str, seq: int, sub: zmq.Socket) -> bool:
    """One message more until the SUB socket sees a frame (its subscription is then live)."""
    pub.send_multipart(protocol.encode_batch_message(pid, seq, 0, b"large/prime", [b"p"]))
    assert pub.poll(5000)
    pub.recv()
    if not sub.poll(200):
        return False
    while sub.poll(50):
        sub.recv_multipart()
    return True


# The prototypes of issue 34 item 5 (bench/prototypes_large.py) keep what a subscriber gets.
PROTOTYPES = {"views": {"payload_views": True, "zero_copy_send_bytes": 0, "socket_buffer_bytes": 1 << 20}}


@pytest.mark.parametrize("knobs", ["default", "views"])
def test_the_client_sends_large_payloads_as_parts_and_the_subscriber_gets_them(config, zk, paths, cluster, knobs):
    """Publisher and Subscriber with the library's threshold: sizes on both sides of it, one
    publish() at a time and publish_many, each message once, in order, byte for byte. With the
    prototypes on, each large payload is a read-only view."""
    queue = f"large-{knobs}"
    create(config, zk, paths, queue, 1)
    config = config.replace(client=PROTOTYPES[knobs]) if knobs in PROTOTYPES else config
    got: list[tuple[str, bytes]] = []
    sub = Subscriber(queue, config, topics=["a", "b"], callback=lambda m: got.append((m.topic, m.payload)))
    sub.wait_connected(timeout=30)
    threshold = config.client.large_payload_bytes
    sizes = [0, 1, threshold - 1, threshold, threshold + 1, 64 << 10, 3 * threshold, 5]
    sent: list[tuple[str, bytes]] = []
    try:
        pub = Publisher(queue, config)
        try:
            for i, size in enumerate(sizes * 3):
                topic = "ab"[i % 2]
                payload = bytes([i % 256]) * size
                pub.publish(topic, payload)
                sent.append((topic, payload))
            many = [bytes([n]) * size for n, size in enumerate(sizes)]
            pub.publish_many("a", many)
            sent += [("a", p) for p in many]
            pub.flush(30)
        finally:
            pub.close()
        wait_until(lambda: len(got) >= len(sent), timeout=30, message="every message")
    finally:
        sub.close()
    assert got == sent
    large = [payload for _, payload in got if len(payload) >= threshold]
    views = [isinstance(p, memoryview) and p.readonly for p in large]
    assert large and views == [knobs in PROTOTYPES] * len(large)
