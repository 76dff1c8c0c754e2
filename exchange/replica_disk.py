"""A replica's copies on its own host's disk: one segment store per primary incarnation copied.

With a queue whose storage policy keeps frames on disk (roq/storage_policy.py), the replica writes
every frame it copies (exchange/replica.py) to a segment store of the same format as the primary's
(docs/segment-store.md), `store_dir(data_dir, queue, xid + "~r")/<incarnation>/` on its host, so
that when the primary's host is lost with its disk, the copy of each ended incarnation is still
served from position 1 (within retention) below the copy's memory tail (exchange/tiered.py).

A copy's store starts with the copy: a new follow, or a jump (the primary no longer holds the frames
between), replaces it; a dropped copy's store is deleted. The store is written before a copy page
is answered `copied` (a killed replica process loses nothing it acknowledged: the page cache has
it) and synced on the stats tick, as the primary's is; with `exchange.store_sync = confirm` a loop
turn's copy pages are answered only after one fsync of each store they wrote (`sync_written`). A
store whose disk refuses writes makes the replica take no more pages (`accepts` is False) until a
flush goes through: the primary's confirms wait, its retention fills, its publishers are held;
nothing acknowledged is lost.

**State transfer** (protocol section 6.5): a copy that started at a jump (a new replica, placed
after the primary's memory had moved on) lacks what lies below its start on the primary's disk.
The primary sends it as `fill` pages, written to a second store (`<incarnation>~base/`) that is
not served; once it reaches the copy's start, its segments are moved into the copy's store
(highest first, so a crash leaves consecutive positions) and the copy is served whole: the
replica is then `in sync`. The stores of the primary's earlier incarnations (it restarted on its
host) come the same way (`fill_ended`), each to `<earlier>~base/`, renamed `<earlier>/` once whole
and then served as an adopted store is: so the primary's host lost with its disk loses none of them.
A copy whose own transfer did not finish (the link broke, either side restarted) keeps a marker in
its store (exchange/transfer_marker.py), so the primary's next incarnation offering it as an
earlier one gets what lies below its start transferred instead of an answer that it is complete.
A fresh transfer store takes only a transfer's first page (`jump`, or position 1).

**Adoption**: a restarted replica process keeps the stores an earlier process of it wrote (its
host restarted with its data directory, or only the process did): each becomes a *stored*
incarnation, read only, served on the replay socket like an ended copy (sealed by a subscriber's
position request, as a copy is) until its retention deletes it. So when every host restarts, or
the primary's host is lost meanwhile, what this replica held of an ended incarnation is still
served. Should the primary follow an adopted incarnation again (it still runs: only the replica
restarted), the adopted store is replaced by a fresh copy (the primary holds that incarnation, and
sends it again, with a state transfer of what lies on its disk). An unfinished transfer
(`~base`) is never served: it is deleted at start.

Incarnation names come from the primary (checked against the cluster's digest, and here against
the characters a directory name may have), so a peer can never make the replica write outside its
root.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import time
from pathlib import Path

from exchange.journal_format import fsync_directory
from exchange.retention import TopicCounts
from exchange.segment_format import SEGMENT_FILE
from exchange.segment_store import SegmentStore, StoreLimits, StoreState
from exchange.store_hooks import PolicyInbox, limits_for, stored_frame
from exchange.transfer_marker import TORN, clear_missing, read_missing, write_missing
from roq import protocol
from roq.storage_policy import StoragePolicy

log = logging.getLogger(__name__)

BASE_SUFFIX = "~base"  # a transfer in progress, beside the copy's store
REPLICA_SUFFIX = "~r"  # the replica's stores of xid live beside the primary's, as <xid>~r
MAX_PENDING_BYTES = 64 << 20  # appended, not written yet: past this no page is taken
MAX_ADOPTED = 8  # stores adopted at start (as many as copies kept): the most recently written
RETRY_EVERY = 0.5  # s between two flushes of a store whose disk refused the last one
_DIR_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.~-]{0,199}")


def safe_dir_name(name: str) -> bool:
    """Whether `name` may be a directory under the replica's root (no separator, no dot-dot)."""
    return _DIR_NAME.fullmatch(name) is not None and ".." not in name


