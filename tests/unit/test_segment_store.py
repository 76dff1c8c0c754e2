"""The segment store (exchange/segment_store.py): what was written is what a read, a restart and a
crash at any byte give back, against a model; damage is cut or skipped and reported, never served;
a full disk holds what was appended until it has room; a large store opens from its indexes.

Files are real (tmp_path, and a real tmpfs for the full disk). A crash is the process dying: the
files are left as they are (what was only appended is lost), then the tail segment and its index
are cut at any byte, as a power loss may leave them.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from exchange.segment_format import INDEX_ENTRY, INDEX_HEADER, SEGMENT_HEADER, IndexEntry, encode_entry, index_name
from exchange.segment_store import SegmentStore, StoredFrame, StoreLimits, StoreState
from tests.profiles import examples
from tests.support.helpers import record_figures

LIMITS = StoreLimits(segment_bytes=4096, index_every=300)
T0 = 1_800_000_000.0


def frame(pos: int, size: int, stored_at: float, meta: bytes = b"") -> StoredFrame:
    return StoredFrame(pos, stored_at, b"t.%d" % (pos % 3), bytes([pos % 251]) * size, pos % 5 + 1, meta)


def read_all(store: SegmentStore, max_bytes: int = 1 << 20) -> tuple[list[StoredFrame], list[tuple[int, int]]]:
    frames, damaged, pos = [], [], store.first_pos
    while pos < store.end_pos:
        page = store.read(pos, store.end_pos, max_bytes)
        assert page.next_pos > pos, "a read makes progress"
        frames += page.frames
        damaged += page.damaged
        pos = page.next_pos
    return frames, damaged


def abandon(store: SegmentStore) -> None:
    """The process dies: descriptors go, nothing more is written."""
    for segment in store.segments:
        segment.close()
    for fd in store._read_fds.values():
        os.close(fd)
    store._read_fds.clear()


class StoreMachine(RuleBasedStateMachine):
    """Append, flush, read, look up times, delete, crash at any byte and reopen, against a list."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="segstore-"))
        self.store = SegmentStore(self.dir, LIMITS)
        self.frames: dict[int, StoredFrame] = {}  # position -> frame as stored (appended, maybe not written)
        self.next = 1
        self.clock = T0
        self.newest = 0.0  # the latest time the store holds or remembers

    def teardown(self) -> None:
        abandon(self.store)
        shutil.rmtree(self.dir, ignore_errors=True)

    def held(self) -> list[StoredFrame]:
        return [self.frames[p] for p in range(self.store.first_pos, self.store.end_pos)]

    @rule(sizes=st.lists(st.integers(0, 700), min_size=1, max_size=12), step=st.floats(-5, 30),
          meta=st.sampled_from([b"", b"m", b"\x00" * 40]))
    def append(self, sizes: list[int], step: float, meta: bytes) -> None:
        for size in sizes:
            self.clock += step  # may go back: the store keeps its times from decreasing
            stored = self.store.append(frame(self.next, size, self.clock, meta))
            assert stored.stored_at == max(self.clock, self.newest)
            self.frames[self.next], self.newest = stored, stored.stored_at
            self.next += 1

    @rule(sync=st.booleans())
    def flush(self, sync: bool) -> None:
        assert self.store.flush(sync)
        assert self.store.pending_bytes == 0
        assert self.store.end_pos == self.next or self.store.next_pos is None  # a new store has no position yet

    @rule(start=st.integers(0, 400), span=st.integers(0, 400), max_bytes=st.integers(1, 5000))
    def read(self, start: int, span: int, max_bytes: int) -> None:
        page = self.store.read(start, start + span, max_bytes)
        first, end = max(start, self.store.first_pos), min(start + span, self.store.end_pos)
        expected = [self.frames[p] for p in range(first, end)]
        assert page.frames == expected[:len(page.frames)] and not page.damaged
        assert bool(page.frames) == bool(expected)  # at least one when there is one
        taken = sum(len(f.topic) + len(f.body) + len(f.meta) for f in page.frames[1:])
        assert taken <= max_bytes
        if len(page.frames) < len(expected):
            assert page.next_pos == expected[len(page.frames)].pos

    @rule(offset=st.floats(-10, 3000))
    def position_at(self, offset: float) -> None:
        when = T0 + offset
        held = self.held()
        expected = next((f.pos for f in held if f.stored_at >= when), self.store.end_pos)
        assert self.store.position_at(when) == expected

    @rule(age=st.floats(0, 2000), max_bytes=st.sampled_from([0, 3000, 9000, 20000]), late=st.floats(0, 500))
    def retention(self, age: float, max_bytes: int, late: float) -> None:
        now = self.clock + late
        self.store.set_limits(StoreLimits(LIMITS.segment_bytes, LIMITS.index_every, age, max_bytes))
        before = self.store.first_pos
        self.store.apply_retention(now)
        assert self.store.first_pos >= before
        if age and not max_bytes:  # nothing within the age bound goes
            assert all(f.pos >= self.store.first_pos for f in self.held() if f.stored_at >= now - age)
        if max_bytes:
            assert self.store.disk_bytes <= max_bytes or len(self.store.segments) <= 1

    @precondition(lambda self: self.store.segments and not self.store.pending_bytes)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        tail = self.store.segments[-1]
        cut = data.draw(st.integers(0, tail.size), label="tail cut at")
        index_cut = data.draw(st.integers(0, tail.index_size), label="index cut at")
        offset, survivors, boundaries = len(SEGMENT_HEADER), tail.first_pos, {0, len(SEGMENT_HEADER), tail.size}
        for pos in range(tail.first_pos, tail.end_pos):
            offset += self.frames[pos].record_size
            boundaries.add(offset)
            if offset <= cut and cut >= len(SEGMENT_HEADER):
                survivors = pos + 1
        abandon(self.store)
        os.truncate(tail.data_path, cut)
        os.truncate(tail.index_path, index_cut)
        self.reopen()
        if self.store.segments:
            assert self.store.end_pos == survivors
        else:  # its only segment was cut before its header: a new store, which takes any position
            assert survivors == tail.first_pos and self.store.next_pos is None
        # What it remembers of time: its tail's newest (an index entry may still carry the time of
        # a record cut off after it: later, never earlier, so times stay ordered).
        self.newest = self.store.segments[-1].newest if self.store.segments else 0.0
        if survivors > tail.first_pos:
            assert self.newest >= self.frames[survivors - 1].stored_at
        if cut not in boundaries:  # torn in a record: cut and reported (at a boundary no reader can tell)
            assert self.store.problems
        self.next = survivors
        self.frames = {p: f for p, f in self.frames.items() if p < survivors}

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store.close()  # idempotent
        self.next = self.store.end_pos  # nothing was pending after the close's flush
        self.reopen()
        assert not self.store.problems

    def reopen(self) -> None:
        self.store = SegmentStore(self.dir, LIMITS)
        if self.store.next_pos is not None:
            assert self.store.next_pos == self.store.end_pos

    @invariant()
    def written_frames_read_back(self) -> None:
        frames, damaged = read_all(self.store, max_bytes=2000)
        assert frames == self.held() and not damaged


