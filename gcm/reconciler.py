"""The leader's tick: compare where exchanges should run with the hosts alive.

Exchanges on a host that has been gone for `gcm.reassign_grace` seconds (for a
host that keeps journals, `gcm.journal_reassign_grace`: their journals are on
its disk, and a host that restarts within it gets them back), and
exchanges never placed (no capacity at the time), are moved to the least
loaded survivors; an exchange that cannot write its journal (its disk full or
failing, as its statistics say) for `gcm.storage_full_grace` is moved to a host
with room, and none is placed on a full one (gcm.view `full_hosts`); with no
host with room it stays, and an ERROR line says so once; so are the replicas of a replicas-2 queue (a lost or missing
replica is placed again, never on its exchange's host, and an exchange that
moves never goes to its replica's host: gcm.placement's `plan_moves`, the
rules' one home). A replica whose process stopped answering while its host stays
(its znode `silent` for `REPLICA_SILENT_GRACE`: frozen, or stuck where its HCM's
kill of a hung child did not help) is moved to another host if one can take it,
like a lost one: its primary confirms nothing meanwhile. The hosts' assignment lists, `~r` slots included, are
repaired to match the placements, and `live/` and `replicas/` to hold one
directory per queue. Every write is fenced (gcm.fence), the directories it
needs too; a refused one simply ends the tick.

Rebalancing (`gcm.rebalance`, on by default; docs/elasticity.md): once every slot runs where it
is placed, on a live host, and nothing changed for `gcm.rebalance_delay` (no host joined, nothing
moved: a restarting host's exchanges come back to their journals first, a moved one is running and
its replica caught up), the tick moves at most `gcm.rebalance_moves` slots by gcm.placement's
`plan_rebalance`, the ordinary way (`_move`: the old incarnation asks its publishers to move, they
resend; a new replica is copied the retention before it confirms). An exchange of a queue without
replicas on a host that journals is left where it is: its journal would stay behind. `rebalance_now`
(`queue.rebalance`, `roq queue rebalance`) runs the same plan at once, without the delay.

Which hosts keep journals outlives a leader and a restart of the whole cluster: the
leader writes it into the host's assignment list's own data, `assignments/<host>`
= {"journals": true}, when the host registers so (`journal` not off, or journals
left on its disk), and clears it when it registers with neither. A leader elected
while such a host is down thus still waits `gcm.journal_reassign_grace` for it.

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
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import NoNodeError, NotEmptyError

from gcm.fence import LeaderFence
from gcm.placement import Move, plan_moves, plan_rebalance
from gcm.queues import QueueManager
from gcm.view import Placements, assignment_data, full_hosts, placement_data, read_placements, storage_full
from roq.config import GcmConfig
from roq.errors import QueueNotFoundError
from roq.names import check_queue_name
from roq.paths import Paths, is_replica_slot, primary_of, replica_slot, split_assignment
from roq.state import HostInfo, Source, queue_names, read_hosts, read_live, tree
from roq.zk import encode

log = logging.getLogger(__name__)

# Seconds a replica's znode may say `silent` before the leader moves the replica to another host:
# longer than an HCM takes to kill a hung child and start it again (hcm.hung_timeout), so the
# cheaper cure goes first.
REPLICA_SILENT_GRACE = 10.0
ON_DEMAND_MOVES = 64  # most slots one `queue.rebalance` moves (one per exchange)


class Reconciler:
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
        self.moves = 0  # slots (exchanges and replicas) moved since this leader started (for status)
        self.balance = balance or GcmConfig(rebalance=False)  # gcm.rebalance*
        self.rebalanced = 0  # of which by rebalancing
        self.rebalanced_exchanges: set[tuple[str, str]] = set()  # not yet told to the event log
        self._quiet_since = time.monotonic()  # last host join or move: rebalancing waits rebalance_delay
        self._known_hosts: set[str] = set()
        self._balanced: object = None  # the state the last plan found nothing to do in (not planned again)

    def tick(self) -> dict[str, HostInfo]:
        """One pass; returns the hosts it saw, for the rest of the leader's tick."""
        with self.write_lock:
            hosts = read_hosts(self.cache, self.paths)
            self._remember_journals(hosts)
            placements = self.queues.all_placements()
            movable = self._hosts_to_evacuate(hosts, placements.values())
            storage, refusing = self._storage_moves(placements)
            full = full_hosts(hosts, self.queues.min_free_bytes, refusing)
            moved = self.moves
            self._place_orphans(hosts, placements, movable, storage | self._stuck_replicas(hosts, placements), full)
            self._report_stuck(storage, placements, full)
            self._note_changes(hosts, moved)
            if self.balance.rebalance and time.monotonic() - self._quiet_since >= self.balance.rebalance_delay:
                self._rebalance(hosts, placements, full, self.balance.rebalance_moves)
            self._repair_assignments(placements, hosts)
            self._repair_live_dirs()
        return hosts

    def _note_changes(self, hosts: dict[str, HostInfo], moves_before: int) -> None:
        """Restart the rebalancing delay when a host joins (its journals come back first) or a slot
        moved this tick."""
        joined = set(hosts) - self._known_hosts
        self._known_hosts = set(hosts)
        if joined or self.moves != moves_before:
            self._quiet_since = time.monotonic()

    def unsettled(self, hosts: dict[str, HostInfo], placements: Placements) -> str | None:
        """Why no slot may be rebalanced now (a host missing, a slot unplaced or not running where it
        is placed yet), or None."""
        for (queue, slot), host in sorted(placements.items(), key=lambda item: (item[0], item[1] or "")):
            if host is None:
                return f"{_what(queue, slot)} is unplaced"
            if host not in hosts:
                return f"host {host} is missing"
        running: dict[str, dict[str, dict[str, Any]]] = {}
        for (queue, slot), host in placements.items():
            xid = primary_of(slot)
            if is_replica_slot(slot):
                data = self.cache.read_json(self.paths.replica_live(queue, xid)) or {}
            else:
                if queue not in running:
                    running[queue] = read_live(self.cache, self.paths, queue)
                data = running[queue].get(xid) or {}
            if data.get("host") != host:
                return f"{_what(queue, slot)} is not running on {host} yet"
        return None

    def _pinned(self, hosts: dict[str, HostInfo], placements: Placements) -> set[tuple[str, str]]:
        """Exchanges without a replica on a host that journals: a move would leave their journal behind."""
        return {(queue, slot) for (queue, slot), host in placements.items()
                if not is_replica_slot(slot) and (queue, replica_slot(slot)) not in placements
                and host in hosts and hosts[host].journal != "off"}

    def _rebalance(self, hosts: dict[str, HostInfo], placements: Placements, full: set[str], limit: int,
                   queues: set[str] | None = None) -> list[Move]:
        """Plan and carry out up to `limit` moves (gcm.placement `plan_rebalance`) if every slot runs
        where it is placed; `placements` is updated to match."""
        state = (frozenset(placements.items()), frozenset((h.name, h.capacity, h.zone) for h in hosts.values()),
                 frozenset(full), None if queues is None else frozenset(queues))
        if state == self._balanced or self.unsettled(hosts, placements) is not None:
            return []
        moves = plan_rebalance({h.name: h.capacity for h in hosts.values()}, placements,
                               {h.name: h.zone for h in hosts.values()}, max_moves=limit,
                               margin=self.balance.rebalance_margin, queues=queues,
                               pinned=self._pinned(hosts, placements), full=full)
        if not moves:
            self._balanced = state
            return []
        for move in moves:
            placements[(move.queue, move.slot)] = move.new
            xid = primary_of(move.slot)
            self._move(move.queue, xid, [move], placement_data(placements, move.queue, xid), why="to even the spread")
            self.rebalanced += 1
            if not is_replica_slot(move.slot):
                self.rebalanced_exchanges.add((move.queue, xid))
        self._quiet_since = time.monotonic()
        return moves

    def take_rebalanced(self) -> set[tuple[str, str]]:
        """The (queue, exchange) moved to even the spread since the last call (for the event log)."""
        taken, self.rebalanced_exchanges = self.rebalanced_exchanges, set()
        return taken

    def rebalance_now(self, name: Any = None) -> dict[str, Any]:
        """`queue.rebalance`: the same plan at once (no delay), for queue `name` or every queue."""
        queues = None if name is None else {check_queue_name(name)}
        with self.write_lock:
            if self.fence.already_applied():
                return {"moves": [], "applied_before": True}
            if queues and name not in queue_names(self.cache, self.paths):
                raise QueueNotFoundError(f"queue {name!r} does not exist")
            hosts = read_hosts(self.cache, self.paths)
            placements = self.queues.all_placements()
            waiting = self.unsettled(hosts, placements)
            moves: list[Move] = []
            if waiting is None:
                refusing = {host for host, _, _ in storage_full(self.cache, self.paths).values()}
                full = full_hosts(hosts, self.queues.min_free_bytes, refusing)
                self._balanced = None
                moves = self._rebalance(hosts, placements, full, ON_DEMAND_MOVES, queues)
        return {"moves": [{"queue": m.queue, "exchange": primary_of(m.slot), "replica": is_replica_slot(m.slot),
                           "from": m.old, "to": m.new} for m in moves],
                "waiting": waiting}

    def _remember_journals(self, hosts: dict[str, HostInfo]) -> None:
        """Record in `assignments/<host>` whether each registered host keeps journals (a fenced write,
        only when that changes), so that any later leader knows it while the host is down."""
        for info in hosts.values():
            path = self.paths.host_assignments(info.name)
            recorded = self.cache.read_json(path)
            if recorded is None or bool(recorded.get("journals")) == info.keeps_journals:
                continue  # its HCM makes the node at registration; next tick if not yet there

            def build(txn: TransactionRequest, path: str = path, data: dict[str, Any] = recorded,
                      keeps: bool = info.keeps_journals) -> None:
                txn.set_data(path, encode({**data, "journals": keeps}))

            self.fence.write(build)
            log.info("host %s %s journals", info.name, "keeps" if info.keeps_journals else "keeps no more")

    def _keeps_journals(self, host: str) -> bool:
        return bool((self.cache.read_json(self.paths.host_assignments(host)) or {}).get("journals"))

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

    def _hosts_to_evacuate(self, hosts: dict[str, HostInfo], placed: Iterable[str | None]) -> set[str]:
        now = time.monotonic()
        gone = {h for h in placed if h and h not in hosts}
        for host in list(self._missing_since):
            if host not in gone:
                del self._missing_since[host]
        for host in gone:
            if host not in self._missing_since:
                log.warning("host %s is gone; its exchanges move in %.1fs%s", host, self._grace_of(host),
                            " (it keeps journals: waiting for it to come back)" if self._keeps_journals(host) else "")
                self._missing_since[host] = now
        return {h for h in gone if now - self._missing_since[h] >= self._grace_of(h)}

    def _grace_of(self, host: str) -> float:
        return self.journal_grace if self._keeps_journals(host) else self.grace

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
            self._move(queue, xid, moves, placement_data(placements, queue, xid))

    def _move(self, queue: str, xid: str, moves: list[Move], placement: dict[str, Any], why: str = "") -> None:
        for move in moves:
            if move.new:
                self.fence.ensure_path(self.paths.host_assignments(move.new))
        old_assignments = [self.paths.assignment(m.old, queue, m.slot) for m in moves if m.old]

        def build(txn: TransactionRequest) -> None:
            txn.set_data(self.paths.exchange(queue, xid), encode(placement))
            for path in old_assignments:
                if self.client.exists(path):
                    txn.delete(path)
            for m in moves:
                if m.new:
                    txn.create(self.paths.assignment(m.new, queue, m.slot), encode(assignment_data(queue, m.slot)))

        self.fence.write(build)
        for m in moves:
            self.moves += 1
            log.info("moved %s from %s to %s%s", _what(queue, m.slot), m.old or "(unplaced)", m.new or "(unplaced)",
                     f" {why}" if why else "")

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
                txn.create(self.paths.assignment(host, q, x), encode(assignment_data(q, x)))

        self.fence.write(build)
        log.warning("repaired assignments: removed %d, added %d", len(extra), len(missing))

    def _assignments(self, source: Source) -> set[tuple[str, str, str]]:
        """(host, queue, slot) of every assignment listed."""
        reader = tree(source)
        return {(host, *split_assignment(name)) for host in reader.children(self.paths.assignments)
                for name in reader.children(self.paths.host_assignments(host))}

    def _repair_live_dirs(self) -> None:
        """`live/<queue>` and `replicas/<queue>` for every queue and no other: clients watch them,
        and those with a read-only identity cannot make them (a create whose own ensure_path failed
        is mended here)."""
        queues = set(queue_names(self.cache, self.paths))
        for root, directory in ((self.paths.live, self.paths.live_queue),
                                (self.paths.replicas, self.paths.replica_queue)):
            self._repair_dirs(queues, set(self.cache.children(root)), directory)

    def _repair_dirs(self, queues: set[str], dirs: set[str], directory: Callable[[str], str]) -> None:
        for queue in sorted(queues - dirs):
            self.fence.ensure_path(directory(queue))
        for queue in sorted(dirs - queues):
            def build(txn: TransactionRequest, path: str = directory(queue)) -> None:
                txn.delete(path)

            try:
                self.fence.write(build)
            except (NoNodeError, NotEmptyError):
                pass  # its exchanges are still stopping


def _what(queue: str, slot: str) -> str:
    xid = primary_of(slot)
    return f"replica of exchange {queue}/{xid}" if is_replica_slot(slot) else f"exchange {queue}/{xid}"


def _assigned(placed: Placements) -> set[tuple[str, str, str]]:
    """(host, queue, slot) of every placed slot: what the assignment lists should hold."""
    return {(h, q, x) for (q, x), h in placed.items() if h}
