"""ZooKeeper hygiene with real processes (an idle cluster writes next to nothing): an idle HCM
does not rewrite its exchanges' znodes between heartbeats, a change is written at once, and a
frozen exchange is published as silent, so publishers still choose another (hcm/heartbeat.py,
roq/client/publisher/exchange_choice.py is_stale).
Everything polls with a deadline; a quiet window is a poll that must time out."""

from __future__ import annotations

import os
import signal
import time

import pytest

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.state import read_leader, read_live
from roq.zk import decode
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration

HEARTBEAT = 10.0  # hcm.stats_heartbeat here; the report interval is 0.5 s (fast_config)
QUIET = 5.0  # a window shorter than the heartbeat: ten report intervals


def start(config, procs, zk, paths, queue, exchanges):
    procs.gcm("gcm-0")
    for host in ("host-1", "host-2"):
        procs.start("hcm", host, f"hcm.host={host}", f"hcm.stats_heartbeat={HEARTBEAT}")
    wait_until(lambda: read_leader(zk, paths), message="a leader")
    wait_until(lambda: len(zk.get_children(paths.hosts)) == 2, message="two hosts")
    with Admin(config) as admin:
        admin.create_queue(queue, exchanges=exchanges)
    wait_until(lambda: len(read_live(zk, paths, queue)) == exchanges, timeout=20, message="exchanges live")


def node(zk, path):
    """(data, version, mtime in s) of a znode."""
    raw, stat = zk.get(path)
    return decode(raw), stat.version, stat.mtime / 1000


def changes_within(zk, path, version, seconds):
    """The znode's first version other than `version` within `seconds`, else None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _, now_version, _ = node(zk, path)
        if now_version != version:
            return now_version
        time.sleep(0.05)
    return None


def test_an_idle_exchange_is_rewritten_only_by_its_heartbeat_and_a_change_at_once(config, zk, paths, procs):
    start(config, procs, zk, paths, "idle", 1)
    path = paths.live_exchange("idle", "x1")
    # Its first report written (the create had none), the exchange is idle from here on.
    wait_until(lambda: node(zk, path)[0]["stats"].get("at"), timeout=10, message="the first report")
    data, version, written = node(zk, path)
    assert data["heartbeat"] == HEARTBEAT and data["silent"] is False
    assert changes_within(zk, path, version, QUIET) is None, \
        f"rewritten within {QUIET}s while idle (reports every 0.5 s, heartbeat {HEARTBEAT}s)"
    # The heartbeat: about HEARTBEAT after the last write, with a fresh `at`.
    beat = changes_within(zk, path, version, HEARTBEAT + 5)
    assert beat is not None, "no heartbeat"
    data2, version, written2 = node(zk, path)
    assert HEARTBEAT - 1 <= written2 - written <= HEARTBEAT + 3
    assert data2["stats"]["at"] > data["stats"]["at"]
    # Work is a change: written within a few report intervals.
    with Publisher("idle", config) as pub:
        pub.publish("t", b"m")
        pub.flush(10)
        assert changes_within(zk, path, version, 3.0) is not None, "traffic not written"
    wait_until(lambda: node(zk, path)[0]["stats"].get("msgs_in") == 1, timeout=5, message="msgs_in 1")


def test_a_frozen_exchange_is_published_silent_and_publishers_choose_another(config, zk, paths, procs):
    start(config, procs, zk, paths, "frozen", 2)
    wait_until(lambda: all(d["stats"].get("at") for d in read_live(zk, paths, "frozen").values()),
               timeout=10, message="first reports")
    pid = read_live(zk, paths, "frozen")["x1"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        # Silent after 3 report intervals (1.5 s) without a report, long before any heartbeat.
        wait_until(lambda: read_live(zk, paths, "frozen")["x1"]["silent"] is True, timeout=5,
                   message="x1 published as silent")
        for _ in range(3):  # no prefer, no avoided exchange, no publishers anywhere: only staleness decides
            with Publisher("frozen", config) as pub:
                wait_until(lambda: pub.exchange is not None, timeout=10, message="an exchange chosen")
                assert pub.exchange == "x2"
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: read_live(zk, paths, "frozen")["x1"]["silent"] is False, timeout=5,
               message="x1 reporting again")
