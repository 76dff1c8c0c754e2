"""Leader fencing: every write of a leader is a ZooKeeper transaction that checks
the epoch it was elected with.

A new leader bumps `<root>/gcm/epoch` (a compare-and-set on the znode's
version) in the same transaction that creates the ephemeral leader record.
From then on, any transaction of an older leader fails its version check and
is refused as a whole: a paused, partitioned or expired ex-leader cannot
change anything, even if its own session is still alive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient
from kazoo.client import TransactionRequest
from kazoo.exceptions import (BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError,
                              OperationTimeoutError, RolledBackError, SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError

from roq.errors import (FencedError, RequestTimeoutError, UnavailableError,
                        ZooKeeperUnavailableError)
from roq.paths import Paths
from roq.zk import encode

log = logging.getLogger(__name__)

_request = threading.local()


@contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Writes made inside must be sent within `seconds`, or not at all.

    kazoo queues requests while it reconnects; without this, a request the
    client already gave up on would be applied whenever ZooKeeper came back.
    """
    _request.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _request.deadline = None


class LeaderFence:
    def __init__(self, client: KazooClient, paths: Paths) -> None:
        self.client = client
        self.paths = paths
        self.epoch: int | None = None
        self._version: int | None = None  # version of the epoch znode our claim wrote

    def claim(self, identity: dict[str, Any]) -> int:
        """Become the fenced leader: bump the epoch and publish the leader record atomically."""
        self.client.retry(self.client.ensure_path, self.paths.epoch)
        while True:
            raw, stat = self.client.retry(self.client.get, self.paths.epoch)
            epoch = int(raw or b"0") + 1
            txn = self.client.transaction()
            txn.set_data(self.paths.epoch, str(epoch).encode(), version=stat.version)
            if self.client.retry(self.client.exists, self.paths.leader):
                # A leader that stepped down without its session ending leaves its record.
                txn.delete(self.paths.leader)
            txn.create(self.paths.leader, encode(dict(identity, epoch=epoch)), ephemeral=True)
            results = txn.commit()
            failures = [r for r in results if isinstance(r, Exception)]
            if not failures:
                self.epoch, self._version = epoch, stat.version + 1
                log.info("claimed leadership with epoch %d", epoch)
                return epoch
            log.info("leadership claim raced (%s), retrying", type(failures[0]).__name__)

    def write(self, build: Callable[[TransactionRequest], None]) -> list[Any]:
        """Commit the operations `build` adds, only if our epoch is still current."""
        if self._version is None:
            raise FencedError("this GCM is not the leader")
        deadline = getattr(_request, "deadline", None)
        if deadline is not None and time.monotonic() > deadline:
            raise UnavailableError("ZooKeeper was too slow to answer; the request expired and changed nothing")
        if not self.client.connected:
            raise ZooKeeperUnavailableError("the leader lost its ZooKeeper connection; nothing was changed")
        txn = self.client.transaction()
        txn.check(self.paths.epoch, self._version)
        build(txn)
        try:
            results = txn.commit()
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError, KazooTimeoutError) as exc:
            # Sent, but no answer: ZooKeeper may still commit it when its quorum returns.
            raise RequestTimeoutError(f"ZooKeeper connection lost during the write ({type(exc).__name__}); "
                                      "the outcome is unknown") from None
        if results and isinstance(results[0], (BadVersionError, NoNodeError)):
            raise FencedError(f"epoch {self.epoch} is no longer current: a newer leader was elected")
        for result in results[1:]:
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise result
        return results[1:]

    def release(self) -> None:
        """Step down: forget the epoch and remove our leader record if it is still ours."""
        self._version = None
        try:
            _, stat = self.client.get(self.paths.leader)
            if stat.ephemeralOwner == self.client.client_id[0]:
                self.client.delete(self.paths.leader, version=stat.version)
        except (NoNodeError, BadVersionError, NodeExistsError):
            pass
        except Exception as exc:  # connection gone: the session's end removes it anyway
            log.info("could not remove the leader record on step-down: %s", exc)
