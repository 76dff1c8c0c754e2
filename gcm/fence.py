"""Leader fencing: the one place that decides whether this GCM may write, and the only writer of
the leader's changes.

Every leader write is `write()` or `ensure_path()` here: one ZooKeeper transaction that checks the
version of `<root>/gcm/epoch` the leader was elected with, so a deposed leader changes nothing.
`may_write()` (a term is held and ZooKeeper is connected) and the request deadline
(REQUEST_DEADLINE) are decided here too. A keyed request's first write also records
`<root>/gcm/requests/<key>`, so a retry to any leader is answered with success (`already_applied()`;
the newest KEEP_KEYS kept). Term and commit listeners let gcm.cache start anew each term and read
the leader's own writes. The whole design: docs/leader.md "Fencing".
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from roq.errors import FencedError, RequestTimeoutError, UnavailableError, UserError, ZooKeeperUnavailableError
from roq.paths import Paths
from roq.zk import decode, encode

log = logging.getLogger(__name__)

# A retry is recognised while fewer than this many keyed writes followed it: minutes of the
# busiest control traffic, far beyond any client's retries (client.request_timeout).
KEEP_KEYS = 1000
PRUNE_BATCH = 200  # deletes per pruning transaction
ENSURE_ATTEMPTS = 3  # an ensure_path whose directory another client made meanwhile looks again

TermListener = Callable[[int | None], None]
CommitListener = Callable[[list[Any]], None]

_request = threading.local()


@dataclass
class RequestContext:
    """The control request this thread serves: what it may write, and until when."""
    deadline: float  # time.monotonic(): writes after it are refused unsent
    op: str = ""
    key: str | None = None
    subject: str | None = None  # the queue it names, kept with the key to spot a reused key
    recorded: bool = False  # the key went out with a committed write


@contextmanager
def serving(context: RequestContext) -> Iterator[RequestContext]:
    """Writes made inside are fenced by `context`: sent before its deadline or not at all, and
    recording its key.

    kazoo queues requests while it reconnects; without the deadline, a request the
    client already gave up on would be applied whenever ZooKeeper came back.
    """
    previous = current_request()  # a restore fences each of its changes on its own, inside its request
    _request.context = context
    try:
        yield context
    finally:
        _request.context = previous


def current_request() -> RequestContext | None:
    return getattr(_request, "context", None)


class LeaderFence:
    def __init__(self, client: KazooClient, paths: Paths) -> None:
        self.client = client
        self.paths = paths
        self.epoch: int | None = None
        self._version: int | None = None  # version of the epoch znode our claim wrote; None: no term
        self._term_listeners: list[TermListener] = []
        self._commit_listeners: list[CommitListener] = []
        client.add_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._version = None  # the session that won the election is gone, and the term with it

    def add_term_listener(self, listener: TermListener) -> None:
        self._term_listeners.append(listener)

    def add_commit_listener(self, listener: CommitListener) -> None:
        self._commit_listeners.append(listener)

    def may_write(self) -> bool:
        """A term is held (claimed, not released, its session not lost) and ZooKeeper is connected.
        `write()` checks this and the request's deadline before sending, and the epoch in ZooKeeper."""
        return self._version is not None and self.client.connected

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
                for listener in self._term_listeners:
                    listener(epoch)
                return epoch
            log.info("leadership claim raced (%s), retrying", type(failures[0]).__name__)

    def write(self, build: Callable[[TransactionRequest], None]) -> list[Any]:
        """Commit the operations `build` adds, only if our epoch is still current. The first write
        made while serving a keyed request records its key (see the module docstring)."""
        return self._commit(build, for_request=True)

    def ensure_path(self, path: str) -> None:
        """Create `path` and whichever of its parents are missing, in one fenced transaction; a path
        that is there already is success and writes nothing.

        What is missing is read from ZooKeeper itself, never a cache. Neither the request's key nor its
        deadline applies: an empty directory is no change a client asked for (the write that is comes
        before or after it), and made late it changes nothing anyone sees as a change."""
        for attempt in range(ENSURE_ATTEMPTS):
            missing = self._missing(path)
            if not missing:
                return
            try:
                self._commit(functools.partial(_create_all, missing), for_request=False)
                return
            except NodeExistsError:
                if attempt == ENSURE_ATTEMPTS - 1:
                    raise
                log.info("%s was created by another client meanwhile; looking again", path)

    def _missing(self, path: str) -> list[str]:
        """`path` and its parents that do not exist, the shallowest first."""
        missing: list[str] = []
        while path not in ("", "/") and self.client.retry(self.client.exists, path) is None:
            missing.insert(0, path)
            path = path.rsplit("/", 1)[0]
        return missing

    def _commit(self, build: Callable[[TransactionRequest], None], for_request: bool) -> list[Any]:
        """The fenced transaction; `for_request`: bound by the request's deadline, recording its key."""
        if self._version is None:
            raise FencedError("this GCM is not the leader")
        request = current_request() if for_request else None
        if request is not None and time.monotonic() > request.deadline:
            raise UnavailableError("ZooKeeper was too slow to answer; the request expired and changed nothing")
        if not self.client.connected:
            raise ZooKeeperUnavailableError("the leader lost its ZooKeeper connection; nothing was changed")
        txn = self.client.transaction()
        txn.check(self.paths.epoch, self._version)
        build(txn)
        keyed = request if request is not None and request.key and not request.recorded else None
        if keyed is not None:
            txn.create(self.paths.request(str(keyed.key)),
                       encode({"op": keyed.op, "name": keyed.subject, "at": time.time()}))
        try:
            results = txn.commit()
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError, KazooTimeoutError) as exc:
            # Sent, but no answer: ZooKeeper may still commit it when its quorum returns.
            raise RequestTimeoutError(f"ZooKeeper connection lost during the write ({type(exc).__name__}); "
                                      "the outcome is unknown") from None
        if results and isinstance(results[0], (BadVersionError, NoNodeError)):
            raise FencedError(f"epoch {self.epoch} is no longer current: a newer leader was elected")
        if keyed is not None and isinstance(results[-1], NodeExistsError):
            raise UserError(f"request key {keyed.key} was already used for another change; nothing was changed")
        for result in results[1:]:
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise result
        if keyed is not None:
            keyed.recorded = True  # a second write of the same request must not record it again
            results.pop()
        for listener in self._commit_listeners:
            listener(txn.operations[1:])
        return results[1:]

    def already_applied(self) -> bool:
        """Was the request being served applied before (a retry)? A key reused for another
        change is refused: answering it with success would hide the client's bug."""
        request = current_request()
        if request is None or request.key is None:
            return False
        try:
            raw, _ = self.client.retry(self.client.get, self.paths.request(request.key))
        except NoNodeError:
            return False
        earlier = decode(raw)
        if (earlier.get("op"), earlier.get("name")) != (request.op, request.subject):
            raise UserError(f"request key {request.key} was already used for {earlier.get('op')} "
                            f"of {earlier.get('name')!r}; send a new key for a new change")
        log.info("%s of %s with key %s was applied before: answering the retry", request.op,
                 request.subject, request.key)
        return True

    def prune_keys(self, keep: int = KEEP_KEYS) -> int:
        """Delete all but the newest `keep` request keys, once there are twice as many: a listing
        and one stat per key every `keep` writes. Returns how many went."""
        stat = self.client.exists(self.paths.requests)
        if stat is None or stat.numChildren <= 2 * keep:
            return 0
        names = self.client.get_children(self.paths.requests)
        stats = [self.client.exists_async(self.paths.request(n)) for n in names]  # one round of requests
        created = sorted((s.czxid, n) for n, r in zip(names, stats) if (s := r.get()) is not None)
        doomed = [n for _, n in created[:-keep]]
        for start in range(0, len(doomed), PRUNE_BATCH):
            self.write(functools.partial(self._delete_keys, doomed[start:start + PRUNE_BATCH]))
        log.info("pruned %d request keys, kept the newest %d", len(doomed), keep)
        return len(doomed)

    def _delete_keys(self, names: list[str], txn: TransactionRequest) -> None:
        for name in names:
            txn.delete(self.paths.request(name))

    def release(self, remove_record: bool = True) -> None:
        """End the term: forget the epoch, tell the term listeners, and remove our leader record if it
        is still ours (`remove_record` false without a connection: the session's end removes it)."""
        self._version = None
        for listener in self._term_listeners:
            listener(None)
        if not remove_record:
            return
        try:
            _, stat = self.client.get(self.paths.leader)
            if stat.ephemeralOwner == self.client.client_id[0]:
                self.client.delete(self.paths.leader, version=stat.version)
        except (NoNodeError, BadVersionError, NodeExistsError):
            pass
        except Exception as exc:  # connection gone: the session's end removes it anyway
            log.info("could not remove the leader record on step-down: %s", exc)


def _create_all(paths: list[str], txn: TransactionRequest) -> None:
    for path in paths:
        txn.create(path, b"")
