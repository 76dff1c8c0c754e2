"""The segment files of one journal incarnation's directory (docs/journal.md), and the thread that syncs them.

`SegmentFiles` opens, writes, syncs and deletes whole segment files; a failure it cannot undo
(a failed sync, a torn write it could not cut off) is kept in `failure`, sticky: nothing written
afterwards could be called durable. Deleting logs what fails and never raises.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from exchange import journal_format as fmt

log = logging.getLogger(__name__)


@dataclass
class _Segment:
    first_pos: int
    path: Path
    fd: int | None  # open while written to, or until its last writes are synced
    size: int = len(fmt.FILE_HEADER)  # bytes written
    end_pos: int = 0  # next position after its last written record
    last_write: float = 0.0  # monotonic
    dirty: bool = False  # written since its last sync

    @property
    def frame_bytes(self) -> int:
        """Topic and body bytes of its frames (what the retention counts)."""
        return self.size - len(fmt.FILE_HEADER) - fmt.RECORD_OVERHEAD * (self.end_pos - self.first_pos)


class SegmentFiles:
    def __init__(self, path: Path, retention_seconds: float, retention_bytes: int) -> None:
        self.path = path
        self._retention_seconds = retention_seconds
        self._retention_bytes = retention_bytes
        self.segments: deque[_Segment] = deque()  # oldest first; the last one is written to
        self._frame_bytes = 0  # sum of the segments' frame_bytes
        self.dir_dirty = False  # a file was created in self.path since the last sync
        self.failure: OSError | None = None  # sticky: nothing can be written durably any more
        self.fsyncs = 0  # file and directory syncs done (for stats)
        # Made at the first write (a full disk at start is a failure like any other); the levels
        # still to make, top down, each made durable in its parent, so a retry finishes the chain.
        self._dirs_to_make: list[Path] | None = None

    def make_dirs(self) -> None:
        if self._dirs_to_make is None:
            self._dirs_to_make = fmt.missing_dirs(self.path)
        while self._dirs_to_make:
            fmt.make_private_dir(self._dirs_to_make[0])
            del self._dirs_to_make[0]

    def write(self, records: memoryview, end_pos: int, now: float) -> None:
        """Append whole records to the segment written to; a failed write is cut off."""
        segment = self.segments[-1]
        assert segment.fd is not None
        try:
            fmt.write_all(segment.fd, records)
        except OSError:
            # Cut the partial record off so the file stays readable and a retry appends cleanly
            # (the file is opened O_APPEND). If even that fails, later records would be unreadable.
            try:
                os.ftruncate(segment.fd, segment.size)
            except OSError as exc:
                self.failure = exc
            raise
        self._frame_bytes -= segment.frame_bytes
        segment.size += len(records)
        segment.end_pos = end_pos
        self._frame_bytes += segment.frame_bytes
        segment.last_write = now
        segment.dirty = True

    def open(self, first_pos: int, now: float) -> None:
        """Start the segment whose first record is at `first_pos`."""
        path = self.path / fmt.segment_name(first_pos)
        # O_TRUNC, not O_EXCL: only this incarnation writes here, so a file of that name is what an
        # attempt that failed half-way (a full disk) left, and could not delete.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fmt.write_all(fd, memoryview(fmt.FILE_HEADER))
        except OSError:
            fmt.close_quietly(fd)
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
            raise
        self.segments.append(_Segment(first_pos, path, fd, end_pos=first_pos, last_write=now, dirty=True))
        self.dir_dirty = True
        self.close_synced()

    def sync(self) -> None:
        """fdatasync every segment written since the last sync, then the directory if a file was made."""
        try:
            for segment in self.segments:
                if segment.dirty and segment.fd is not None:
                    os.fdatasync(segment.fd)
                    self.fsyncs += 1
                    segment.dirty = False
            if self.dir_dirty:
                fmt.fsync_directory(self.path)
                self.fsyncs += 1
                self.dir_dirty = False
        except OSError as exc:
            self.failure = exc
            raise
        self.close_synced()

    def hand_over_dirty(self) -> tuple[list[int], bool]:
        """For a sync in another thread: duplicates of the descriptors written since the last sync (a
        segment closed or deleted meanwhile does not disturb it: fdatasync through a dup syncs the
        same file), and whether the directory needs one; both count as synced from now on."""
        fds = [os.dup(segment.fd) for segment in self.segments if segment.dirty and segment.fd is not None]
        for segment in self.segments:
            segment.dirty = False
        directory_too, self.dir_dirty = self.dir_dirty, False
        self.fsyncs += len(fds) + int(directory_too)
        self.close_synced()
        return fds, directory_too

    def close_synced(self) -> None:
        """Close the files of segments no longer written to, once nothing of theirs awaits a sync."""
        for segment in islice(self.segments, max(0, len(self.segments) - 1)):
            if segment.fd is not None and not segment.dirty:
                fmt.close_quietly(segment.fd)
                segment.fd = None

    def trim(self, oldest_pos: int, buffered: bool) -> bool:
        """Delete whole segments all of whose frames are below oldest_pos (the retention evicted
        them); True if the last one went too (the next record opens a new segment). `buffered`:
        records wait to be written to the last one, which then stays."""
        segments = self.segments
        while len(segments) > 1 and segments[1].first_pos <= oldest_pos:
            self._delete_oldest()
        if len(segments) == 1 and segments[0].end_pos <= oldest_pos and not buffered:
            self._delete_oldest()
            return True
        return False

    def apply_retention_bounds(self, now: float) -> None:
        """Delete closed segments the retention has evicted by its own bounds (age, bytes)."""
        segments = self.segments
        horizon = now - self._retention_seconds
        while len(segments) > 1 and (segments[0].last_write < horizon
                                     or self._frame_bytes - segments[0].frame_bytes >= self._retention_bytes):
            self._delete_oldest()

    def _delete_oldest(self) -> None:
        segment = self.segments.popleft()
        self._frame_bytes -= segment.frame_bytes
        if segment.fd is not None:
            fmt.close_quietly(segment.fd)  # its unsynced writes need no sync: the file goes
        try:
            segment.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:  # a failing disk: the file stays, counted no more (a restart's load bounds it)
            log.warning("journal %s: could not delete %s: %s", self.path, segment.path.name, exc)

    def close(self) -> None:
        for segment in self.segments:
            if segment.fd is not None:
                fmt.close_quietly(segment.fd)
                segment.fd = None


class Syncer:
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
                    fmt.fsync_directory(self.directory)
                self.synced_pos = pos
            except OSError as exc:
                log.error("journal sync failed: %s; nothing written since the last good sync is durable", exc)
                self.failure = exc
            finally:
                for fd in fds:
                    fmt.close_quietly(fd)
                with self._cond:
                    self._busy = False
            self.on_synced()
