"""The leader's tick: compare where exchanges should run with the hosts alive.

Exchanges on a host that has been gone for `gcm.reassign_grace` seconds (for a host that keeps
journals, or holds an exchange or replica of a queue whose storage policy keeps frames on disk,
`gcm.journal_reassign_grace`: their journals and segment stores are on its disk, and a host that
restarts within it gets them back), and exchanges never placed (no capacity at the time), are moved to the
least loaded survivors; an exchange that cannot write its journal (its disk full or failing, as its
statistics say) for `gcm.storage_full_grace` is moved to a host with room, and none is placed on a
full one (gcm.view `full_hosts`); with no host with room it stays, and an ERROR line says so once;
so are the replicas of a replicas-2 queue (a lost or missing replica is placed again, never on its
exchange's host, and an exchange that moves never goes to its replica's host: gcm.placement's
`plan_moves`, the rules' one home). A replica whose process stopped answering while its host stays
(its znode `silent` for `REPLICA_SILENT_GRACE`: frozen, or stuck where its HCM's kill of a hung
child did not help) is moved to another host if one can take it, like a lost one: its primary
confirms nothing meanwhile.

The moves, the repair of the hosts' assignment lists (`~r` slots included) to match the
placements, and of `live/` and `replicas/` to hold one directory per queue, are written by
gcm.assignments, fenced; a refused write simply ends the tick. Once the cluster has settled, the
tick evens the spread (gcm.rebalancer). Everything is read from the leader's cache (gcm.cache).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kazoo.client import KazooClient

from gcm.assignments import AssignmentWriter
from gcm.fence import LeaderFence
from gcm.placement import Move, plan_moves
from gcm.queues import QueueManager
from gcm.rebalancer import Rebalancer
from gcm.view import Placements, full_hosts, keeps_frames_on_disk, placement_data, storage_full
from roq.config import GcmConfig
from roq.errors import QueueNotFoundError
from roq.names import check_queue_name
from roq.paths import Paths, is_replica_slot, primary_of
from roq.state import HostInfo, queue_names, read_hosts

log = logging.getLogger(__name__)

# Seconds a replica's znode may say `silent` before the leader moves the replica to another host:
# longer than an HCM takes to kill a hung child and start it again (hcm.hung_timeout), so the
# cheaper cure goes first.
REPLICA_SILENT_GRACE = 10.0
ON_DEMAND_MOVES = 64  # most slots one `queue.rebalance` moves (one per exchange)


class Reconciler:
    """Decides which slots must move (lost hosts, full disks, silent replicas, unplaced slots) and
    has them moved; `write_lock` serialises its writes with the control API's."""

    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence,
                 queues: QueueManager, write_lock: threading.Lock, grace: float,
                 journal_grace: float | None = None, storage_grace: float = 3.0,
                 balance: GcmConfig | None = None) -> None:
        self.client = client
        self.paths = paths
        self.fence = fence
        self.queues = queues
        self.cache = queues.cache
        self.write_lock = write_lock
        self.grace = grace
        self._missing_since: dict[str, float] = {}
        # When a host that keeps journals goes, its exchanges wait journal_grace for it (a restart
        # brings them back to their journals) instead of `grace`.
        self.journal_grace = grace if journal_grace is None else max(grace, journal_grace)
        self._silent_since: dict[tuple[str, str], float] = {}  # replica slot → when first seen silent
        self.storage_grace = storage_grace
        self._full_since: dict[tuple[str, str], tuple[str, float]] = {}  # exchange → (incarnation, since)
        self._stuck: set[tuple[str, str]] = set()  # full exchanges with nowhere to go, logged once
        self.writer = AssignmentWriter(client, self.cache, paths, fence)
        self.rebalancer = Rebalancer(self.cache, paths, self.writer, balance or GcmConfig(rebalance=False))

    @property
    def moves(self) -> int:
        """Slots (exchanges and replicas) moved since this leader started (for status)."""
        return self.writer.moves

    @property
    def rebalanced(self) -> int:
        """Of which by rebalancing."""
        return self.rebalancer.rebalanced

    def tick(self) -> dict[str, HostInfo]:
        """One pass; returns the hosts it saw, for the rest of the leader's tick."""
        with self.write_lock:
            hosts = read_hosts(self.cache, self.paths)
            self.writer.remember_journals(hosts)
            placements = self.queues.all_placements()
            movable = self._hosts_to_evacuate(hosts, placements)
            storage, refusing = self._storage_moves(placements)
            full = full_hosts(hosts, self.queues.min_free_bytes, refusing)
            moved = self.moves
            self._place_orphans(hosts, placements, movable, storage | self._stuck_replicas(hosts, placements), full)
            self._report_stuck(storage, placements, full)
            self.rebalancer.note_changes(hosts, self.moves != moved)
            if self.rebalancer.due():
                self.rebalancer.rebalance(hosts, placements, full, self.rebalancer.balance.rebalance_moves)
            self.writer.repair_assignments(placements)
            self.writer.repair_live_dirs()
        return hosts

    def take_rebalanced(self) -> set[tuple[str, str]]:
        """The (queue, exchange) moved to even the spread since the last call (for the event log)."""
        return self.rebalancer.take_rebalanced()

    def rebalance_now(self, name: Any = None) -> dict[str, Any]:
        """`queue.rebalance`: the same plan at once (no delay), for queue `name` or every queue.
        Raises QueueNotFoundError for an unknown queue; a retry of an applied request moves nothing."""
        queues = None if name is None else {check_queue_name(name)}
        with self.write_lock:
            if self.fence.already_applied():
                return {"moves": [], "applied_before": True}
            if queues and name not in queue_names(self.cache, self.paths):
                raise QueueNotFoundError(f"queue {name!r} does not exist")
            hosts = read_hosts(self.cache, self.paths)
            placements = self.queues.all_placements()
            waiting = self.rebalancer.unsettled(hosts, placements)
            moves: list[Move] = []
            if waiting is None:
                refusing = {host for host, _, _ in storage_full(self.cache, self.paths).values()}
                full = full_hosts(hosts, self.queues.min_free_bytes, refusing)
                moves = self.rebalancer.rebalance(hosts, placements, full, ON_DEMAND_MOVES, queues, replan=True)
        return {"moves": [{"queue": m.queue, "exchange": primary_of(m.slot), "replica": is_replica_slot(m.slot),
                           "from": m.old, "to": m.new} for m in moves],
                "waiting": waiting}

    def _storage_moves(self, placements: Placements) -> tuple[set[tuple[str, str]], set[str]]:
        """Exchanges whose journal's disk has refused writes for `storage_grace` (to move), and the
        hosts where one refuses now. Judged on the exchange's own statistics, of the incarnation
        running where it is placed: a report of a process already moved away does not count."""
        now = time.monotonic()
        refusing = storage_full(self.cache, self.paths)
        for key in set(self._full_since) - set(refusing):
            del self._full_since[key]
        self._stuck &= set(refusing)
        relocate = set()
        for key, (host, incarnation, error) in refusing.items():
            if placements.get(key) != host:
                continue
            seen = self._full_since.get(key)
            if seen is None or seen[0] != incarnation:
                log.warning("exchange %s/%s on %s cannot write its journal (%s); moved in %.1fs unless its disk "
                            "takes writes again", *key, host, error, self.storage_grace)
                seen = self._full_since[key] = (incarnation, now)
            if now - seen[1] >= self.storage_grace:
                relocate.add(key)
        return relocate, {host for host, _, _ in refusing.values()}

    def _report_stuck(self, relocate: set[tuple[str, str]], placements: Placements, full: set[str]) -> None:
        """One ERROR line per full exchange that no host could take (it stays, holding its publishers)."""
        for key in sorted(relocate - self._stuck):
            host = placements.get(key)
            if host not in full:
                continue  # moved this tick
            self._stuck.add(key)
            log.error("exchange %s/%s on %s cannot write its journal and no host has room for it (every other "
                      "host is full, lost or at capacity: journaling hosts need gcm.min_free_bytes free): it stays "
                      "and holds its publishers until its disk takes writes again or a host with room joins",
                      *key, host)

    def _hosts_to_evacuate(self, hosts: dict[str, HostInfo], placements: Placements) -> set[str]:
        now = time.monotonic()
        gone = {h for h in placements.values() if h and h not in hosts}
        for host in list(self._missing_since):
            if host not in gone:
                del self._missing_since[host]
        for host in gone:
            if host not in self._missing_since:
                waited = self._grace_of(host, placements)
                log.warning("host %s is gone; its exchanges move in %.1fs%s", host, waited,
                            f" (it keeps {self._kept_on(host, placements)}: waiting for it to come back)"
                            if waited > self.grace else "")
                self._missing_since[host] = now
        return {h for h in gone if now - self._missing_since[h] >= self._grace_of(h, placements)}

    def _grace_of(self, host: str, placements: Placements) -> float:
        return self.grace if not self._kept_on(host, placements) else self.journal_grace

    def _kept_on(self, host: str, placements: Placements) -> str:
        """What the lost `host`'s disk holds that is worth waiting for ("" for nothing): journals
        (as last recorded), or segment stores (a slot of a queue with a disk storage policy)."""
        if self.writer.keeps_journals(host):
            return "journals"
        if any(placed == host and keeps_frames_on_disk(self.cache, self.paths, queue)
               for (queue, _), placed in placements.items()):
            return "segment stores"
        return ""

    def _stuck_replicas(self, hosts: dict[str, HostInfo], placements: Placements) -> set[tuple[str, str]]:
        """Replica slots on live hosts whose process has said nothing for REPLICA_SILENT_GRACE."""
        now = time.monotonic()
        silent = set()
        for (queue, slot), host in placements.items():
            if is_replica_slot(slot) and host in hosts:
                data = self.cache.read_json(self.paths.replica_live(queue, primary_of(slot))) or {}
                if data.get("silent") is True and data.get("host") == host:
                    silent.add((queue, slot))
        for key in set(self._silent_since) - silent:
            del self._silent_since[key]
        stuck = set()
        for key in silent:
            since = self._silent_since.setdefault(key, now)
            if now - since >= REPLICA_SILENT_GRACE:
                stuck.add(key)
                if now - since < REPLICA_SILENT_GRACE + 1:  # once, not every tick it stays
                    log.warning("replica of exchange %s/%s on %s has been silent for %.0fs: moving it",
                                key[0], primary_of(key[1]), placements[key], now - since)
        return stuck

    def _place_orphans(self, hosts: dict[str, HostInfo], placements: Placements, evacuate: set[str],
                       relocate: set[tuple[str, str]], full: set[str]) -> None:
        """Carry out gcm.placement's plan, one fenced transaction per exchange (its slot and its
        replica's together); `placements` is updated to match, for the repair that follows."""
        capacities = {h.name: h.capacity for h in hosts.values()}
        by_exchange: dict[tuple[str, str], list[Move]] = {}
        zones = {h.name: h.zone for h in hosts.values()}
        for move in plan_moves(capacities, placements, evacuate, relocate, full, zones):
            by_exchange.setdefault((move.queue, primary_of(move.slot)), []).append(move)
        for (queue, xid), moves in by_exchange.items():
            for move in moves:
                placements[(queue, move.slot)] = move.new
            self.writer.move(queue, xid, moves, placement_data(placements, queue, xid))
