"""Publishers → exchanges → subscribers through a real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roq import protocol
from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.state import read_hosts, read_leader, read_live
from tests.integration.conftest import create
from tests.profiles import examples
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration


def test_two_publishers_two_subscribers_exactly_once_in_order(config, zk, paths, cluster):
    create(config, zk, paths, "q", 2)
    per_publisher = 50_000
    subs = [Subscriber("q", config) for _ in range(2)]
    pubs = [Publisher("q", config, prefer=x) for x in ("x1", "x2")]
    try:
        for sub in subs:
            sub.wait_connected(2)
        for pub in pubs:
            pub.wait_for_subscribers(2)

        def run(pub: Publisher) -> None:
            for i in range(per_publisher):
                pub.publish("t", i.to_bytes(4, "big"))
            pub.flush(60)

        threads = [threading.Thread(target=run, args=(p,)) for p in pubs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for sub in subs:
            got: dict[str, list[int]] = {p.id: [] for p in pubs}
            while sum(map(len, got.values())) < 2 * per_publisher:
                msg = sub.receive(timeout=10)
                assert msg is not None, f"stalled at {sum(map(len, got.values()))} messages"
                got[msg.publisher].append(int.from_bytes(msg.payload, "big"))
            for ids in got.values():
                assert ids == list(range(per_publisher))  # each once, in publisher order
            assert sub.receive(timeout=0.3) is None
        assert all(p.confirmed == per_publisher for p in pubs)
    finally:
        for p in pubs:
            p.close(timeout=0)
        for s in subs:
            s.close()


def test_running_subscriber_joins_a_new_exchange(config, zk, paths, cluster):
    create(config, zk, paths, "grow", 1)
    with Subscriber("grow", config) as sub:
        sub.wait_connected(1)
        with Admin(config) as admin:
            admin.scale_queue("grow", 2)
        wait_until(lambda: len(read_live(zk, paths, "grow")) == 2, timeout=15, message="x2 live")
        sub.wait_connected(2)
        with Publisher("grow", config, prefer="x2") as pub:
            pub.wait_for_subscribers(1)
            assert pub.exchange == "x2"
            pub.publish("t", b"via-x2")
            pub.flush(10)
        msg = sub.receive(timeout=10)
        assert msg is not None and msg.payload == b"via-x2" and msg.exchange == "x2"


def test_topic_prefix_filtering(config, zk, paths, cluster):
    create(config, zk, paths, "topics", 1)
    with Subscriber("topics", config, topics=["eu."]) as sub, Publisher("topics", config) as pub:
        sub.wait_connected(1)
        pub.wait_for_subscribers(1)
        for topic in ("us.ny", "eu.fr", "asia", "eu.de"):
            pub.publish(topic, topic.encode())
        pub.flush(10)
        got = [sub.receive(timeout=5), sub.receive(timeout=5)]
        assert [m.topic for m in got if m] == ["eu.fr", "eu.de"]
        assert sub.receive(timeout=0.3) is None


def test_publisher_moves_when_its_exchange_dies(config, zk, paths, cluster):
    import os
    import signal
    create(config, zk, paths, "move", 2)
    with Subscriber("move", config) as sub, Publisher("move", config, prefer="x1") as pub:
        sub.wait_connected(2)
        pub.wait_for_subscribers(1)
        for i in range(1000):
            pub.publish("t", str(i).encode())
        pub.flush(10)
        pub.prefer = None
        os.kill(read_live(zk, paths, "move")["x1"]["pid"], signal.SIGKILL)
        wait_until(lambda: pub.exchange == "x2", timeout=10, message="the publisher to move to x2")
        for i in range(1000, 2000):
            pub.publish("t", str(i).encode())
        pub.flush(10)
        got = []
        while len(got) < 2000:
            msg = sub.receive(timeout=10)
            assert msg is not None, f"stalled after {len(got)}"
            got.append(int(msg.payload))
        assert got == list(range(2000))
        assert pub.moves >= 1


# ------------------------------------------------------------------ hostile input


@pytest.fixture(scope="module")
def lone_exchange(zookeeper):
    """An exchange process on its own (no HCM), with a small message limit."""
    from tests.support.helpers import fast_config
    cfg = fast_config(zookeeper.connect_string).replace(exchange={"max_message_bytes": 1024,
                                                                  "max_batch_bytes": 65536})
    proc = subprocess.Popen([sys.executable, "-m", "exchange.main", "--queue", "fuzz", "--id", "x1",
                             "--config-json", cfg.to_json(), "--no-watch-stdin"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    assert ready["event"] == "ready"
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    yield proc, ready
    proc.kill()
    proc.wait()


def publisher_socket(context, ready):
    """A raw DEALER on the lone exchange's publisher endpoint."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(ready["pub"])
    return sock


