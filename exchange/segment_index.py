"""One segment of the store in memory, its sparse index, and reading it back at start-up.

The index of a segment holds an entry about every `index_every` bytes of records (and one at its end
once it is sealed), so finding a position or a time costs a binary search and the read of at most
that many bytes; start-up reads the index files and verifies only what was written after each
segment's last entry (`recover_segment`): an exchange with 10 GB on disk reads megabytes, not
gigabytes. A record that fails its checks there is cut off (the file truncated to the last good
record) and the cut reported; an index that fails its checks is rebuilt from the records.
"""

from __future__ import annotations

import contextlib
import os
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from exchange.journal_format import close_quietly, fsync_directory, write_all
from exchange.segment_format import (
    INDEX_ENTRY,
    INDEX_HEADER,
    SEGMENT_FILE,
    SEGMENT_HEADER,
    IndexEntry,
    decode_index,
    encode_entry,
    index_name,
    scan_records,
    segment_name,
)

READ_CHUNK = 256 << 10  # bytes read at once when scanning records


class SegmentIndex:
    """Sparse entries (position, offset, time), ascending in all three; the first is the segment's first record."""

    def __init__(self) -> None:
        self.positions = array("Q")
        self.offsets = array("Q")
        self.times = array("d")

    def __len__(self) -> int:
        return len(self.positions)

    def add(self, entry: IndexEntry) -> None:
        self.positions.append(entry.pos)
        self.offsets.append(entry.offset)
        self.times.append(entry.stored_at)

    def entry(self, i: int) -> IndexEntry:
        return IndexEntry(self.positions[i], self.offsets[i], self.times[i])

    @property
    def last(self) -> IndexEntry:
        return self.entry(len(self.positions) - 1)

    def floor(self, pos: int) -> IndexEntry:
        """The last entry at or before position `pos` (the first if `pos` is before it)."""
        return self.entry(max(0, bisect_right(self.positions, pos) - 1))

    def before_time(self, stored_at: float) -> IndexEntry:
        """The last entry whose time is below `stored_at` (the first if none): no record before it is as late."""
        return self.entry(max(0, bisect_left(self.times, stored_at) - 1))

    def after(self, offset: int) -> IndexEntry | None:
        """The first entry past `offset`: where reading may go on after a damaged record."""
        i = bisect_right(self.offsets, offset)
        return self.entry(i) if i < len(self.offsets) else None

    def entries(self) -> list[IndexEntry]:
        return [self.entry(i) for i in range(len(self.positions))]


@dataclass
class Segment:
    first_pos: int
    data_path: Path
    index_path: Path
    index: SegmentIndex = field(default_factory=SegmentIndex)
    size: int = len(SEGMENT_HEADER)  # bytes of the data file, header included
    index_size: int = len(INDEX_HEADER)  # bytes of the index file
    end_pos: int = 0  # the position after its last record
    newest: float = 0.0  # stored_at of its last record
    data_fd: int | None = None  # open while written to
    index_fd: int | None = None

    torn: OSError | None = None  # a refused write could not be cut off: the file is not whole any more

    def write(self, records: bytes | bytearray, entries: list[IndexEntry]) -> None:
        """Append whole records, then their index entries. A refusal cuts both files back to what
        they held (O_APPEND: a retry appends there) and raises; if even that fails, `torn` says so."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        if self.data_fd is None:
            self.data_fd = os.open(self.data_path, flags)
        if self.index_fd is None:
            self.index_fd = os.open(self.index_path, flags)
        encoded = b"".join(map(encode_entry, entries))
        try:
            write_all(self.data_fd, memoryview(records))
            write_all(self.index_fd, memoryview(encoded))
        except OSError:
            try:
                os.ftruncate(self.data_fd, self.size)
                os.ftruncate(self.index_fd, self.index_size)
            except OSError as exc:
                self.torn = exc
            raise
        self.size += len(records)
        self.index_size += len(encoded)
        for entry in entries:
            self.index.add(entry)

    def sync(self) -> None:
        for fd in (self.data_fd, self.index_fd):
            if fd is not None:
                os.fdatasync(fd)

    def close(self) -> None:
        for fd in (self.data_fd, self.index_fd):
            if fd is not None:
                close_quietly(fd)
        self.data_fd = self.index_fd = None


def new_segment(directory: Path, first_pos: int) -> Segment:
    return Segment(first_pos, directory / segment_name(first_pos), directory / index_name(first_pos),
                   end_pos=first_pos)


def create_segment(directory: Path, first_pos: int) -> Segment:
    """A new segment's two files, each with its header, open for appending; a refusal leaves neither."""
    segment = new_segment(directory, first_pos)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
    try:
        segment.data_fd = os.open(segment.data_path, flags, 0o600)
        write_all(segment.data_fd, memoryview(SEGMENT_HEADER))
        segment.index_fd = os.open(segment.index_path, flags, 0o600)
        write_all(segment.index_fd, memoryview(INDEX_HEADER))
    except OSError:
        delete_files(segment)
        raise
    return segment


