"""The metadata service every GCM runs: `metadata.get` and `metadata.watch` on the control socket,
answered from the GCM's read cache (gcm/metadata_cache.py), and pushes to the connections that
watch a queue when its topology changes (docs/protocol.md section 8).

Versions: each queue's topology (exchanges' endpoints and identities, replicas, relocations, the
leader and the GCMs; not the figures that move every report) is numbered by this GCM, higher with
each change it saw (one sequence for all queues, so a number is never reused). The numbering is
this GCM's own (`gcm`, its id, new each start): a client that moves to another GCM takes its
numbers afresh. Pushes are coalesced (one per queue per COALESCE at most), carry the whole body and
never block: a push a client does not read is dropped, and its next renewal repairs that. A watch
lasts `gcm.metadata_lease` seconds unless renewed.

Cost: a request does work of its own size, whatever the number of watchers (10,000 idle clients
renew about 1,000 watches a second): watches and rate buckets are kept in the order of their last
request, so expiry looks only at the oldest, and a queue's body is read from the cache once per
change, not once per request.

Limits (hostile or runaway clients): queues per watch, watching connections in all, requests per
second per connection; over one, `limit_exceeded` naming it, and nothing changes. While ZooKeeper
is down the cache keeps its last view and answers from it (the cluster cannot change meanwhile);
only a GCM that never read the tree answers `zookeeper_unavailable`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roq.config import GcmConfig
from roq.errors import LimitExceededError, ZooKeeperUnavailableError
from roq.protocol.metadata import check_get, check_watch, encode_push, topology_part

log = logging.getLogger(__name__)

COALESCE = 0.02  # s: changes within this go out as one push per queue
SWEEP = 1.0  # s between sweeps of expired watches and idle rate buckets
BUCKET_IDLE = 10.0  # s a connection's rate bucket is kept without requests

Body = Callable[[str], dict[str, Any]]
Push = Callable[[bytes, bytes], None]


@dataclass
class _Queue:
    version: int
    digest: Any
    watchers: set[bytes] = field(default_factory=set)
    # The version every watcher has been pushed (or answered). A request may read a change first
    # and number it: the push still goes out, since it compares with this, not with the version
    # the push thread saw last.
    pushed: int = 0


@dataclass
class _Watcher:
    queues: frozenset[str]
    expires: float


class MetadataService:
    def __init__(self, gcm_id: str, config: GcmConfig, body: Body, ready: Callable[[], bool], push: Push) -> None:
        """`body(queue)` reads the cache, `ready()` says whether it was ever read, `push(peer, frame)`
        sends one frame to a connection without blocking (any thread)."""
        self.gcm_id = gcm_id
        self.config = config
        self._body, self._ready, self._push = body, ready, push
        self._lock = threading.Condition()
        self._queues: dict[str, _Queue] = {}
        # One sequence for every queue: a queue forgotten (deleted, unwatched) and seen again still
        # gets a higher version than any it had.
        self._sequence = itertools.count(1)
        # Both in the order of their last request (every lease is as long): expiry looks only at the
        # oldest, so a request costs the same with 20 or 20,000 watchers.
        self._watchers: OrderedDict[bytes, _Watcher] = OrderedDict()
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # peer → (tokens, last refill)
        self._dirty: set[str] = set()
        self._all_dirty = False
        # Each known queue's body and topology as last read from the cache, until the cache says it
        # changed: a renewal costs no reading and decoding of the tree.
        self._read: dict[str, tuple[dict[str, Any], Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metadata-pushes", daemon=True)
        self.pushes = 0  # frames handed to the socket (for tests and measurements)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        self._thread.join(timeout=5)

    @property
    def watchers(self) -> int:
        with self._lock:
            return len(self._watchers)

    # ------------------------------------------------------------ requests (the control thread)

    def get(self, args: dict[str, Any], peer: bytes) -> dict[str, Any]:
        queue = check_get(args)
        self._admit(peer)
        with self._lock:
            return self._current(queue)

    def watch(self, args: dict[str, Any], peer: bytes) -> dict[str, Any]:
        request = check_watch(args, self.config.metadata_max_queues)
        theirs = args.get("gcm")
        self._admit(peer)
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            if peer not in self._watchers and len(self._watchers) >= self.config.metadata_max_watchers:
                raise LimitExceededError(f"this GCM serves {self.config.metadata_max_watchers} watching "
                                         "connections at most (gcm.metadata_max_watchers); try another seed")
            self._unregister(peer)
            self._watchers[peer] = _Watcher(frozenset(request.queues), now + self.config.metadata_lease)
            answers = {}
            for queue in request.queues:
                body = self._current(queue, keep=True)
                self._queues[queue].watchers.add(peer)
                if theirs == self.gcm_id and request.versions.get(queue) == body["version"]:
                    answers[queue] = {"queue": queue, "version": body["version"], "gcm": self.gcm_id,
                                      "unchanged": True}
                else:
                    answers[queue] = body
        return {"gcm": self.gcm_id, "lease": self.config.metadata_lease, "queues": answers}

    def _admit(self, peer: bytes) -> None:
        """A token bucket per connection: `gcm.metadata_rate` requests per second, as many at once."""
        rate = self.config.metadata_rate
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.pop(peer, (rate, now))
            tokens = min(rate, tokens + (now - last) * rate)
            if tokens < 1:
                self._buckets[peer] = (tokens, now)
                raise LimitExceededError(f"more than {rate:g} metadata requests per second on one connection "
                                         "(gcm.metadata_rate); slow down")
            self._buckets[peer] = (tokens - 1, now)

    # ------------------------------------------------------------ changes (kazoo's threads)

    def dirty(self, queue: str | None) -> None:
        """The cache changed under `queue` (None: under every queue)."""
        with self._lock:
            if queue is None:
                self._all_dirty = True
                self._read.clear()
            else:
                self._dirty.add(queue)
                self._read.pop(queue, None)
            self._lock.notify_all()

    # ------------------------------------------------------------ internals (under the lock)

    def _current(self, queue: str, keep: bool = False) -> dict[str, Any]:
        """The queue's body with this GCM's version, bumped if its topology changed since last seen;
        `keep`: remember the queue even if it does not exist (someone watches it)."""
        if not self._ready():
            raise ZooKeeperUnavailableError("this GCM has not read the cluster's metadata from ZooKeeper yet; "
                                            "ask another seed or retry shortly")
        body, digest = self._read.get(queue) or self._read_body(queue)
        state = self._queues.get(queue)
        if state is None:
            version = next(self._sequence)
            state = _Queue(version, digest, pushed=version)
            if body["exists"] or keep:  # only real queues and watched ones: a name costs nothing to send
                self._queues[queue] = state
                self._read[queue] = body, digest
        elif state.digest != digest:
            state.version, state.digest = next(self._sequence), digest
        return {**body, "version": state.version, "gcm": self.gcm_id}

    def _read_body(self, queue: str) -> tuple[dict[str, Any], Any]:
        body = self._body(queue)
        read = body, topology_part(body)
        if queue in self._queues:  # remembered only for queues kept: any name may be asked for
            self._read[queue] = read
        return read

    def _unregister(self, peer: bytes) -> None:
        old = self._watchers.pop(peer, None)
        for queue in old.queues if old else ():
            state = self._queues.get(queue)
            if state is not None:
                state.watchers.discard(peer)

    def _expire(self, now: float) -> None:
        """Forget lapsed watches and idle rate buckets: the oldest first, stopping at the first live one."""
        while self._watchers:
            peer, watcher = next(iter(self._watchers.items()))
            if watcher.expires >= now:
                break
            self._unregister(peer)
        while self._buckets:
            peer, (_, last) = next(iter(self._buckets.items()))
            if now - last <= BUCKET_IDLE:
                break
            del self._buckets[peer]

    # ------------------------------------------------------------ the push thread

    def _run(self) -> None:
        next_sweep = time.monotonic() + SWEEP
        while not self._stop.is_set():
            with self._lock:
                if not (self._dirty or self._all_dirty):
                    self._lock.wait(max(0.0, next_sweep - time.monotonic()))
            if self._stop.wait(COALESCE):
                return
            try:
                self._flush()
            except Exception:  # a bad read must not end pushes for good; the next change retries
                log.exception("metadata pushes failed; retrying with the next change")
            if time.monotonic() >= next_sweep:
                with self._lock:
                    self._expire(time.monotonic())
                next_sweep = time.monotonic() + SWEEP

    def _flush(self) -> None:
        frames: list[tuple[bytes, bytes]] = []
        with self._lock:
            queues = set(self._queues) if self._all_dirty else self._dirty & set(self._queues)
            self._dirty, self._all_dirty = set(), False
            if not self._ready():
                return
            for queue in sorted(queues):
                body = self._current(queue)
                state = self._queues[queue]
                if body["version"] != state.pushed and state.watchers:
                    frame = encode_push(body)
                    frames += [(peer, frame) for peer in state.watchers]
                state.pushed = body["version"]
                if not state.watchers and not body["exists"]:
                    del self._queues[queue]  # deleted and nobody cares
                    self._read.pop(queue, None)
        for peer, frame in frames:
            self._push(peer, frame)
        self.pushes += len(frames)
