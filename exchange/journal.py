"""The journal: an exchange incarnation's retained frames on disk, for the incarnations after it.

With `exchange.journal` = "async" or "fsync", every frame the exchange retains (exchange/retention.py)
is also appended here, so that after a restart the new incarnation can still serve the frames of
the ones before it (same positions, same incarnation names) instead of reporting them lost.
With "off" nothing is written.

Layout: `<hcm.data_dir>/journal/<queue>/<xid>/<incarnation>/<first_pos as 20 digits>.seg`
(directories 0700, files 0600: message bodies are as private as the exchange's memory).
Each incarnation writes only its own directory, so a restarted exchange never appends to a file a
dead process may have left half-written; it only reads, and deletes whole files.

Segment file (all integers little-endian):

    file header   "RoQJ" (4 bytes) | version u32 = 1
    record        length u32 | crc u32 | payload (`length` bytes)
    payload       pos u64 | messages u32 | topic_len u32 | topic (topic_len bytes) | body (the rest)

`crc` is the CRC-32 (zlib) of the payload. The records of a file are frames at consecutive
positions, the first at the position in the file's name; the next file starts where it ends.
Why this shape:
* A new segment starts once the current one exceeds `exchange.journal_segment_bytes`, so what the
  retention evicted goes away by deleting whole files (no rewriting, no compaction); a file's
  name tells which positions it holds without opening it.
* Length + CRC per record make a torn tail (a crash in the middle of a write) and a damaged
  byte detectable: a reader checks the header fits, the payload fits in the file, the CRC, and
  that the position is the next one, and stops at the first record failing any of these
  (everything after it in that incarnation is ignored: positions must stay consecutive).
  The file is never repaired in place: a reader only drops what it cannot verify.
* A fixed binary payload instead of msgpack: about half the encoding cost per frame, and a
  reader needs no schema checks beyond the lengths.
* The version in the file header lets a later format be told apart instead of read as damage.

Writing: `append` only encodes into a buffer (no system call); `commit` writes the buffer with one
`write` per segment touched. Mode "fsync" then `fdatasync`s each file written (one, or two when a
segment filled up) and the directory when a file was created, before `committed_pos` moves: a
batch confirmed to a publisher survives a power loss. Mode "async" leaves the data to the OS and
syncs at most once per second, during a later commit: it survives the process crashing, and a
power loss costs at most about the last second.

Failures (a full or failing disk): `commit` raises the OSError; `try_commit`, what the exchange
calls, never does. A failed `write` (ENOSPC, EIO) is cut off (`ftruncate` to the last whole record),
what it did not write stays buffered, and `try_commit` tries again every `STORAGE_RETRY` seconds:
`error` says why meanwhile, `committed_pos` does not move, and once a write goes through the journal
carries on as if nothing happened (the exchange holds its publishers meanwhile, so the buffer stays
bounded). Directories are made at the first commit, so a disk full from the start is such a failure
too. Two failures are `broken` for good instead: a failed `fdatasync` (after one, Linux may have
dropped the dirty pages, so nothing written since the last good sync can be called durable again)
and a torn write that cannot be cut off; every later commit fails. `close`, `trim` and the deletion
of old segments log what fails and never raise.

Bounds: `trim(oldest)` deletes the segments the retention has fully evicted. The journal also
applies the retention's own bounds to its closed segments (written to longer ago than
`retention_seconds`; or the newer segments already hold `retention_bytes` of topics and bodies,
as the retention counts them), so the disk stays bounded even where `trim` is called rarely.
`load_archives` reads the other incarnations' directories after a restart, bounded by age and
total bytes.

Purges (an admin's `roq queue purge`): `purge(upto)` writes the file `purged` into the incarnation's
directory, holding the position below which its stream was purged (written to a temporary name,
fsync'ed, renamed), and deletes the segments wholly below it; `load_archives` leaves out the frames
below that position, so a restart never serves purged frames again. A disk that refuses the mark is
logged; the segments below the position still go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import NamedTuple
from zlib import crc32

from roq.config import JOURNAL_MODES

log = logging.getLogger(__name__)


FILE_HEADER = b"RoQJ" + struct.pack("<I", 1)
RECORD_HEADER = struct.Struct("<II")  # payload length, CRC-32 of payload
PAYLOAD_HEADER = struct.Struct("<QII")  # pos, messages, topic length
RECORD_OVERHEAD = RECORD_HEADER.size + PAYLOAD_HEADER.size  # bytes of a record that are not topic or body
RECORD_FIXED = struct.Struct("<IIQII")  # both headers, read at once
SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
JOURNAL_DIR = "journal"  # under hcm.data_dir: <JOURNAL_DIR>/<queue>/<xid>/<incarnation>/
PURGE_MARK = "purged"  # in an incarnation's directory: positions below the number it holds were purged
ASYNC_SYNC_INTERVAL = 1.0  # seconds between syncs in mode "async"
STORAGE_RETRY = 0.5  # seconds between two attempts to write while the disk refuses (try_commit)


class ArchivedFrame(NamedTuple):
    pos: int
    topic: bytes
    body: bytes
    messages: int


@dataclass
class Archive:
    """An earlier incarnation's frames, as far as they could be verified."""
    incarnation: str
    frames: list[ArchivedFrame]  # consecutive positions, ascending
    lost_before: int  # position of frames[0] (the next position if empty)
    newest_mtime: float  # wall time its newest segment was last written


