"""One cluster for the web tests: real ZooKeeper, a GCM, two HCMs and a `roq-web` process with
web.auth on (an admin and a client token), shared by the module's tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from roq.config import Config
from roq.paths import Paths
from roq.state import read_hosts, read_leader
from roq.tools.zkserver import ZooKeeperServer
from roq.zk import start_client, stop_client
from roq_web.auth import add_token
from tests.conftest import failed
from tests.support.helpers import Processes, fast_config, wait_until


@dataclass
class WebCluster:
    url: str
    admin_token: str
    client_token: str
    config: Config
    zk: KazooClient
    procs: Processes

    def headers(self, token: str | None = None) -> dict[str, str]:
        token = token or self.client_token
        return {"Authorization": f"Bearer {token}"}


def start_gateway(procs: Processes, name: str = "web", *settings: str) -> str:
    """Start a roq-web process (a free port) and return its URL once it serves."""
    return procs.web(name, *settings)


@pytest.fixture(scope="module")
def web_cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[WebCluster]:
    workdir = tmp_path_factory.mktemp("web")
    tokens = workdir / "tokens"
    admin_token = add_token(tokens, "ops", "admin")
    client_token = add_token(tokens, "app", "client")
    config = fast_config(zookeeper.connect_string).replace(
        web={"auth": True, "tokens_file": str(tokens), "sample_interval": 0.5},
        client={"state_dir": str(workdir / "subscribers")})
    procs = Processes(config, Path(workdir) / "daemons")
    zk = start_client(config)
    paths = Paths(config.zk.root)
    try:
        procs.start("gcm", "gcm-0")
        for host in ("host-1", "host-2"):
            procs.start("hcm", host, f"hcm.host={host}")
        wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 2, message="cluster")
        url = start_gateway(procs)
        yield WebCluster(url, admin_token, client_token, config, zk, procs)
    finally:
        procs.stop_all()
        if failed(request):
            print(procs.dump_logs())
        stop_client(zk)
