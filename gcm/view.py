"""Where every slot is placed: (queue, slot) → host, or None while unplaced.

A slot is an exchange ("x1") or, for a queue with replicas 2, that exchange's replica ("x1~r",
roq.paths.replica_slot). Both live in the exchange's placement znode, `{"host": H1, "replica": H2}`
(`placement_data`); the replica slot exists for every exchange of a queue whose settings say
replicas 2, even while its placement has no `replica` yet (then it reads as unplaced).

`PlacementView` reads the placements from the leader's cache (gcm.cache), kept current by
ZooKeeper and showing the leader's own committed writes, so `queue.create`, `queue.scale` and the
reconcile tick read them without a round trip (from ZooKeeper they cost three reads per queue and
one per exchange). `read_placements(source)` reads the same from any source: the reconciler reads
ZooKeeper itself with it before it repairs anything.

Full disks (docs/guarantees.md "A full disk"): `storage_full` lists the running exchanges whose
journal's disk refuses writes, as their statistics say; `full_hosts` the hosts no exchange may
be placed on: those that keep journals with less than `gcm.min_free_bytes` free on their data
disk, as they report it, and those where an exchange cannot write its journal right now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gcm.cache import ClusterCache
from roq.paths import Paths, is_replica_slot, primary_of, replica_slot
from roq.records import ExchangeStats, HostStats
from roq.state import HostInfo, Source, queue_names, read_exchanges, read_live, replica_count, tree
from roq.storage_policy import policy_of

Placements = dict[tuple[str, str], str | None]


class PlacementView:
    def __init__(self, cache: ClusterCache, paths: Paths) -> None:
        self.cache = cache
        self.paths = paths

    def get(self) -> Placements:
        """A dict the caller may change."""
        return read_placements(self.cache, self.paths)

    def invalidate(self) -> None:
        """Read everything from ZooKeeper again at the next use (a new term, a doubt)."""
        self.cache.reset()


def read_placements(source: Source, paths: Paths) -> Placements:
    found: Placements = {}
    reader = tree(source)
    for queue in queue_names(reader, paths):
        replicated = replica_count(reader.read_json(paths.queue(queue)) or {}) == 2
        for x in read_exchanges(reader, paths, queue, live=False):
            found[(queue, x.id)] = x.host
            if replicated:
                found[(queue, replica_slot(x.id))] = x.replica
    return found


def keeps_frames_on_disk(source: Source, paths: Paths, queue: str) -> bool:
    """Whether `queue`'s storage policy keeps frames on disk: its slots' segment stores stay on
    their hosts (a lost host is waited for, an exchange without a replica is not rebalanced)."""
    return policy_of(tree(source).read_json(paths.queue(queue)) or {}).on_disk


def exchanges_only(placements: Placements) -> Placements:
    """The exchanges' own placements, without their replicas'."""
    return {key: host for key, host in placements.items() if not is_replica_slot(key[1])}


def replicas_only(placements: Placements) -> Placements:
    """The replicas' placements, keyed by their slots."""
    return {key: host for key, host in placements.items() if is_replica_slot(key[1])}


def placement_data(placements: Placements, queue: str, xid: str) -> dict[str, Any]:
    """What exchange `xid`'s placement znode holds, given where its slots are."""
    data: dict[str, Any] = {"host": placements.get((queue, xid))}
    if (queue, replica_slot(xid)) in placements:
        data["replica"] = placements[(queue, replica_slot(xid))]
    return data


def assignment_data(queue: str, slot: str) -> dict[str, Any]:
    """What a host's assignment of `slot` holds; a replica's names its exchange and its role."""
    if is_replica_slot(slot):
        return {"queue": queue, "exchange": primary_of(slot), "role": "replica"}
    return {"queue": queue, "exchange": slot}


def storage_full(source: Source, paths: Paths) -> dict[tuple[str, str], tuple[str, str, str]]:
    """Running exchanges that cannot write their journal: (queue, xid) → (host, incarnation, error)."""
    found = {}
    reader = tree(source)
    for queue in queue_names(reader, paths):
        for xid, data in read_live(reader, paths, queue).items():
            stats = ExchangeStats.from_dict(data.get("stats"))
            if stats.storage_full:
                found[(queue, xid)] = (str(data.get("host")), str(data.get("incarnation")), stats.storage_error)
    return found


def full_hosts(hosts: Mapping[str, HostInfo], min_free_bytes: int, refusing: Iterable[str] = ()) -> set[str]:
    """Hosts whose disk takes no more journals: those keeping journals whose data disk reports less
    than `min_free_bytes` free (an HCM that reports no disk counts as having room), and `refusing`
    (hosts where an exchange cannot write its journal now)."""
    full = set(refusing)
    for host in hosts.values():
        figures = HostStats.from_dict(host.stats)
        if host.journal != "off" and figures.data_total_bytes > 0 and figures.data_free_bytes < min_free_bytes:
            full.add(host.name)
    return full
