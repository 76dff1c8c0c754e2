"""Rebalancing (`gcm.rebalance`, on by default; docs/elasticity.md): evening the spread of slots
over the hosts once the cluster has settled.

Once every slot runs where it is placed, on a live host, and nothing changed for
`gcm.rebalance_delay` (no host joined, nothing moved: a restarting host's exchanges come back to
their journals first, a moved one is running and its replica caught up), the leader's tick moves
at most `gcm.rebalance_moves` slots by gcm.placement's `plan_rebalance`, the ordinary way
(gcm.assignments `move`: the old incarnation asks its publishers to move, they resend; a new
replica is copied the retention before it confirms). An exchange of a queue without replicas on a
host that journals, or of a queue whose storage policy keeps frames on disk, is left where it is:
its journal or segment store would stay behind. `queue.rebalance` (`roq
queue rebalance`) runs the same plan at once, without the delay (gcm.reconciler `rebalance_now`).
"""

from __future__ import annotations

import time
from typing import Any

from gcm.assignments import AssignmentWriter, describe_slot
from gcm.cache import ClusterCache
from gcm.placement import Move, plan_rebalance
from gcm.view import Placements, keeps_frames_on_disk, placement_data
from roq.config import GcmConfig
from roq.paths import Paths, is_replica_slot, primary_of, replica_slot
from roq.state import HostInfo, read_live


class Rebalancer:
    """Plans the moves that even the spread and has `writer` carry them out; remembers when the
    cluster last changed, and a state it found balanced (not planned again)."""

    def __init__(self, cache: ClusterCache, paths: Paths, writer: AssignmentWriter, balance: GcmConfig) -> None:
        self.cache = cache
        self.paths = paths
        self.writer = writer
        self.balance = balance  # gcm.rebalance*
        self.rebalanced = 0  # slots moved by rebalancing since this leader started
        self.rebalanced_exchanges: set[tuple[str, str]] = set()  # not yet told to the event log
        self._quiet_since = time.monotonic()  # last host join or move: rebalancing waits rebalance_delay
        self._known_hosts: set[str] = set()
        self._balanced: object = None  # the state the last plan found nothing to do in (not planned again)

    def note_changes(self, hosts: dict[str, HostInfo], moved: bool) -> None:
        """Restart the rebalancing delay when a host joins (its journals come back first) or a slot
        moved this tick."""
        joined = set(hosts) - self._known_hosts
        self._known_hosts = set(hosts)
        if joined or moved:
            self._quiet_since = time.monotonic()

    def due(self) -> bool:
        """Is rebalancing on, and has the cluster been quiet for `gcm.rebalance_delay`?"""
        return self.balance.rebalance and time.monotonic() - self._quiet_since >= self.balance.rebalance_delay

    def unsettled(self, hosts: dict[str, HostInfo], placements: Placements) -> str | None:
        """Why no slot may be rebalanced now (a host missing, a slot unplaced or not running where it
        is placed yet), or None."""
        for (queue, slot), host in sorted(placements.items(), key=lambda item: (item[0], item[1] or "")):
            if host is None:
                return f"{describe_slot(queue, slot)} is unplaced"
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
                return f"{describe_slot(queue, slot)} is not running on {host} yet"
        return None

    def rebalance(self, hosts: dict[str, HostInfo], placements: Placements, full: set[str], limit: int,
                  queues: set[str] | None = None, replan: bool = False) -> list[Move]:
        """Plan and carry out up to `limit` moves (gcm.placement `plan_rebalance`) if every slot runs
        where it is placed; `placements` is updated to match. `replan`: plan even a state found
        balanced before (an operator asked)."""
        state = (frozenset(placements.items()), frozenset((h.name, h.capacity, h.zone) for h in hosts.values()),
                 frozenset(full), None if queues is None else frozenset(queues))
        if (state == self._balanced and not replan) or self.unsettled(hosts, placements) is not None:
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
            self.writer.move(move.queue, xid, [move], placement_data(placements, move.queue, xid),
                             why="to even the spread")
            self.rebalanced += 1
            if not is_replica_slot(move.slot):
                self.rebalanced_exchanges.add((move.queue, xid))
        self._quiet_since = time.monotonic()
        return moves

    def _pinned(self, hosts: dict[str, HostInfo], placements: Placements) -> set[tuple[str, str]]:
        """Exchanges without a replica on a host that journals, or keeping frames on disk: a move
        would leave their journal or segment store behind."""
        def left_behind(queue: str, host: str) -> bool:
            return hosts[host].journal != "off" or keeps_frames_on_disk(self.cache, self.paths, queue)
        return {(queue, slot) for (queue, slot), host in placements.items()
                if not is_replica_slot(slot) and (queue, replica_slot(slot)) not in placements
                and host in hosts and left_behind(queue, host)}

    def take_rebalanced(self) -> set[tuple[str, str]]:
        """The (queue, exchange) moved to even the spread since the last call (for the event log)."""
        taken, self.rebalanced_exchanges = self.rebalanced_exchanges, set()
        return taken