class ReplicaDisk:
    def __init__(self, root: Path | None, inbox: PolicyInbox | None = None, sync_before_answer: bool = False) -> None:
        """`root`: where this replica's stores live (None: nowhere, memory only); `inbox`: the
        HCM's storage policy lines; `sync_before_answer` (`exchange.store_sync = confirm`): a copy
        page is answered only once the store fsync'ed it (`sync_written`, once per loop turn)."""
        self.root = root
        self.sync_before_answer = sync_before_answer
        self.syncs = 0  # sync_written's fsyncs of a store (one per store and loop turn)
        self._unsynced: set[str] = set()  # copies written since sync_written last ran
        self.inbox = inbox if inbox is not None else PolicyInbox()
        self.policy = StoragePolicy()
        self.stores: dict[str, SegmentStore] = {}
        self.starts: dict[str, int] = {}  # where each copy began: a transfer fills what lies below
        self.bases: dict[str, SegmentStore] = {}  # transfers in progress
        self.in_sync: set[str] = set()  # copies whose transfer completed (or that needed none)
        self.adopted: dict[str, SegmentStore] = {}  # stores an earlier process of this replica wrote
        self.missing: dict[str, int] = {}  # adopted stores that lack what lies below this position
        self.purged: set[str] = set()  # earlier incarnations a purge dropped: no transfer brings them back
        self._marker_due: dict[str, int] = {}  # copies whose transfer marker a full disk refused
        self._retry_at = 0.0

    def start(self, policy: StoragePolicy | None) -> None:
        """Before the loop: the stores an earlier replica process left are adopted (served read
        only); its unfinished transfers, and empty stores, go; all of them if the policy keeps
        nothing on disk. No policy (none came): they are left as they are."""
        if policy is None:
            return
        self.policy = policy
        if self.root is None or not self.root.is_dir():
            return
        limits = limits_for(self.policy)
        found = [d for d in self.root.iterdir() if d.is_dir() and safe_dir_name(d.name)]
        for directory in sorted(found, key=_modified, reverse=True):  # the newest kept past MAX_ADOPTED
            if limits is None or directory.name.endswith(BASE_SUFFIX) or len(self.adopted) >= MAX_ADOPTED:
                shutil.rmtree(directory, ignore_errors=True)
                continue
            store = SegmentStore(directory, limits)
            if store.first_pos < store.end_pos:
                self.adopted[directory.name] = store
                self._note_missing(directory.name, store)
                log.info("adopted the stored copy of %s: positions %d-%d", directory.name, store.first_pos,
                         store.end_pos - 1)
            else:
                _delete(store)

    def _note_missing(self, name: str, store: SegmentStore) -> None:
        """An adopted store whose transfer did not finish (transfer_marker.py) lacks what lies below
        its first position: the copy began there, or a transfer that was joining it when the process
        stopped left it consecutive from there (the marker's own position, or a damaged marker,
        says no more than that)."""
        below = read_missing(store.directory)
        if below is None:
            return
        if below == TORN:
            log.warning("the transfer marker of %s cannot be read: it still says the store is not whole", name)
        self.missing[name] = store.first_pos
        log.warning("the stored copy of %s lacks positions below %d (its state transfer did not finish): "
                    "a primary that holds them transfers them again", name, store.first_pos)

    # -- the copies' life ----------------------------------------------------------------------

    def open(self, incarnation: str, first_pos: int = 1) -> None:
        """A copy of `incarnation` starts at `first_pos` (1, or where a jump says): a fresh store,
        if the policy keeps frames on disk."""
        self.drop(incarnation)
        limits = limits_for(self.policy)
        if limits is None or self.root is None or not safe_dir_name(incarnation + BASE_SUFFIX):
            return
        shutil.rmtree(self.root / incarnation, ignore_errors=True)  # one an earlier process left unadopted
        store = self.stores[incarnation] = SegmentStore(self.root / incarnation, limits)
        self.starts[incarnation] = first_pos
        if first_pos <= 1:
            self.in_sync.add(incarnation)
        else:
            self._marker_due[incarnation] = first_pos  # before the first frame: a restart must know
            self._note_transfer_due(incarnation, store)
        log.info("copy of %s stored at %s: %s", incarnation, self.root / incarnation, self.policy.describe())

    def _note_transfer_due(self, incarnation: str, store: SegmentStore) -> bool:
        """The marker of a copy begun at a jump (transfer_marker.py): its store takes nothing before."""
        try:
            write_missing(store.directory, self._marker_due[incarnation])
        except OSError as err:
            full = err.errno in (errno.ENOSPC, errno.EDQUOT)
            if store.state is StoreState.OK:  # once, not at each retry
                log.error("cannot note the transfer due below position %d of %s (%s): its store takes nothing%s",
                          self._marker_due[incarnation], incarnation, err, " until its disk has room" if full else "")
            store.state, store.error = StoreState.FULL if full else StoreState.BROKEN, err
            self._retry_at = time.monotonic() + RETRY_EVERY
            if full:
                return False  # refusing writes (the full-disk tolerance); `accepts` tries again
        del self._marker_due[incarnation]  # written, or broken for good: nothing to retry
        return store.state is not StoreState.BROKEN

    def drop(self, incarnation: str) -> None:
        self._marker_due.pop(incarnation, None)
        self.starts.pop(incarnation, None)
        self.missing.pop(incarnation, None)
        self.in_sync.discard(incarnation)
        for stores in (self.stores, self.bases, self.adopted):
            store = stores.pop(incarnation, None)
            if store is not None:
                _delete(store)

    # -- state transfer --------------------------------------------------------------------------

    def fill(self, fill: protocol.Fill) -> int | None:
        """Take a transfer page; returns where the transfer is (`filled next_pos`: end_pos once
        complete, 0 when no transfer toward fill.end_pos is taken here; None: the disk refuses it
        now, no answer, the primary asks again)."""
        incarnation, end = fill.incarnation, fill.end_pos
        tail = self.stores.get(incarnation)
        if tail is None or self.starts.get(incarnation) != end or incarnation in self.in_sync:
            return end if incarnation in self.in_sync and self.starts.get(incarnation) == end else 0
        held = self._take(incarnation, fill, tail.limits)
        if held is not None:
            self._try_complete(incarnation)
        return held

    def fill_ended(self, fill: protocol.Fill) -> int | None:
        """Take a page of the primary's earlier incarnation `fill.ended` (`fill_ended`), whole up to
        its end: written to `<ended>~base/`, which once complete becomes a stored incarnation of
        this replica, served as an adopted one. One we hold a store of already (we copied it, or
        adopted it) is answered complete at once; 0: none is taken here (memory only)."""
        ended, end = fill.ended, fill.end_pos
        below = self._lacks_below(ended, end)
        if below is not None:
            return self._fill_below(ended, fill, below)
        if ended in self.stores or (ended in self.adopted and self.adopted[ended].end_pos >= end):
            return end  # held whole (a store adopted short, e.g. torn by a power cut, is taken again)
        limits = limits_for(self.policy)
        if limits is None or self.root is None or not safe_dir_name(ended + BASE_SUFFIX) or ended in self.purged:
            return 0
        held = self._take(ended, fill, limits)
        if held is not None and held >= end:
            self._store_ended(ended)
        return held

    def _lacks_below(self, ended: str, end: int) -> int | None:
        """Below which position a store we keep of `ended` lacks frames the primary may hold: our
        copy of it that started at a jump and is not in sync yet, or such a store adopted at start
        (one adopted short of `end` is taken again whole instead). None: nothing known missing."""
        if ended in self.stores:
            return None if ended in self.in_sync else self.starts.get(ended)
        store = self.adopted.get(ended)
        if store is None or store.end_pos < end or ended not in self.missing:
            return None
        return max(self.missing[ended], store.first_pos)  # its retention may have deleted its start since

    def _fill_below(self, name: str, fill: protocol.Fill, below: int) -> int | None:
        """A `fill_ended` page for a store of ours that lacks what lies below `below`: written to
        its transfer store, joined to it once the transfer reaches `below` (then answered complete,
        fill.end_pos). A first page (`jump`) at or past `below`: the primary holds nothing of what
        we lack, the store stays as it is."""
        tail = self.stores.get(name) or self.adopted[name]
        if tail.state is StoreState.BROKEN:  # a transfer could never join it: none is taken (0)
            log.warning("%s: its store broke (%s); no transfer of what lies below %d is taken", name, tail.error, below)
            return 0
        if fill.jump and fill.first_pos >= below:
            log.info("%s: the primary holds nothing below position %d; its store stays as it is", name, below)
            self._now_whole(name, tail)
            return fill.end_pos
        held = self._take(name, fill, tail.limits, upto=below)
        if held is None or held < below:
            return held
        if name in self.stores:  # our copy of that ended incarnation
            self._try_complete(name)
            if name in self.in_sync:
                return fill.end_pos
            if tail.segments and tail.first_pos > below:  # its retention deleted where the transfer joins
                self._now_whole(name, tail)
                return fill.end_pos
            return None  # its store has not written everything yet: the primary asks again in 2 s
        self._join_adopted(name)
        return fill.end_pos

    def _now_whole(self, name: str, tail: SegmentStore) -> None:
        """Nothing more will come below `tail`: its transfer (if any) goes, it counts as whole."""
        base = self.bases.pop(name, None)
        if base is not None:
            _delete(base)
        try:
            clear_missing(tail.directory)
        except OSError as err:
            log.error("cannot remove the transfer marker of %s (%s): a restart takes the transfer again", name, err)
        self.missing.pop(name, None)
        if name in self.stores:
            self.in_sync.add(name)

    def _join_adopted(self, name: str) -> None:
        """The transfer of what an adopted store lacked reached its first position: one store now."""
        merged = join_below(self.bases.pop(name), self.adopted[name])
        self.adopted[name] = merged
        self._now_whole(name, merged)
        log.info("stored %s is whole again: positions %d-%d", name, merged.first_pos, merged.end_pos - 1)

    def _take(self, name: str, fill: protocol.Fill, limits: StoreLimits, upto: int | None = None) -> int | None:
        """Write a page to the transfer store of `name` (a new one at a jump past what it holds; a
        fresh one takes only a transfer's first page: `jump`, or position 1), frames from `upto`
        on left out; returns where it is (1 for a page refused: send from your first position),
        None if its disk refuses the page now."""
        base = self.bases.get(name)
        if fill.jump and (base is None or fill.first_pos > base.end_pos):
            base = self._new_base(name, limits)
        elif (base is None or base.next_pos is None) and fill.first_pos > 1:
            log.warning("refused a transfer page of %s at position %d: a new transfer starts with the first "
                        "page of the primary's store (jump); asking again from the start", name, fill.first_pos)
            return 1
        elif base is None:
            base = self._new_base(name, limits)
        held = base.next_pos if base.next_pos is not None else fill.first_pos
        skip = held - fill.first_pos
        if skip < 0:
            return held
        if not self.accepts_base(base):
            return None
        wanted = fill.frames[skip:] if upto is None else fill.frames[skip:max(skip, upto - fill.first_pos)]
        for stored_at_us, topic, body, messages in wanted:
            frame = stored_frame(held, stored_at_us / 1e6, topic, body, messages, protocol.body_topics(body))
            base.append(frame)
            held += 1
        if not self._flush(base):
            return None  # the primary asks again; what was appended waits in the store
        return held

    def _store_ended(self, ended: str) -> None:
        """A complete transfer of an earlier incarnation: its directory becomes the stored one."""
        assert self.root is not None
        base = self.bases.pop(ended)
        base.close()
        short = self.adopted.pop(ended, None)  # an adopted store that ended short: replaced
        if short is not None:
            short.close()
        self.missing.pop(ended, None)  # what the short one lacked came with the whole transfer
        target = self.root / ended
        shutil.rmtree(target, ignore_errors=True)
        os.replace(base.directory, target)
        fsync_directory(self.root)
        self.adopted[ended] = SegmentStore(target, base.limits)
        stored = self.adopted[ended]
        log.info("stored %s, transferred whole: positions %d-%d", ended, stored.first_pos, stored.end_pos - 1)

    def accepts_base(self, base: SegmentStore) -> bool:
        if base.state is StoreState.FULL and time.monotonic() >= self._retry_at:
            self._flush(base)
        return base.state is StoreState.OK and base.pending_bytes <= MAX_PENDING_BYTES

    def _new_base(self, incarnation: str, limits: StoreLimits) -> SegmentStore:
        old = self.bases.pop(incarnation, None)
        if old is not None:
            old.close()
            shutil.rmtree(old.directory, ignore_errors=True)
        assert self.root is not None
        shutil.rmtree(self.root / (incarnation + BASE_SUFFIX), ignore_errors=True)
        base = SegmentStore(self.root / (incarnation + BASE_SUFFIX), limits)
        self.bases[incarnation] = base
        return base

    def _try_complete(self, incarnation: str) -> None:
        """Once the transfer reached the copy's start and the copy's store has written everything
        (reopening it must lose nothing), the two become one (retried on the stats tick)."""
        base, tail = self.bases.get(incarnation), self.stores.get(incarnation)
        if base is None or tail is None or base.end_pos != self.starts.get(incarnation) or base.pending_bytes:
            return
        # A copy that jumped with an empty page has written nothing yet: it continues the transfer.
        starts_there = tail.first_pos == base.end_pos or (tail.next_pos is None and not tail.segments)
        if tail.state is StoreState.OK and not tail.pending_bytes and starts_there:
            self._complete(incarnation)

    def _complete(self, incarnation: str) -> None:
        """The transfer reached the copy's start: its segments join the copy's store, which is
        reopened over both (it is written to only between two pages, never during this)."""
        merged = self.stores[incarnation] = join_below(self.bases.pop(incarnation), self.stores[incarnation])
        self._now_whole(incarnation, merged)
        log.info("copy of %s in sync: positions %d-%d stored", incarnation, merged.first_pos, merged.end_pos - 1)

    def store_of(self, incarnation: str) -> SegmentStore | None:
        """The store serving `incarnation`: its copy's, or one adopted at start."""
        return self.stores.get(incarnation) or self.adopted.get(incarnation)

    def accepts(self, incarnation: str) -> bool:
        """May a page of `incarnation` be taken now? Not while its store's disk refuses writes,
        it broke, or too much waits to be written."""
        store = self.stores.get(incarnation)
        if store is None:
            return True
        if incarnation in self._marker_due and (
                time.monotonic() < self._retry_at or not self._note_transfer_due(incarnation, store)):
            return False
        if store.state is StoreState.FULL and time.monotonic() >= self._retry_at:
            self._flush(store)
        return store.state is StoreState.OK and store.pending_bytes <= MAX_PENDING_BYTES

    def problem(self, incarnation: str) -> str:
        """Why the store of `incarnation` takes no page (for the `broken` answer and the logs)."""
        store = self.stores.get(incarnation)
        if store is None:
            return ""
        state = "broken (an fsync or write failed)" if store.state is StoreState.BROKEN else "refusing writes"
        return f"{state}: {store.error}" if store.error is not None else state

    def append(self, incarnation: str, pos: int, topic: bytes, body: bytes, messages: int,
               topics: TopicCounts) -> None:
        store = self.stores.get(incarnation)
        if store is None or store.state is StoreState.BROKEN:
            return
        store.append(stored_frame(pos, time.time(), topic, body, messages, topics))

    def flush(self, incarnation: str) -> bool:
        """Write what a page appended (before it is answered); False: the disk refused it."""
        store = self.stores.get(incarnation)
        if store is None:
            return True
        if self.sync_before_answer:
            self._unsynced.add(incarnation)
        return self._flush(store)

    def sync_written(self) -> set[str]:
        """Fsync every copy's store written since the last call (the loop turn's group commit, before
        its `copied` answers leave); returns the incarnations whose store refused it (not answered:
        the primary asks again)."""
        refused = set()
        for incarnation in self._unsynced:
            store = self.stores.get(incarnation)
            if store is None:
                continue  # dropped meanwhile: its copy answers nothing more
            self.syncs += 1
            if not self._flush(store, sync=True):
                refused.add(incarnation)
        self._unsynced.clear()
        return refused

    def purge(self, incarnation: str, upto: int) -> None:
        """A purge of `incarnation`: its store below `upto`, and the adopted stores of the others
        (and earlier incarnations' transfers under way: they must not complete after it)."""
        for other in [inc for inc in (*self.adopted, *self.bases) if inc != incarnation]:
            self.drop(other)
            self.purged.add(other)
        store = self.stores.get(incarnation)
        if store is not None:
            store.delete_below(upto)

    # -- the stats tick ------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """A new policy applied, what was written made durable, retention applied."""
        policy = self.inbox.take()
        if policy is not None:
            self.policy = policy
            limits = limits_for(policy)
            for incarnation, store in [*self.stores.items(), *self.adopted.items(), *self.bases.items()]:
                if limits is None:
                    self.drop(incarnation)  # memory only now: a copy's store would have holes
                else:
                    store.set_limits(limits)
        wall = time.time() if now is None else now
        for store in self.stores.values():
            if store.state is not StoreState.BROKEN:
                self._flush(store, sync=True)
            store.apply_retention(wall)
        for incarnation, store in list(self.adopted.items()):
            store.apply_retention(wall)
            if store.first_pos >= store.end_pos:
                self.drop(incarnation)
        for incarnation, base in list(self.bases.items()):
            base.apply_retention(wall)  # a long transfer's oldest frames age out as the copy's would
            self._try_complete(incarnation)

    def adopted_oldest_first(self) -> list[str]:
        """The stored incarnations (adopted at start, or transferred whole), by their newest frame's
        time: the exchange's incarnations followed one another, so this is the order they ran in."""
        return sorted(self.adopted, key=lambda incarnation: _newest(self.adopted[incarnation]))

    def close(self) -> None:
        for store in [*self.stores.values(), *self.bases.values(), *self.adopted.values()]:
            store.close()

    def report(self) -> dict[str, int | bool]:
        return {"stored_bytes": sum(store.disk_bytes for store in [*self.stores.values(), *self.adopted.values()]),
                "transferring": len(self.bases), "adopted": len(self.adopted),
                "storage_full": bool(any(store.state is not StoreState.OK for store in self.stores.values()))}

    def _flush(self, store: SegmentStore, sync: bool = False) -> bool:
        if store.flush(sync=sync):
            return True
        self._retry_at = time.monotonic() + RETRY_EVERY
        return False


def join_below(base: SegmentStore, tail: SegmentStore) -> SegmentStore:
    """Move a transfer's segments into the store they end below, and reopen that store over both
    (neither is written to meanwhile). Highest first: a crash between two leaves consecutive
    positions, with the transfer marker still there (transfer_marker.py)."""
    base.close()
    tail.close()
    names = sorted((name for name in os.listdir(base.directory) if SEGMENT_FILE.match(name)), reverse=True)
    for name in names:
        for suffix in (".seg", ".idx"):  # an index missing is rebuilt at start-up
            source = base.directory / (name.rsplit(".", 1)[0] + suffix)
            if source.exists():
                os.replace(source, tail.directory / source.name)
    fsync_directory(tail.directory)
    shutil.rmtree(base.directory, ignore_errors=True)
    return SegmentStore(tail.directory, tail.limits)


def _modified(directory: Path) -> float:
    try:
        return directory.stat().st_mtime
    except OSError:
        return 0.0


def _newest(store: SegmentStore) -> float:
    return store.segments[-1].newest if store.segments else 0.0


def _delete(store: SegmentStore) -> None:
    store.close()
    shutil.rmtree(store.directory, ignore_errors=True)
