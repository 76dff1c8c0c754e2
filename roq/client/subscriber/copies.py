"""Where a subscriber reads an ended exchange incarnation from: its stored copies.

When an exchange incarnation ends (it died, moved or restarted), what it held may still be read
from the replica of a replicated exchange, or from the running incarnation of the same exchange
when its journal reloaded it. The stream rules (roq.client.subscriber.streams) ask for these
endpoints through the replay client; they are looked up in ZooKeeper at most every half second per
exchange, since a resumed subscriber may drain many incarnations of one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient

from roq.client.subscriber.streams import FetchFailed
from roq.paths import Paths
from roq.zk import read_json

CACHE_SECONDS = 0.5  # an exchange's copies are looked up again after this long
CACHE_LIMIT = 1000  # exchanges remembered; the cache starts again when full


class StoredCopies:
    def __init__(self, zk: KazooClient, paths: Paths, queue: str,
                 running: Callable[[], dict[str, dict[str, Any]]]) -> None:
        """`running()`: the queue's running exchanges, as the subscriber follows them."""
        self.zk = zk
        self.paths = paths
        self.queue = queue
        self._running = running
        self._cache: dict[str, tuple[float, list[str] | FetchFailed]] = {}

    def __call__(self, xid: str) -> list[str]:
        """Replay endpoints that may hold ended incarnations of exchange `xid` (I/O thread): its
        replica, and its running incarnation (what a journal reloaded). FetchFailed: ask again."""
        now = time.monotonic()
        cached = self._cache.get(xid)
        if cached is None or now - cached[0] > CACHE_SECONDS:
            try:
                found: list[str] | FetchFailed = self._look_up(xid)
            except FetchFailed as failed:
                found = failed
            cached = self._cache[xid] = (now, found)
            if len(self._cache) > CACHE_LIMIT:
                self._cache.clear()
        if isinstance(cached[1], FetchFailed):
            raise cached[1]
        return cached[1]

    def _look_up(self, xid: str) -> list[str]:
        if not self.zk.connected:  # kazoo would block this thread until it reconnects
            raise FetchFailed("ZooKeeper is unreachable: the replica cannot be looked up")
        endpoints = []
        try:
            replica = read_json(self.zk, self.paths.replica_live(self.queue, xid))
        except Exception as exc:  # ZooKeeper unreachable: the drain is tried again
            raise FetchFailed(f"could not read the replica of {self.queue}/{xid}: {exc}") from None
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
