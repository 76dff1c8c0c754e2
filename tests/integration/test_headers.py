"""Message headers end to end (protocol section 3.2.1): publisher, exchange, subscribers (live, fetched,
batches), group members, dead letters that say where they came from; hostile publishers whose
headers lie are refused one message at a time. Topics and keys come back as text (polish).

One real exchange process for the module, advertised in ZooKeeper as the only exchange of each
test's queue (no GCM, no HCM: nothing here concerns placement); raw ZeroMQ peers for the wire."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from roq import protocol
from roq.client.group_member import WorkMessage
from roq.client.publisher import Publisher
from roq.client.subscriber import EMPTY_HEADERS, Message, MessageBatch, Subscriber
from roq.config import Config
from roq.errors import MessageTooLargeError, UserError
from roq.paths import Paths
from roq.zk import encode, start_client, stop_client
from tests.support.helpers import MetadataOnlyGcm, fast_config, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MAX_MESSAGE = 4096  # exchange.max_message_bytes of the module's exchange: headers count against it


class Lone:
    """One exchange process, and queues in ZooKeeper whose only exchange it is."""

    def __init__(self, config: Config, ready: dict[str, Any], zk: Any) -> None:
        self.config, self.ready, self.zk = config, ready, zk
        self.count = 0

    def queue(self, name: str) -> str:
        self.count += 1
        queue = f"{name}{self.count}"
        paths = Paths(self.config.zk.root)
        self.zk.ensure_path(paths.queue(queue))
        self.zk.ensure_path(paths.live_queue(queue))
        data = {k: self.ready[k] for k in ("pub", "sub", "replay", "work", "incarnation", "pid")}
        data.update(host="local", stats={})
        self.zk.create(paths.live_exchange(queue, "x1"), encode(data), ephemeral=True)
        return queue


@pytest.fixture(scope="module")
def lone(zookeeper) -> Iterator[Lone]:
    config = fast_config(zookeeper.connect_string).replace(exchange={"max_message_bytes": MAX_MESSAGE})
    proc = subprocess.Popen([sys.executable, "-m", "exchange.main", "--queue", "headers", "--id", "x1",
                             "--config-json", config.to_json(), "--no-watch-stdin"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    zk = start_client(config)
    seed = MetadataOnlyGcm(config)  # the clients' seed: no GCM places anything here
    try:
        yield Lone(config, ready, zk)
    finally:
        seed.close()
        stop_client(zk)
        proc.kill()
        proc.wait()


def dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def replies(sock: zmq.Socket, until_kind: str = "ack") -> list[protocol.ExchangeReply]:
    out = []
    while True:
        assert sock.poll(5000), f"no answer from the exchange after {out}"
        out.append(protocol.decode_exchange_reply(sock.recv()))
        if out[-1].kind == until_kind:
            return out


def raw_subscriber(lone: Lone, topic: bytes) -> zmq.Socket:
    """A SUB socket on the exchange with `topic` subscribed, live once its sync marker answers."""
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.linger = 0
    sock.connect(lone.ready["sub"])
    marker = protocol.sync_topic(secrets.token_hex(8))
    for t in (topic, marker):
        sock.setsockopt(zmq.SUBSCRIBE, t)
    while True:
        assert sock.poll(5000), "no sync from the exchange"
        if sock.recv_multipart()[0] == marker:
            return sock


def next_body(sock: zmq.Socket) -> list[Any]:
    assert sock.poll(5000), "no delivery"
    _, body = sock.recv_multipart()
    return msgpack.unpackb(body, raw=False)


def bodies_until(sock: zmq.Socket, count: int) -> dict[int, list[Any] | None]:
    """Deliveries until `count` messages came: each message's attrs entry (without its index) by
    sequence number, None for a message without."""
    out: dict[int, list[Any] | None] = {}
    while len(out) < count:
        body = next_body(sock)
        attrs = {a[0]: a[1:] for a in body[11]} if len(body) == 12 else {}
        out.update((seq, attrs.get(i)) for i, seq in enumerate(body[8]))
    return out


# ---------------------------------------------------------------- end to end


def test_headers_reach_every_kind_of_subscriber_and_plain_messages_are_as_before(lone: Lone) -> None:
    queue = lone.queue("e2e")
    config = lone.config
    got: list[Message] = []
    batches: list[MessageBatch] = []
    raw = raw_subscriber(lone, b"orders")
    with Subscriber(queue, config, ["orders"]) as iterating, \
            Subscriber(queue, config, ["orders"], callback=got.append) as calling, \
            Subscriber(queue, config, ["orders"], batch_callback=batches.append) as batching, \
            Publisher(queue, config) as pub:
        for sub in (iterating, calling, batching):
            sub.wait_connected(1)
        pub.publish("orders.eu", b"plain")
        pub.flush()
        plain_body = next_body(raw)
        pub.publish("orders.eu", b"tagged", headers={"trace-id": "4bf9", "bin": b"\x00\xff", "empty": b""})
        pub.publish("orders.eu", b"keyed", key="customer-42", priority=3, headers={"é": "ü"})
        pub.flush()
        wire = bodies_until(raw, 2)
        received = [iterating.receive(timeout=5) for _ in range(3)]
        wait_until(lambda: len(got) == 3 and sum(len(b.seqs) for b in batches) == 3, message="3 messages each")
        # Late: fetched from retention, not live.
        with Subscriber(queue, config, ["orders"], start="beginning") as late:
            fetched = [late.receive(timeout=5) for _ in range(3)]
    # On the wire: a message without headers is a delivery of 11 fields, exactly as before headers.
    assert len(plain_body) == 11
    assert wire == {2: [0, 0, b"", {"trace-id": b"4bf9", "bin": b"\x00\xff", "empty": b""}],
                    3: [3, 0, b"customer-42", {"é": "ü".encode()}]}
    for messages in (received, got, fetched, [m for b in batches for m in b.messages()]):
        assert [m.payload for m in messages] == [b"plain", b"tagged", b"keyed"]  # type: ignore[union-attr]
        plain, tagged, keyed = messages
        assert plain.headers == {} and plain.headers is EMPTY_HEADERS  # type: ignore[union-attr]
        assert tagged.headers == {"trace-id": b"4bf9", "bin": b"\x00\xff", "empty": b""}  # type: ignore[union-attr]
        assert keyed.headers == {"é": "ü".encode()}  # type: ignore[union-attr]
        assert plain.topic == "orders.eu" and plain.topic_bytes == b"orders.eu"  # type: ignore[union-attr]
    assert [b.headers for b in batches if b.payloads == [b"plain"]] == [None]  # a batch without: no list


def test_group_members_get_headers_and_text_topics_and_keys(lone: Lone) -> None:
    queue = lone.queue("members")
    with Subscriber(queue, lone.config, ["jobs"], group="workers") as member, \
            Publisher(queue, lone.config) as pub:
        pub.publish("jobs", b"a", key="customer-42", headers={"attempt": "1"})
        pub.publish("jobs", b"b", key=b"\xffraw")
        pub.flush()
        first, second = member.receive(timeout=5), member.receive(timeout=5)
    assert isinstance(first, WorkMessage) and isinstance(second, WorkMessage)
    assert (first.topic, first.topic_bytes, first.key, first.key_bytes) == ("jobs", b"jobs", "customer-42",
                                                                            b"customer-42")
    assert first.headers == {"attempt": b"1"} and second.headers == {}
    assert second.key_bytes == b"\xffraw" and second.key == "\udcffraw"  # not UTF-8: surrogate escapes
    assert "headers={'attempt': b'1'}" in repr(first)


def test_dead_letters_say_where_they_came_from_and_keep_the_message(lone: Lone) -> None:
    queue = lone.queue("dead")
    letters: list[Message] = []

    def refuse(msg: WorkMessage) -> None:
        msg.nack(requeue=msg.payload != b"reject")  # "poison" comes back until max_deliveries
    before_ms = time.time_ns() // 1_000_000
    # One exchange serves every queue of this module: each test's group has a name of its own.
    with Subscriber(queue, lone.config, ["roq.dead/fragile"], callback=letters.append) as dead, \
            Subscriber(queue, lone.config, ["jobs"], group="fragile", callback=refuse, auto_ack=False,
                       max_deliveries=2), \
            Publisher(queue, lone.config) as pub:
        dead.wait_connected(1)
        poison = pub.publish("jobs", b"poison", priority=7, key="k1", headers={"trace-id": "t1"})
        reject = pub.publish("jobs", b"reject")
        pub.flush()
        wait_until(lambda: len(letters) == 2, timeout=15, message="two dead letters")
    after_ms = time.time_ns() // 1_000_000
    by_payload = {m.payload: m for m in letters}
    poisoned, rejected = by_payload[b"poison"], by_payload[b"reject"]
    assert poisoned.topic == "roq.dead/fragile" and poisoned.publisher.startswith("dl-x1.")
    assert poisoned.headers["trace-id"] == b"t1"  # the original headers are kept ...
    assert {k: v for k, v in poisoned.headers.items() if k != "roq-time"} == {
        "trace-id": b"t1", "roq-topic": b"jobs", "roq-publisher": pub.id.encode(), "roq-seq": b"%d" % poison,
        "roq-reason": b"max_deliveries", "roq-deliveries": b"2", "roq-group": b"fragile"}
    assert before_ms <= int(poisoned.headers["roq-time"]) <= after_ms
    assert rejected.headers["roq-reason"] == b"nack" and rejected.headers["roq-deliveries"] == b"1"
    assert rejected.headers["roq-seq"] == b"%d" % reject and "trace-id" not in rejected.headers
    # ... and so are its priority and key (for a group reading the dead letters).
    fetched = protocol.decode_delivery(retained_body(lone, b"roq.dead/fragile", poisoned.pos))
    attrs = fetched.attrs or []
    assert [(a[1], a[3]) for a in attrs] == [(7, b"k1")]


def retained_body(lone: Lone, topic: bytes, pos: int) -> bytes:
    sock = dealer(lone.ready["replay"])
    try:
        sock.send(protocol.encode_fetch(1, lone.ready["incarnation"], pos - 1, pos + 1, [topic], 0))
        assert sock.poll(5000)
        page = protocol.decode_replay_reply(sock.recv(), 1 << 24)
        assert isinstance(page, protocol.Frames) and len(page.frames) == 1
        return page.frames[0][1]
    finally:
        sock.close()


def test_the_publisher_checks_headers_before_anything_is_queued(lone: Lone) -> None:
    queue = lone.queue("checks")
    with Publisher(queue, lone.config) as pub:
        for bad in ({"roq-topic": "x"}, {"ROQ-x": "x"}, {"": "x"}, {"k" * 129: "x"}, {"a\nb": "x"},
                    {"k": "v" * 8193}, {f"k{i}": "v" for i in range(65)}, {b"bytes-key": "v"}, {"k": 5},
                    {f"k{i}": "v" * 8000 for i in range(9)}):
            with pytest.raises(UserError):
                pub.publish("t", b"x", headers=bad)  # type: ignore[dict-item]
        with pytest.raises(MessageTooLargeError, match="bytes of headers"):
            pub.publish("t", b"x" * (MAX_MESSAGE - 10), headers={"trace": "0123456789"})
        assert pub.unconfirmed == 0 and pub._log.next_seq == 1


# ---------------------------------------------------------------- hostile publishers


def _str_map(*pairs: tuple[Any, Any]) -> bytes:
    """A msgpack map written by hand: keys and values as given, repeated keys kept (msgpack's
    packer cannot write those)."""
    out = bytes([0x80 | len(pairs)])
    for key, value in pairs:
        out += msgpack.packb(key, use_bin_type=True) + msgpack.packb(value, use_bin_type=True)
    return out


class Raw(bytes):
    """Bytes spliced into a hand-made frame as they are (already msgpack)."""


def _pack(value: Any) -> bytes:
    if isinstance(value, Raw):
        return bytes(value)
    if isinstance(value, list):
        head = bytes([0x90 | len(value)]) if len(value) < 16 else b"\xdc" + len(value).to_bytes(2, "big")
        return head + b"".join(_pack(v) for v in value)
    return msgpack.packb(value, use_bin_type=True)


HOSTILE_HEADERS = {
    "not a map": Raw(msgpack.packb([b"k", b"v"])),
    "an int key": Raw(_str_map((1, b"v"))),
    "a bin key": Raw(_str_map((b"k", b"v"))),
    "a repeated key (the count lies)": Raw(_str_map(("k", b"1"), ("k", b"2"))),
    "a key that is not UTF-8": Raw(b"\x81\xa2\xff\xfe\xc4\x01v"),
    "an empty key": Raw(_str_map(("", b"v"))),
    "a key of 129 bytes": Raw(_str_map(("k" * 129, b"v"))),
    "a control character": Raw(_str_map(("a\rb", b"v"))),
    "RoQ's own prefix": Raw(_str_map(("Roq-Reason", b"nack"))),
    "a str value": Raw(_str_map(("k", "text"))),
    "a value of 8193 bytes": Raw(_str_map(("k", b"v" * 8193))),
    "65 headers": Raw(b"\xde\x00\x41" + b"".join(_pack(f"k{i}") + _pack(b"") for i in range(65))),
}


def test_hostile_headers_are_rejected_one_message_at_a_time(lone: Lone) -> None:
    """Each lying or oversize headers map gets a `reject malformed` of its own message, which
    changes nothing else: the good messages around it are forwarded, the batch acked."""
    raw = raw_subscriber(lone, b"hostile")
    sock = dealer(lone.ready["pub"])
    token = secrets.token_bytes(16)
    pid = protocol.publisher_id_for(token)
    sock.send(protocol.encode_hello(pid, token, 1))
    assert replies(sock, "welcome")[-1].kind == "welcome"
    names = sorted(HOSTILE_HEADERS)
    messages: list[Any] = [[b"hostile", 0, 0, b"", Raw(_str_map(("ok", b"1")))], b"first"]
    for name in names:
        messages += [[b"hostile", 0, 0, b"", HOSTILE_HEADERS[name]], name.encode()]
    # Within its limits, but with the payload over exchange.max_message_bytes; then a plain one.
    messages += [[b"hostile", 0, 0, b"", Raw(_str_map(("big", b"h" * 100)))], b"p" * (MAX_MESSAGE - 100),
                 b"hostile", b"last"]
    count = len(messages) // 2
    sock.send(_pack(["batch", protocol.DATA_VERSION, pid, 1, 0, messages]))
    answers = replies(sock)
    rejected = {a.seq: (a.code, a.message) for a in answers if a.kind == "reject"}
    assert answers[-1].kind == "ack" and answers[-1].seq == count
    assert sorted(rejected) == list(range(2, 2 + len(names))) + [count - 1]  # every bad one, and only those
    assert {rejected[2 + i][0] for i in range(len(names))} == {"malformed"}, rejected
    assert rejected[count - 1][0] == "too_large" and "bytes of headers" in rejected[count - 1][1]
    assert "twice" in rejected[2 + names.index("a repeated key (the count lies)")][1]
    assert "RoQ's own" in rejected[2 + names.index("RoQ's own prefix")][1]
    assert "UTF-8" in rejected[2 + names.index("a key that is not UTF-8")][1]
    body = next_body(raw)  # one topic: the two good messages in one frame
    assert (body[8], body[9], body[10], body[11]) == ([1, count], [b"first", b"last"], None,
                                                      [[0, 0, 0, b"", {"ok": b"1"}]])
    # A map header that claims more entries than the frame holds ends the frame: refused whole.
    sock.send(_pack(["batch", protocol.DATA_VERSION, pid, count + 1, 0,
                     [[b"hostile", 0, 0, b"", Raw(b"\xdf\xff\xff\xff\xff")], b"x"]]))
    refused = replies(sock, "error")
    assert refused[-1].code == "malformed" and len(refused) == 1
    sock.send(protocol.encode_batch(pid, count + 1, 0, [b"hostile", b"after"]))
    assert replies(sock)[-1].seq == count + 1  # the session goes on where it was: nothing changed
    assert next_body(raw)[9] == [b"after"]
    sock.close()
    raw.close()
