"""A two-host cluster of real processes, and queues on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from roq.client.admin import Admin
from roq.config import Config
from roq.paths import Paths
from roq.state import read_hosts, read_leader, read_live
from roq.zk import start_client, stop_client
from tests.support.helpers import Processes, fast_config, wait_until


@dataclass
class SharedCluster:
    config: Config
    zk: KazooClient
    paths: Paths
    procs: Processes

    def endpoints(self) -> list[str]:
        """The control endpoints of the GCMs in the election, sorted."""
        from roq.state import tree
        return sorted(tree(self.zk).read_json(f"{self.paths.election}/{c}")["endpoint"]
                      for c in self.zk.get_children(self.paths.election))

    def wait_healthy(self, gcms: int = 2) -> None:
        """A leader, `gcms` GCMs in the election and both hosts: what a test that follows one which
        stopped ZooKeeper or killed a process starts from."""
        wait_until(lambda: read_leader(self.zk, self.paths) and len(read_hosts(self.zk, self.paths)) == 2
                   and len(self.zk.get_children(self.paths.election)) == gcms, timeout=30, message="a healthy cluster")


@pytest.fixture(scope="module")
def two_gcm_cluster(zookeeper, tmp_path_factory: pytest.TempPathFactory,
                    request: pytest.FixtureRequest) -> Iterator[SharedCluster]:
    """Two GCMs and two HCMs shared by the tests of one module (one instance per module): each test
    uses queues of its own names."""
    with shared_cluster(zookeeper, tmp_path_factory.mktemp("two-gcms"), request, gcms=2) as cluster:
        yield cluster


@contextmanager
def shared_cluster(zookeeper, workdir: Path, request: pytest.FixtureRequest, *host_settings: str,
                   gcms: int = 1) -> Iterator[SharedCluster]:
    """A cluster (start_cluster) in a ZooKeeper root of its own, for the tests of a module; the
    daemons' logs are printed if one of them failed."""
    config = fast_config(zookeeper.connect_string)
    procs = Processes(config, workdir / "daemons")
    zk = start_client(config)
    failures = request.session.testsfailed
    try:
        start_cluster(procs, zk, Paths(config.zk.root), *host_settings, gcms=gcms)
        yield SharedCluster(config, zk, Paths(config.zk.root), procs)
    finally:
        procs.stop_all()
        if request.session.testsfailed > failures:  # a test of the module failed: the daemons' side
            print(procs.dump_logs())
        stop_client(zk)


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
    # A GCM just started may not listen yet: the client gives up once every seed refused for 1.5 s.
    wait_until(lambda: read_leader(zk, paths), timeout=30, message="a leader")
    with Admin(config) as admin:
        admin.create_queue(name, exchanges=exchanges)
    wait_until(lambda: len(read_live(zk, paths, name)) == exchanges, timeout=15, message="exchanges live")
