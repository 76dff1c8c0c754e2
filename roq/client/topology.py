"""The running exchanges of one queue, followed through ZooKeeper watches.

Two watches: one on the queue's znode (it exists iff the queue does) and one on the children of
`live/<queue>` (one per running exchange). Both are re-armed by hand, so they survive what
kazoo's ChildrenWatch does not: the live node being deleted with its queue (the reconciler
removes it) and created again when the queue is. `deleted` says whether the queue exists now;
`on_change` fires when it is deleted or created again and when endpoints change.

`close()` ends both watches: after it, `on_change` is never called again (a closed Publisher's
wake-up pipe may already be another file).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
from kazoo.protocol.states import WatchedEvent

from roq.errors import QueueNotFoundError
from roq.names import check_queue_name
from roq.paths import Paths
from roq.state import read_live

log = logging.getLogger(__name__)

GONE_GRACE = 5.0  # s a receiver goes on after its queue was deleted (it may be created again)


class QueueTopology:
    """`exchanges` maps exchange id → {pub, sub, replay, host, stats}."""

    def __init__(self, zk: KazooClient, paths: Paths, queue: str,
                 on_change: Callable[[], None] | None = None) -> None:
        self.zk = zk
        self.paths = paths
        self.queue = check_queue_name(queue)
        if not zk.retry(zk.exists, paths.queue(queue)):
            raise QueueNotFoundError(f"queue {queue!r} does not exist")
        self._on_change: Callable[[], None] | None = None  # not during the first, synchronous read
        self._lock = threading.Lock()
        self._closed = False
        self.deleted = False
        self._gone_since: float | None = None  # when check_exists() first saw it deleted
        self.exchanges: dict[str, dict[str, Any]] = {}
        self.version = 0
        try:
            zk.retry(zk.ensure_path, paths.live_queue(queue))
        except NoAuthError:
            pass  # a read-only identity: the leader creates it with the queue
        self._arm_children()
        zk.DataWatch(paths.queue(queue), self._queue_changed)
        zk.add_listener(self._session_changed)
        self._on_change = on_change

    def close(self) -> None:
        """Stop watching; `on_change` is not called from here on."""
        with self._lock:
            self._closed = True
            self._on_change = None
        self.zk.remove_listener(self._session_changed)

    def check_exists(self) -> None:
        """Raise QueueNotFoundError once the queue has been deleted (and not created again) for
        GONE_GRACE seconds: what a receiver's `receive()` calls when nothing came."""
        if not self.deleted:
            self._gone_since = None
            return
        now = time.monotonic()
        self._gone_since = self._gone_since or now
        if now - self._gone_since >= GONE_GRACE:
            raise QueueNotFoundError(f"queue {self.queue!r} was deleted")

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self.exchanges)

    def refresh(self) -> dict[str, dict[str, Any]]:
        """Re-read endpoints and statistics (watches call this; callers may too)."""
        live = read_live(self.zk, self.paths, self.queue)
        with self._lock:
            if self._closed:
                return live
            changed = {k: _endpoints(v) for k, v in live.items()} != \
                      {k: _endpoints(v) for k, v in self.exchanges.items()}
            self.exchanges = live
            if changed:
                self.version += 1
        if changed:
            log.debug("queue %s now has exchanges %s", self.queue, sorted(live))
            self._notify()
        return live

    # ------------------------------------------------------------ watches

    def _arm_children(self) -> None:
        """Watch the live node's children; while it does not exist, watch for its creation."""
        if self._closed:
            return
        path = self.paths.live_queue(self.queue)
        try:
            self.zk.get_children(path, watch=self._children_event)
        except NoNodeError:
            self.zk.exists(path, watch=self._children_event)  # fires when it is created
        self.refresh()

    def _children_event(self, _event: WatchedEvent) -> None:
        if self._closed:
            return
        try:
            self._arm_children()
        except KazooException as exc:  # connection trouble: the session listener re-arms
            log.debug("queue %s: could not re-arm the live watch: %s", self.queue, exc)

    def _queue_changed(self, data: bytes | None, stat: Any) -> bool | None:
        if self._closed:
            return False  # ends the DataWatch
        deleted = stat is None
        if deleted != self.deleted:
            self.deleted = deleted
            log.info("queue %s was %s", self.queue, "deleted" if deleted else "created again")
            if not deleted:
                self.zk.handler.spawn(self._children_event, None)  # its live node is back too
            self._notify()
        return None

    def _session_changed(self, state: str) -> None:
        """A new session lost our one-shot watch: re-arm it (never block a listener)."""
        if state == KazooState.CONNECTED and not self._closed:
            self.zk.handler.spawn(self._children_event, None)

    def _notify(self) -> None:
        callback = self._on_change
        if callback is not None and not self._closed:
            callback()


def _endpoints(live: dict[str, Any]) -> tuple[Any, ...]:
    return live.get("pub"), live.get("sub"), live.get("replay"), live.get("work")
