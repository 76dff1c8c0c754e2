"""A consumer group's cursor file (exchange/group_cursor.py): a crash cut at any byte recovers a prefix."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.group_cursor import COMPACT_RATIO, COMPACT_SLACK_BYTES, CursorState, GroupCursor, encode
from tests.profiles import examples

MIB = 1 << 20
START = ["start", [b"jobs"], 30_000, 5, b"dead", 10, "x1.0a0b0c0d"]
RANGES = st.lists(st.tuples(st.integers(10, 60), st.integers(0, 20), st.integers(1, 5)), min_size=1, max_size=4)
OPS = st.lists(st.one_of(RANGES.map(lambda r: ["done", [list(x) for x in r]]),
                         st.integers(10, 60).map(lambda p: ["floor", p])), max_size=25)


def started(directory: Path) -> tuple[Path, GroupCursor]:
    """A new cursor file, its group started at position 1."""
    path = directory / "g.cur"
    cursor = GroupCursor(path)
    cursor.recover()
    cursor.start((b"jobs",), 30_000, 5, b"", 1, "x1.0a0b0c0d")
    return path, cursor


def fold(records: list[list[Any]]) -> CursorState:
    state = CursorState()
    for record in records:
        state.apply(record)
    return state


def write(path: Path, records: list[list[Any]]) -> list[int]:
    """Appends each record through a GroupCursor; the file's size after each."""
    cursor = GroupCursor(path)
    cursor.recover()
    sizes = []
    for record in records:
        if record[0] == "start":
            cursor.start(tuple(bytes(p) for p in record[1]), *record[2:5], record[5], record[6])  # type: ignore[arg-type]
        elif record[0] == "done":
            cursor.done([tuple(r) for r in record[1]])
        else:
            cursor._append(record)  # a floor that may not advance: the file must still fold the same
        sizes.append(path.stat().st_size)
    cursor.close()
    return sizes


