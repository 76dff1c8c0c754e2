"""`roq cluster up` on a local cluster as a user runs it: a second `up` after `down` keeps
ZooKeeper's port and names the saved queues it brought back; an `up` over a cluster with dead
processes (ZooKeeper, an HCM) starts them again instead of refusing, and says which."""

from __future__ import annotations

import json
import os
import signal

import pytest

from roq.tools.cluster import ClusterState
from roq.tools.zkserver import stop_process_group
from tests.integration.test_cli import assert_one_line_error, roq
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_cluster_up_brings_back_saved_queues_on_the_same_port_and_restarts_what_died(tmp_path):
    run = tmp_path / ".roq" / "cluster"
    try:
        first = roq("cluster", "up", "--gcms", "1", "--hcms", "2", cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        assert "brought back" not in first.stdout  # nothing was saved
        assert roq("queue", "create", "kept", "-x", "2", cwd=tmp_path).returncode == 0
        port = ClusterState.load(run).zk_hosts
        assert roq("cluster", "down", cwd=tmp_path).returncode == 0

        second = roq("cluster", "up", cwd=tmp_path)
        assert second.returncode == 0, second.stderr
        assert "brought back 1 saved queue: kept" in second.stdout, second.stdout
        assert ClusterState.load(run).zk_hosts == port  # clients configured for it keep working
        assert f"ZooKeeper at {port}" in second.stdout

        # ZooKeeper and an HCM die; `up` starts those two again, and only those.
        state = ClusterState.load(run)
        pids = {p["name"]: p["pid"] for p in state.processes}
        stop_process_group(pids["zookeeper"], grace=0.5)
        os.kill(pids["host-2"], signal.SIGKILL)
        wait_until(lambda: len(ClusterState.load(run).alive()) == len(pids) - 2, timeout=15,
                   message="ZooKeeper and host-2 gone")
        repaired = roq("cluster", "up", cwd=tmp_path)
        assert repaired.returncode == 0, repaired.stderr
        assert "restarted zookeeper, host-2" in repaired.stdout, repaired.stdout
        assert "brought back 1 saved queue: kept" in repaired.stdout
        now = {p["name"]: p["pid"] for p in ClusterState.load(run).processes}
        assert now["gcm-1"] == pids["gcm-1"] and now["host-1"] == pids["host-1"]
        assert now["host-2"] != pids["host-2"] and ClusterState.load(run).zk_hosts == port
        # `up` may return on host-2's old registration (ZooKeeper kept its session): the new one follows it.
        wait_until(lambda: sorted(h["name"] for h in json.loads(
            roq("cluster", "status", "--json", cwd=tmp_path).stdout)["hosts"]) == ["host-1", "host-2"],
            timeout=30, message="both hosts registered again")

        assert_one_line_error(roq("cluster", "up", cwd=tmp_path), 1, "already running")
        changed = roq("--set", "exchange.journal=fsync", "cluster", "up", cwd=tmp_path)
        assert_one_line_error(changed, 1, "with other settings")
    finally:
        down = roq("cluster", "down", cwd=tmp_path)
    assert down.returncode == 0 and "stopped 4 processes" in down.stdout, down.stdout
