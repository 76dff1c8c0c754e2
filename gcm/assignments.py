"""The leader's writes of where slots run: placements, the hosts' assignment lists, `live/` and
`replicas/` directories. Every write is fenced (gcm.fence), the directories it needs too; a refused
one raises and so ends the leader's tick.

Which hosts keep journals outlives a leader and a restart of the whole cluster: the leader writes
it into the host's assignment list's own data, `assignments/<host>` = {"journals": true}, when the
host registers so (`journal` not off, or journals left on its disk), and clears it when it
registers with neither. A leader elected while such a host is down thus still waits
`gcm.journal_reassign_grace` for it (gcm.reconciler).

Everything is compared on the leader's cache (gcm.cache): a tick with nothing to do sends ZooKeeper
nothing. When the cache's assignment lists and placements differ, both are read again from
ZooKeeper itself and only what that read shows is repaired, so a cache behind ZooKeeper never
deletes a right assignment; if ZooKeeper shows no difference, the cache is read again in full.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import NoNodeError, NotEmptyError

from gcm.cache import ClusterCache
from gcm.fence import LeaderFence
from gcm.placement import Move
from gcm.view import Placements, assignment_data, read_placements
from roq.paths import Paths, is_replica_slot, primary_of, split_assignment
from roq.state import HostInfo, Source, queue_names, tree
from roq.zk import encode

log = logging.getLogger(__name__)


class AssignmentWriter:
    """Carries out the leader's decisions in ZooKeeper, fenced; counts the slots it moved."""

    def __init__(self, client: KazooClient, cache: ClusterCache, paths: Paths, fence: LeaderFence) -> None:
        self.client = client
        self.cache = cache
        self.paths = paths
        self.fence = fence
        self.moves = 0  # slots (exchanges and replicas) moved since this leader started (for status)

    def move(self, queue: str, xid: str, moves: list[Move], placement: dict[str, Any], why: str = "") -> None:
        """Write exchange `xid`'s new `placement` and its slots' assignment lists in one fenced
        transaction; `moves` are its slots that change host."""
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
            log.info("moved %s from %s to %s%s", describe_slot(queue, m.slot), m.old or "(unplaced)",
                     m.new or "(unplaced)", f" {why}" if why else "")

    def remember_journals(self, hosts: dict[str, HostInfo]) -> None:
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

    def keeps_journals(self, host: str) -> bool:
        """Whether `host` was last seen keeping journals (as recorded, so also while it is down)."""
        return bool((self.cache.read_json(self.paths.host_assignments(host)) or {}).get("journals"))

    def repair_assignments(self, cached: Placements) -> None:
        """Make the assignment lists hold every placed slot and nothing else, as ZooKeeper itself
        shows them (`cached`: the placements as the cache holds them)."""
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

    def repair_live_dirs(self) -> None:
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


def describe_slot(queue: str, slot: str) -> str:
    """`exchange q/x1`, or `replica of exchange q/x1` for a replica slot (for log lines)."""
    xid = primary_of(slot)
    return f"replica of exchange {queue}/{xid}" if is_replica_slot(slot) else f"exchange {queue}/{xid}"


def _assigned(placed: Placements) -> set[tuple[str, str, str]]:
    """(host, queue, slot) of every placed slot: what the assignment lists should hold."""
    return {(h, q, x) for (q, x), h in placed.items() if h}
