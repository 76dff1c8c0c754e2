"""Reading the cluster's state from ZooKeeper: shared by the GCM and the clients.

Every reader takes a `Source`: a KazooClient reads ZooKeeper itself (a round trip per znode), and
anything else answering `children` and `read_json` the same way is read instead — the leader
passes its cache of the tree (gcm.cache), kept current by ZooKeeper's watches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

from kazoo.client import KazooClient

from roq import zk
from roq.paths import Paths


@runtime_checkable
class Tree(Protocol):
    """The tree as a reader sees it: a missing znode lists no children and reads as None."""

    def children(self, path: str) -> list[str]:
        """Names of the children of `path`, sorted."""

    def read_json(self, path: str) -> dict[str, Any] | None:
        """The znode's data as a dict (roq.zk.decode), or None if there is no such znode."""


Source: TypeAlias = KazooClient | Tree


class _ZooKeeper:
    """ZooKeeper itself, read through the client's retry."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client

    def children(self, path: str) -> list[str]:
        return zk.children(self.client, path)

    def read_json(self, path: str) -> dict[str, Any] | None:
        return zk.read_json(self.client, path)


def tree(source: Source) -> Tree:
    return source if isinstance(source, Tree) else _ZooKeeper(source)


@dataclass(frozen=True)
class HostInfo:
    name: str
    address: str
    capacity: int
    pid: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    journal: str = "off"  # its exchanges' exchange.journal: they are worth waiting for when it goes
    metrics: str | None = None  # its HCM's Prometheus URL (None: hcm.metrics_port = -1)
    journals: int = 0  # incarnations' journals on its disk when its HCM started (any journal setting)
    zone: str = ""  # hcm.zone: its failure domain (an EC2 availability zone); "" for none

    @property
    def keeps_journals(self) -> bool:
        """Its disk holds (or its exchanges write) journals that no other host has."""
        return self.journal != "off" or self.journals > 0


@dataclass(frozen=True)
class ExchangeInfo:
    queue: str
    id: str
    host: str | None
    live: dict[str, Any] | None = None  # endpoints and statistics, while it runs
    # With replicas 2: the replica's host (None while unplaced), and its endpoints while it runs.
    replica: str | None = None
    replica_live: dict[str, Any] | None = None

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
    replicas: int = 1  # processes per exchange: 1, or 2 with a replica (replica_count)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_leader(source: Source, paths: Paths) -> dict[str, Any] | None:
    return tree(source).read_json(paths.leader)


def read_hosts(source: Source, paths: Paths) -> dict[str, HostInfo]:
    hosts = {}
    reader = tree(source)
    for name in reader.children(paths.hosts):
        data = reader.read_json(paths.host(name))
        if data is None:  # vanished between the listing and the read
            continue
        metrics, journals = data.get("metrics"), data.get("journals")
        hosts[name] = HostInfo(name, str(data.get("address", "")), int(data.get("capacity", 0)),
                               data.get("pid"), data.get("stats") or {}, str(data.get("journal", "off")),
                               metrics if isinstance(metrics, str) else None,
                               journals if isinstance(journals, int) and not isinstance(journals, bool) else 0,
                               str(data.get("zone") or ""))
    return hosts


def queue_names(source: Source, paths: Paths) -> list[str]:
    return tree(source).children(paths.queues)


def read_exchanges(source: Source, paths: Paths, queue: str, live: bool = True) -> list[ExchangeInfo]:
    """The queue's exchanges, in id order; with `live`, their running endpoints and their replicas'."""
    result = []
    reader = tree(source)
    for xid in reader.children(paths.exchanges(queue)):
        data = reader.read_json(paths.exchange(queue, xid))
        if data is None:
            continue
        running = reader.read_json(paths.live_exchange(queue, xid)) if live else None
        replicated = "replica" in data  # written for every exchange of a replicas-2 queue
        replica_running = reader.read_json(paths.replica_live(queue, xid)) if live and replicated else None
        result.append(ExchangeInfo(queue, xid, data.get("host"), running, data.get("replica"), replica_running))
    return sorted(result, key=lambda x: exchange_order(x.id))


def read_queue(source: Source, paths: Paths, queue: str) -> QueueInfo | None:
    reader = tree(source)
    settings = reader.read_json(paths.queue(queue))
    if settings is None:
        return None
    return QueueInfo(queue, settings, read_exchanges(reader, paths, queue), replica_count(settings))


def replica_count(settings: dict[str, Any]) -> int:
    """Processes per exchange of a queue with these settings: 2 with a replica, else 1 (a queue made
    before replicas existed has no key)."""
    return 2 if settings.get("replicas") == 2 else 1


def read_live(source: Source, paths: Paths, queue: str) -> dict[str, dict[str, Any]]:
    """Running exchanges of a queue: id → {pub, sub, host, stats}."""
    live = {}
    reader = tree(source)
    for xid in reader.children(paths.live_queue(queue)):
        data = reader.read_json(paths.live_exchange(queue, xid))
        if data:
            live[xid] = data
    return live


def exchange_order(xid: str) -> tuple[int, str]:
    """x2 before x10."""
    digits = xid.lstrip("x")
    return (int(digits), xid) if digits.isdigit() else (1 << 30, xid)