def recover_segment(directory: Path, first_pos: int, index_every: int) -> tuple[Segment | None, str | None]:
    """The segment starting at `first_pos` as far as it can be verified, and what was wrong with it
    (None: nothing). A segment with no good record is None: the caller deletes its files."""
    segment = new_segment(directory, first_pos)
    try:
        with open(segment.data_path, "rb") as data:
            if data.read(len(SEGMENT_HEADER)) != SEGMENT_HEADER:
                return None, f"{segment.data_path.name}: no segment header (torn at creation, or another version)"
            size = os.fstat(data.fileno()).st_size
            entries, index_problem = _read_index(segment.index_path, first_pos, size)
            problem = _scan_tail(segment, data.fileno(), size, entries, index_every)
    except OSError as exc:
        return None, f"{segment.data_path.name}: unreadable ({exc})"
    if len(segment.index) == 0:  # created, nothing written yet (or a disk refused the first write)
        return None, f"{segment.data_path.name}: no whole record ({problem})" if problem else None
    if problem or index_problem or segment.index.entries() != entries:
        _rewrite_index(segment)
    else:
        segment.index_size = len(INDEX_HEADER) + INDEX_ENTRY.size * len(entries)
    if problem:
        return segment, f"{segment.data_path.name}: {problem}; cut at byte {segment.size}"
    return segment, None


def _read_index(path: Path, first_pos: int, size: int) -> tuple[list[IndexEntry], str | None]:
    """The index entries that may be trusted: a prefix, starting at the segment's first record,
    pointing inside the data file."""
    try:
        entries, problem = decode_index(path.read_bytes())
    except FileNotFoundError:
        return [], "no index file"
    if entries and (entries[0].pos != first_pos or entries[0].offset != len(SEGMENT_HEADER)):
        return [], "index does not start at the segment's first record"
    kept = [entry for entry in entries if entry.offset <= size]
    return kept, problem if len(kept) == len(entries) else "index points past the data"


def _scan_tail(segment: Segment, fd: int, size: int, entries: list[IndexEntry], index_every: int) -> str | None:
    """Verify the records after the last trusted entry, adding entries to the index as they go; cut
    the file after the last good record. Returns what was wrong (None: nothing)."""
    for entry in entries[:-1]:
        segment.index.add(entry)
    start = entries[-1] if entries else IndexEntry(segment.first_pos, len(SEGMENT_HEADER), float("-inf"))
    offset, pos, newest, indexed = start.offset, start.pos, start.stored_at, start.offset
    if entries:
        segment.index.add(start)
    problem = None
    want = READ_CHUNK
    while offset < size:
        scan = scan_records(os.pread(fd, want, offset), pos, offset)
        for frame in scan.frames:
            if len(segment.index) == 0 or offset - indexed >= index_every:
                segment.index.add(IndexEntry(frame.pos, offset, frame.stored_at))
                indexed = offset
            offset += frame.record_size
            pos, newest = frame.pos + 1, frame.stored_at
        if scan.damage:
            problem = scan.damage
            break
        if scan.needed and offset + scan.needed > size:
            problem = f"torn record at byte {offset}"
            break
        if not scan.frames and not scan.needed:  # the file shrank under us
            problem = f"file ends early at byte {offset}"
            break
        want = max(READ_CHUNK, scan.needed)  # a record longer than a chunk is read whole
    if problem:
        with open(segment.data_path, "r+b") as data:
            data.truncate(offset)
            os.fsync(data.fileno())
    segment.size, segment.end_pos, segment.newest = offset, pos, max(newest, 0.0)
    return problem


def _rewrite_index(segment: Segment) -> None:
    """Replace the index file with the entries verified (temporary file, fsync, rename)."""
    temporary = segment.index_path.with_suffix(".idx.tmp")
    data = INDEX_HEADER + b"".join(encode_entry(entry) for entry in segment.index.entries())
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, memoryview(data))
        os.fsync(fd)
    finally:
        close_quietly(fd)
    os.replace(temporary, segment.index_path)
    fsync_directory(segment.index_path.parent)
    segment.index_size = len(data)


def delete_files(segment: Segment) -> str | None:
    """Delete a segment's files (data first: an index without data is ignored); why not, or None."""
    segment.close()
    try:
        segment.data_path.unlink(missing_ok=True)
        segment.index_path.unlink(missing_ok=True)
    except OSError as exc:
        return f"could not delete {segment.data_path.name}: {exc}"
    with contextlib.suppress(OSError):
        segment.index_path.with_suffix(".idx.tmp").unlink(missing_ok=True)
    return None


def load_segments(directory: Path, index_every: int) -> tuple[list[Segment], list[str]]:
    """The segments of a store directory, verified as `recover_segment` does, and what was wrong.
    Positions must be consecutive: a segment that does not follow the one before it (one was cut,
    or lost) is deleted, and so is one with no whole record."""
    segments: list[Segment] = []
    problems: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return segments, problems
    for first_pos in sorted(int(match.group(1)) for name in names if (match := SEGMENT_FILE.match(name))):
        if segments and first_pos != segments[-1].end_pos:
            problems.append(f"segment {first_pos} does not follow position {segments[-1].end_pos - 1}: deleted")
            segment = None
        else:
            segment, problem = recover_segment(directory, first_pos, index_every)
            if problem:
                problems.append(problem)
        if segment is not None:
            segments.append(segment)
            continue
        failed = delete_files(new_segment(directory, first_pos))
        if failed:
            problems.append(failed)
    return segments, problems
