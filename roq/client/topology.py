"""The running exchanges of one queue, as the GCMs tell them (roq.client.metadata, docs/protocol.md
section 8): no ZooKeeper. `deleted` says whether the queue exists now; `on_change` fires when it is
deleted or created again and when endpoints change. `replicas` and `relocations` come with every
topology (what a subscriber reads ended incarnations from, where the leader moves publishers).

While no GCM answers, the last topology stays: nothing changes in the cluster meanwhile.
`close()` ends the watch: after it, `on_change` is never called again (a closed Publisher's
wake-up pipe may already be another file).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from roq.client.metadata import MetadataClient
from roq.errors import QueueNotFoundError
from roq.names import check_queue_name

log = logging.getLogger(__name__)

GONE_GRACE = 5.0  # s a receiver goes on after its queue was deleted (it may be created again)


class QueueTopology:
    """`exchanges` maps exchange id → {pub, sub, replay, work, incarnation, host, stats, ...}."""

    def __init__(self, metadata: MetadataClient, queue: str, on_change: Callable[[], None] | None = None,
                 on_relocations: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.metadata = metadata
        self.queue = check_queue_name(queue)
        self._on_change: Callable[[], None] | None = None  # not during the first, synchronous read
        self._on_relocations = on_relocations
        self._lock = threading.Lock()
        self._closed = False
        self.deleted = False
        self._gone_since: float | None = None  # when check_exists() first saw it deleted
        self.exchanges: dict[str, dict[str, Any]] = {}
        self.replicas: dict[str, dict[str, Any]] = {}
        self.relocations: dict[str, Any] = {}
        self.version = 0
        self._apply(metadata.follow(self.queue, self._apply, metadata.config.client.request_timeout))
        self._on_change = on_change

    def close(self) -> None:
        """Stop following; `on_change` is not called from here on."""
        with self._lock:
            self._closed = True
            self._on_change = None
        self.metadata.unfollow(self.queue, self._apply)

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
        """The exchanges as last told (the GCM pushes every change; nothing to read again)."""
        return self.snapshot()

    def _apply(self, body: dict[str, Any]) -> None:
        """A topology from the GCMs (the metadata client's thread, or the constructor's)."""
        live = body["exchanges"]
        with self._lock:
            if self._closed:
                return
            changed = {k: _endpoints(v) for k, v in live.items()} != \
                      {k: _endpoints(v) for k, v in self.exchanges.items()}
            existence_changed = self.deleted != (not body["exists"])
            self.deleted = not body["exists"]
            self.exchanges, self.replicas = live, body["replicas"]
            relocations_changed = body["relocations"] != self.relocations
            self.relocations = body["relocations"]
            if changed:
                self.version += 1
        if existence_changed:
            log.info("queue %s was %s", self.queue, "deleted" if self.deleted else "created again")
        if relocations_changed and self._on_relocations is not None and not self._closed:
            self._on_relocations(self.relocations)
        if changed or existence_changed:
            log.debug("queue %s now has exchanges %s", self.queue, sorted(live))
            callback = self._on_change
            if callback is not None and not self._closed:
                callback()


def _endpoints(live: dict[str, Any]) -> tuple[Any, ...]:
    return live.get("pub"), live.get("sub"), live.get("replay"), live.get("work"), live.get("incarnation")