def _segment_name(first_pos: int) -> str:
    return f"{first_pos:020d}.seg"


@dataclass
class _Segment:
    first_pos: int
    path: Path
    fd: int | None  # open while written to, or until its last writes are synced
    size: int = len(FILE_HEADER)  # bytes written
    end_pos: int = 0  # next position after its last written record
    last_write: float = 0.0  # monotonic
    dirty: bool = False  # written since its last sync

    @property
    def frame_bytes(self) -> int:
        """Topic and body bytes of its frames (what the retention counts)."""
        return self.size - len(FILE_HEADER) - RECORD_OVERHEAD * (self.end_pos - self.first_pos)


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
        self._retention_seconds = retention_seconds
        self._retention_bytes = retention_bytes
        self._buf = bytearray()  # encoded records appended since the last commit
        self._splits: list[tuple[int, int]] = []  # (offset in _buf, pos): a new segment starts there
        self._segment_fill = segment_bytes + 1  # bytes of the segment the next record goes to; none open yet
        self._next_pos: int | None = None  # position the next append must have
        self._written_pos = 1  # every frame below it was handed to the OS
        self._committed_pos = 1
        self._segments: deque[_Segment] = deque()  # oldest first; the last one is written to
        self._frame_bytes = 0  # sum of the segments' frame_bytes
        self._dir_dirty = False  # a file was created in self.path since the last sync
        self._last_sync = time.monotonic()
        self._failure: OSError | None = None  # sticky: this journal can never write again (see `broken`)
        self._closed = False
        # Made at the first commit (a full disk at start is a failure like any other); the levels
        # still to make, top down, each made durable in its parent, so a retry finishes the chain.
        self._dirs_to_make: list[Path] | None = None
        self.fsyncs = 0  # file and directory syncs done (for stats)
        self.error: OSError | None = None  # why the last try_commit failed; None once one succeeded
        self.errors = 0  # failed try_commit attempts (for stats)
        self.failing_since: float | None = None  # monotonic: the first failure of the current run of them
        self._retry_at = 0.0
        self._syncer: _Syncer | None = None  # started by the first commit_in_background

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
        if self._failure is not None:
            raise self._failure
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
            syncer = self._syncer = _Syncer(self.path, on_synced)
        if syncer.failure is not None and self._failure is None:
            self._failure = syncer.failure  # sticky, as in _sync
        if self._failure is not None:
            raise self._failure
        self._write_pending()
        if self._written_pos > syncer.submitted_pos and syncer.idle():
            # Duplicates of the descriptors: a segment closed or deleted meanwhile does not disturb
            # the sync (fdatasync through a dup syncs the same file).
            fds = [os.dup(segment.fd) for segment in self._segments if segment.dirty and segment.fd is not None]
            for segment in self._segments:
                segment.dirty = False
            syncer.submit(fds, self._dir_dirty, self._written_pos)
            self.fsyncs += len(fds) + int(self._dir_dirty)
            self._dir_dirty = False
            self._close_synced()
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
        return self._failure is not None or (self._syncer is not None and self._syncer.failure is not None)

    @property
    def pending_bytes(self) -> int:
        """Encoded records not yet handed to the OS (they wait for a commit, or for the disk)."""
        return len(self._buf)

    def _write_pending(self) -> float:
        """Hand what was buffered to the OS and drop what the bounds evict; returns the time."""
        now = time.monotonic()
        if self._dirs_to_make is None:
            self._dirs_to_make = _missing_dirs(self.path)
        while self._dirs_to_make:
            _make_private_dir(self._dirs_to_make[0])
            del self._dirs_to_make[0]
        if self._buf:
            self._write_buffered(now)
            self._apply_retention_bounds(now)
        return now

    @property
    def committed_pos(self) -> int:
        """Every frame below this position is durable per the mode (fsync'ed, or handed to the OS);
        1 before the first commit."""
        return self._committed_pos

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
                    self._write_to_current(view[done:boundary], end_pos, now)
                    done = boundary
                if split == len(splits):
                    break
                self._open_segment(splits[split][1], now)
                split += 1
        finally:
            # A new buffer, not an in-place resize: after an error the traceback may still hold
            # slices of the old one, which a bytearray refuses to be resized under.
            self._buf = self._buf[done:]
            self._splits = [(offset - done, pos) for offset, pos in splits[split:]]

    def _write_to_current(self, records: memoryview, end_pos: int, now: float) -> None:
        segment = self._segments[-1]
        assert segment.fd is not None
        try:
            _write_all(segment.fd, records)
        except OSError:
            # Cut the partial record off so the file stays readable and a retry appends cleanly
            # (the file is opened O_APPEND). If even that fails, later records would be unreadable.
            try:
                os.ftruncate(segment.fd, segment.size)
            except OSError as exc:
                self._failure = exc  # sticky: later records would be unreadable
            raise
        self._frame_bytes -= segment.frame_bytes
        segment.size += len(records)
        segment.end_pos = end_pos
        self._frame_bytes += segment.frame_bytes
        segment.last_write = now
        segment.dirty = True
        self._written_pos = end_pos

    def _open_segment(self, first_pos: int, now: float) -> None:
        path = self.path / _segment_name(first_pos)
        # O_TRUNC, not O_EXCL: only this incarnation writes here, so a file of that name is what an
        # attempt that failed half-way (a full disk) left, and could not delete.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, memoryview(FILE_HEADER))
        except OSError:
            _close_quietly(fd)
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            raise
        self._segments.append(_Segment(first_pos, path, fd, end_pos=first_pos, last_write=now, dirty=True))
        self._dir_dirty = True
        self._close_synced()

    def _sync(self, now: float) -> None:
        """fdatasync every segment written since the last sync, then the directory if a file was made."""
        try:
            for segment in self._segments:
                if segment.dirty and segment.fd is not None:
                    os.fdatasync(segment.fd)
                    self.fsyncs += 1
                    segment.dirty = False
            if self._dir_dirty:
                _fsync_directory(self.path)
                self.fsyncs += 1
                self._dir_dirty = False
        except OSError as exc:
            self._failure = exc
            raise
        self._last_sync = now
        self._close_synced()

    def _close_synced(self) -> None:
        """Close the files of segments no longer written to, once nothing of theirs awaits a sync."""
        for segment in islice(self._segments, max(0, len(self._segments) - 1)):
            if segment.fd is not None and not segment.dirty:
                _close_quietly(segment.fd)
                segment.fd = None

    # -- deleting ----------------------------------------------------------------------------

    def trim(self, oldest_pos: int) -> None:
        """Delete whole segments all of whose frames are below oldest_pos (the retention evicted them)."""
        segments = self._segments
        while len(segments) > 1 and segments[1].first_pos <= oldest_pos:
            self._delete_oldest()
        if len(segments) == 1 and segments[0].end_pos <= oldest_pos and not self._buf:
            self._delete_oldest()
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

    def _apply_retention_bounds(self, now: float) -> None:
        """Delete closed segments the retention has evicted by its own bounds (see the module doc)."""
        segments = self._segments
        horizon = now - self._retention_seconds
        while len(segments) > 1 and (segments[0].last_write < horizon
                                     or self._frame_bytes - segments[0].frame_bytes >= self._retention_bytes):
            self._delete_oldest()

    def _delete_oldest(self) -> None:
        segment = self._segments.popleft()
        self._frame_bytes -= segment.frame_bytes
        if segment.fd is not None:
            _close_quietly(segment.fd)  # its unsynced writes need no sync: the file goes
        try:
            segment.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:  # a failing disk: the file stays, counted no more (a restart's load bounds it)
            log.warning("journal %s: could not delete %s: %s", self.path, segment.path.name, exc)

    def close(self) -> None:
        """Commit what is buffered, sync (whatever the mode), close the files. Idempotent, and
        never raises OSError: what the disk refuses now is logged (in mode fsync none of it was
        confirmed)."""
        if self._closed:
            return
        if self._syncer is not None:
            self._syncer.stop()  # its sync ends first: the synchronous one below covers the rest
            if self._syncer.failure is not None and self._failure is None:
                self._failure = self._syncer.failure
        try:
            if self._writes and self._failure is None:
                self.commit()
                self._sync(time.monotonic())
        except OSError as exc:
            log.warning("journal %s closed with %d bytes not written or not synced: %s", self.path,
                        len(self._buf), exc)
        finally:
            self._closed = True
            for segment in self._segments:
                if segment.fd is not None:
                    _close_quietly(segment.fd)
                    segment.fd = None


