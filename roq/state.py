"""Reading the cluster's state from ZooKeeper: shared by the GCM and the clients."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kazoo.client import KazooClient

from roq.paths import Paths
from roq.zk import children, read_json


@dataclass(frozen=True)
class HostInfo:
    name: str
    address: str
    capacity: int
    pid: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExchangeInfo:
    queue: str
    id: str
    host: str | None
    live: dict[str, Any] | None = None  # endpoints and statistics, while it runs

    @property
    def pub_endpoint(self) -> str | None:
        return (self.live or {}).get("pub")

    @property
    def sub_endpoint(self) -> str | None:
        return (self.live or {}).get("sub")


@dataclass(frozen=True)
class QueueInfo:
    name: str
    settings: dict[str, Any]
    exchanges: list[ExchangeInfo]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_leader(client: KazooClient, paths: Paths) -> dict[str, Any] | None:
    return read_json(client, paths.leader)


def read_hosts(client: KazooClient, paths: Paths) -> dict[str, HostInfo]:
    hosts = {}
    for name in children(client, paths.hosts):
        data = read_json(client, paths.host(name))
        if data is None:  # vanished between the listing and the read
            continue
        hosts[name] = HostInfo(name, str(data.get("address", "")), int(data.get("capacity", 0)),
                               data.get("pid"), data.get("stats") or {})
    return hosts


def queue_names(client: KazooClient, paths: Paths) -> list[str]:
    return children(client, paths.queues)


def read_exchanges(client: KazooClient, paths: Paths, queue: str, live: bool = True) -> list[ExchangeInfo]:
    result = []
    for xid in children(client, paths.exchanges(queue)):
        data = read_json(client, paths.exchange(queue, xid))
        if data is None:
            continue
        running = read_json(client, paths.live_exchange(queue, xid)) if live else None
        result.append(ExchangeInfo(queue, xid, data.get("host"), running))
    return sorted(result, key=lambda x: exchange_order(x.id))


def read_queue(client: KazooClient, paths: Paths, queue: str) -> QueueInfo | None:
    settings = read_json(client, paths.queue(queue))
    if settings is None:
        return None
    return QueueInfo(queue, settings, read_exchanges(client, paths, queue))


def read_live(client: KazooClient, paths: Paths, queue: str) -> dict[str, dict[str, Any]]:
    """Running exchanges of a queue: id → {pub, sub, host, stats}."""
    live = {}
    for xid in children(client, paths.live_queue(queue)):
        data = read_json(client, paths.live_exchange(queue, xid))
        if data:
            live[xid] = data
    return live


def exchange_order(xid: str) -> tuple[int, str]:
    """x2 before x10."""
    digits = xid.lstrip("x")
    return (int(digits), xid) if digits.isdigit() else (1 << 30, xid)