StoreMachine.TestCase.settings = settings(max_examples=examples(60), stateful_step_count=30, deadline=None)
TestSegmentStore = StoreMachine.TestCase


def build(directory: Path, count: int, limits: StoreLimits = LIMITS) -> list[StoredFrame]:
    store = SegmentStore(directory, limits)
    frames = [store.append(frame(p, p * 7 % 400, T0 + p)) for p in range(1, count + 1)]
    assert store.flush(sync=True)
    store.close()
    return frames


def flip(paths: list[Path], which: int, at: int, bit: int) -> None:
    """Flip one bit of one of the files."""
    path = paths[which % len(paths)]
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 1 << bit
    path.write_bytes(bytes(data))


@settings(max_examples=examples(60), deadline=None)
@given(which=st.integers(0, 1 << 30), at=st.integers(0, 1 << 30), bit=st.integers(0, 7))
def test_a_damaged_byte_anywhere_is_never_served(which: int, at: int, bit: int) -> None:
    """A flipped bit in any data file: a restart cuts a damaged tail and reports it, and a read skips
    a damaged record to the next index entry, reporting the positions it could not serve; every
    frame returned is the one written."""
    with tempfile.TemporaryDirectory() as root:
        directory = Path(root)
        written = {f.pos: f for f in build(directory, 120)}
        flip(sorted(directory.glob("*.seg")), which, at, bit)
        store = SegmentStore(directory, LIMITS)
        frames, damaged = read_all(store, max_bytes=3000)
        assert all(f == written[f.pos] for f in frames)
        served = {f.pos for f in frames} | {p for first, end in damaged for p in range(first, end)}
        assert served == set(range(store.first_pos, store.end_pos))  # each position served or reported
        if store.end_pos < 121:  # a cut: the damage was in a tail it verified, and it says so
            assert store.problems and store.end_pos >= 1
        abandon(store)