class _Syncer:
    """One background thread that fdatasyncs what a Journal hands it, one job at a time."""

    def __init__(self, directory: Path, on_synced: Callable[[], None]) -> None:
        self.directory = directory
        self.on_synced = on_synced
        self.submitted_pos = 1  # the position the latest job makes durable
        self.synced_pos = 1  # every frame below it is fsync'ed (read by the loop; one int, set atomically)
        self.failure: OSError | None = None
        self._job: tuple[list[int], bool, int] | None = None
        self._busy = False
        self._stopping = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="journal-sync", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        with self._cond:
            return self._job is None and not self._busy and self.failure is None

    def submit(self, fds: list[int], directory_too: bool, pos: int) -> None:
        with self._cond:
            self._job = (fds, directory_too, pos)
            self.submitted_pos = pos
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stopping:
                    self._cond.wait()
                if self._job is None:
                    return
                job, self._job, self._busy = self._job, None, True
            fds, directory_too, pos = job
            try:
                for fd in fds:
                    os.fdatasync(fd)  # releases the GIL: the loop forwards meanwhile
                if directory_too:
                    _fsync_directory(self.directory)
                self.synced_pos = pos
            except OSError as exc:
                log.error("journal sync failed: %s; nothing written since the last good sync is durable", exc)
                self.failure = exc
            finally:
                for fd in fds:
                    _close_quietly(fd)
                with self._cond:
                    self._busy = False
            self.on_synced()