@settings(max_examples=examples(200), deadline=None)
@given(ops=OPS, cut_at=st.floats(0, 1), flip=st.booleans())
def test_a_cut_or_damaged_cursor_file_recovers_the_state_of_a_prefix_of_its_records(ops, cut_at, flip) -> None:
    records = [START, *ops]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.cur"
        sizes = write(path, records)
        data = path.read_bytes()
        cut = int(len(data) * cut_at)
        damaged = bytearray(data[:cut])
        if flip and cut:
            damaged[cut // 2] ^= 0x40  # a damaged byte too: nothing from its record on is trusted
        path.write_bytes(bytes(damaged))
        cursor = GroupCursor(path)
        recovered = cursor.recover()
        whole = sum(1 for size in sizes if size <= cut)
        if flip and cut:
            whole = sum(1 for size in sizes if size <= cut // 2)
        assert recovered == fold(records[:whole]), "the state of exactly the records wholly before the damage"
        assert path.stat().st_size == (sizes[whole - 1] if whole else 0), "the bad tail is cut off"
        cursor.done([(55, 0, 1)])  # appends go on after the cut ...
        cursor.close()
        assert GroupCursor(path).recover() == fold([*records[:whole], ["done", [[55, 0, 1]]]])  # ... and are read


def test_a_compacted_cursor_says_the_same_in_fewer_bytes() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path, cursor = started(Path(tmp))
        written = 0
        for pos in range(1, 80_000):  # about 1.2 MB of records in all
            cursor.done([(pos, 0, 100)])
            written += len(encode(["done", [[pos, 0, 100]]]))
            if pos % 50 == 0:
                cursor.floor(pos - 1)  # compacts once big enough: the floor leaves little to keep
        assert written > MIB
        before = cursor.state
        assert path.stat().st_size < MIB, "compaction ran"
        cursor.close()
        after = GroupCursor(path).recover()
        assert after == before
        assert after.is_done(pos, 99) and not after.is_done(pos + 1, 0) and after.is_done(3, 7)


def test_garbage_is_no_state_and_is_cut() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.cur"
        path.write_bytes(encode(START) + b"\xff" * 40)
        cursor = GroupCursor(path)
        assert cursor.recover() == fold([START]) and cursor.cut == 40
        cursor.close()


def test_a_frame_acked_message_by_message_is_one_run() -> None:
    state = CursorState()
    state.apply(START)
    for idx in (3, 0, 2, 1, 5):
        state.apply(["done", [[20, idx, 1]]])
    assert state.done[20] == [(0, 4), (5, 1)]
    assert [state.is_done(20, i) for i in range(7)] == [True, True, True, True, False, True, False]


def test_a_stuck_floor_still_compacts_the_acks_above_it() -> None:
    """One message never acked at position 1: the acks of every later frame merge into runs."""
    with tempfile.TemporaryDirectory() as tmp:
        path, cursor = started(Path(tmp))
        for pos in range(2, 700):  # about 1.3 MB of records
            for idx in range(0, 100, 2):  # acked in two passes, one message at a time
                cursor.done([(pos, idx, 1)])
            for idx in range(1, 100, 2):
                cursor.done([(pos, idx, 1)])
            cursor.floor(1)
        assert path.stat().st_size < MIB, "compacted although the floor never moved"
        assert cursor.state.done[699] == [(0, 100)]
        cursor.close()
        assert GroupCursor(path).recover() == cursor.state


def state_bytes(state: CursorState) -> int:
    return sum(len(encode(r)) for r in state.records())


def test_a_long_cursor_file_reads_in_linear_time_and_stays_within_a_few_times_its_state() -> None:
    """A floor stuck at the first frame and 50,000 frames acked one record each (the reviewer's
    quadratic case: 20,000 records took minutes): the file keeps to a few times what its state
    needs, and reads back at once."""
    with tempfile.TemporaryDirectory() as tmp:
        path, cursor = started(Path(tmp))
        for pos in range(2, 50_002):
            cursor.done([(pos, 0, 100)])
            if pos % 100 == 0:
                cursor.floor(1)
            if pos % 5_000 == 0:
                assert path.stat().st_size <= 2 * COMPACT_RATIO * state_bytes(cursor.state) + 2 * COMPACT_SLACK_BYTES
        cursor.close()
        records = 50_000 + 1
        data = path.read_bytes()
        path.write_bytes(data + b"".join(encode(["floor", 1]) for _ in range(records)))  # and as many floor records
        began = time.monotonic()
        assert GroupCursor(path).recover() == cursor.state
        assert time.monotonic() - began < 5.0, "read in linear time (quadratic: many minutes)"


def test_a_small_file_of_repeated_acks_is_compacted_too() -> None:
    """Under a megabyte, with the floor stuck: 20,000 records that merge into a few runs."""
    with tempfile.TemporaryDirectory() as tmp:
        path, cursor = started(Path(tmp))
        for n in range(20_000):
            cursor.done([(2 + n // 5_000, n % 5_000, 1)])
            if n % 100 == 0:
                cursor.floor(1)
        cursor.floor(1)
        assert path.stat().st_size <= COMPACT_RATIO * state_bytes(cursor.state) + 2 * COMPACT_SLACK_BYTES
        cursor.close()
        assert GroupCursor(path).recover() == cursor.state


BAD_FIELDS = [["floor", math.inf], ["floor", -1], ["floor", (1 << 64) - 1], ["floor", True], ["floor", "7"],
              ["start", [1 << 40], 30_000, 5, b"", 10, "x"], ["start", [b"jobs"], 1.5, 5, b"", 10, "x"],
              ["start", [b"jobs"], 30_000, 5, b"", 10, 7], ["start", "jobs", 30_000, 5, b"", 10, "x"],
              ["done", [[1, 2]]], ["done", [[1, 2, math.nan]]], ["done", 5], ["gap", 1], ["gap", 1, None],
              ["floor"], [], "floor", {"floor": 1}, [7, 1]]
SCALARS = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats()
           | st.binary(max_size=8) | st.text(max_size=8))
ANY = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4), max_leaves=12).filter(
    lambda r: not (isinstance(r, list) and r and r[0] in ("start", "done", "floor", "gap")))  # those: BAD_FIELDS


@settings(max_examples=examples(300), deadline=None)
@given(bad=st.sampled_from(BAD_FIELDS) | ANY, before=OPS)
def test_a_record_with_a_good_crc_and_bad_fields_is_cut_like_a_torn_one(bad, before) -> None:
    """["floor", inf] raised OverflowError at start-up; bytes(n) in a prefix allocated n bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.cur"
        write(path, [START, *before])
        good = path.read_bytes()
        path.write_bytes(good + encode(bad) + encode(["floor", 59]))
        cursor = GroupCursor(path)
        assert cursor.recover() == fold([START, *before]), "the records before it, and nothing after"
        assert cursor.cut == len(encode(bad)) + len(encode(["floor", 59]))
        cursor.close()
        assert path.read_bytes() == good
