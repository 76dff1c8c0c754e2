"""The cluster's recent events, kept by the leader: who leads, hosts joining and lost, exchanges
moved (failover, or rebalance when the leader moved them to even the spread) or restarted, queues
created and deleted, scaling and publisher relocations.

Every tick the leader compares what it just aggregated (the autoscaler's `ClusterStats`) with the
previous tick's and appends what changed to a bounded log, `<root>/events`: `{"events": [...]}`, the
newest EVENT_LIMIT events, rewritten through the fence on a tick that added some (an idle cluster
writes nothing). Each event has a sequence number; `cluster.events` answers the events after the one
a reader saw last, so a console started at any time shows what happened before it, and one polling
every few seconds gets each event once.

A new leader reads the log back, adds that it now leads and goes on numbering from the log's last
event: a failover keeps the history. What changed while no one led (between the old leader's last
tick and the new one's first) is not seen as a change; the new leader's first tick is its baseline.
A write that fails (ZooKeeper unavailable) keeps the events for the next tick; a deposed leader's
writes are refused by the fence, so its events never reach the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import KazooException

from gcm.fence import LeaderFence
from roq.errors import RoqError, UserError
from roq.paths import Paths
from roq.records import ClusterStats, QueueStats
from roq.zk import encode, read_json

log = logging.getLogger(__name__)

EVENT_LIMIT = 200  # events kept in the log: hours of an eventful cluster, about 30 KB


class EventLog:
    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence, write_lock: threading.Lock) -> None:
        self.client = client
        self.paths = paths
        self.fence = fence
        self.write_lock = write_lock
        self._lock = threading.Lock()  # the control API reads while the leader loop writes
        self._events: list[dict[str, Any]] = []  # in the log (written), oldest first
        self._pending: list[dict[str, Any]] = []  # noted, not written yet
        self._seq = 0
        self._last: ClusterStats | None = None
        self._scaling_seen: dict[str, float] = {}  # queue → time of the newest autoscaler event noted
        self._term: tuple[str, int] | None = None  # (leader, epoch) of a term whose log is not read yet
        self._rebalanced: set[tuple[str, str]] = set()  # (queue, exchange) the leader moved to even the spread

    # ------------------------------------------------------------ the leader loop

    def start_term(self, gcm: str, epoch: int) -> None:
        """A new term: the log is read back at the first tick, which notes that `gcm` leads and is
        the baseline of the changes."""
        with self._lock:
            self._events, self._pending = [], []
        self._term = (gcm, epoch)
        self._last = None
        self._scaling_seen = {}

    def _load(self) -> bool:
        """Read the log back once per term (until it could be read, nothing is written over it)."""
        if self._term is None:
            return True
        try:
            stored = (read_json(self.client, self.paths.events) or {}).get("events")
        except KazooException as exc:
            log.info("events log not read yet (%s)", type(exc).__name__)
            return False
        events = [e for e in stored if _valid(e)] if isinstance(stored, list) else []
        with self._lock:
            self._events = events[-EVENT_LIMIT:]
            self._seq = max((e["seq"] for e in self._events), default=0)
        gcm, epoch = self._term
        self._term = None
        self._note("leader", f"{gcm} is the leader (epoch {epoch})")
        return True

    def tick(self, stats: ClusterStats, rebalanced: Iterable[tuple[str, str]] = ()) -> None:
        """Note what changed since the previous tick, then write the log if anything was noted.
        `rebalanced`: the (queue, exchange) the leader moved on purpose since, which are not failovers."""
        self._rebalanced.update(rebalanced)
        if not self._load():
            return
        self._note_scaling(stats)
        if self._last is not None:
            self._note_changes(self._last, stats)
        self._last = stats
        self._flush()

    def _flush(self) -> None:
        with self._lock:
            if not self._pending:
                return
            merged = (self._events + self._pending)[-EVENT_LIMIT:]
        exists = self.client.exists(self.paths.events) is not None

        def build(txn: TransactionRequest) -> None:
            data = encode({"events": merged})
            if exists:
                txn.set_data(self.paths.events, data)
            else:
                txn.create(self.paths.events, data)

        try:
            with self.write_lock:
                self.fence.write(build)
        except (RoqError, KazooException) as exc:  # kept for the next tick; a deposed leader's never land
            log.info("events not written yet (%s): %s", type(exc).__name__, exc)
            return
        with self._lock:
            written = {e["seq"] for e in merged}
            self._pending = [e for e in self._pending if e["seq"] not in written]
            self._events = merged

    # ------------------------------------------------------------ the control API

    def after(self, after: Any = 0) -> dict[str, Any]:
        """`cluster.events`: the logged events numbered above `after`, oldest first, and the newest
        number (`last`; below `after` when the log was started anew: read it again from 0)."""
        if isinstance(after, bool) or not isinstance(after, int):
            raise UserError(f"after must be an event number (an integer), got {after!r}")
        with self._lock:
            events = [dict(e) for e in self._events if e["seq"] > after]
            last = self._events[-1]["seq"] if self._events else 0
        return {"events": events, "last": last}

    # ------------------------------------------------------------ what changed

    def _note(self, kind: str, detail: str, queue: str | None = None, when: float | None = None) -> None:
        with self._lock:
            self._seq += 1
            self._pending.append({"seq": self._seq, "time": when or time.time(), "kind": kind,
                                  "detail": detail, "queue": queue})

    def _note_changes(self, old: ClusterStats, new: ClusterStats) -> None:
        for host in sorted(set(old.hosts) - set(new.hosts)):
            self._note("host lost", f"host {host} is gone")
        for host in sorted(set(new.hosts) - set(old.hosts)):
            self._note("host joined", f"host {host} joined")
        for name in sorted(set(new.queues) - set(old.queues)):
            self._note("queue created", f"queue {name} created", name)
        for name in sorted(set(old.queues) - set(new.queues)):
            self._note("queue deleted", f"queue {name} deleted", name)
        for name, queue in sorted(new.queues.items()):
            if name in old.queues:
                self._note_exchanges(name, old.queues[name], queue)

    def _note_exchanges(self, queue: str, old: QueueStats, new: QueueStats) -> None:
        before = {x.id: x for x in old.by_exchange}
        for x in new.by_exchange:
            was = before.get(x.id)
            if was is None:
                continue
            if was.host != x.host:
                kind = "rebalance" if (queue, x.id) in self._rebalanced else "failover"
                self._rebalanced.discard((queue, x.id))
                self._note(kind, f"exchange {x.id} moved from {was.host or 'nowhere'} to {x.host or 'nowhere'}",
                           queue)
            elif x.restarts > was.restarts:
                self._note("restart", f"exchange {x.id} restarted on {x.host}", queue)

    def _note_scaling(self, stats: ClusterStats) -> None:
        """The autoscaler's own events (it keeps the last few per queue, with their time)."""
        for name, queue in sorted(stats.queues.items()):
            seen = self._scaling_seen.get(name, 0.0)
            for e in queue.events:
                at = e.get("at", 0.0)
                if not isinstance(at, (int, float)) or at <= seen:
                    continue
                self._scaling_seen[name] = max(self._scaling_seen.get(name, 0.0), at)
                if "relocated" in e:
                    self._note("relocation", f"publisher {e['relocated']} moved from {e.get('from')} to "
                                             f"{e.get('to')}", name, at)
                else:
                    self._note("scaling", f"scaled from {e.get('from')} to {e.get('to')} exchanges: "
                                          f"{e.get('reason', '')}", name, at)
        for gone in set(self._scaling_seen) - set(stats.queues):
            del self._scaling_seen[gone]


def _valid(event: Any) -> bool:
    return (isinstance(event, dict) and isinstance(event.get("seq"), int) and isinstance(event.get("kind"), str)
            and isinstance(event.get("time"), (int, float)))