# -- loading -------------------------------------------------------------------------------------

@dataclass
class _Loading:
    """One earlier incarnation while it is read."""
    name: str
    newest_mtime: float
    lost_before: int
    next_pos: int
    frames: deque[ArchivedFrame] = field(default_factory=deque)
    segments: list[tuple[int, Path]] = field(default_factory=list)  # (first_pos, path) read, in order
    evicted: int = 0  # frames dropped by the byte bound

    def archive(self) -> Archive:
        return Archive(self.name, list(self.frames), self.lost_before, self.newest_mtime)


def load_archives(directory: str | Path, exclude: str, max_age: float, max_bytes: int,
                  now: float | None = None) -> list[Archive]:
    """Every other incarnation's journal under `directory` (skip `exclude`), oldest first. Deletes
    incarnation directories whose newest segment is older than max_age seconds (wall clock) and
    keeps at most max_bytes of frames in total (dropping the oldest frames/segments first, deleting
    fully dropped segment files). Never raises on a corrupt or torn file: it stops that incarnation
    at the last good record (logging a warning). Unreadable entries are skipped.
    An incarnation whose frames the byte bound all dropped is returned once more, empty (its
    lost_before tells where it ended), and its directory goes."""
    now = time.time() if now is None else now
    found = []
    for incarnation in _incarnation_dirs(Path(directory), exclude):
        segments = _segment_files(incarnation)
        newest = max((mtime for _, _, mtime in segments), default=None)
        if newest is None:
            newest = _mtime(incarnation)
        if newest is None:
            continue
        if now - newest > max_age:
            log.info("journal %s: last written %.0f s ago, deleted", incarnation, now - newest)
            shutil.rmtree(incarnation, ignore_errors=True)
            continue
        if segments:
            found.append((newest, incarnation.name, [(first, path) for first, path, _ in segments]))
    found.sort()
    loaded: list[_Loading] = []
    total = 0
    for newest, name, files in found:
        loading = _Loading(name, newest, lost_before=files[0][0], next_pos=files[0][0])
        loaded.append(loading)
        floor = read_purge_mark(Path(directory) / name)
        for frames in _read_incarnation(loading, files):
            frames = [frame for frame in frames if frame.pos >= floor]  # purged: never served again
            loading.frames.extend(frames)
            total += _frame_bytes(frames)
            total = _evict_oldest(loaded, total, max_bytes)  # as it goes: memory stays near max_bytes
        loading.lost_before = max(loading.lost_before, min(floor, loading.next_pos))
    for loading in loaded:
        _delete_evicted_segments(loading)
    return [loading.archive() for loading in loaded]


