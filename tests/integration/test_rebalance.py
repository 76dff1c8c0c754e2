"""Rebalancing with real processes (gcm/placement.py `plan_rebalance`, gcm/reconciler.py): after a
host is lost and comes back, the leader spreads a queue's exchanges again by itself, and
`roq queue rebalance` does it on demand; moves under load lose and duplicate nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from roq.client.admin import Admin
from roq.state import read_exchanges, read_hosts, read_leader
from tests.support.helpers import SteadyTraffic, record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HOSTS = ("host-1", "host-2", "host-3")


def start(procs, zk, paths, *gcm_settings: str) -> None:
    procs.start("gcm", "gcm-0", *gcm_settings)
    for host in HOSTS:
        procs.start("hcm", host, f"hcm.host={host}")
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == len(HOSTS),
               message="a leader and every host")


def placed(zk, paths, queue: str) -> dict[str, str | None]:
    """Slot ("x1", "x1~r") → host, from ZooKeeper."""
    found: dict[str, str | None] = {}
    for x in read_exchanges(zk, paths, queue, live=False):
        found[x.id] = x.host
        if x.replica is not None:
            found[f"{x.id}~r"] = x.replica
    return found


def running_as_placed(zk, paths, queue: str) -> bool:
    """Every slot runs on the host it is placed on."""
    where = placed(zk, paths, queue)
    running: dict[str, str | None] = {}
    for x in read_exchanges(zk, paths, queue):
        running[x.id] = (x.live or {}).get("host")
        if x.replica_live is not None:
            running[f"{x.id}~r"] = x.replica_live.get("host")
    return all(running.get(slot) == host for slot, host in where.items())


def roq(config_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(config_path), *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="200"))


def test_the_leader_spreads_a_replicated_queue_again_when_a_lost_host_comes_back(config, zk, paths, procs):
    start(procs, zk, paths, "gcm.rebalance=true", "gcm.rebalance_delay=2")
    with Admin(config) as admin:
        admin.create_queue("spread", exchanges=2, replicas=2)
    wait_until(lambda: running_as_placed(zk, paths, "spread"), timeout=30, message="every slot running")
    traffic = SteadyTraffic("spread", config, rate=400)
    try:
        traffic.start()
        traffic.wait_for_more(200, timeout=20)
        # 4 slots on 3 hosts: lose a host with one slot; its slot goes to a survivor, and the host
        # comes back empty while the others carry two slots of the queue each.
        load = Counter(placed(zk, paths, "spread").values())
        victim = min(HOSTS, key=lambda h: (load[h], h))
        procs.kill(victim, signal.SIGKILL)
        wait_until(lambda: victim not in placed(zk, paths, "spread").values()
                   and running_as_placed(zk, paths, "spread"), timeout=40, message=f"failover off {victim}")
        assert sorted(Counter(placed(zk, paths, "spread").values()).values()) == [2, 2]
        traffic.wait_for_more(200, timeout=20)

        procs.start("hcm", victim, f"hcm.host={victim}")
        wait_until(lambda: victim in read_hosts(zk, paths), timeout=20, message=f"{victim} registered again")
        back = time.monotonic()
        wait_until(lambda: victim in placed(zk, paths, "spread").values(), timeout=40,
                   message=f"the leader moving a slot back to {victim}")
        moved = time.monotonic() - back
        wait_until(lambda: running_as_placed(zk, paths, "spread"), timeout=40, message="the moved slot running")
        even = time.monotonic() - back
        assert sorted(Counter(placed(zk, paths, "spread").values()).values()) == [1, 1, 2]
        for xid in ("x1", "x2"):
            where = placed(zk, paths, "spread")
            assert where[xid] != where[f"{xid}~r"]
        traffic.wait_for_more(200, timeout=30)  # confirms go on after the move
        with Admin(config) as admin:
            status = admin.status()
        figures = traffic.stop()
    finally:
        traffic.close()
    record_figures("rebalance: host back, replicated 2-exchange queue", rebalanced=status["rebalanced"],
                   host_back_to_move_s=round(moved, 2), host_back_to_even_s=round(even, 2), **figures)
    assert status["rebalanced"] == 1  # one move evens 4 slots on 3 hosts, and nothing moves after it
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures


def test_roq_queue_rebalance_spreads_a_queue_on_demand(config, zk, paths, procs):
    start(procs, zk, paths)  # rebalancing off (the test configuration): only the command moves
    with Admin(config) as admin:
        admin.create_queue("ondemand", exchanges=2)
    wait_until(lambda: running_as_placed(zk, paths, "ondemand"), timeout=30, message="both exchanges running")
    first = placed(zk, paths, "ondemand")
    keeper = first["x1"]
    others = [h for h in HOSTS if h != keeper]
    traffic = SteadyTraffic("ondemand", config, rate=400)
    try:
        traffic.start()
        traffic.wait_for_more(200, timeout=20)
        for host in others:  # both exchanges end up on one host
            procs.kill(host, signal.SIGKILL)
        wait_until(lambda: set(placed(zk, paths, "ondemand").values()) == {keeper}
                   and running_as_placed(zk, paths, "ondemand"), timeout=40, message=f"both on {keeper}")
        for host in others:
            procs.start("hcm", host, f"hcm.host={host}")
        wait_until(lambda: len(read_hosts(zk, paths)) == len(HOSTS), timeout=20, message="the hosts back")
        traffic.wait_for_more(200, timeout=20)
        assert set(placed(zk, paths, "ondemand").values()) == {keeper}  # nothing moves by itself

        started = time.monotonic()
        result = roq(procs.config_path, "queue", "rebalance", "ondemand")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("moved ondemand/x") and f"{keeper} -> host-" in lines[0], \
            result.stdout
        wait_until(lambda: running_as_placed(zk, paths, "ondemand"), timeout=40, message="the moved exchange running")
        spread = time.monotonic() - started

        def moves_logged() -> list[str]:
            with Admin(config) as admin:
                return [e["kind"] for e in admin.cluster_events()["events"]
                        if e.get("queue") == "ondemand" and f"moved from {keeper}" in e["detail"]]
        # The event log says why it moved: to even the spread, not a failover.
        assert wait_until(moves_logged, timeout=20, message="the move in the event log") == ["rebalance"]
        assert len(set(placed(zk, paths, "ondemand").values())) == 2
        again = roq(procs.config_path, "queue", "rebalance", "ondemand")
        assert again.returncode == 0 and "already as even" in again.stdout, again.stdout
        missing = roq(procs.config_path, "queue", "rebalance", "nope")
        assert missing.returncode == 1 and "does not exist" in missing.stderr, missing.stderr
        traffic.wait_for_more(200, timeout=30)
        figures = traffic.stop()
    finally:
        traffic.close()
    record_figures("roq queue rebalance: 2 exchanges on one host", command_to_running_s=round(spread, 2), **figures)
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
