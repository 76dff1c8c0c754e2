"""An exchange's frames on disk beyond its memory tail: the loop's side of its segment store.

A queue whose storage policy keeps frames on disk (roq/storage_policy.py) gets one segment store
per incarnation, `store_dir(data_dir, queue, xid)/<incarnation>/` (docs/segment-store.md): every
frame the retention keeps is appended, written at each turn of the loop (`flush`), made durable
on the stats tick (`tick`), and served below the memory tail (exchange/tiered.py). Stored frames
belong to their incarnation, as the journal's do (docs/journal.md): a restarted exchange opens
its earlier incarnations' stores read-only (`archived`) and serves them on the replay socket until
their retention deletes them, so positions saved before a restart stay valid.

A disk that refuses the store's writes is the journal's backpressure (exchange/durability.py):
`full` holds the publishers and says why (`storage_full`); what was appended waits in memory and a
later flush retries. A broken store (a failed sync) stays full: only a new incarnation, on a host
the leader moves it to, stores again. A queue made memory only keeps nothing new on disk, and its
stores go with their next retention pass.
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from pathlib import Path
from typing import TypedDict

from exchange.retention import TopicCounts
from exchange.segment_store import SegmentStore, StoreLimits, StoreState
from exchange.store_hooks import PolicyInbox, limits_for, stored_frame
from roq import protocol
from roq.storage_policy import StoragePolicy

log = logging.getLogger(__name__)

MAX_PENDING_BYTES = 64 << 20  # appended, not yet written: past this the publishers are held
RETRY_EVERY = 0.5  # s between two flushes of a store whose disk refused the last one
GONE = StoreLimits(retention=1e-9)  # a queue made memory only: every segment goes at the next pass
GROUPS_DIR = "groups"  # beside the incarnations' stores: the consumer groups' cursor files (exchange/group_restore.py)


class StoreFigures(TypedDict, total=False):
    """The `store_*` fields of records.ExchangeStats (none: no store)."""
    store_state: str
    store_bytes: int
    store_segments: int
    store_oldest_pos: int
    store_oldest_time: float | None


class DiskTail:
    def __init__(self, root: Path | None, incarnation: str, name: str = "",
                 inbox: PolicyInbox | None = None) -> None:
        """`root`: where this exchange's stores live (None: nowhere, memory only); `inbox`: the
        HCM's storage policy lines; `name` ("queue/xid") for the log and `storage_full` reasons."""
        self.root = root
        self.incarnation = incarnation
        self.name = name
        self.inbox = inbox if inbox is not None else PolicyInbox()
        self.store: SegmentStore | None = None
        self.archived: dict[str, SegmentStore] = {}  # earlier incarnations' stores, read only
        self.policy = StoragePolicy()
        self._retry_at = 0.0
        self._started = False
        self.unsynced_from: int | None = None  # the first position appended and not yet fsync'ed (None: none)

    # -- starting and policies ----------------------------------------------------------------

    def start(self, policy: StoragePolicy | None) -> None:
        """Before the loop runs: open earlier incarnations' stores, and ours if `policy` keeps
        frames on disk (None: no policy came, memory only)."""
        self._started = True
        if self.root is None:
            return
        self._open_archived()
        if policy is not None:
            self.apply(policy)

    def apply(self, policy: StoragePolicy) -> None:
        """A storage policy (the first, or a change from `queue.set`): applied to every store."""
        self.policy = policy
        if not policy.on_disk:
            self.unsynced_from = None  # memory only: nothing more waits for the store
        limits = limits_for(policy)
        for store in self.stores():
            store.set_limits(limits or GONE)
        if limits is not None and self.store is None and self.root is not None:
            self.store = SegmentStore(self.root / self.incarnation, limits)
            log.info("segment store of %s at %s: %s", self.name, self.store.directory, policy.describe())

    def _open_archived(self) -> None:
        assert self.root is not None
        if not self.root.is_dir():
            return
        for directory in sorted(self.root.iterdir()):
            if not directory.is_dir() or directory.name in (self.incarnation, GROUPS_DIR):
                continue
            store = SegmentStore(directory, StoreLimits(retention=self.policy.retention,
                                                        retention_bytes=self.policy.retention_bytes))
            if store.first_pos < store.end_pos:
                self.archived[directory.name] = store
                log.info("segment store of earlier incarnation %s: positions %d-%d", directory.name,
                         store.first_pos, store.end_pos - 1)
            else:
                self._remove(directory.name, store)

    def stores(self) -> list[SegmentStore]:
        return ([self.store] if self.store is not None else []) + list(self.archived.values())

    def store_of(self, incarnation: str) -> SegmentStore | None:
        """The store that holds `incarnation`'s frames, if any."""
        return self.store if incarnation == self.incarnation else self.archived.get(incarnation)

    # -- the loop -------------------------------------------------------------------------------

    def append(self, pos: int, topic: bytes, body: object, messages: int, topics: TopicCounts) -> None:
        """A frame the retention just kept (`body` a LargeBody too: stored inline, as the journal does)."""
        store = self.store
        if store is None or not self.policy.on_disk or store.state is StoreState.BROKEN:
            return
        if store.next_pos is not None and store.next_pos != pos:
            store = self._restart(pos)  # the policy was memory only meanwhile: positions must follow
        store.append(stored_frame(pos, time.time(), topic, protocol.inline(body), messages, topics))
        if self.unsynced_from is None:
            self.unsynced_from = pos

    def flush(self, now: float, sync: bool = False) -> None:
        """Write what was appended (each turn of the loop; a refused write is retried every RETRY_EVERY s)."""
        store = self.store
        if store is None or store.state is StoreState.BROKEN or not (store.pending_bytes or sync):
            return
        if store.state is StoreState.FULL and now < self._retry_at and not sync:
            return
        was_full = store.state is StoreState.FULL
        if store.flush(sync=sync):
            if sync:
                self.unsynced_from = None  # every record appended is written, and the tail synced
            if was_full:
                log.info("segment store of %s writes again", self.name)
            return
        self._retry_at = now + RETRY_EVERY
        if not was_full:
            log.error("segment store of %s: %s; publishers held until it writes", self.name, self.error_text)

    def sync(self, now: float) -> None:
        """Write and fsync what was appended (`exchange.store_sync = confirm`: once per loop turn
        with acks waiting, a group commit); a disk that refused the last write is retried only
        every RETRY_EVERY s."""
        store = self.store
        if self.unsynced_from is None or store is None or store.state is StoreState.BROKEN:
            return
        if store.state is StoreState.FULL and now < self._retry_at:
            return
        self.flush(now, sync=True)

    def durable_before(self, next_pos: int) -> int:
        """Every position below this is on the store's disk, fsync'ed (`next_pos`: the stream's)."""
        return next_pos if self.unsynced_from is None else min(next_pos, self.unsynced_from)

    def tick(self, now: float | None = None) -> None:
        """On the stats tick: a new policy, the frames written made durable, retention applied."""
        policy = self.inbox.take() if self._started else None
        if policy is not None:
            self.apply(policy)
        self.flush(time.monotonic(), sync=True)
        wall = time.time() if now is None else now
        for store in self.stores():
            store.apply_retention(wall)
        for incarnation, store in list(self.archived.items()):
            if store.first_pos >= store.end_pos:
                self._remove(incarnation, store)

    def purge(self, upto: int) -> None:
        """A purge: earlier incarnations' stores go, and this one's segments wholly below `upto`
        (the rest is hidden by the retention's floor: exchange/tiered.py)."""
        for incarnation, store in list(self.archived.items()):
            self._remove(incarnation, store)
        if self.store is not None:
            self.store.delete_below(upto)

    def close(self) -> None:
        for store in self.stores():
            store.close()

    # -- what backpressure and the statistics see -----------------------------------------------

    @property
    def full(self) -> bool:
        """The store's disk refuses writes, the store broke, or too much waits to be written."""
        store = self.store
        return store is not None and self.policy.on_disk and (
            store.state is not StoreState.OK or store.pending_bytes > MAX_PENDING_BYTES)

    def figures(self) -> StoreFigures:
        """The store's figures for the statistics (records.ExchangeStats `store_*`): bytes and
        segments on disk over every incarnation's store, this one's oldest position, the oldest
        time held, and the state ("" with no store at all)."""
        stores = self.stores()
        if not stores:
            return StoreFigures()
        store = self.store
        oldest = [held[0].index.times[0] for s in stores
                  if (held := [seg for seg in s.segments if seg.end_pos > seg.first_pos and len(seg.index)])]
        return StoreFigures(
            store_state="full" if self.full else "ok", store_bytes=sum(s.disk_bytes for s in stores),
            store_segments=sum(len(s.segments) for s in stores),
            store_oldest_pos=store.first_pos if store is not None and store.first_pos < store.end_pos else 0,
            store_oldest_time=min(oldest) if oldest else None)

    @property
    def error_text(self) -> str:
        store = self.store
        if store is None or store.state is StoreState.OK:
            return "" if not self.full else "too much waits to be written"
        error = store.error
        code = errno.errorcode.get(error.errno or 0, "E?") if error is not None else "E?"
        text = f"{code}: {error.strerror or error}" if error is not None else "unknown"
        return f"broken: {text}" if store.state is StoreState.BROKEN else text

    @property
    def reason(self) -> str:
        return f"storage_full: exchange {self.name} cannot write its segment store ({self.error_text})"

    # -- helpers --------------------------------------------------------------------------------

    def _restart(self, pos: int) -> SegmentStore:
        assert self.store is not None
        log.warning("segment store of %s missed positions up to %d (memory only meanwhile): started again",
                    self.name, pos - 1)
        limits = self.store.limits
        self._remove(self.incarnation, self.store)
        self.store = SegmentStore(self.store.directory, limits)
        return self.store

    def _remove(self, incarnation: str, store: SegmentStore) -> None:
        store.close()
        self.archived.pop(incarnation, None)
        shutil.rmtree(store.directory, ignore_errors=True)
