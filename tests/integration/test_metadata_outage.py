"""Clients without ZooKeeper: traffic goes on with ZooKeeper stopped (an exchange killed meanwhile
included), and clients follow the topology again once it is back; a GCM failover moves clients to
another seed without losing messages.

The outage lasts ZK_OUTAGE_SECONDS seconds (default 60, the issue's full minute; `ZK_OUTAGE_SECONDS=6`
for a quick run). Both tests share one cluster (tests/integration/conftest.py `two_gcm_cluster`), the
outage first: the failover test kills a GCM."""

from __future__ import annotations

import os
import signal
import time

import pytest

from roq.client.admin import Admin
from roq.state import read_live
from tests.integration.conftest import SharedCluster
from tests.support.helpers import SteadyTraffic, record_figures, wait_until

OUTAGE = float(os.environ.get("ZK_OUTAGE_SECONDS", "60"))
pytestmark = pytest.mark.timeout(120 + 2 * OUTAGE)


@pytest.fixture
def two_gcms(two_gcm_cluster: SharedCluster):
    """The module's cluster, healthy, with queue `q` of two running exchanges (made once, then kept)."""
    two_gcm_cluster.wait_healthy()
    config, zk, paths = two_gcm_cluster.config, two_gcm_cluster.zk, two_gcm_cluster.paths
    with Admin(config) as admin:
        admin.create_queue("q", exchanges=2, exist_ok=True)
    wait_until(lambda: len(read_live(zk, paths, "q")) == 2, timeout=30, message="exchanges live")
    return two_gcm_cluster.procs


def test_zookeeper_down_under_traffic_loses_nothing(two_gcm_cluster, two_gcms, zookeeper):
    config, zk, paths = two_gcm_cluster.config, two_gcm_cluster.zk, two_gcm_cluster.paths
    traffic = SteadyTraffic("q", config, rate=400)
    try:
        traffic.start()
        traffic.wait_for_more(400, timeout=30)
        live = read_live(zk, paths, "q")
        victim = traffic.pub.exchange
        zookeeper.stop()
        try:
            traffic.wait_for_more(400, timeout=15)  # ZooKeeper down: traffic goes on
            os.kill(live[victim]["pid"], signal.SIGKILL)  # and the publisher's exchange dies meanwhile
            wait_until(lambda: traffic.pub.exchange not in (None, victim), timeout=10,
                       message="the publisher to move to the other exchange")
            traffic.wait_for_more(400, timeout=15)
            deadline = time.monotonic() + OUTAGE
            while time.monotonic() < deadline:  # the rest of the outage: traffic keeps flowing
                traffic.wait_for_more(100, timeout=15)
        finally:
            zookeeper.start()
        # Back: the victim's host restarts it, and every client follows the new incarnation.
        restarted = wait_until(lambda: (x := read_live(zk, paths, "q").get(victim)) and
                               x["incarnation"] != live[victim]["incarnation"] and x, timeout=30,
                               message="the killed exchange to run again")
        wait_until(lambda: traffic.sub.topology.snapshot().get(victim, {}).get("incarnation")
                   == restarted["incarnation"], timeout=10, message="the subscriber to follow the topology")
        wait_until(lambda: traffic.pub.topology.snapshot().get(victim, {}).get("incarnation")
                   == restarted["incarnation"], timeout=10, message="the publisher to follow the topology")
        report = traffic.stop()
    finally:
        traffic.close()
    record_figures(f"ZooKeeper down {OUTAGE:g} s under traffic, an exchange killed meanwhile", **report)
    assert report["publisher_moves"] >= 1
    assert report["lost"] == 0 and report["duplicated"] == 0


def test_gcm_failover_moves_clients_to_another_seed(two_gcm_cluster, two_gcms):
    config = two_gcm_cluster.config
    traffic = SteadyTraffic("q", config, rate=400)
    try:
        traffic.start()
        traffic.wait_for_more(400, timeout=30)
        moves = traffic.sub.metadata.moves
        port = traffic.sub.metadata.endpoint.rpartition(":")[2]
        # The GCM the subscriber talks to (its seeds are tried from a random one).
        two_gcms.kill(next(name for name, p in two_gcms.gcm_ports.items() if p == port))
        wait_until(lambda: traffic.sub.metadata.moves > moves, timeout=10, message="the subscriber to change seeds")
        traffic.wait_for_more(400, timeout=15)
        # The new seed pushes changes: scale out and see both clients use the new exchange.
        with Admin(config) as admin:
            admin.call("queue.scale", name="q", exchanges=3)
        wait_until(lambda: "x3" in traffic.sub.topology.snapshot() and "x3" in traffic.pub.topology.snapshot(),
                   timeout=20, message="both clients to see x3 through the new seed")
        report = traffic.stop()
    finally:
        traffic.close()
    assert report["lost"] == 0 and report["duplicated"] == 0
