"""A two-host cluster of real processes, and queues on it."""

from __future__ import annotations

import pytest

from roq.client.admin import Admin
from roq.state import read_hosts, read_leader, read_live
from tests.support.helpers import wait_until


@pytest.fixture
def cluster(config, zk, paths, procs):
    return start_cluster(procs, zk, paths)


def start_cluster(procs, zk, paths, *host_settings: str, gcm_settings: tuple[str, ...] = (), gcms: int = 1):
    """`gcms` GCMs (all in the election) and two HCMs; `host_settings` ("exchange.sub_hwm=5") reach the
    exchanges."""
    for i in range(gcms):
        procs.start("gcm", f"gcm-{i}", *gcm_settings)
    for host in ("host-1", "host-2"):
        procs.start("hcm", host, f"hcm.host={host}", *host_settings)
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 2
               and len(zk.get_children(paths.election)) == gcms, timeout=20, message="cluster")
    return procs


def create(config, zk, paths, name, exchanges):
    """Create a queue and wait until all its exchanges run."""
    with Admin(config) as admin:
        admin.create_queue(name, exchanges=exchanges)
    wait_until(lambda: len(read_live(zk, paths, name)) == exchanges, timeout=15, message="exchanges live")
