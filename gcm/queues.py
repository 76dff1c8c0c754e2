"""Queue operations of the leader: create, delete, scale, list, describe.

Every change is one fenced transaction that writes the queue, its exchanges' placements (and
replicas') and the hosts' assignment lists together, so ZooKeeper never holds a half-created queue
and a deposed leader changes nothing; a keyed retry changes nothing more. `create` with `exist_ok`
and `delete` with `if_empty` / `if_unused` judge from the leader's cache; `delete` and `scale` read
the queue they change from ZooKeeper itself. The rules in full: docs/leader.md "Queue operations".
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import NodeExistsError

from gcm.cache import ClusterCache
from gcm.commands import command_paths
from gcm.fence import LeaderFence
from gcm.placement import host_loads, place_new_exchanges
from gcm.view import (
    Placements,
    PlacementView,
    assignment_data,
    exchanges_only,
    full_hosts,
    placement_data,
    storage_full,
)
from roq.errors import LimitExceededError, PreconditionFailedError, QueueExistsError, QueueNotFoundError, UserError
from roq.names import MAX_EXCHANGES, check_queue_name
from roq.paths import Paths, replica_slot
from roq.records import ExchangeStats
from roq.state import (
    ExchangeInfo,
    exchange_order,
    queue_names,
    read_exchanges,
    read_hosts,
    read_live,
    read_queue,
    replica_count,
)
from roq.storage_policy import StoragePolicy, check_retention, check_retention_bytes, policy_of
from roq.zk import encode, read_json

log = logging.getLogger(__name__)


def check_exchange_count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_EXCHANGES:
        raise UserError(f"exchanges must be an integer from 1 to {MAX_EXCHANGES}, got {value!r}")
    return value


def check_replica_count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value not in (1, 2):
        raise UserError(f"replicas must be 1 or 2, got {value!r}")
    return value


def check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{name} must be true or false, got {value!r}")
    return value


class QueueManager:
    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence,
                 write_lock: threading.Lock, max_queues: int, default_replicas: int = 1,
                 min_free_bytes: int = 0, default_policy: StoragePolicy = StoragePolicy()) -> None:
        self.client = client
        self.max_queues = max_queues
        self.default_replicas = default_replicas
        self.default_policy = default_policy  # gcm.default_retention, gcm.default_retention_bytes
        self.min_free_bytes = min_free_bytes  # gcm.min_free_bytes: a journaling host with less takes no exchange
        self.paths = paths
        self.fence = fence
        self.write_lock = write_lock
        self.cache = ClusterCache(client, paths, fence)
        self.view = PlacementView(self.cache, paths)

    # ------------------------------------------------------------ reads

    def list(self) -> list[dict[str, Any]]:
        result = []
        for name in queue_names(self.cache, self.paths):
            exchanges = read_exchanges(self.cache, self.paths, name, live=False)
            live = read_live(self.cache, self.paths, name)
            settings = self.cache.read_json(self.paths.queue(name)) or {}
            result.append({"name": name, "exchanges": len(exchanges), "replicas": replica_count(settings),
                           "placed": sum(1 for x in exchanges if x.host),
                           "running": sum(1 for x in exchanges if x.id in live), **policy_of(settings).to_dict()})
        return result

    def describe(self, name: Any) -> dict[str, Any]:
        info = read_queue(self.cache, self.paths, check_queue_name(name))
        if info is None:
            raise QueueNotFoundError(f"queue {name!r} does not exist")
        return dict(info.to_dict(), **policy_of(info.settings).to_dict())

    # ------------------------------------------------------------ writes

    def create(self, name: Any, exchanges: Any = None, replicas: Any = None, exist_ok: Any = False,
               retention: Any = None, retention_bytes: Any = None) -> dict[str, Any]:
        """`exchanges` (default 1), `replicas` (default gcm.default_replicas) and the storage policy
        (default gcm.default_retention, gcm.default_retention_bytes: roq/storage_policy.py); with
        `exist_ok` an existing queue with the settings named is success (the module docstring)."""
        name = check_queue_name(name)
        count = check_exchange_count(1 if exchanges is None else exchanges)
        asked = {"exchanges": exchanges, "replicas": replicas, "retention": retention,
                 "retention_bytes": retention_bytes}
        replicas = check_replica_count(self.default_replicas if replicas is None else replicas)
        policy = StoragePolicy(
            self.default_policy.retention if retention is None else check_retention(retention),
            self.default_policy.retention_bytes if retention_bytes is None else check_retention_bytes(retention_bytes))
        exist_ok = check_flag("exist_ok", exist_ok)
        with self.write_lock:
            if self.fence.already_applied():
                return self.describe(name)
            names = queue_names(self.cache, self.paths)
            if name in names:
                if exist_ok:
                    return self._as_asked(name, asked)
                raise QueueExistsError(f"queue {name!r} already exists")
            existing = len(names)
            if existing >= self.max_queues:
                raise LimitExceededError(f"the cluster has {existing} queues, the limit (gcm.max_queues) "
                                         f"is {self.max_queues}: delete one first")
            placed = self._place([f"x{i}" for i in range(1, count + 1)], name, replicas)
            settings = {"created": time.time(), "next_exchange": count + 1, "replicas": replicas, **policy.to_dict()}

            def build(txn: TransactionRequest) -> None:
                txn.create(self.paths.queue(name), encode(settings))
                txn.create(self.paths.exchanges(name), b"")
                self._add_exchanges(txn, name, placed)

            self._ensure_assignment_dirs(placed)
            try:
                self.fence.write(build)
            except NodeExistsError:
                if self.client.retry(self.client.exists, self.paths.queue(name)):  # the cache was behind
                    if exist_ok:
                        return self._as_asked(name, asked)
                    raise QueueExistsError(f"queue {name!r} already exists") from None
                raise
            # Clients with a read-only ZooKeeper identity watch them and cannot create them themselves.
            self.fence.ensure_path(self.paths.live_queue(name))
            self.fence.ensure_path(self.paths.replica_queue(name))
        log.info("created queue %s with %d exchanges (replicas %d) on %s", name, count, replicas,
                 _where(placed))
        return self.describe(name)

    def delete(self, name: Any, if_empty: Any = False, if_unused: Any = False) -> dict[str, Any]:
        name = check_queue_name(name)
        if_empty, if_unused = check_flag("if_empty", if_empty), check_flag("if_unused", if_unused)
        with self.write_lock:
            if self.fence.already_applied():
                return {"name": name, "deleted": True}
            if not self.client.exists(self.paths.queue(name)):
                raise QueueNotFoundError(f"queue {name!r} does not exist")
            if if_empty or if_unused:
                self._check_deletable(name, if_empty, if_unused)
            exchanges = read_exchanges(self.client, self.paths, name, live=False)
            relocations = self.client.exists(self.paths.relocations(name))
            commands = command_paths(self.client, self.paths, name)

            def build(txn: TransactionRequest) -> None:
                for x in exchanges:
                    self._remove_exchange(txn, x)
                txn.delete(self.paths.exchanges(name))
                txn.delete(self.paths.queue(name))
                if relocations:
                    txn.delete(self.paths.relocations(name))
                for path in commands:
                    txn.delete(path)

            self.fence.write(build)
        log.info("deleted queue %s", name)
        return {"name": name, "deleted": True}

    def scale(self, name: Any, exchanges: Any) -> dict[str, Any]:
        """Add exchanges (placed least loaded first) or remove the newest ones."""
        name, target = check_queue_name(name), check_exchange_count(exchanges)
        with self.write_lock:
            if self.fence.already_applied():
                return self.describe(name)
            settings = self._settings(name)
            current = read_exchanges(self.client, self.paths, name, live=False)
            if target > len(current):
                first = int(settings.get("next_exchange", len(current) + 1))
                ids = [f"x{first + i}" for i in range(target - len(current))]
                placed = self._place(ids, name, replica_count(settings))
                settings["next_exchange"] = first + len(ids)
                self._ensure_assignment_dirs(placed)

                def build(txn: TransactionRequest) -> None:
                    txn.set_data(self.paths.queue(name), encode(settings))
                    self._add_exchanges(txn, name, placed)
            else:
                doomed = sorted(current, key=lambda x: exchange_order(x.id))[target:]

                def build(txn: TransactionRequest) -> None:
                    for x in doomed:
                        self._remove_exchange(txn, x)

            self.fence.write(build)
        log.info("scaled queue %s to %d exchanges", name, target)
        return self.describe(name)

    def set_policy(self, name: Any, retention: Any = None, retention_bytes: Any = None) -> dict[str, Any]:
        """`queue.set`: change the storage policy (the values given; at least one). One fenced write of
        the settings znode; the HCMs hand the new policy to the running exchanges, restarting none."""
        name = check_queue_name(name)
        if retention is None and retention_bytes is None:
            raise UserError("queue.set needs retention or retention_bytes (or both)")
        changes: dict[str, Any] = {}
        if retention is not None:
            changes["retention"] = check_retention(retention)
        if retention_bytes is not None:
            changes["retention_bytes"] = check_retention_bytes(retention_bytes)
        with self.write_lock:
            if self.fence.already_applied():
                return self.describe(name)
            settings = dict(self._settings(name), **changes)
            self.fence.write(lambda txn: txn.set_data(self.paths.queue(name), encode(settings)))
        log.info("queue %s storage policy: %s", name, policy_of(settings).describe())
        return self.describe(name)

    # ------------------------------------------------------------ helpers

    def _settings(self, name: str) -> dict[str, Any]:
        """A copy of the queue's settings as ZooKeeper holds them (not the cache: they are about to change)."""
        found = read_json(self.client, self.paths.queue(name))
        if found is None:
            raise QueueNotFoundError(f"queue {name!r} does not exist")
        return dict(found)

    def _as_asked(self, name: str, asked: dict[str, Any]) -> dict[str, Any]:
        """The existing queue's description if it has the settings the request named, else
        QueueExistsError naming what differs."""
        info = read_queue(self.cache, self.paths, name)
        if info is None:  # deleted meanwhile: the client's retry creates it
            raise QueueExistsError(f"queue {name!r} was being deleted; retry")
        has = {"exchanges": len(info.exchanges), "replicas": info.replicas, **policy_of(info.settings).to_dict()}
        if info.settings.get("rules"):
            has["exchanges"] = asked["exchanges"]  # autoscaled: the leader owns its size
        differ = [f"{key} {has[key]} (asked {want})" for key, want in asked.items()
                  if want is not None and has[key] != want]
        if differ:
            raise QueueExistsError(f"queue {name!r} already exists with other settings: {', '.join(differ)}")
        return dict(info.to_dict(), existed=True)

    def _check_deletable(self, name: str, if_empty: bool, if_unused: bool) -> None:
        """Refuse (PreconditionFailedError) to delete a queue that is not empty or not unused, as its
        exchanges' latest statistics say; or one that has an exchange that does not run or report."""
        holds, uses = [], []
        for x in read_exchanges(self.cache, self.paths, name):
            if x.live is None or x.live.get("silent"):
                raise PreconditionFailedError(f"exchange {x.id} of queue {name!r} is not running or not reporting: "
                                              "whether it holds messages or clients cannot be told")
            stats = ExchangeStats.from_dict(x.live.get("stats"))
            if stats.retained_frames:
                holds.append(f"{x.id} retains {stats.retained_frames} frames")
            holds += [f"group {g} holds {figures.backlog} messages on {x.id}"
                      for g, figures in stats.groups.items() if figures.backlog]
            if stats.publishers or stats.subscribers or stats.subscriptions:
                uses.append(f"{x.id} has {stats.publishers} publishers and {stats.subscribers} subscribers "
                            f"({stats.subscriptions} subscriptions)")
            uses += [f"group {g} has {figures.members} members on {x.id}"
                     for g, figures in stats.groups.items() if figures.members]
        if if_empty and holds:
            raise PreconditionFailedError(f"queue {name!r} is not empty: {'; '.join(holds)} "
                                          "(roq queue purge drops it)")
        if if_unused and uses:
            raise PreconditionFailedError(f"queue {name!r} is in use: {'; '.join(uses)}")

    def _place(self, ids: builtins.list[str], queue: str, replicas: int) -> Placements:
        """Slots of new exchanges `ids` of `queue` → hosts (None: unplaced), with their replicas'
        slots when `replicas` is 2. `list` is also a method here, hence builtins.list."""
        hosts = read_hosts(self.cache, self.paths)
        placements = self.all_placements()
        spread: dict[str, int] = {}
        for (q, _), host in placements.items():
            if q == queue and host:
                spread[host] = spread.get(host, 0) + 1
        loads = host_loads({h.name: h.capacity for h in hosts.values()}, placements.values(),
                           {h.name: h.zone for h in hosts.values()})
        refusing = {host for host, _, _ in storage_full(self.cache, self.paths).values()}
        full = full_hosts(hosts, self.min_free_bytes, refusing)
        placed: Placements = {}
        for xid, (host, replica) in zip(ids, place_new_exchanges(len(ids), loads, replicas, spread, full)):
            placed[(queue, xid)] = host
            if replicas == 2:
                placed[(queue, replica_slot(xid))] = replica
        return placed

    def all_placements(self) -> Placements:
        """Every slot's host (None: unplaced), replicas' included, from the cache (gcm.view)."""
        return self.view.get()

    def _ensure_assignment_dirs(self, placed: Placements) -> None:
        for host in sorted({host for host in placed.values() if host}):
            self.fence.ensure_path(self.paths.host_assignments(host))

    def _add_exchanges(self, txn: TransactionRequest, queue: str, placed: Placements) -> None:
        """Placements of the new exchanges in `placed`, and the assignments of every placed slot."""
        for xid in (slot for _, slot in exchanges_only(placed)):
            txn.create(self.paths.exchange(queue, xid), encode(placement_data(placed, queue, xid)))
        for (_, slot), host in placed.items():
            if host:
                txn.create(self.paths.assignment(host, queue, slot), encode(assignment_data(queue, slot)))

    def _remove_exchange(self, txn: TransactionRequest, x: ExchangeInfo) -> None:
        """The exchange's placement, and the assignments of it and of its replica that exist."""
        for host, slot in ((x.host, x.id), (x.replica, replica_slot(x.id))):
            if host and self.client.exists(self.paths.assignment(host, x.queue, slot)):
                txn.delete(self.paths.assignment(host, x.queue, slot))
        txn.delete(self.paths.exchange(x.queue, x.id))


def _where(placed: Placements) -> str:
    return ", ".join(f"{slot}@{host or 'unplaced'}" for (_, slot), host in placed.items())

