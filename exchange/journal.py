"""The journal: an exchange incarnation's retained frames on disk, for the incarnations after it.

With `exchange.journal` = "async" or "fsync", every frame the exchange retains is also appended
here, so that after a restart the new incarnation can still serve the frames of the ones before
it; "fsync" makes a frame durable before its ack goes. A full or failing disk never raises out of
`try_commit` (what the exchange calls): the write is retried, and only a failed sync breaks the
journal for good. Layout, on-disk format, failure and bound rules: docs/journal.md. The segment
files are exchange/journal_segments.py's, the format exchange/journal_format.py's, and reading
earlier incarnations back exchange/journal_archives.py's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from zlib import crc32

from exchange.journal_archives import journals_kept, load_archives
from exchange.journal_format import (
    FILE_HEADER,
    JOURNAL_DIR,
    PAYLOAD_HEADER,
    RECORD_HEADER,
    RECORD_OVERHEAD,
    Archive,
    ArchivedFrame,
    write_purge_mark,
)
from exchange.journal_segments import SegmentFiles, Syncer
from roq.config import JOURNAL_MODES

__all__ = ["JOURNAL_DIR", "RECORD_OVERHEAD", "Archive", "ArchivedFrame", "Journal", "journals_kept", "load_archives"]

log = logging.getLogger(__name__)

ASYNC_SYNC_INTERVAL = 1.0  # seconds between syncs in mode "async"
STORAGE_RETRY = 0.5  # seconds between two attempts to write while the disk refuses (try_commit)


class Journal:
    def __init__(self, directory: str | Path, incarnation: str, mode: str, segment_bytes: int,
                 retention_seconds: float, retention_bytes: int) -> None:
        """Journal of `incarnation` under directory/<incarnation>/; creates dirs (0700).
        Mode "off" writes nothing (append checks positions, commit confirms at once)."""
        if mode not in JOURNAL_MODES:
            raise ValueError(f"journal mode must be one of {JOURNAL_MODES}, not {mode!r}")
        if not incarnation or incarnation in (".", "..") or "/" in incarnation or "\0" in incarnation:
            raise ValueError(f"incarnation {incarnation!r} is not a directory name")
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be positive")
        self.path = Path(directory) / incarnation
        self.mode = mode
        self._writes = mode != "off"
        self._segment_bytes = segment_bytes
        self._files = SegmentFiles(self.path, retention_seconds, retention_bytes)
        self._buf = bytearray()  # encoded records appended since the last commit
        self._splits: list[tuple[int, int]] = []  # (offset in _buf, pos): a new segment starts there
        self._segment_fill = segment_bytes + 1  # bytes of the segment the next record goes to; none open yet
        self._next_pos: int | None = None  # position the next append must have
        self._written_pos = 1  # every frame below it was handed to the OS
        self._committed_pos = 1
        self._last_sync = time.monotonic()
        self._closed = False
        self.error: OSError | None = None  # why the last try_commit failed; None once one succeeded
        self.errors = 0  # failed try_commit attempts (for stats)
        self.failing_since: float | None = None  # monotonic: the first failure of the current run of them
        self._retry_at = 0.0
        self._syncer: Syncer | None = None  # started by the first commit_in_background

    @property
    def fsyncs(self) -> int:
        """File and directory syncs done (for stats)."""
        return self._files.fsyncs

    # -- appending ---------------------------------------------------------------------------

    def append(self, pos: int, topic: bytes, body: bytes, messages: int) -> None:
        """Buffer one frame (positions strictly consecutive; ValueError otherwise). Cheap: no syscall per call."""
        if pos != self._next_pos:
            self._check_first(pos)
        if not self._writes:
            self._next_pos = pos + 1
            return
        payload = PAYLOAD_HEADER.pack(pos, messages, len(topic)) + topic + body
        if self._segment_fill > self._segment_bytes:
            self._splits.append((len(self._buf), pos))
            self._segment_fill = len(FILE_HEADER)
        buf = self._buf
        buf += RECORD_HEADER.pack(len(payload), crc32(payload))
        buf += payload
        self._segment_fill += RECORD_HEADER.size + len(payload)
        self._next_pos = pos + 1

    def _check_first(self, pos: int) -> None:
        if self._next_pos is not None:
            raise ValueError(f"journal position {pos} does not follow {self._next_pos - 1}")
        if pos < 1:
            raise ValueError(f"journal positions start at 1 or above, not {pos}")

    # -- committing --------------------------------------------------------------------------

    def commit(self) -> None:
        """Write what was buffered. mode fsync: fsync before returning (group commit: one fsync per call,
        plus fsync of the directory when a new segment file was created). mode async: write to the OS,
        fsync at most once per second in the background of later commits (no thread needed: just time-based)."""
        if self._closed:
            raise ValueError("journal is closed")
        if self._files.failure is not None:
            raise self._files.failure
        if not self._writes:
            self._committed_pos = self._next_pos if self._next_pos is not None else 1
            return
        now = self._write_pending()
        if self.mode == "fsync" or now - self._last_sync >= ASYNC_SYNC_INTERVAL:
            self._sync(now)
        self._committed_pos = self._written_pos

    def commit_in_background(self, on_synced: Callable[[], None]) -> None:
        """`commit` for an event loop: write what was buffered now (a cheap `write`), and in mode
        fsync start syncing it in a background thread unless a sync is running (the next call
        covers what came meanwhile: group commit, pipelined). The loop goes on forwarding while the
        disk works; `committed_pos` moves, at a later call, once a sync covering it has ended, and
        `on_synced` (called from the sync thread) says when to call again. Other modes: `commit`."""
        if self.mode != "fsync":
            self.commit()
            return
        if self._closed:
            raise ValueError("journal is closed")
        syncer = self._syncer
        if syncer is None:
            syncer = self._syncer = Syncer(self.path, on_synced)
        files = self._files
        if syncer.failure is not None and files.failure is None:
            files.failure = syncer.failure  # sticky, as in a synchronous sync
        if files.failure is not None:
            raise files.failure
        self._write_pending()
        if self._written_pos > syncer.submitted_pos and syncer.idle():
            fds, directory_too = files.hand_over_dirty()
            syncer.submit(fds, directory_too, self._written_pos)
        self._committed_pos = max(self._committed_pos, syncer.synced_pos)

    def try_commit(self, on_synced: Callable[[], None], now: float | None = None) -> bool:
        """`commit_in_background` in mode fsync, else `commit`, never raising OSError: True if it
        went through. A failure is kept in `error` and `errors`; what was not written stays buffered,
        and the next attempt waits STORAGE_RETRY seconds (calls before that return False at once)."""
        now = time.monotonic() if now is None else now
        if self.error is not None and now < self._retry_at:
            return False
        try:
            if self.mode == "fsync":
                self.commit_in_background(on_synced)
            else:
                self.commit()
        except OSError as exc:
            self.error, self._retry_at = exc, now + STORAGE_RETRY
            self.errors += 1
            if self.failing_since is None:
                self.failing_since = now
            return False
        self.error = self.failing_since = None
        return True

    @property
    def broken(self) -> bool:
        """A failure this journal cannot recover from (a failed sync, a torn write it could not cut
        off): nothing it writes can be confirmed any more."""
        return self._files.failure is not None or (self._syncer is not None and self._syncer.failure is not None)

    @property
    def pending_bytes(self) -> int:
        """Encoded records not yet handed to the OS (they wait for a commit, or for the disk)."""
        return len(self._buf)

    @property
    def committed_pos(self) -> int:
        """Every frame below this position is durable per the mode (fsync'ed, or handed to the OS);
        1 before the first commit."""
        return self._committed_pos

    def _write_pending(self) -> float:
        """Hand what was buffered to the OS and drop what the bounds evict; returns the time."""
        now = time.monotonic()
        self._files.make_dirs()
        if self._buf:
            self._write_buffered(now)
            self._files.apply_retention_bounds(now)
        return now

    def _write_buffered(self, now: float) -> None:
        """Write _buf: each run of records to its segment, opening segments at the split points.
        On an error, what was written is dropped from the buffer and the rest stays for a retry."""
        assert self._next_pos is not None
        done = 0  # bytes of _buf written
        split = 0  # index of the next split point
        splits = self._splits
        ends = splits + [(len(self._buf), self._next_pos)]  # (offset, position) where each run ends
        view = memoryview(self._buf)
        try:
            while True:
                boundary, end_pos = ends[split]
                if boundary > done:
                    self._files.write(view[done:boundary], end_pos, now)
                    self._written_pos = end_pos
                    done = boundary
                if split == len(splits):
                    break
                self._files.open(splits[split][1], now)
                split += 1
        finally:
            # A new buffer, not an in-place resize: after an error the traceback may still hold
            # slices of the old one, which a bytearray refuses to be resized under.
            self._buf = self._buf[done:]
            self._splits = [(offset - done, pos) for offset, pos in splits[split:]]

    def _sync(self, now: float) -> None:
        self._files.sync()
        self._last_sync = now

    # -- deleting ----------------------------------------------------------------------------

    def trim(self, oldest_pos: int) -> None:
        """Delete whole segments all of whose frames are below oldest_pos (the retention evicted them)."""
        if self._files.trim(oldest_pos, buffered=bool(self._buf)):
            self._segment_fill = self._segment_bytes + 1  # the next record opens a new segment

    def purge(self, upto: int) -> None:
        """The stream was purged below `upto`: mark it for the incarnations that load this journal
        later, and delete the segments wholly below it. Never raises (a refused mark is logged)."""
        if self._writes and self.path.is_dir():
            try:
                write_purge_mark(self.path, upto)
            except OSError as exc:
                log.warning("journal %s: could not mark the purge below position %d (%s): a restart may serve "
                            "what the segment files still hold of it", self.path, upto, exc)
        self.trim(upto)

    def close(self) -> None:
        """Commit what is buffered, sync (whatever the mode), close the files. Idempotent, and
        never raises OSError: what the disk refuses now is logged (in mode fsync none of it was
        confirmed)."""
        if self._closed:
            return
        files = self._files
        if self._syncer is not None:
            self._syncer.stop()  # its sync ends first: the synchronous one below covers the rest
            if self._syncer.failure is not None and files.failure is None:
                files.failure = self._syncer.failure
        try:
            if self._writes and files.failure is None:
                self.commit()
                self._sync(time.monotonic())
        except OSError as exc:
            log.warning("journal %s closed with %d bytes not written or not synced: %s", self.path,
                        len(self._buf), exc)
        finally:
            self._closed = True
            files.close()