def say_hello(sock, name: bytes, from_seq: int = 1) -> str:
    """Claim the publisher id of token `name` on `sock`; returns the id once welcomed."""
    token = name.ljust(16, b".")
    pid = protocol.publisher_id_for(token)
    sock.send(protocol.encode_hello(pid, token, from_seq))
    assert sock.poll(5000), "no welcome"
    reply = protocol.decode_exchange_reply(sock.recv())
    assert reply.kind == "welcome", reply
    return pid


def _round_trip(ready, context, tag: bytes) -> None:
    """A well-behaved publisher and subscriber still work."""
    sub = context.socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"ok")
    sub.connect(ready["sub"])
    pub = context.socket(zmq.DEALER)
    pub.linger = 0
    pub.connect(ready["pub"])
    try:
        pid = say_hello(pub, b"probe-" + tag)
        seq = 1
        deadline_tries = 200
        while deadline_tries:
            pub.send(protocol.encode_batch(pid, seq, 0, [b"ok", tag]))
            assert pub.poll(5000), "exchange stopped answering"
            reply = msgpack.unpackb(pub.recv())
            assert reply[0] == "ack" and reply[2] == seq
            if sub.poll(50):
                topic, body = sub.recv_multipart()
                assert topic == b"ok" and protocol.decode_delivery(body).payloads == [tag]
                return
            seq += 1
            deadline_tries -= 1
        raise AssertionError("subscriber never got a message")
    finally:
        pub.close()
        sub.close()


ints = st.integers(min_value=-2**63, max_value=2**64 - 1)  # what msgpack can encode
frames = st.one_of(
    st.binary(max_size=300),
    st.builds(msgpack.packb, st.recursive(
        st.none() | st.booleans() | ints | st.text(max_size=20) | st.binary(max_size=50),
        lambda kids: st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
        max_leaves=20)),
    st.builds(lambda kind, pid, seq, flat: msgpack.packb([kind, protocol.DATA_VERSION, pid, seq, 0, flat]),
              st.sampled_from(["batch", "hello", "bye", "nope"]), st.text(max_size=10),
              st.integers(min_value=-5, max_value=2**64 - 1),
              st.lists(st.one_of(st.binary(max_size=2000), st.text(max_size=5), ints), max_size=8)),
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.lists(frames, min_size=1, max_size=3), min_size=1, max_size=5))
def test_random_frames_never_break_an_exchange(lone_exchange, batch):
    proc, ready = lone_exchange
    context = zmq.Context.instance()
    sock = publisher_socket(context, ready)
    try:
        for message in batch:
            sock.send_multipart(message)
    finally:
        sock.close()
    assert proc.poll() is None


fetches = st.one_of(
    frames,
    st.builds(lambda rid, inc, after, before, prefixes, size: msgpack.packb(
        ["fetch", protocol.DATA_VERSION, rid, inc, after, before, prefixes, size]),
        ints, st.text(max_size=12), ints, ints, st.lists(st.one_of(st.binary(max_size=8), ints), max_size=4),
        ints),
    st.builds(lambda rid, prefixes: msgpack.packb(["position", protocol.DATA_VERSION, rid, prefixes]),
              ints, st.lists(st.one_of(st.binary(max_size=8), ints), max_size=4)),
)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.lists(fetches, min_size=1, max_size=3), min_size=1, max_size=4))
def test_random_fetches_never_break_an_exchange(lone_exchange, requests):
    proc, ready = lone_exchange
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(ready["replay"])
    try:
        for request in requests:
            sock.send_multipart(request)
    finally:
        sock.close()
    assert proc.poll() is None


def test_exchange_forwards_after_the_fuzzing(lone_exchange):
    proc, ready = lone_exchange
    _round_trip(ready, zmq.Context.instance(), b"after-fuzz")
    assert proc.poll() is None


def test_retained_frames_are_fetched_after_the_fuzzing(lone_exchange):
    proc, ready = lone_exchange
    _round_trip(ready, zmq.Context.instance(), b"to-fetch")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(ready["replay"])
    try:
        sock.send(protocol.encode_fetch(7, "", 0, 0, [b"ok"], 1 << 20))
        assert sock.poll(5000), "no answer to a valid fetch"
        page = protocol.decode_replay_reply(sock.recv(), 1 << 30)
        assert isinstance(page, protocol.Frames)
        payloads = [p for _, body in page.frames for p in protocol.decode_delivery(body).payloads]
        assert page.request_id == 7 and page.done and b"to-fetch" in payloads
    finally:
        sock.close()
    assert proc.poll() is None


