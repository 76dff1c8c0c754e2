"""Loading a journal's earlier incarnations after a restart (docs/journal.md), and counting them.

Never raises on a corrupt or torn file: an incarnation stops at its last good record (a warning
says where). What is too old or beyond the byte bound is deleted as it is found.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from exchange.journal_format import JOURNAL_DIR, SEGMENT_NAME, Archive, ArchivedFrame, read_purge_mark, read_segment

log = logging.getLogger(__name__)


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
        frames, problem = read_segment(path, first_pos)
        loading.next_pos = first_pos + len(frames)
        yield frames
        if problem is not None:
            log.warning("journal %s: %s: %s; the incarnation stops before position %d",
                        loading.name, path.name, problem, loading.next_pos)
            return


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
