"""The leader's tick: compare where exchanges should run with the hosts alive.

Exchanges on a host that has been gone for `gcm.reassign_grace` seconds, and
exchanges never placed (no capacity at the time), are moved to the least
loaded survivors. The hosts' assignment lists are repaired to match the
placements. Every write is fenced; a refused one simply ends the tick.

Placements come from the leader's view (gcm.view); the assignment lists are read
every tick, and a difference between the two makes the view be read again before
anything is repaired, so a stale view never deletes a right assignment.
"""

from __future__ import annotations

import logging
import threading
import time

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import NoNodeError, NotEmptyError

from gcm.fence import LeaderFence
from gcm.placement import choose_hosts, host_loads
from gcm.queues import QueueManager
from roq.paths import Paths, split_assignment
from roq.state import HostInfo, read_hosts, queue_names
from roq.zk import children, encode

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence,
                 queues: QueueManager, write_lock: threading.Lock, grace: float) -> None:
        self.client = client
        self.paths = paths
        self.fence = fence
        self.queues = queues
        self.write_lock = write_lock
        self.grace = grace
        self._missing_since: dict[str, float] = {}
        self.moves = 0  # exchanges moved since this leader started (for status)

    def tick(self) -> dict[str, HostInfo]:
        """One pass; returns the hosts it saw, for the rest of the leader's tick."""
        with self.write_lock:
            hosts = read_hosts(self.client, self.paths)
            placements = self.queues.all_placements()
            movable = self._hosts_to_evacuate(hosts, placements.values())
            self._place_orphans(hosts, placements, movable)
            self._repair_assignments(placements, hosts)
            self._remove_stale_live_dirs()
        return hosts

    def _hosts_to_evacuate(self, hosts: dict, placed: object) -> set[str]:
        now = time.monotonic()
        gone = {h for h in placed if h and h not in hosts}  # type: ignore[union-attr]
        for host in list(self._missing_since):
            if host not in gone:
                del self._missing_since[host]
        for host in gone:
            if host not in self._missing_since:
                log.warning("host %s is gone; its exchanges move in %.1fs", host, self.grace)
                self._missing_since[host] = now
        return {h for h in gone if now - self._missing_since[h] >= self.grace}

    def _place_orphans(self, hosts: dict, placements: dict[tuple[str, str], str | None],
                       evacuate: set[str]) -> None:
        capacities = {h.name: h.capacity for h in hosts.values()}
        for (queue, xid), old in sorted(placements.items()):
            if old is not None and old not in evacuate:
                continue
            loads = host_loads(capacities, placements.values())
            if all(load.assigned >= load.capacity for load in loads):
                return  # every host is full: the other orphans wait for the next tick too
            spread: dict[str, int] = {}
            for (q, _), h in placements.items():
                if q == queue and h in capacities:
                    spread[h] = spread.get(h, 0) + 1
            picks = choose_hosts(1, loads, spread)
            if not picks:
                continue  # no capacity anywhere; retried next tick
            self._move(queue, xid, old, picks[0])
            placements[(queue, xid)] = picks[0]

    def _move(self, queue: str, xid: str, old: str | None, new: str) -> None:
        self.client.ensure_path(self.paths.host_assignments(new))
        old_assignment = self.paths.assignment(old, queue, xid) if old else None

        def build(txn: TransactionRequest) -> None:
            txn.set_data(self.paths.exchange(queue, xid), encode({"host": new}))
            if old_assignment and self.client.exists(old_assignment):
                txn.delete(old_assignment)
            txn.create(self.paths.assignment(new, queue, xid), encode({"queue": queue, "exchange": xid}))

        self.queues.view.commit(build, placed={(queue, xid): new})
        self.moves += 1
        log.info("moved exchange %s/%s from %s to %s", queue, xid, old or "(unplaced)", new)

    def _repair_assignments(self, placements: dict[tuple[str, str], str | None], hosts: dict) -> None:
        actual = set()
        for host in children(self.client, self.paths.assignments):
            for name in children(self.client, self.paths.host_assignments(host)):
                actual.add((host, *split_assignment(name)))
        if actual == _assigned(placements):
            return
        self.queues.view.invalidate()  # repair only what a fresh read of the placements confirms
        expected = _assigned(self.queues.all_placements())
        extra, missing = actual - expected, expected - actual
        if not extra and not missing:
            return
        for host, _, _ in missing:
            self.client.ensure_path(self.paths.host_assignments(host))

        def build(txn: TransactionRequest) -> None:
            for host, q, x in extra:
                txn.delete(self.paths.assignment(host, q, x))
            for host, q, x in missing:
                txn.create(self.paths.assignment(host, q, x), encode({"queue": q, "exchange": x}))

        self.fence.write(build)
        log.warning("repaired assignments: removed %d, added %d", len(extra), len(missing))

    def _remove_stale_live_dirs(self) -> None:
        queues = set(queue_names(self.client, self.paths))
        for queue in children(self.client, self.paths.live):
            if queue not in queues:
                try:
                    self.fence.write(lambda txn, q=queue: txn.delete(self.paths.live_queue(q)))
                except (NoNodeError, NotEmptyError):
                    pass  # its exchanges are still stopping


def _assigned(placements: dict[tuple[str, str], str | None]) -> set[tuple[str, str, str]]:
    """(host, queue, exchange) of every placed exchange: what the assignment lists should hold."""
    return {(h, q, x) for (q, x), h in placements.items() if h}
