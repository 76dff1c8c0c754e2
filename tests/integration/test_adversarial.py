"""Regression tests for what adversarial runs found: forged publisher ids, acks over
holes, new topics lost by a slow subscriber, false gaps, frames that crashed an exchange, frozen
exchanges chosen again, memory pinned by hoarded fetches and floods of ids, a deleted queue.

Each test names the point it covers; each failed before its fix."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

import msgpack
import psutil
import pytest
import zmq

from roq import protocol
from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.errors import QueueNotFoundError
from roq.state import read_live
from roq.zk import encode
from tests.integration.conftest import create, start_cluster
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


# ------------------------------------------------------------------ raw peers


def dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def answer(sock: zmq.Socket, timeout_ms: int = 5000) -> protocol.ExchangeReply:
    assert sock.poll(timeout_ms), "the exchange did not answer"
    return protocol.decode_exchange_reply(sock.recv())


def hello(sock: zmq.Socket, token: bytes | None = None, from_seq: int = 1) -> str:
    token = token or secrets.token_bytes(16)
    pid = protocol.publisher_id_for(token)
    sock.send(protocol.encode_hello(pid, token, from_seq))
    reply = answer(sock)
    assert reply.kind == "welcome", reply
    return pid


@pytest.fixture(scope="module")
def lone(zookeeper):
    """One exchange process on its own, and a queue "lone" in ZooKeeper pointing at it (so the
    client library can use it), for tests that talk to it raw."""
    from tests.support.helpers import fast_config
    config = fast_config(zookeeper.connect_string).replace(exchange={"fetch_max_bytes": 1 << 20,
                                                                     "replay_budget_bytes": 8 << 20})
    proc = subprocess.Popen([sys.executable, "-m", "exchange.main", "--queue", "lone", "--id", "x1",
                             "--config-json", config.to_json(), "--no-watch-stdin"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    from tests.support.helpers import MetadataOnlyGcm
    seed = MetadataOnlyGcm(config)  # the client library's seed: no GCM places anything here
    yield config, proc, ready
    seed.close()
    proc.kill()
    proc.wait()


def advertise(zk, config, queue: str, ready: dict, pub: str | None = None) -> None:
    """Make `queue` exist in ZooKeeper with the lone exchange as its x1 (publishing through `pub`)."""
    from roq.paths import Paths
    paths = Paths(config.zk.root)
    zk.ensure_path(paths.queue(queue))
    zk.ensure_path(paths.live_queue(queue))
    data = {k: ready[k] for k in ("sub", "replay", "incarnation", "pid")}
    data.update(pub=pub or ready["pub"], host="local", stats={})
    zk.create(paths.live_exchange(queue, "x1"), encode(data), ephemeral=True)


# ------------------------------------------------------------------ 1: forged publisher ids


def test_1_a_forged_publisher_id_is_refused_and_the_victim_loses_nothing(lone, zookeeper):
    config, proc, ready = lone
    from roq.zk import start_client, stop_client
    zk = start_client(config)
    try:
        advertise(zk, config, "forged", ready)
        with Subscriber("forged", config) as sub, Publisher("forged", config) as victim:
            sub.wait_connected(1)
            victim.wait_for_subscribers(1)
            victim.publish("t", b"before")
            victim.flush(5)
            attacker = dealer(ready["pub"])
            # A batch claiming the victim's id from another connection, far ahead.
            attacker.send(protocol.encode_batch(victim.id, 10**12, 0, [b"t", b"x"]))
            refusal = answer(attacker)
            assert (refusal.kind, refusal.code) == ("resend", "hello_required") and refusal.seq == 0
            # A hello with the victim's id but not its token.
            attacker.send(protocol.encode_hello(victim.id, secrets.token_bytes(16), 10**12))
            refusal = answer(attacker)
            assert (refusal.kind, refusal.code) == ("error", "refused")
            attacker.close()
            for i in range(200):
                victim.publish("t", b"%d" % i)
            victim.flush(10)
            got = [sub.receive(timeout=5) for _ in range(201)]
            assert None not in got
            assert [m.payload for m in got[1:]] == [b"%d" % i for i in range(200)]
            assert sub.stats().gaps == 0 and victim.confirmed == 201
    finally:
        stop_client(zk)
    assert proc.poll() is None


# ------------------------------------------------------------------ 2: acks never cover holes


def test_2_an_ack_never_covers_a_refused_batch_or_a_jump_ahead(lone):
    _, proc, ready = lone
    sock = dealer(ready["pub"])
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"hole")
    sub.connect(ready["sub"])
    try:
        pid = hello(sock)
        sock.send(protocol.encode_hello(pid, b"short", 1))
        assert answer(sock).kind == "error"  # a malformed hello changes nothing
        flat = [b"hole", b"m"] * 8
        sock.send(protocol.encode_batch(pid, 1, 0, flat))
        assert answer(sock).seq == 8
        sock.send(msgpack.packb(["batch", protocol.DATA_VERSION, pid, 9, 1.5, [b"hole", b"float"]]))  # a float sent_ns
        refused = answer(sock)
        assert (refused.kind, refused.seq, refused.code) == ("resend", 9, "malformed")
        sock.send(protocol.encode_batch(pid, 10, 0, [b"hole", b"after-the-refused"]))
        refused = answer(sock)
        assert (refused.kind, refused.seq, refused.code) == ("resend", 9, "out_of_order")
        sock.send(protocol.encode_batch(pid, 1000, 0, [b"hole", b"far-ahead"]))
        assert answer(sock).kind == "resend"
        sock.send(protocol.encode_batch(pid, 9, 0, [b"hole", b"nine", b"hole", b"ten"]))
        ack = answer(sock)
        assert (ack.kind, ack.seq) == ("ack", 10)
    finally:
        sock.close()
        sub.close()
    assert proc.poll() is None


class CuttingProxy:
    """A TCP proxy that cuts its connections every `every` bytes, in the middle of whatever frame
    is passing: what a flaky network does to a publisher under load."""

    def __init__(self, target: str, every: int) -> None:
        host, port = target.replace("tcp://", "").rsplit(":", 1)
        self.target = (host, int(port))
        self.every = every
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            budget = [self.every]
            for a, b, cut in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(a, b, budget, cut), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, budget: list[int], cut: bool) -> None:
        try:
            while not self._stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if cut and budget[0] <= len(data):
                    dst.sendall(data[:budget[0]])  # part of a frame, then the cut
                    self.cuts += 1
                    break
                budget[0] -= len(data)
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


def test_2_connections_cut_mid_frame_under_load_lose_nothing(lone):
    """Bytes in flight die with the connection while ZeroMQ reconnects underneath: the exchange
    sees the next batch start past what it holds and asks for a resend; lost = 0."""
    config, proc, ready = lone
    from roq.zk import start_client, stop_client
    proxy = CuttingProxy(ready["pub"], every=300_000)  # noqa
    zk = start_client(config)
    total = 60_000
    try:
        advertise(zk, config, "cut", ready, pub=proxy.endpoint)
        fast = config.replace(client={"confirm_timeout": 30.0})  # resends, not moves, must repair it
        with Subscriber("cut", fast, topics=["cut"]) as sub, Publisher("cut", fast) as pub:
            sub.wait_connected(1)
            for i in range(total):
                pub.publish("cut", b"%08d" % i + b"." * 92)
            pub.flush(60)
            got = []
            while len(got) < total:
                msg = sub.receive(timeout=10)
                assert msg is not None, f"stalled after {len(got)}"
                got.append(int(msg.payload[:8]))
            record_figures("publisher behind a cutting proxy", messages=total, cuts=proxy.cuts,
                           resends=pub.resends, reconnects=pub.reconnects, lost=len(set(range(total)) - set(got)),
                           duplicated=len(got) - len(set(got)))
            assert got == list(range(total)) and proxy.cuts >= 5 and pub.reconnects + pub.resends >= 1
    finally:
        proxy.close()
        stop_client(zk)
    assert proc.poll() is None


# ------------------------------------------------------------------ 6: one frame must not end an exchange


@pytest.mark.parametrize("first_seq, count", [(2**64 - 1, 2), (2**63 - 1, 2), (2**63, 1)])
def test_6_sequence_numbers_at_the_edge_are_refused_and_the_exchange_lives(lone, first_seq, count):
    _, proc, ready = lone
    sock = dealer(ready["pub"])
    try:
        pid = hello(sock)
        sock.send(msgpack.packb(["batch", protocol.DATA_VERSION, pid, first_seq, 0, [b"t", b"x"] * count]))
        assert answer(sock).kind in ("resend", "error")
        sock.send(protocol.encode_batch(pid, 1, 0, [b"t", b"fine"]))
        assert answer(sock).kind == "ack"
    finally:
        sock.close()
    assert proc.poll() is None


# ------------------------------------------------------------------ 8, 9: bounded memory


def test_8_hoarded_fetches_cannot_pin_exchange_memory(lone):
    """300 fetches of 1 MiB pages never read: the exchange answers `busy` beyond its budget."""
    config, proc, ready = lone
    sock = dealer(ready["pub"])
    pid = hello(sock)
    chunk = [b"hoard", b"x" * 100_000] * 10
    for i in range(30):  # 30 MB retained
        sock.send(protocol.encode_batch(pid, 1 + 10 * i, 0, chunk))
        assert answer(sock).kind == "ack"
    sock.close()
    exchange = psutil.Process(proc.pid)
    before = exchange.memory_info().rss
    hoarder = dealer(ready["replay"])
    hoarder.rcvhwm = 1
    hoarder.setsockopt(zmq.RCVBUF, 4096)
    for rid in range(300):
        hoarder.send(protocol.encode_fetch(rid, "", 0, 0, [b""], 0))
    peak = before
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        peak = max(peak, exchange.memory_info().rss)
        time.sleep(0.05)
    busy = 0
    while hoarder.poll(500):
        try:
            protocol.decode_replay_reply(hoarder.recv(), 1 << 30)
        except protocol.ReplayRefused as refused:
            busy += refused.refusal == "busy"
    hoarder.close()
    growth = (peak - before) / 1e6
    record_figures("300 hoarded fetches", exchange_rss_growth_mb=round(growth, 1), busy_answers=busy,
                   budget_mb=config.exchange.replay_budget_bytes >> 20)
    assert busy > 0 and growth < 8 + 40, f"exchange grew by {growth:.1f} MB"
    assert proc.poll() is None


def test_9_a_flood_of_hellos_is_capped_per_connection(lone):
    config, proc, ready = lone
    sock = dealer(ready["pub"])
    refused = 0
    try:
        for _ in range(10):  # in rounds: replies beyond the high-water marks would be dropped
            for _ in range(200):
                token = secrets.token_bytes(16)
                sock.send(protocol.encode_hello(protocol.publisher_id_for(token), token, 1))
            for _ in range(200):
                refused += answer(sock).kind == "error"
    finally:
        sock.close()
    assert refused == 2_000 - config.exchange.max_publishers_per_connection
    assert proc.poll() is None


def test_31_one_frame_per_request_answered_with_its_id_and_one_publisher_id_rule(lone):
    """A hostile peer's findings: a replay request of two frames is answered `malformed` with the
    request id its first frame names (it was nil); a publisher id of another shape than "p-" and 24
    hex digits is `error malformed` in a batch as in a hello (a batch took any 1-128 characters and
    was answered `resend hello_required`, a hello `error refused`)."""
    _, proc, ready = lone
    replay, pub = dealer(ready["replay"]), dealer(ready["pub"])
    try:
        replay.send_multipart([protocol.encode_position_request(77, [b"t"]), b"extra"])
        assert replay.poll(5000), "the exchange did not answer"
        with pytest.raises(protocol.ReplayRefused) as refused:
            protocol.decode_replay_reply(replay.recv(), 1 << 20)
        assert (refused.value.refusal, refused.value.request_id) == ("malformed", 77)
        replay.send(protocol.encode_position_request(78, [b"t"]))
        assert replay.poll(5000), "the exchange did not answer"
        assert protocol.decode_replay_reply(replay.recv(), 1 << 20).request_id == 78
        for frame in (protocol.encode_batch("p-forged", 1, 0, [b"t", b"x"]),
                      protocol.encode_hello("p-forged", b"t" * 16, 1)):
            pub.send(frame)
            reply = answer(pub)
            assert (reply.kind, reply.code) == ("error", "malformed") and "publisher id" in reply.message, reply
    finally:
        replay.close()
        pub.close()
    assert proc.poll() is None


# ------------------------------------------------------------------ 3, 5: subscribers


def test_3_a_stalled_subscriber_gets_every_new_topic_back(config, zk, paths, procs):
    """20,000 messages on distinct topics while a subscriber does not read: the XPUB queue drops
    most of their first (and only) frames; the prefix chains reveal every one of them."""
    start_cluster(procs, zk, paths, "exchange.sub_hwm=20")
    create(config, zk, paths, "fresh", 1)
    small = config.replace(client={"receive_hwm": 20})
    gate = threading.Event()
    got: list[bytes] = []

    def slow(msg):
        gate.wait(30)
        got.append(msg.topic_bytes)

    total = 20_000
    with Subscriber("fresh", small, callback=slow) as sub, Publisher("fresh", config) as pub:
        sub.wait_connected(1)
        pub.wait_for_subscribers(1)
        for i in range(total):
            pub.publish(b"topic-%05d" % i, b"x")
        pub.flush(30)
        stop = threading.Event()

        def busy() -> None:  # other traffic keeps the stream busy: it never goes quiet
            for _ in range(30_000):
                if stop.wait(0.002):
                    return
                pub.publish("busy", b"y")

        traffic = threading.Thread(target=busy, daemon=True)
        traffic.start()
        gate.set()
        try:
            wait_until(lambda: sum(1 for t in list(got) if t != b"busy") >= total, timeout=30,
                       message="every new topic's message while the stream stays busy")
        finally:
            stop.set()
            traffic.join()
        pub.flush(30)
        stats = sub.stats().as_dict()
    fresh = [t for t in got if t != b"busy"]
    record_figures("stalled subscriber, 20,000 new topics", delivered=len(fresh), gaps=stats["gaps"],
                   recovered_frames=stats["recovered_frames"], duplicates=stats["duplicates"])
    assert len(fresh) == len(set(fresh)) == total and stats["gaps"] == 0


def test_5_a_quiet_stream_after_long_traffic_reports_no_false_gap(config, zk, paths, procs):
    start_cluster(procs, zk, paths, "exchange.retention_seconds=1.0")
    create(config, zk, paths, "quiet", 1)
    with Subscriber("quiet", config, topics=["a"]) as sub, Publisher("quiet", config) as pub:
        sub.wait_connected(1)
        pub.wait_for_subscribers(1)
        end = time.monotonic() + 3  # three retention windows of traffic
        sent = 0
        while time.monotonic() < end:
            pub.publish("a", b"m")
            pub.publish("b", b"other")
            sent += 1
            time.sleep(0.002)
        pub.flush(10)
        wait_until(lambda: sub.stats().received == sent, timeout=10, message="all messages")
        checks = sub.stats().position_checks
        # The first beat after the traffic finds the stream quiet and checks where it ends: the
        # old code fetched from a floor live traffic never advanced, long evicted: a false gap.
        wait_until(lambda: sub.stats().position_checks > checks, timeout=10,
                   message="a position check on the quiet stream")
        assert sub.stats().gaps == 0


# ------------------------------------------------------------------ 7: frozen exchanges


def test_7_a_frozen_exchange_is_not_chosen_again(config, zk, paths, cluster):
    create(config, zk, paths, "frozen", 2)
    with Publisher("frozen", config, prefer="x1") as pub:
        pub.publish("t", b"first")
        pub.flush(10)
        pub.prefer = None
        pid = read_live(zk, paths, "frozen")["x1"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            pub.publish("t", b"while frozen")
            wait_until(lambda: pub.exchange == "x2", timeout=20, message="a move away from the frozen x1")
            pub.flush(10)
            for attempt in range(3):  # moves for other reasons: never back onto x1
                moves = pub.moves
                pub._request_move("test")
                wait_until(lambda: pub.moves > moves and pub.exchange is not None, timeout=10, message="move")
                assert pub.exchange == "x2"
                pub.publish("t", b"%d" % attempt)
                pub.flush(10)
        finally:
            os.kill(pid, signal.SIGCONT)


# ------------------------------------------------------------------ 10, 12: topology


def test_10_a_closed_publisher_stops_watching_the_queue(config, zk, paths, cluster):
    create(config, zk, paths, "closed", 1)
    pub = Publisher("closed", config)
    pub.close()
    version = pub.topology.version
    with Admin(config) as admin:
        admin.scale_queue("closed", 2)
    wait_until(lambda: len(read_live(zk, paths, "closed")) == 2, timeout=15, message="a second exchange")
    assert pub.topology.version == version and pub._link._wake.closed


def test_12_clients_follow_a_queue_deleted_and_created_again(config, zk, paths, cluster):
    create(config, zk, paths, "again", 1)
    with Subscriber("again", config) as sub, Publisher("again", config) as pub:
        sub.wait_connected(1)
        pub.wait_for_subscribers(1)
        pub.publish("t", b"old")
        pub.flush(10)
        assert sub.receive(timeout=5).payload == b"old"
        with Admin(config) as admin:
            admin.delete_queue("again")
            wait_until(lambda: pub.queue_deleted, timeout=10, message="the publisher to see the deletion")
            with pytest.raises(QueueNotFoundError):
                pub.publish("t", b"into the void")
            admin.create_queue("again", exchanges=1)
        wait_until(lambda: not pub.queue_deleted and pub.exchange is not None, timeout=20,
                   message="the publisher on the new exchange")
        sub.wait_connected(1, timeout=20)
        pub.wait_for_subscribers(1, timeout=20)
        pub.publish("t", b"new")
        pub.flush(10)
        assert sub.receive(timeout=10).payload == b"new"