def write_purge_mark(incarnation_dir: Path, upto: int) -> None:
    """The file `purged` of an incarnation's directory, made durable before it replaces the last one."""
    temporary = incarnation_dir / (PURGE_MARK + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, memoryview(b"%d\n" % upto))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, incarnation_dir / PURGE_MARK)
    _fsync_directory(incarnation_dir)


def read_purge_mark(incarnation_dir: Path) -> int:
    """The position below which the incarnation was purged (1: never; an unreadable mark counts as none)."""
    try:
        return max(1, int((incarnation_dir / PURGE_MARK).read_text().strip()))
    except (OSError, ValueError):
        return 1


def journals_kept(data_dir: str | Path) -> int:
    """How many incarnations' journals (directories holding a segment file) lie under a host's data
    directory, <data_dir>/journal/<queue>/<xid>/<incarnation>/; unreadable entries count nothing."""
    found = 0
    for queue in _subdirs(Path(data_dir) / JOURNAL_DIR):
        for exchange in _subdirs(queue):
            found += sum(1 for incarnation in _subdirs(exchange) if _segment_files(incarnation))
    return found


def _subdirs(path: Path) -> list[Path]:
    try:
        return [Path(entry.path) for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _incarnation_dirs(root: Path, exclude: str) -> Iterator[Path]:
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            if entry.name != exclude and entry.is_dir(follow_symlinks=False):
                yield Path(entry.path)
        except OSError:
            continue


def _segment_files(incarnation: Path) -> list[tuple[int, Path, float]]:
    """(first_pos, path, mtime) of its segment files, by position; other entries are ignored."""
    try:
        entries = list(os.scandir(incarnation))
    except OSError as exc:
        log.warning("journal %s: unreadable (%s), skipped", incarnation, exc)
        return []
    segments = []
    for entry in entries:
        match = SEGMENT_NAME.match(entry.name)
        if match is None:
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                segments.append((int(match.group(1)), Path(entry.path), entry.stat(follow_symlinks=False).st_mtime))
        except OSError:
            continue
    return sorted(segments)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _read_incarnation(loading: _Loading, files: list[tuple[int, Path]]) -> Iterator[list[ArchivedFrame]]:
    """The frames of each segment in turn, up to the first one that is not the next position."""
    for first_pos, path in files:
        if first_pos != loading.next_pos:
            log.warning("journal %s: %s does not continue at position %d; the incarnation stops there",
                        loading.name, path.name, loading.next_pos)
            return
        loading.segments.append((first_pos, path))
        frames, problem = _read_segment(path, first_pos)
        loading.next_pos = first_pos + len(frames)
        yield frames
        if problem is not None:
            log.warning("journal %s: %s: %s; the incarnation stops before position %d",
                        loading.name, path.name, problem, loading.next_pos)
            return


def _read_segment(path: Path, first_pos: int) -> tuple[list[ArchivedFrame], str | None]:
    """The verified records of one segment file, and why reading stopped early (None: clean end).
    One loop without a call per record: a restart reads millions of them."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [], f"unreadable ({exc})"
    if data[:len(FILE_HEADER)] != FILE_HEADER:
        return [], "no journal file header (torn at creation, or another version)"
    frames: list[ArchivedFrame] = []
    add = frames.append
    view = memoryview(data)
    size = len(data)
    offset = len(FILE_HEADER)
    pos = first_pos
    while offset < size:
        if offset + RECORD_OVERHEAD > size:
            return frames, f"torn record at byte {offset}"
        length, crc, record_pos, messages, topic_len = RECORD_FIXED.unpack_from(data, offset)
        end = offset + RECORD_HEADER.size + length
        if end > size:
            return frames, f"torn record at byte {offset}"
        if length < PAYLOAD_HEADER.size or crc32(view[offset + RECORD_HEADER.size:end]) != crc:
            return frames, f"record fails its CRC at byte {offset}"
        if record_pos != pos:
            return frames, f"record of position {record_pos} where {pos} was due, at byte {offset}"
        topic_end = offset + RECORD_OVERHEAD + topic_len
        if topic_end > end:
            return frames, f"topic longer than its record at byte {offset}"
        add(ArchivedFrame(pos, data[offset + RECORD_OVERHEAD:topic_end], data[topic_end:end], messages))
        offset = end
        pos += 1
    return frames, None


def _frame_bytes(frames: list[ArchivedFrame]) -> int:
    return sum(len(topic) + len(body) for _, topic, body, _ in frames)


def _evict_oldest(loaded: list[_Loading], total: int, max_bytes: int) -> int:
    """Drop the oldest frames (oldest incarnation first) until `total` fits; returns the new total."""
    for loading in loaded:
        frames = loading.frames
        while total > max_bytes and frames:
            frame = frames.popleft()
            total -= len(frame.topic) + len(frame.body)
            loading.lost_before = frame.pos + 1
            loading.evicted += 1
        if total <= max_bytes:
            break
    return total


def _delete_evicted_segments(loading: _Loading) -> None:
    """Delete the files whose every frame the byte bound dropped (and the directory, once empty)."""
    if not loading.evicted:
        return
    ends = [first for first, _ in loading.segments[1:]] + [loading.next_pos]
    for (_, path), end in zip(loading.segments, ends):
        if end <= loading.lost_before:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                continue
    try:
        loading.segments[0][1].parent.rmdir()  # only succeeds when nothing else is left in it
    except OSError:
        pass


# -- files ---------------------------------------------------------------------------------------

def _close_quietly(fd: int) -> None:
    """close(2) can report an earlier write's error (NFS, EIO): what it says is already known or
    will show at the next sync; the descriptor is released either way."""
    with contextlib.suppress(OSError):
        os.close(fd)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _fsync_directory(path: Path) -> None:
    """Make the directory's entries (a created file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _missing_dirs(path: Path) -> list[Path]:
    """The levels of `path` that do not exist yet, top down."""
    missing = []
    level = path
    while not level.is_dir():
        missing.append(level)
        level = level.parent
    return missing[::-1]


def _make_private_dir(level: Path) -> None:
    """mkdir with mode 0700 (there already: fine), made durable in its parent."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(level, 0o700)
    _fsync_directory(level.parent)
