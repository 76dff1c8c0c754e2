"""Where a subscriber reads an ended exchange incarnation from: its stored copies.

When an exchange incarnation ends (it died, moved or restarted), what it held may still be read
from the replica of a replicated exchange, or from the running incarnation of the same exchange
when its journal reloaded it. The stream rules (roq.client.subscriber.streams) ask for these
endpoints through the replay client; they come from the topology the GCMs push (replicas and
running exchanges), so no lookup leaves the process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from roq.client.subscriber.streams import FetchFailed
from roq.paths import primary_of

Running = Callable[[], dict[str, dict[str, Any]]]


class StoredCopies:
    def __init__(self, queue: str, replicas: Running, running: Running) -> None:
        """`replicas()`: the queue's running replicas by exchange id; `running()`: its running
        exchanges, as the subscriber follows them."""
        self.queue = queue
        self._replicas = replicas
        self._running = running

    def __call__(self, xid: str) -> list[str]:
        """Replay endpoints that may hold ended incarnations of exchange `xid` (I/O thread): its
        replica, and its running incarnation (what a journal reloaded). FetchFailed: ask again."""
        return self._look_up(xid)

    def _look_up(self, xid: str) -> list[str]:
        endpoints = []
        replica = self._replicas().get(primary_of(xid))
        if isinstance(replica, dict) and isinstance(replica.get("replay"), str):
            endpoints.append(replica["replay"])
        running = self._running().get(xid)
        if running is None or (running.get("replicas") == 2 and not endpoints):
            # Not running yet (it may come back with its journal), or its replica is restarting:
            # ask again (until END_DRAIN_TIMEOUT) rather than give the ended incarnation up.
            raise FetchFailed(f"{self.queue}/{xid} or its replica is not running now")
        if isinstance(running.get("replay"), str) and running.get("archived"):
            endpoints.append(running["replay"])
        return endpoints
