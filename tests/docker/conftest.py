"""Fixtures for the Docker failover suite: a real engine, the locally built image,
one launcher per test that always removes what it started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from roq.config import Config
from roq.zk import start_client, stop_client
from tests.conftest import docker_engine, failed
from tests.support.helpers import wait_until

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
    from tests.support.docker_launcher import IMAGE
    return docker_engine(IMAGE, "the Docker failover suite", "`make docker-images` starts dockerd and builds it")


class Lab:
    """A launcher plus the test-side view of the containerised cluster."""

    def __init__(self, launcher) -> None:
        self.launcher = launcher
        self.config: Config | None = None
        self.zk = None
        self.hosts: list[str] = []

    def start(self, zookeepers: int = 1, gcms: int = 2, hcms: int = 2, env: dict[str, str] | None = None) -> None:
        """ZooKeeper, GCMs gcm1.., HCMs host1..; `env` adds settings for every container."""
        self.launcher.env.update(env or {})
        self.hosts = [f"host{i}" for i in range(1, hcms + 1)]
        hosts = self.launcher.start_zookeepers(zookeepers)
        self.launcher.env["ROQ_ZK_HOSTS"] = hosts
        self.config = Config().replace(
            zk={"hosts": hosts, "session_timeout": 4.0},
            client={"confirm_timeout": 2.0, "request_timeout": 15.0},
        )
        self.zk = wait_until(lambda: start_client(self.config, timeout=3), timeout=60,
                             message="ZooKeeper in its container")
        gcm_nodes = [self.launcher.start_gcm(f"gcm{i}") for i in range(1, gcms + 1)]
        # Clients reach the cluster through the GCMs (the entrypoint's gcm.port 5500), never ZooKeeper.
        seeds = ",".join(f"tcp://{node.ip}:5500" for node in gcm_nodes)
        self.config = self.config.replace(cluster={"seeds": seeds})
        self.launcher.env["ROQ_SEEDS"] = seeds  # client containers started from here on
        for i in range(1, hcms + 1):
            self.launcher.start_hcm(f"host{i}")
        from roq.paths import Paths
        from roq.state import read_hosts, read_leader
        self.paths = Paths(self.config.zk.root)
        wait_until(lambda: read_leader(self.zk, self.paths) and len(read_hosts(self.zk, self.paths)) == hcms,
                   timeout=60, message="a leader and every host")

    def create_queue(self, name: str, exchanges: int = 1, replicas: int = 1) -> None:
        """Create a queue and wait until every exchange (and, with replicas 2, its replica) runs."""
        from roq.client.admin import Admin
        with Admin(self.config) as admin:
            admin.create_queue(name, exchanges=exchanges, replicas=replicas)
        self.wait_serving(name, exchanges, replicas)

    def wait_serving(self, name: str, exchanges: int, replicas: int = 1, timeout: float = 60.0,
                     replacing: set[str] = frozenset()) -> None:
        """Wait until `exchanges` exchanges of queue `name` (and, with replicas 2, their
        replicas) run, none of them an incarnation in `replacing` (what ran before a restart:
        its znodes stay until the old session expires)."""
        from roq.state import read_live

        def serving(found: dict[str, dict]) -> bool:
            return len(found) == exchanges and not {d.get("incarnation") for d in found.values()} & replacing

        wait_until(lambda: serving(read_live(self.zk, self.paths, name))
                   and (replicas == 1 or serving(self.replicas_live(name))),
                   timeout=timeout, message=f"{exchanges} exchanges of {name!r} running"
                   + (" with their replicas" if replicas > 1 else "") + (" again" if replacing else ""))

    def incarnations(self, name: str) -> set[str]:
        """The incarnations of queue `name`'s running exchanges and replicas."""
        from roq.state import read_live
        found = [*read_live(self.zk, self.paths, name).values(), *self.replicas_live(name).values()]
        return {d["incarnation"] for d in found if d.get("incarnation")}

    def replicas_live(self, queue: str) -> dict[str, dict]:
        """Exchange id → its running replica's znode data (`replicas/<queue>/<x>`)."""
        import json

        from kazoo.exceptions import NoNodeError
        base = self.paths.replica_queue(queue)
        out = {}
        try:
            children = self.zk.get_children(base)
        except NoNodeError:
            return {}
        for xid in children:
            try:
                out[xid] = json.loads(self.zk.get(self.paths.replica_live(queue, xid))[0] or b"{}")
            except NoNodeError:
                continue
        return out

    def close(self) -> None:
        if self.zk is not None:
            try:
                stop_client(self.zk)
            except Exception:
                pass


@pytest.fixture
def lab(docker_client, request) -> Iterator[Lab]:
    from tests.support.docker_launcher import DockerLauncher
    launcher = DockerLauncher(client=docker_client, env=dict(ENV))
    the_lab = Lab(launcher)
    try:
        yield the_lab
    finally:
        the_lab.close()
        if failed(request):
            print(launcher.logs())
        launcher.teardown()
