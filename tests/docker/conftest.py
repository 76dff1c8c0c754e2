"""Fixtures for the Docker failover suite: a real engine, the locally built image,
one launcher per test that always removes what it started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from roq.config import Config
from roq.tools.testing import wait_until
from roq.zk import start_client, stop_client
from tests.conftest import docker_engine, failed

# Timing shared by the containers (environment) and the test's own clients.
ENV = {
    "ROQ_ZK_SESSION_TIMEOUT": "4",
    "ROQ_GCM_TICK": "0.5",
    "ROQ_HCM_TICK": "0.2",
    "ROQ_HCM_RESTART_BACKOFF": "0.2",
    "ROQ_EXCHANGE_STATS_INTERVAL": "0.5",
    "ROQ_CLIENT_CONFIRM_TIMEOUT": "2",
}


@pytest.fixture(scope="session")
def docker_client():
    return docker_engine("roq:test", "the Docker failover suite", "`make docker-images` starts dockerd and builds it")


class Lab:
    """A launcher plus the test-side view of the containerised cluster."""

    def __init__(self, launcher) -> None:
        self.launcher = launcher
        self.config: Config | None = None
        self.zk = None

    def start(self, zookeepers: int = 1, gcms: int = 2, hcms: int = 2) -> None:
        hosts = self.launcher.start_zookeepers(zookeepers)
        self.launcher.env["ROQ_ZK_HOSTS"] = hosts
        self.config = Config().replace(
            zk={"hosts": hosts, "session_timeout": 4.0},
            client={"confirm_timeout": 2.0, "request_timeout": 15.0},
        )
        self.zk = wait_until(lambda: start_client(self.config, timeout=3), timeout=60,
                             message="ZooKeeper in its container")
        for i in range(1, gcms + 1):
            self.launcher.start_gcm(f"gcm{i}")
        for i in range(1, hcms + 1):
            self.launcher.start_hcm(f"host{i}")
        from roq.paths import Paths
        from roq.state import read_hosts, read_leader
        self.paths = Paths(self.config.zk.root)
        wait_until(lambda: read_leader(self.zk, self.paths) and len(read_hosts(self.zk, self.paths)) == hcms,
                   timeout=60, message="a leader and every host")

    def close(self) -> None:
        if self.zk is not None:
            try:
                stop_client(self.zk)
            except Exception:
                pass


@pytest.fixture
def lab(docker_client, request) -> Iterator[Lab]:
    from roq.tools.docker_launcher import DockerLauncher
    launcher = DockerLauncher(client=docker_client, env=dict(ENV))
    the_lab = Lab(launcher)
    try:
        yield the_lab
    finally:
        the_lab.close()
        if failed(request):
            print(launcher.logs())
        launcher.teardown()
