"""The segment store's read path: frames of a range of positions, read from the nearest index entry on.

Only the bytes from the index entry at or before the first position asked for are read, in chunks
of READ_CHUNK (a record longer than that is read whole), never a whole segment. A record that
fails its checks costs the positions up to the next index entry (or the segment's end), reported in
`damaged`; a store never returns a frame it could not verify.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from typing import TYPE_CHECKING, NamedTuple

from exchange.segment_format import StoredFrame, scan_records
from exchange.segment_index import READ_CHUNK, Segment

if TYPE_CHECKING:
    from exchange.segment_store import SegmentStore


class ReadResult(NamedTuple):
    frames: list[StoredFrame]
    next_pos: int  # where the next read goes on
    damaged: list[tuple[int, int]]  # [first, end) ranges of positions whose records failed their checks


class _Page:
    def __init__(self, max_bytes: int) -> None:
        self.frames: list[StoredFrame] = []
        self.damaged: list[tuple[int, int]] = []
        self.room = max_bytes  # bytes of topics, bodies and metas it may still take
        self.full = False

    def take(self, frame: StoredFrame) -> bool:
        size = len(frame.topic) + len(frame.body) + len(frame.meta)
        if self.frames and size > self.room:
            self.full = True
            return False
        self.frames.append(frame)
        self.room -= size
        return True


def read_segments(store: SegmentStore, pos: int, to_pos: int, max_bytes: int) -> ReadResult:
    page = _Page(max_bytes)
    while pos < to_pos and not page.full:
        segment = store.segment_of(pos)
        if segment is None:
            break
        pos = _read_segment(segment, store.read_fd(segment), pos, min(to_pos, segment.end_pos), page)
    return ReadResult(page.frames, pos, page.damaged)


def _read_segment(segment: Segment, fd: int, pos: int, to_pos: int, page: _Page) -> int:
    """Frames pos <= p < to_pos of one segment into `page`; returns the position to go on from."""
    entry = segment.index.floor(pos)
    offset, at = entry.offset, entry.pos
    want = READ_CHUNK
    while at < to_pos and offset < segment.size:
        scan = scan_records(os.pread(fd, min(want, segment.size - offset), offset), at, offset)
        for frame in scan.frames:
            if frame.pos >= to_pos:
                return frame.pos
            if frame.pos >= pos and not page.take(frame):
                return frame.pos
            offset += frame.record_size
            at = frame.pos + 1
        broken = scan.damage is not None or (not scan.frames and not scan.needed) \
            or offset + scan.needed > segment.size
        if broken:
            offset, resume = _skip(segment, offset, at)
            _lost(page, max(at, pos), min(resume, to_pos))
            at = resume
        want = max(READ_CHUNK, scan.needed)
    _lost(page, max(at, pos), to_pos)  # records ended before the segment's end position: damage too
    return to_pos


def _lost(page: _Page, first: int, end: int) -> None:
    if end > first:
        page.damaged.append((first, end))


def _skip(segment: Segment, offset: int, at: int) -> tuple[int, int]:
    """Past a damaged record at `offset` (position `at`): the next index entry beyond it, or the segment's end."""
    following = segment.index.after(offset)
    if following is None or following.pos <= at:
        return segment.size, segment.end_pos
    return following.offset, following.pos


def find_time(store: SegmentStore, stored_at: float) -> int:
    """The first position stored at or after `stored_at` (the store's end if none is): the first
    segment whose newest frame is that late, then its index, then at most an index step of records."""
    i = bisect_left([segment.newest for segment in store.segments], stored_at)
    if i == len(store.segments):
        return store.end_pos
    segment = store.segments[i]
    pos = segment.index.before_time(stored_at).pos
    while pos < segment.end_pos:
        page = read_segments(store, pos, segment.end_pos, READ_CHUNK)
        for frame in page.frames:
            if frame.stored_at >= stored_at:
                return frame.pos
        pos = page.next_pos
    return segment.end_pos
