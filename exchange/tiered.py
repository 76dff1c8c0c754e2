"""A stream served from its memory tail and, below it, from its segment store (exchange/disk_tail.py).

The replay socket (exchange/replay.py) answers a fetch and a position request from a `Retention`
alone when a queue keeps frames in memory only. With a store, what the memory no longer holds is
read from disk with the same contract (exchange/store_hooks.py `fetch_below_memory`), so a page
may start on disk and go on in memory; `served_from` is then the store's oldest position (above a
purge's floor); positions neither holds any more, and records whose checks fail on disk
(`damaged`), are counted lost. Frames the store has not written yet are not lost: readers that
pass `wait_pending` (a spilled group, a replay fetch, which answers `pending`) end a page before them.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from exchange.retention import Retention
from exchange.segment_store import SegmentStore
from exchange.store_hooks import fetch_below_memory


class Page(NamedTuple):
    frames: list[tuple[bytes, bytes]]
    scanned_to: int
    done: bool
    lost: int
    exact: bool


def held(store: SegmentStore | None) -> bool:
    return store is not None and store.first_pos < store.end_pos


def pending(store: SegmentStore, pos: int) -> bool:
    """The frame at `pos` was appended to the store and waits to be written."""
    return store.end_pos <= pos < (store.next_pos or 0)


def served_from(retention: Retention, store: SegmentStore | None) -> int:
    """Oldest position a reader may still fetch."""
    memory = retention.served_from
    if store is None or not held(store):
        return memory
    return min(max(min(store.first_pos, memory), retention.floor), retention.next_pos)


def read(retention: Retention, store: SegmentStore | None, after: int, before: int, prefixes: list[bytes],
         max_bytes: int, wait_pending: bool = False) -> Page:
    """`Retention.read` and `Retention.lost` in one, over the disk and the memory. `wait_pending`:
    frames appended to the store and not written yet (its disk refused them, the memory let them
    go) end the page, not done, rather than counted lost: a reader that can wait (a spilled group, a
    replay fetch) gets them once they are written."""
    memory_from = retention.served_from
    waits = wait_pending and store is not None and after + 1 < memory_from
    if waits and store is not None and pending(store, max(after + 1, retention.floor)):
        return Page([], after, False, 0, True)  # the next frame the memory let go waits to be written
    start = max(after, retention.floor - 1, store.first_pos - 1) if store is not None else after
    if store is None or not held(store) or start + 1 >= memory_from:
        found, scanned_to, done = retention.read(after, before, prefixes, max_bytes)
        return Page(found, scanned_to, done, *retention.lost(after, before, prefixes))
    upto = min(before, memory_from)
    # Below the store's oldest (or a purge's floor): gone; the retention's tombstones count them.
    lost, exact = retention.lost(after, min(upto, start + 1), prefixes) if start > after else (0, True)
    if upto <= start + 1:
        return Page([], max(after, upto - 1), True, lost, exact)
    disk = fetch_below_memory(store, start, upto, prefixes, max_bytes)
    if disk.damaged:
        lost += sum(end - first for first, end in disk.damaged)  # at least one message each
        exact = False
    if not disk.done:
        return Page(disk.frames, disk.scanned_to, False, lost, exact)
    if wait_pending and disk.scanned_to < upto - 1 and pending(store, disk.scanned_to + 1):
        return Page(disk.frames, disk.scanned_to, False, lost, exact)
    if disk.scanned_to < upto - 1:  # the store ends short of the memory (its disk refused writes): gone
        more, more_exact = retention.lost(disk.scanned_to, upto, prefixes)
        lost, exact = lost + more, exact and more_exact
    size = sum(len(body) for _, body in disk.frames)
    if before <= memory_from or (disk.frames and size >= max_bytes):
        return Page(disk.frames, upto - 1, before <= memory_from, lost, exact)
    found, scanned_to, done = retention.read(memory_from - 1, before, prefixes, max(max_bytes - size, 1))
    more, more_exact = retention.lost(memory_from - 1, before, prefixes)
    return Page(disk.frames + found, scanned_to, done, lost + more, exact and more_exact)


def position_at(retention: Retention, store: SegmentStore | None, at: float) -> int:
    """The first position a reader may fetch that was stored at or after Unix time `at` (next_pos
    if none): from the store's time index below the memory tail, else the memory's own times."""
    oldest, memory_from = served_from(retention, store), retention.served_from
    if store is not None and held(store) and oldest < memory_from:
        pos = store.position_at(at)
        if pos < min(store.end_pos, memory_from):
            return max(pos, oldest)
    monotonic_at = at - time.time() + time.monotonic()  # the retention keeps monotonic times
    return min(max(retention.position_at(monotonic_at), oldest), retention.next_pos)