def test_oversize_and_bad_topics_are_rejected_one_by_one(lone_exchange):
    proc, ready = lone_exchange
    context = zmq.Context.instance()
    sock = publisher_socket(context, ready)
    try:
        pid = say_hello(sock, b"rejects")
        sock.send(protocol.encode_batch(pid, 1, 0, [b"ok", b"small", b"ok", b"x" * 2000, b"", b"no-topic"]))
        replies = []
        while len(replies) < 3 and sock.poll(5000):
            replies.append(msgpack.unpackb(sock.recv()))
        kinds = [(r[0], r[2]) for r in replies]
        assert ("reject", 2) in kinds and ("reject", 3) in kinds and ("ack", 3) in kinds
        codes = {r[2]: r[3] for r in replies if r[0] == "reject"}
        assert codes == {2: "too_large", 3: "invalid_name"}
    finally:
        sock.close()
    _round_trip(ready, context, b"after-rejects")


def test_slow_subscriber_cannot_grow_exchange_memory(config, zk, paths, tmp_path):
    """Memory stays within the retention bound plus the high-water marks, whoever stops reading."""
    import psutil

    from tests.support.helpers import Processes
    retention_mb = 16
    small = config.replace(exchange={"sub_hwm": 50, "retention_bytes": retention_mb << 20})
    procs = Processes(small, tmp_path / "slow")
    try:
        procs.gcm("gcm-0")
        procs.hcm("host-1")
        wait_until(lambda: read_leader(zk, paths) and read_hosts(zk, paths), message="cluster")
        create(small, zk, paths, "slow", 1)
        live = read_live(zk, paths, "slow")["x1"]
        exchange = psutil.Process(live["pid"])
        context = zmq.Context.instance()
        stuck = context.socket(zmq.SUB)  # subscribes, then never reads
        stuck.linger = 0
        stuck.rcvhwm = 10
        stuck.setsockopt(zmq.RCVBUF, 4096)
        stuck.setsockopt(zmq.SUBSCRIBE, b"")
        stuck.connect(live["sub"])
        total, payload = 100_000, b"x" * 1000
        with Subscriber("slow", small) as fast, Publisher("slow", small) as pub:
            fast.wait_connected(1)
            pub.wait_for_subscribers(1)
            wait_until(lambda: read_live(zk, paths, "slow")["x1"]["stats"].get("subscriptions", 0) >= 2,
                       message="the stuck subscriber's subscription")
            rss_before = exchange.memory_info().rss
            peak = rss_before
            for i in range(total):
                pub.publish("t", payload)
                if i % 5000 == 0:
                    peak = max(peak, exchange.memory_info().rss)
            pub.flush(60)
            got = 0
            while got < total:
                assert fast.receive(timeout=10) is not None, f"fast subscriber stalled at {got}"
                got += 1
            peak = max(peak, exchange.memory_info().rss)
        growth = (peak - rss_before) / 1e6
        from tests.support.helpers import record_figures
        record_figures("stuck subscriber", exchange_rss_growth_mb=round(growth, 1),
                       sent_mb=total * len(payload) / 1e6, retention_mb=retention_mb)
        assert growth < retention_mb * 1.05 + 40, f"exchange grew by {growth:.1f} MB"
        stuck.close()
    finally:
        procs.stop_all()


def test_sigkill_of_the_exchange_under_10k_per_second_loses_nothing(config, zk, paths, cluster):
    import os
    import signal

    from tests.support.helpers import SteadyTraffic
    create(config, zk, paths, "stream", 2)
    traffic = SteadyTraffic("stream", config, rate=10_000, max_messages=200_000)
    try:
        traffic.start()
        traffic.wait_for_more(10_000, timeout=30)
        victim = traffic.pub.exchange
        os.kill(read_live(zk, paths, "stream")[victim]["pid"], signal.SIGKILL)
        resumed = traffic.wait_for_more(20_000, timeout=60)
        report = traffic.stop()
    finally:
        traffic.close()
    from tests.support.helpers import record_figures
    record_figures("exchange SIGKILL at 10k msg/s", resumed_within_s=round(resumed, 2), **report)
    assert report["publisher_moves"] >= 1
    assert report["lost"] == 0 and report["duplicated"] == 0


def test_exchange_reports_statistics(config, zk, paths, cluster):
    create(config, zk, paths, "stats", 1)
    with Subscriber("stats", config) as sub, Publisher("stats", config) as pub:
        sub.wait_connected(1)
        pub.wait_for_subscribers(1)
        for _ in range(500):
            pub.publish("t", b"12345")
        pub.flush(10)
        stats = wait_until(lambda: (s := read_live(zk, paths, "stats")["x1"]["stats"]).get("msgs_in") == 500 and s,
                           timeout=10, message="statistics to report the 500 messages")
    assert stats["bytes_in"] == stats["bytes_out"] == 2500 and stats["msgs_out"] == 500
    assert stats["publishers"] == 1 and stats["subscriptions"] == 1 and stats["drops"] == 0