def test_a_torn_tail_is_cut_and_reported_and_the_store_goes_on_after_it(tmp_path: Path) -> None:
    frames = build(tmp_path, 40)
    tail = sorted(tmp_path.glob("*.seg"))[-1]
    with open(tail, "ab") as file:
        file.write(b"\x10\x00\x00\x00half a record")
    store = SegmentStore(tmp_path, LIMITS)
    assert store.end_pos == 41 and len(store.problems) == 1 and "torn record" in store.problems[0]
    store.append(frame(41, 10, T0 + 41))
    assert store.flush(sync=True)
    store.close()
    again = SegmentStore(tmp_path, LIMITS)
    assert not again.problems and read_all(again)[0][:40] == frames and again.end_pos == 42
    abandon(again)


def test_segments_that_do_not_follow_are_deleted_and_reported(tmp_path: Path) -> None:
    build(tmp_path, 80)
    paths = sorted(tmp_path.glob("*.seg"))
    assert len(paths) >= 3
    paths[1].write_bytes(b"RoQJ\x01\x00\x00\x00")  # another format's header: that segment is unreadable
    store = SegmentStore(tmp_path, LIMITS)
    first_segment_end = store.segments[-1].end_pos
    assert len(store.segments) == 1 and store.end_pos == first_segment_end
    assert any("no segment header" in p for p in store.problems)
    assert any("does not follow" in p for p in store.problems)
    assert sorted(tmp_path.glob("*.seg")) == paths[:1]
    abandon(store)


def test_a_full_disk_holds_what_was_appended_and_writes_it_once_there_is_room(small_disk, tmp_path: Path) -> None:
    disk = small_disk("store", 1 << 20)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (1000 << 10))
    store = SegmentStore(disk / "q" / "x1", StoreLimits(segment_bytes=64 << 10, index_every=4096))
    written = [store.append(frame(p, 900, T0 + p)) for p in range(1, 301)]  # ~280 KB: more than is free
    assert not store.flush(sync=True)
    assert store.state is StoreState.FULL and store.error is not None and store.error.errno == errno.ENOSPC
    assert store.pending_bytes > 0
    held, _ = read_all(store)
    assert held == written[:len(held)]  # what went through is readable, nothing half-written
    shutil.copytree(disk / "q" / "x1", tmp_path / "copy")  # the files as a crash now would leave them
    reopened = SegmentStore(tmp_path / "copy", store.limits)
    assert read_all(reopened)[0] == held  # whole: nothing to cut, nothing lost that was written
    assert all("no whole record" not in problem for problem in reopened.problems)
    abandon(reopened)
    filler.unlink()
    assert store.flush(sync=True) and store.state is StoreState.OK and store.pending_bytes == 0
    assert read_all(store)[0] == written


