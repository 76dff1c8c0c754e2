"""The running exchanges of one queue, followed through ZooKeeper watches."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from roq.errors import QueueNotFoundError
from roq.names import check_queue_name
from roq.paths import Paths
from roq.state import read_live

log = logging.getLogger(__name__)


class QueueTopology:
    """`exchanges` maps exchange id → {pub, sub, replay, host, stats}; `on_change` fires when endpoints change."""

    def __init__(self, zk: KazooClient, paths: Paths, queue: str,
                 on_change: Callable[[], None] | None = None) -> None:
        self.zk = zk
        self.paths = paths
        self.queue = check_queue_name(queue)
        if not zk.retry(zk.exists, paths.queue(queue)):
            raise QueueNotFoundError(f"queue {queue!r} does not exist")
        self._on_change: Callable[[], None] | None = None  # not during the first, synchronous read
        self._lock = threading.Lock()
        self.exchanges: dict[str, dict[str, Any]] = {}
        self.version = 0
        try:
            zk.retry(zk.ensure_path, paths.live_queue(queue))
        except NoAuthError:
            pass  # a read-only identity: the leader creates it with the queue
        zk.ChildrenWatch(paths.live_queue(queue), self._children_changed)
        self._on_change = on_change

    def _children_changed(self, _names: list[str]) -> None:
        self.refresh()

    def refresh(self) -> dict[str, dict[str, Any]]:
        """Re-read endpoints and statistics (watches call this; callers may too)."""
        live = read_live(self.zk, self.paths, self.queue)
        with self._lock:
            changed = {k: _endpoints(v) for k, v in live.items()} != \
                      {k: _endpoints(v) for k, v in self.exchanges.items()}
            self.exchanges = live
            if changed:
                self.version += 1
        if changed:
            log.debug("queue %s now has exchanges %s", self.queue, sorted(live))
            if self._on_change:
                self._on_change()
        return live

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self.exchanges)


def _endpoints(live: dict[str, Any]) -> tuple[Any, ...]:
    return live.get("pub"), live.get("sub"), live.get("replay")
