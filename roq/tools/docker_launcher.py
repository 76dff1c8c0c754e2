"""Run a RoQ cluster as Docker containers and break it on purpose (docker-py).

The Python counterpart of the original RoQDockerLauncher: a private bridge
network with a subnet of its own (so a disconnected container can come back
with the same address), ZooKeeper / GCM / HCM containers from the locally
built `roq:test` image, and the faults: kill, stop, start, pause, unpause,
disconnect, reconnect. `teardown()` removes every container and the network,
whatever state they are in; `logs()` collects every container's output for
the report of a failing test.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import uuid
from dataclasses import dataclass
from typing import Any

from docker.errors import APIError, NotFound
from docker.models.containers import Container
from docker.types import IPAMConfig, IPAMPool

import docker

log = logging.getLogger(__name__)

IMAGE = "roq:test"
SUBNET_POOL = ipaddress.ip_network("172.30.0.0/16")  # /24s are carved out of it for test networks


@dataclass
class Node:
    name: str
    role: str
    container: Container
    ip: str


class DockerLauncher:
    def __init__(self, image: str = IMAGE, client: docker.DockerClient | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.client = client or docker.from_env(version="auto")
        self.image = image
        self.prefix = f"roq-{uuid.uuid4().hex[:8]}"
        self.env = dict(env or {})
        self.nodes: dict[str, Node] = {}
        self.network = self._create_network()

    # ------------------------------------------------------------ set-up

    def _create_network(self) -> Any:
        used = set()
        for net in self.client.networks.list():
            for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
                if cfg.get("Subnet"):
                    used.add(cfg["Subnet"])
        candidates = [str(s) for s in SUBNET_POOL.subnets(new_prefix=24) if str(s) not in used]
        subnet = random.choice(candidates)
        gateway = str(next(ipaddress.ip_network(subnet).hosts()))
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=subnet, gateway=gateway)])
        return self.client.networks.create(f"{self.prefix}-net", driver="bridge", ipam=ipam,
                                           labels={"roq-test": self.prefix})

    def _run(self, name: str, role: str, args: list[str] | None = None,
             env: dict[str, str] | None = None) -> Node:
        container = self.client.containers.run(
            self.image, [role, *(args or [])], name=f"{self.prefix}-{name}", hostname=name,
            detach=True, network=self.network.name, environment={**self.env, **(env or {})},
            labels={"roq-test": self.prefix}, init=True,
        )
        container.reload()
        ip = container.attrs["NetworkSettings"]["Networks"][self.network.name]["IPAddress"]
        node = Node(name, role, container, ip)
        self.nodes[name] = node
        log.info("started %s (%s) at %s", name, role, ip)
        return node

    def start_zookeepers(self, count: int = 1) -> str:
        """Start a standalone node or an ensemble; returns the connection string."""
        names = [f"zk{i}" for i in range(1, count + 1)]
        # Members find each other by container name (Docker's DNS on a user network).
        servers = ",".join(f"{i}={self.prefix}-{name}" for i, name in enumerate(names, 1)) if count > 1 else ""
        for i, name in enumerate(names, 1):
            self._run(name, "zookeeper", env={"ZK_ID": str(i), "ZK_SERVERS": servers})
        return self.zk_hosts()

    def zk_hosts(self) -> str:
        return ",".join(f"{n.ip}:2181" for n in self.nodes.values() if n.role == "zookeeper")

    def start_gcm(self, name: str) -> Node:
        return self._run(name, "gcm")

    def start_hcm(self, name: str) -> Node:
        return self._run(name, "hcm", env={"ROQ_HCM_HOST": name})

    def node_by_ip(self, ip: str) -> Node:
        return next(n for n in self.nodes.values() if n.ip == ip)

    # ------------------------------------------------------------ faults

    def kill(self, name: str) -> None:
        self.nodes[name].container.kill()

    def stop(self, name: str, timeout: int = 10) -> None:
        self.nodes[name].container.stop(timeout=timeout)

    def start(self, name: str) -> None:
        self.nodes[name].container.start()

    def restart(self, name: str, timeout: int = 10) -> None:
        self.nodes[name].container.restart(timeout=timeout)

    def pause(self, name: str) -> None:
        self.nodes[name].container.pause()

    def unpause(self, name: str) -> None:
        self.nodes[name].container.unpause()

    def disconnect(self, name: str) -> None:
        self.network.disconnect(self.nodes[name].container, force=True)

    def reconnect(self, name: str) -> None:
        node = self.nodes[name]
        self.network.connect(node.container, ipv4_address=node.ip, aliases=[name])

    def is_running(self, name: str) -> bool:
        self.nodes[name].container.reload()
        return self.nodes[name].container.status == "running"

    # ------------------------------------------------------------ reports and clean-up

    def logs(self, tail: int = 200) -> str:
        parts = []
        for node in self.nodes.values():
            try:
                text = node.container.logs(tail=tail).decode(errors="replace")
            except (NotFound, APIError) as exc:
                text = f"(no logs: {exc})"
            parts.append(f"----- {node.name} ({node.role}, {node.ip}) -----\n{text}")
        return "\n".join(parts)

    def teardown(self) -> None:
        for node in self.nodes.values():
            try:
                node.container.remove(force=True)  # also works on paused containers
            except NotFound:
                pass
            except APIError as exc:
                log.warning("could not remove %s: %s", node.name, exc)
        for container in self.client.containers.list(all=True, filters={"label": f"roq-test={self.prefix}"}):
            container.remove(force=True)
        try:
            self.network.remove()
        except (NotFound, APIError) as exc:
            log.warning("could not remove network: %s", exc)