def test_a_large_store_opens_from_its_indexes_without_reading_its_data(tmp_path: Path) -> None:
    """10 GiB of sealed segments (sparse files: their records are never read at start-up) and a real
    tail: opening reads the indexes and the tail only, then serves the tail and finds times."""
    segment_bytes, every, frames_per_entry = 64 << 20, 64 << 10, 64
    first = 1
    for n in range(160):  # 160 x 64 MiB
        entries = [IndexEntry(first + i * frames_per_entry, len(SEGMENT_HEADER) + i * every, T0 + n + i / 2048)
                   for i in range(segment_bytes // every)]
        end = first + len(entries) * frames_per_entry
        entries.append(IndexEntry(end, len(SEGMENT_HEADER) + segment_bytes, T0 + n + 0.999))
        with open(tmp_path / f"{first:020d}.seg", "wb") as data:
            data.write(SEGMENT_HEADER)
            data.truncate(len(SEGMENT_HEADER) + segment_bytes)
        (tmp_path / index_name(first)).write_bytes(INDEX_HEADER + b"".join(map(encode_entry, entries)))
        first = end
    limits = StoreLimits(segment_bytes=segment_bytes, index_every=every)
    tail = SegmentStore(tmp_path / "tail", limits)
    tail_frames = [tail.append(frame(first + i, 1000, T0 + 200 + i)) for i in range(2000)]
    assert tail.flush(sync=True)
    tail.close()
    for path in (tmp_path / "tail").iterdir():
        path.rename(tmp_path / path.name)
    assert sum(p.stat().st_size for p in tmp_path.glob("*.seg")) > 10 << 30

    read_before = _bytes_read()
    started = time.monotonic()
    store = SegmentStore(tmp_path, limits)
    took = time.monotonic() - started
    read = _bytes_read() - read_before
    record_figures("segment store open, 10 GiB", seconds=round(took, 3), bytes_read=read)
    assert not store.problems and len(store.segments) == 161 and store.end_pos == first + 2000
    assert read < 64 << 20  # the indexes (~4 MiB) and the tail, not the data
    assert store.read(first + 1500, first + 1510, 1 << 20).frames == tail_frames[1500:1510]
    assert store.position_at(T0 + 200 + 42) == first + 42
    assert store.segment_of(first - 1) is store.segments[-2] and store.segments[-2].newest == T0 + 159.999
    abandon(store)


def _bytes_read() -> int:
    """Bytes this process has read through system calls (page cache included): /proc/self/io rchar."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


def test_an_index_entry_is_as_long_as_the_format_says() -> None:
    assert len(encode_entry(IndexEntry(1, 8, T0))) == INDEX_ENTRY.size


@pytest.mark.parametrize("bad", [StoreLimits(segment_bytes=10), StoreLimits(index_every=0),
                                 StoreLimits(retention=-1), StoreLimits(retention_bytes=-1)])
def test_bad_limits_are_refused(tmp_path: Path, bad: StoreLimits) -> None:
    with pytest.raises(ValueError):
        SegmentStore(tmp_path, bad)


def test_positions_must_follow(tmp_path: Path) -> None:
    store = SegmentStore(tmp_path, LIMITS)
    with pytest.raises(ValueError):
        store.append(frame(0, 1, T0))
    store.append(frame(7, 1, T0))
    with pytest.raises(ValueError, match="does not follow 8"):
        store.append(frame(9, 1, T0))
    assert store.flush() and store.first_pos == 7 and store.end_pos == 8
    abandon(store)


@settings(max_examples=examples(40), deadline=None)
@given(which=st.integers(0, 1 << 30), at=st.integers(0, 1 << 30), bit=st.integers(0, 7))
def test_a_damaged_index_is_rebuilt_from_the_records_and_loses_nothing(which: int, at: int, bit: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        directory = Path(root)
        written = build(directory, 120)
        flip(sorted(directory.glob("*.idx")), which, at, bit)
        store = SegmentStore(directory, LIMITS)
        assert read_all(store, max_bytes=3000) == (written, [])
        assert [store.position_at(f.stored_at) for f in written] == [f.pos for f in written]
        abandon(store)
        again = SegmentStore(directory, LIMITS)  # the index it rewrote is whole
        assert not again.problems and read_all(again)[0] == written
        abandon(again)
