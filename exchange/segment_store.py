"""An exchange's frames on disk for as long as its queue's storage policy says (docs/segment-store.md).

An append-only log of opaque frames (position, time, routing topic, body, message count, a small
metadata blob) in segment files of about `segment_bytes`, each with a sparse index beside it
(exchange/segment_index.py), so a read costs a binary search and the bytes it returns, and start-up
reads indexes, not data. Positions are consecutive; times never decrease (an earlier clock reading
is stored as the latest time seen), so a time maps to a position by the index too.

`append` only encodes into memory; `flush` writes what was appended (and with `sync` makes it
durable). A disk that refuses a write (ENOSPC, EIO) leaves no partial record: the write is cut off,
what was appended stays pending, the state is FULL with the reason in `error`, and the caller holds
its publishers until a later `flush` goes through (backpressure, never loss). A failed sync, or a
failed write that cannot be cut off, is BROKEN for good: nothing written since can be called durable.
Retention deletes whole segments, oldest first, by age and by bytes; the segment being written goes
only once all of it is past the age bound and nothing waits to be written to it.
A store has one owner (the exchange's loop): it takes no locks.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from exchange import journal_format as files
from exchange.segment_format import (
    SEGMENT_HEADER,
    IndexEntry,
    StoredFrame,
    encode_record,
)
from exchange.segment_index import Segment, create_segment, delete_files, load_segments
from exchange.segment_reader import ReadResult, find_time, read_segments

__all__ = ["ReadResult", "SegmentStore", "StoreBrokenError", "StoreLimits", "StoreState", "StoredFrame"]

log = logging.getLogger(__name__)

READ_FDS = 32  # segments kept open for reading at once (least recently read closed first)
MIN_SEGMENT_BYTES = 4 << 10


class StoreState(enum.Enum):
    OK = "ok"
    FULL = "full"  # the disk refuses writes: what was appended waits, `flush` again later
    BROKEN = "broken"  # a sync failed, or a refused write could not be cut off: nothing more is durable


class StoreBrokenError(RuntimeError):
    """An append to a store that can no longer make anything durable."""


@dataclass(frozen=True)
class StoreLimits:
    segment_bytes: int = 64 << 20  # a segment is sealed once it holds this much
    index_every: int = 64 << 10  # bytes of records between two index entries
    retention: float = 0.0  # seconds a segment is kept after its newest frame; 0: no age bound
    retention_bytes: int = 0  # bytes of files kept (to within one segment); 0: no size bound

    def check(self) -> StoreLimits:
        if self.segment_bytes < MIN_SEGMENT_BYTES or self.index_every < 1:
            raise ValueError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES} and index_every positive")
        if self.retention < 0 or self.retention_bytes < 0:
            raise ValueError("retention and retention_bytes must be >= 0")
        return self


@dataclass
class _Chunk:
    """Records appended and not written yet, all for one segment."""
    first_pos: int
    new_segment: bool  # the segment does not exist yet: the chunk's first record opens it
    end_pos: int
    newest: float
    data: bytearray = field(default_factory=bytearray)
    entries: list[IndexEntry] = field(default_factory=list)
    sealed: bool = False  # its last entry marks the segment's end: the next chunk opens a new one


class SegmentStore:
    def __init__(self, directory: str | Path, limits: StoreLimits = StoreLimits()) -> None:
        """Open the store in `directory` (made at the first flush, 0700): the segments' indexes are
        read and each segment's tail after its last index entry verified; what fails is cut off and
        listed in `problems` (logged), the rest served."""
        self.directory = Path(directory)
        self.limits = limits.check()
        self.segments: list[Segment] = []  # oldest first, positions consecutive
        self.problems: list[str] = []
        self.state = StoreState.OK
        self.error: OSError | None = None
        self._pending: list[_Chunk] = []
        self.pending_bytes = 0  # appended, not written yet
        self._next_pos: int | None = None  # the position the next append must have; None: any (a new store)
        self._newest = 0.0
        self._tail_size = 0  # bytes of the segment appended to, pending records included; 0: none
        self._tail_indexed: int | None = None  # offset of its last index entry; None: index the next record
        self._read_fds: OrderedDict[int, int] = OrderedDict()  # first_pos -> descriptor
        self._dirs_to_make: list[Path] | None = None
        self._dir_dirty = False
        self._load()

    # -- positions ---------------------------------------------------------------------------

    @property
    def first_pos(self) -> int:
        """The oldest position held (== end_pos when none is)."""
        return self.segments[0].first_pos if self.segments else self.end_pos

    @property
    def end_pos(self) -> int:
        """The position after the last one written (pending frames are not readable yet)."""
        if self.segments:
            return self.segments[-1].end_pos
        return self._pending[0].first_pos if self._pending else (self._next_pos or 1)

    @property
    def next_pos(self) -> int | None:
        """The position the next append must have (None: a new store takes any)."""
        return self._next_pos

    @property
    def disk_bytes(self) -> int:
        return sum(segment.size + segment.index_size for segment in self.segments)

    # -- writing -----------------------------------------------------------------------------

    def append(self, frame: StoredFrame) -> StoredFrame:
        """Queue one frame for the next flush (no system call); returns it as stored (its time
        raised to the latest stored, if the clock went back). ValueError if its position does not
        follow; StoreBrokenError once the store is broken."""
        if self.state is StoreState.BROKEN:
            raise StoreBrokenError(f"segment store {self.directory} is broken: {self.error}")
        if frame.pos != self._next_pos and (self._next_pos is not None or frame.pos < 1):
            raise ValueError(f"position {frame.pos} does not follow {self._next_pos}")
        frame = frame._replace(stored_at=max(frame.stored_at, self._newest))
        record = encode_record(frame)
        chunk = self._chunk_for(frame.pos)
        offset = self._tail_size
        if self._tail_indexed is None or offset - self._tail_indexed >= self.limits.index_every:
            chunk.entries.append(IndexEntry(frame.pos, offset, frame.stored_at))
            self._tail_indexed = offset
        chunk.data += record
        chunk.end_pos, chunk.newest = frame.pos + 1, frame.stored_at
        self._tail_size += len(record)
        self.pending_bytes += len(record)
        self._next_pos, self._newest = frame.pos + 1, frame.stored_at
        return frame

    def _chunk_for(self, pos: int) -> _Chunk:
        """The pending chunk the record at `pos` goes to: the tail segment's while it has room, else
        a new segment's, after the tail one got its end entry."""
        chunk = self._pending[-1] if self._pending else None
        if self._tail_size and self._tail_size < self.limits.segment_bytes:
            if chunk is None:
                chunk = _Chunk(pos, False, pos, self._newest)
                self._pending.append(chunk)
            return chunk
        if self._tail_size:  # seal the tail segment
            if chunk is None:
                chunk = _Chunk(pos, False, pos, self._newest)
                self._pending.append(chunk)
            chunk.entries.append(IndexEntry(pos, self._tail_size, self._newest))
            chunk.sealed = True
        chunk = _Chunk(pos, True, pos, self._newest)
        self._pending.append(chunk)
        self._tail_size, self._tail_indexed = len(SEGMENT_HEADER), None
        return chunk

    def flush(self, sync: bool = False) -> bool:
        """Write what was appended, and with `sync` make it durable; True if it all went through.
        Never raises OSError: a refusal is kept in `state` and `error` (see the module docstring)."""
        if self.state is StoreState.BROKEN:
            return False
        try:
            self._make_dirs()
            while self._pending:
                self._write_chunk(self._pending[0])
                self.pending_bytes -= len(self._pending.pop(0).data)
            if sync:
                self._sync()
        except OSError as exc:
            # Without its traceback: the frames it holds would pin the pending bytearray, which
            # takes the next appends (BufferError on a full disk otherwise).
            self.error = exc.with_traceback(None)
            if self.state is not StoreState.BROKEN:
                self.state = StoreState.FULL
            log.warning("segment store %s: %s (%s)", self.directory, exc, self.state.value)
            return False
        self.state, self.error = StoreState.OK, None
        return True

    def _make_dirs(self) -> None:
        if self._dirs_to_make is None:
            self._dirs_to_make = files.missing_dirs(self.directory)
        while self._dirs_to_make:
            files.make_private_dir(self._dirs_to_make[0])
            del self._dirs_to_make[0]

    def _write_chunk(self, chunk: _Chunk) -> None:
        """Write one chunk's records and index entries (a refusal leaves the files as they were)."""
        if chunk.new_segment and (not self.segments or self.segments[-1].first_pos != chunk.first_pos):
            self.segments.append(create_segment(self.directory, chunk.first_pos))
            self._dir_dirty = True
        segment = self.segments[-1]
        try:
            segment.write(chunk.data, chunk.entries)
        except OSError:
            if segment.torn is not None:
                self.state, self.error = StoreState.BROKEN, segment.torn
            raise
        if chunk.data:
            segment.end_pos, segment.newest = chunk.end_pos, chunk.newest
        if chunk.sealed:  # synced once now, so a later sync need only cover the tail
            self._sync_segment(segment)
            segment.close()

    def _sync_segment(self, segment: Segment) -> None:
        try:
            segment.sync()
        except OSError as exc:  # the kernel may have dropped the dirty pages: nothing since is durable
            self.state, self.error = StoreState.BROKEN, exc
            raise

    def _sync(self) -> None:
        if self.segments:
            self._sync_segment(self.segments[-1])
        if self._dir_dirty:
            try:
                files.fsync_directory(self.directory)
            except OSError as exc:
                self.state, self.error = StoreState.BROKEN, exc
                raise
            self._dir_dirty = False

    # -- reading -----------------------------------------------------------------------------

    def read(self, from_pos: int, to_pos: int, max_bytes: int) -> ReadResult:
        """Written frames with from_pos <= pos < to_pos, oldest first, about `max_bytes` of topics,
        bodies and metas at most (at least one frame if any). Frames deleted by retention are simply
        not there (frames[0].pos > from_pos); damaged records are skipped to the next index entry
        and their positions listed in `damaged`. Reads only the bytes it returns, about."""
        return read_segments(self, max(from_pos, self.first_pos), min(to_pos, self.end_pos), max_bytes)

    def position_at(self, stored_at: float) -> int:
        """The first position stored at or after `stored_at` (end_pos if none is)."""
        return find_time(self, stored_at)

    def segment_of(self, pos: int) -> Segment | None:
        i = bisect_right([segment.first_pos for segment in self.segments], pos) - 1
        return self.segments[i] if i >= 0 and pos < self.segments[i].end_pos else None

    def read_fd(self, segment: Segment) -> int:
        fd = self._read_fds.pop(segment.first_pos, None)
        if fd is None:
            fd = os.open(segment.data_path, os.O_RDONLY | os.O_CLOEXEC)
            while len(self._read_fds) >= READ_FDS:
                files.close_quietly(self._read_fds.popitem(last=False)[1])
        self._read_fds[segment.first_pos] = fd
        return fd

    # -- deleting ----------------------------------------------------------------------------

    def set_limits(self, limits: StoreLimits) -> None:
        """A new policy (queue.set): applied by the next `apply_retention`."""
        self.limits = limits.check()

    def apply_retention(self, now: float | None = None) -> int:
        """Delete the oldest whole segments past the age bound, or while the files exceed the byte
        bound; returns how many went."""
        now = time.time() if now is None else now
        limits = self.limits
        deleted = 0
        while self.segments:
            oldest = self.segments[0]
            too_old = limits.retention > 0 and oldest.newest < now - limits.retention
            too_big = limits.retention_bytes > 0 and self.disk_bytes > limits.retention_bytes
            if not (too_old or too_big) or (oldest is self.segments[-1] and not too_old):
                break
            if not self._delete_oldest():
                break
            deleted += 1
        return deleted

    def delete_below(self, pos: int) -> int:
        """Delete the segments all of whose frames are below `pos` (a purge); returns how many went."""
        deleted = 0
        while self.segments and self.segments[0].end_pos <= pos and self._delete_oldest():
            deleted += 1
        return deleted

    def _delete_oldest(self) -> bool:
        """Delete the oldest segment; False if it may not go now. The tail goes only with nothing
        pending, replaced by an empty segment that remembers the next position and the newest time
        (a restart must not forget them); a disk that refuses that keeps the tail for now."""
        segment = self.segments[0]
        if segment is self.segments[-1]:
            if self._pending or segment.size == len(SEGMENT_HEADER) or not self._start_empty_tail(segment):
                return False
        self.segments.pop(0)
        fd = self._read_fds.pop(segment.first_pos, None)
        if fd is not None:
            files.close_quietly(fd)
        problem = delete_files(segment)
        if problem:  # a failing disk: the files stay, counted no more (the next start deletes them)
            log.warning("segment store %s: %s", self.directory, problem)
        return True

    def _start_empty_tail(self, tail: Segment) -> bool:
        entry = IndexEntry(tail.end_pos, len(SEGMENT_HEADER), tail.newest)
        try:
            empty = create_segment(self.directory, tail.end_pos)
        except OSError as exc:
            log.warning("segment store %s: old segment kept, no room for the next one: %s", self.directory, exc)
            return False
        try:
            empty.write(b"", [entry])
        except OSError as exc:
            delete_files(empty)
            log.warning("segment store %s: old segment kept, no room for the next one: %s", self.directory, exc)
            return False
        self.segments.append(empty)
        self._dir_dirty = True
        empty.newest = tail.newest
        self._tail_size, self._tail_indexed = len(SEGMENT_HEADER), len(SEGMENT_HEADER)
        return True

    # -- opening and closing -----------------------------------------------------------------

    def _load(self) -> None:
        self.segments, self.problems = load_segments(self.directory, self.limits.index_every)
        for problem in self.problems:
            log.warning("segment store %s: %s", self.directory, problem)
        if self.segments:
            tail = self.segments[-1]
            self._next_pos, self._newest = tail.end_pos, tail.newest
            self._tail_size, self._tail_indexed = tail.size, tail.index.last.offset

    def close(self) -> None:
        """Write and sync what is pending (a refusal is logged), close every file. Idempotent."""
        if self._pending or self.segments:
            self.flush(sync=True)
        for segment in self.segments:
            segment.close()
        while self._read_fds:
            files.close_quietly(self._read_fds.popitem()[1])
