"""The leader's tick: compare where exchanges should run with the hosts alive.

Exchanges on a host that has been gone for `gcm.reassign_grace` seconds, and
exchanges never placed (no capacity at the time), are moved to the least
loaded survivors. The hosts' assignment lists are repaired to match the
placements, and `live/` to hold one directory per queue. Every write is
fenced (gcm.fence), the directories it needs too; a refused one simply ends
the tick.

Everything is read from the leader's cache (gcm.cache): a tick with nothing to do
sends ZooKeeper nothing. When the cache's assignment lists and placements differ,
both are read again from ZooKeeper itself and only what that read shows is
repaired, so a cache behind ZooKeeper never deletes a right assignment; if
ZooKeeper shows no difference, the cache is read again in full.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import NoNodeError, NotEmptyError

from gcm.fence import LeaderFence
from gcm.placement import choose_hosts, host_loads
from gcm.queues import QueueManager
from gcm.view import Placements, read_placements
from roq.paths import Paths, split_assignment
from roq.state import HostInfo, Source, queue_names, read_hosts, tree
from roq.zk import encode

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence,
                 queues: QueueManager, write_lock: threading.Lock, grace: float) -> None:
        self.client = client
        self.paths = paths
        self.fence = fence
        self.queues = queues
        self.cache = queues.cache
        self.write_lock = write_lock
        self.grace = grace
        self._missing_since: dict[str, float] = {}
        self.moves = 0  # exchanges moved since this leader started (for status)

    def tick(self) -> dict[str, HostInfo]:
        """One pass; returns the hosts it saw, for the rest of the leader's tick."""
        with self.write_lock:
            hosts = read_hosts(self.cache, self.paths)
            placements = self.queues.all_placements()
            movable = self._hosts_to_evacuate(hosts, placements.values())
            self._place_orphans(hosts, placements, movable)
            self._repair_assignments(placements, hosts)
            self._repair_live_dirs()
        return hosts

    def _hosts_to_evacuate(self, hosts: dict[str, HostInfo], placed: Iterable[str | None]) -> set[str]:
        now = time.monotonic()
        gone = {h for h in placed if h and h not in hosts}
        for host in list(self._missing_since):
            if host not in gone:
                del self._missing_since[host]
        for host in gone:
            if host not in self._missing_since:
                log.warning("host %s is gone; its exchanges move in %.1fs", host, self.grace)
                self._missing_since[host] = now
        return {h for h in gone if now - self._missing_since[h] >= self.grace}

    def _place_orphans(self, hosts: dict[str, HostInfo], placements: Placements, evacuate: set[str]) -> None:
        capacities = {h.name: h.capacity for h in hosts.values()}
        for (queue, xid), old in sorted(placements.items()):
            if old is not None and old not in evacuate:
                continue
            loads = host_loads(capacities, placements.values())
            if all(load.assigned >= load.capacity for load in loads):
                return  # every host is full: the other orphans wait for the next tick too
            spread: dict[str, int] = {}
            for (q, _), h in placements.items():
                if q == queue and h is not None and h in capacities:
                    spread[h] = spread.get(h, 0) + 1
            picks = choose_hosts(1, loads, spread)
            if not picks:
                continue  # no capacity anywhere; retried next tick
            self._move(queue, xid, old, picks[0])
            placements[(queue, xid)] = picks[0]

    def _move(self, queue: str, xid: str, old: str | None, new: str) -> None:
        self.fence.ensure_path(self.paths.host_assignments(new))
        old_assignment = self.paths.assignment(old, queue, xid) if old else None

        def build(txn: TransactionRequest) -> None:
            txn.set_data(self.paths.exchange(queue, xid), encode({"host": new}))
            if old_assignment and self.client.exists(old_assignment):
                txn.delete(old_assignment)
            txn.create(self.paths.assignment(new, queue, xid), encode({"queue": queue, "exchange": xid}))

        self.fence.write(build)
        self.moves += 1
        log.info("moved exchange %s/%s from %s to %s", queue, xid, old or "(unplaced)", new)

    def _repair_assignments(self, cached: Placements, hosts: dict[str, HostInfo]) -> None:
        if self._assignments(self.cache) == _assigned(cached):
            return
        # Repair only what ZooKeeper itself shows: the cache may be behind on part of a change.
        actual, expected = self._assignments(self.client), _assigned(read_placements(self.client, self.paths))
        extra, missing = actual - expected, expected - actual
        if not extra and not missing:
            log.info("the cache's placements and assignments differed, ZooKeeper's do not: reading it again")
            self.cache.reset()
            return
        for host in sorted({host for host, _, _ in missing}):
            self.fence.ensure_path(self.paths.host_assignments(host))

        def build(txn: TransactionRequest) -> None:
            for host, q, x in extra:
                txn.delete(self.paths.assignment(host, q, x))
            for host, q, x in missing:
                txn.create(self.paths.assignment(host, q, x), encode({"queue": q, "exchange": x}))

        self.fence.write(build)
        log.warning("repaired assignments: removed %d, added %d", len(extra), len(missing))

    def _assignments(self, source: Source) -> set[tuple[str, str, str]]:
        """(host, queue, exchange) of every assignment listed."""
        reader = tree(source)
        return {(host, *split_assignment(name)) for host in reader.children(self.paths.assignments)
                for name in reader.children(self.paths.host_assignments(host))}

    def _repair_live_dirs(self) -> None:
        """`live/<queue>` for every queue and no other: clients watch it, and those with a read-only
        identity cannot make it (a create whose own ensure_path failed is mended here)."""
        queues = set(queue_names(self.cache, self.paths))
        dirs = set(self.cache.children(self.paths.live))
        for queue in sorted(queues - dirs):
            self.fence.ensure_path(self.paths.live_queue(queue))
        for queue in sorted(dirs - queues):
            def build(txn: TransactionRequest, q: str = queue) -> None:
                txn.delete(self.paths.live_queue(q))

            try:
                self.fence.write(build)
            except (NoNodeError, NotEmptyError):
                pass  # its exchanges are still stopping


def _assigned(placed: Placements) -> set[tuple[str, str, str]]:
    """(host, queue, exchange) of every placed exchange: what the assignment lists should hold."""
    return {(h, q, x) for (q, x), h in placed.items() if h}
