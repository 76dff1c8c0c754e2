"""Retention and resume: subscribers that stop, restart or fall behind lose nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from tests.integration.conftest import create, start_cluster
from tests.support.helpers import record_figures, wait_until

pytestmark = pytest.mark.integration


def publish_numbered(pubs: list[Publisher], first: int, count: int) -> None:
    for i in range(first, first + count):
        for pub in pubs:
            pub.publish("t", i.to_bytes(4, "big"))
    for pub in pubs:
        pub.flush(30)


def take(sub: Subscriber, count: int) -> list[tuple[str, int]]:
    got = []
    for _ in range(count):
        msg = sub.receive(timeout=10)
        assert msg is not None, f"stalled after {len(got)} of {count}"
        got.append((msg.publisher, int.from_bytes(msg.payload, "big")))
    return got


def test_a_subscriber_resumes_from_its_position_with_nothing_lost_or_repeated(config, zk, paths, cluster):
    create(config, zk, paths, "resume", 2)
    pubs = [Publisher("resume", config, prefer=x) for x in ("x1", "x2")]
    try:
        first = Subscriber("resume", config)
        first.wait_connected(2)
        publish_numbered(pubs, 0, 5_000)
        before = take(first, 3_000)  # stops part way through, with more already delivered to it
        position = first.position()
        first.close()
        publish_numbered(pubs, 5_000, 5_000)  # nobody subscribed meanwhile
        with Subscriber("resume", config, position=position) as second:
            after = take(second, 2 * 10_000 - 3_000)
            assert second.receive(timeout=0.5) is None
            stats = second.stats().as_dict()
        everything = {(p.id, i) for p in pubs for i in range(10_000)}
        assert len(before) + len(after) == len(everything)
        assert set(before) | set(after) == everything
        for pub in pubs:  # in publisher order across the restart
            numbers = [i for p, i in before + after if p == pub.id]
            assert numbers == list(range(10_000))
        assert stats["gaps"] == 0 and stats["recovered_frames"] > 0
        record_figures("subscriber resume (2 exchanges, 2 publishers)", taken_before=len(before),
                       resumed_with=len(after), lost=0, duplicated=0, recovered_frames=stats["recovered_frames"])
    finally:
        for pub in pubs:
            pub.close(timeout=0)


def test_a_stalled_subscriber_refills_dropped_frames_from_retention(config, zk, paths, procs):
    """Tiny queues force XPUB to drop frames for the stalled subscriber; it fetches them back."""
    start_cluster(procs, zk, paths, "exchange.sub_hwm=5")
    tight = config.replace(client={"receive_hwm": 5, "max_batch": 1})
    create(tight, zk, paths, "stall", 1)
    release = threading.Event()
    got: list[int] = []

    def slow_start(msg) -> None:
        release.wait(30)  # holds the I/O thread: the socket and then the exchange queue fill up
        got.append(int.from_bytes(msg.payload[:4], "big"))

    total = 3_000
    with Subscriber("stall", tight, callback=slow_start) as sub, \
            Publisher("stall", tight) as pub:
        sub.wait_connected(1)
        pub.wait_for_subscribers(1)
        for i in range(total):
            pub.publish("t", i.to_bytes(4, "big") + b"x" * 4_000)
        pub.flush(30)
        release.set()
        wait_until(lambda: len(got) >= total, timeout=30, message=f"all {total} messages")
        stats = sub.stats().as_dict()
    assert got == list(range(total))
    assert stats["recovered_frames"] > 0 and stats["gaps"] == 0
    record_figures("stalled subscriber", messages=total, recovered_frames=stats["recovered_frames"],
                   fetches=stats["fetches"], lost=0)


def test_beyond_retention_the_loss_is_counted_not_hidden(config, zk, paths, procs):
    start_cluster(procs, zk, paths, "exchange.retention_bytes=300000")
    small = config.replace(client={"max_batch_bytes": 20_000})
    create(small, zk, paths, "short", 1)
    with Publisher("short", small) as pub:
        first = Subscriber("short", small)
        first.wait_connected(1)
        publish_numbered([pub], 0, 10)
        take(first, 10)
        position = first.position()
        first.close()
        for i in range(10, 210):  # 2 MB while it is away: ten times the retention
            pub.publish("t", i.to_bytes(4, "big") + b"x" * 10_000)
        pub.flush(30)
        with Subscriber("short", small, position=position) as second:
            second.wait_connected(1)
            wait_until(lambda: second.stats().gaps >= 1, timeout=10, message="the gap reported")
            resumed = []
            while (msg := second.receive(timeout=0.5)) is not None:
                resumed.append(int.from_bytes(msg.payload[:4], "big"))
    assert resumed and resumed[0] > 10  # the oldest frames were evicted ...
    assert resumed == sorted(set(resumed)) and resumed[-1] == 209  # ... what is left arrives once, in order


def saved_up_to(path) -> int:
    """Highest publisher sequence a saved position covers."""
    data = json.loads(path.read_text())
    return max((run[1] for seqs in data["publishers"].values() for run in seqs["runs"]), default=0)


def test_a_durable_subscriber_killed_and_restarted_loses_nothing(config, zk, paths, cluster, tmp_path):
    """`roq subscribe --durable`: SIGTERM saves the exact position; SIGKILL repeats at most the
    last save interval's messages (at least once), never loses one."""
    create(config, zk, paths, "durable", 1)
    state = tmp_path / "state"
    env = dict(os.environ, ROQ_SEEDS=config.cluster.seeds, ROQ_ZK_HOSTS=config.zk.hosts, ROQ_ZK_ROOT=config.zk.root,
               ROQ_CLIENT_STATE_DIR=str(state), ROQ_CLIENT_POSITION_SAVE_INTERVAL="0.2")

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "roq.cli", "subscribe", "durable", "--durable", "audit"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def lines_until(proc: subprocess.Popen[bytes], count: int) -> list[int]:
        assert proc.stdout is not None
        out = []
        while len(out) < count:
            line = proc.stdout.readline()
            assert line, f"subscriber exited after {len(out)} lines: {proc.stderr.read().decode()[-2000:]}"
            out.append(int(line.split(b"\t")[1]))
        return out

    seen: list[int] = []
    with Publisher("durable", config) as pub:
        def publish(first: int, count: int) -> None:
            for i in range(first, first + count):
                pub.publish("t", str(i).encode())
            pub.flush(30)

        proc = start()
        pub.wait_for_subscribers(1, timeout=15)
        publish(0, 1_000)
        seen += lines_until(proc, 1_000)
        proc.send_signal(signal.SIGTERM)  # clean stop: exact position saved
        assert proc.wait(10) == 0
        publish(1_000, 1_000)
        proc = start()
        seen += lines_until(proc, 1_000)
        assert seen == list(range(2_000))  # exactly once across a clean restart
        wait_until(lambda: saved_up_to(state / "durable" / "audit.json") >= 2_000, message="position saved")
        publish(2_000, 1_000)
        seen += lines_until(proc, 500)
        proc.kill()  # crash: up to one save interval is repeated
        proc.wait(10)
        proc = start()
        rest = lines_until(proc, 1)
        expected_last = 2_999
        while rest[-1] != expected_last:
            rest += lines_until(proc, 1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    repeated = len(seen) + len(rest) - 3_000
    assert set(seen) | set(rest) == set(range(3_000))  # nothing lost
    assert 0 <= repeated <= 500
    record_figures("durable subscriber SIGKILL", messages=3_000, lost=0, repeated_after_crash=repeated)
