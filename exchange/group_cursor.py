"""A consumer group's durable progress over a disk-retained stream: its cursor file.

The messages of a disk-retained queue are in its segment store already, in position order
(docs/segment-store.md), so what a group must keep to survive a restart is small: where it
started, the position below which it holds nothing any more (`floor`), and the messages above the
floor that left it (acked or dead-lettered) as (pos, idx, count) ranges. These are records appended
to one file per group, each framed as the store's (length u32 | crc u32 | payload, little-endian,
CRC-32 of the payload), the payload msgpack:

    ["start", prefixes, ack_timeout_ms, max_deliveries, dead_letter, first_pos, incarnation]
                                                   the first record: positions are that incarnation's
    ["done", [[pos, idx, count], ...]]                                            messages that left
    ["floor", pos]                                                                nothing held below pos
    ["gap", from, to]              positions from..to-1 hold nothing of the group's (written by earlier
                                   versions, whose restores forwarded backlogs again; still read)

Recovery reads records until the first that fails (a torn tail after a crash, a damaged byte):
the state is that of the records before it, which is always a prefix of what was written, and
the file is cut there. Reading applies each record in place, once it is checked whole (fields of
the right types and ranges), so it takes time linear in the file. Whenever the file has grown by
as much as its state needed at the last look (COMPACT_SLACK_BYTES at least), the state is
measured again, and a file more than COMPACT_RATIO times its state is rewritten as the fewest
records (a temporary file, fsync, rename, fsync of the directory: a crash leaves the old or the
new file, both whole). So the file stays within a few times its state, whatever the floor does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from bisect import insort
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zlib import crc32

import msgpack

from exchange.journal_format import write_whole

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
MAX_RECORD = 64 << 20  # a longer length field is damage
COMPACT_RATIO = 2  # rewrite once the file is this many times the size of its state
COMPACT_SLACK_BYTES = 64 << 10  # the least growth between two looks at the state's size
DONE_PER_RECORD = 10_000  # (pos, idx, count) runs in one compacted "done" record: each well under MAX_RECORD


@dataclass
class CursorState:
    """What a group's cursor file says."""
    prefixes: tuple[bytes, ...] = ()
    ack_timeout_ms: int = 0
    max_deliveries: int = 0
    dead_letter: bytes = b""
    first_pos: int = 0  # 0: no start record (an empty or unreadable file)
    incarnation: str = ""  # whose stream the positions are of
    floor: int = 0  # every message below this position left the group
    done: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # pos → sorted (idx, count) above floor
    gap: tuple[int, int] = (0, 0)

    def apply(self, record: list[Any], prune: bool = True) -> None:
        """One record (checked: `checked`); `prune` False leaves runs below a raised floor for
        `prune()` (reading a file: one pass at the end, not one per floor record)."""
        kind = record[0]
        if kind == "start":
            _, prefixes, self.ack_timeout_ms, self.max_deliveries, dead_letter, self.first_pos, incarnation = record
            self.incarnation = str(incarnation)
            self.prefixes, self.dead_letter = tuple(bytes(p) for p in prefixes), bytes(dead_letter)
            self.floor = max(self.floor, self.first_pos)
        elif kind == "done":
            for pos, idx, count in record[1]:
                if pos >= self.floor:
                    runs = self.done.setdefault(int(pos), [])
                    insort(runs, (int(idx), int(count)))
                    self.done[int(pos)] = _merged(runs)
        elif kind == "gap":
            self.gap = (int(record[1]), int(record[2]))
        elif kind == "floor":
            self.floor = max(self.floor, int(record[1]))
            if prune:
                self.prune()
        else:
            raise ValueError(f"unknown cursor record {kind!r}")

    def prune(self) -> None:
        """Drop the runs below the floor (they say nothing more)."""
        if any(pos < self.floor for pos in self.done):
            self.done = {pos: runs for pos, runs in self.done.items() if pos >= self.floor}

    def is_done(self, pos: int, idx: int) -> bool:
        """Whether message `idx` of the frame at `pos` left the group."""
        if pos < self.floor or self.gap[0] <= pos < self.gap[1]:
            return True
        return any(start <= idx < start + count for start, count in self.done.get(pos, ()))

    def records(self) -> list[list[Any]]:
        """The fewest records that say the same."""
        out: list[list[Any]] = []
        if self.first_pos:
            out.append(["start", list(self.prefixes), self.ack_timeout_ms, self.max_deliveries, self.dead_letter,
                        self.first_pos, self.incarnation])
            out.append(["floor", self.floor])
        if self.gap != (0, 0):
            out.append(["gap", *self.gap])
        runs = [[pos, idx, count] for pos, pieces in sorted(self.done.items()) for idx, count in pieces]
        out += [["done", runs[at:at + DONE_PER_RECORD]] for at in range(0, len(runs), DONE_PER_RECORD)]
        return out


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted (idx, count) runs with the touching and overlapping ones joined: a frame acked message
    by message is one run."""
    out: list[tuple[int, int]] = []
    for idx, count in runs:
        if out and idx <= out[-1][0] + out[-1][1]:
            start, length = out[-1]
            out[-1] = (start, max(length, idx + count - start))
        else:
            out.append((idx, count))
    return out


MAX_POS = 1 << 63  # positions and counts are u64 in the protocol; idx and count within a frame u32
MAX_IDX = 1 << 32
MAX_NAME = 1 << 16  # a prefix, a dead-letter queue name


def _int(upper: int) -> Any:
    return lambda v: type(v) is int and 0 <= v < upper


def _blob(v: Any) -> bool:
    return isinstance(v, bytes) and len(v) <= MAX_NAME


def _runs(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(r, list) and len(r) == 3 and _int(MAX_POS)(r[0]) and _int(MAX_IDX)(r[1])
        and _int(MAX_IDX)(r[2]) for r in v)


SHAPES: dict[str, tuple[Any, ...]] = {  # each field's check, after the kind
    "start": (lambda v: isinstance(v, list) and all(map(_blob, v)), _int(MAX_POS), _int(MAX_POS), _blob,
              _int(MAX_POS), lambda v: isinstance(v, str) and len(v) <= MAX_NAME),
    "done": (_runs,),
    "floor": (_int(MAX_POS),),
    "gap": (_int(MAX_POS), _int(MAX_POS)),
}


def encode(record: list[Any]) -> bytes:
    return framed(msgpack.packb(record, use_bin_type=True))


def framed(payload: bytes) -> bytes:
    """A record: its header, then `payload`."""
    return HEADER.pack(len(payload), crc32(payload)) + payload


def payloads(data: bytes) -> Iterator[tuple[bytes, int]]:
    """Each whole record's payload at the start of `data`, with where the record ends; it stops at
    the first torn or damaged one (the caller stops too at one whose payload says nonsense)."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, crc = HEADER.unpack_from(data, offset)
        end = offset + HEADER.size + length
        if length > MAX_RECORD or end > len(data):
            return
        payload = data[offset + HEADER.size:end]
        if crc32(payload) != crc:
            return
        yield payload, end
        offset = end


def decode_all(data: bytes) -> tuple[CursorState, int]:
    """The state of the whole records at the start of `data`, and where the first bad one starts."""
    state, offset = CursorState(), 0
    for payload, end in payloads(data):
        try:
            record = checked(msgpack.unpackb(payload, raw=False))
        except (ValueError, TypeError, IndexError, msgpack.UnpackException):
            break
        state.apply(record, prune=False)  # a checked record applies whole: no copy of the state to roll back to
        offset = end
    state.prune()
    return state, offset


def checked(record: Any) -> list[Any]:
    """`record` if each of its fields has its kind's type (and range), else ValueError: a record
    that passed its CRC but says nonsense is cut as a torn one is."""
    if not isinstance(record, list) or not record:
        raise ValueError("a cursor record is a non-empty list")
    kind, shape = record[0], SHAPES.get(record[0]) if isinstance(record[0], str) else None
    if shape is None or len(record) != len(shape) + 1:
        raise ValueError(f"unknown cursor record {kind!r}")
    for value, check in zip(record[1:], shape, strict=True):
        if not check(value):
            raise ValueError(f"cursor record {kind!r}: a field out of type or range")
    return record



class GroupCursor:
    """One group's cursor file: `recover` at start, `start`, `done` and `floor` as the group goes,
    `sync` on the stats tick."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = CursorState()
        self.cut = 0  # bytes of a bad tail dropped at recovery
        self._file: Any = None
        self._size = 0
        self._look_at = 0  # the file size at which the state's size is looked at again
        self._behind = False  # a record the disk refused: the file says less than `state` until a compaction

    def recover(self) -> CursorState:
        """Read the file (if any), cut a bad tail, and open it for appending."""
        data = self.path.read_bytes() if self.path.exists() else b""
        self.state, good = decode_all(data)
        self.cut = len(data) - good
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, good)
        os.lseek(fd, good, os.SEEK_SET)
        self._file = os.fdopen(fd, "ab", buffering=0)
        self._size = self._look_at = good  # a file left big by an earlier run is looked at on the first tick
        return self.state

    def start(self, prefixes: tuple[bytes, ...], ack_timeout_ms: int, max_deliveries: int, dead_letter: bytes,
              first_pos: int, incarnation: str) -> None:
        self._append(["start", list(prefixes), ack_timeout_ms, max_deliveries, dead_letter, first_pos, incarnation])

    def done(self, ranges: list[tuple[int, int, int]]) -> None:
        if ranges:
            self._append(["done", [list(r) for r in ranges]])

    def floor(self, pos: int) -> None:
        """On the stats tick: the group's floor, and a compaction when the file has grown to
        COMPACT_RATIO times its state (also when the floor is stuck: acks above it pile up in the
        file, merged in its state). The state is measured once the file grew by as much as the
        state was at the last look: the measuring costs a constant per byte appended."""
        if pos > self.state.floor:
            self._append(["floor", pos])
        if self._size < self._look_at and not self._behind:
            return
        needed = self._state_size()
        if self._size > COMPACT_RATIO * needed or self._behind:
            try:
                self.compact()
            except OSError as exc:  # a full disk: the file stays as it was, tried again next tick
                log.warning("cursor file %s: compaction refused (%s)", self.path, exc)
                return
        self._look_at = self._size + max(needed, COMPACT_SLACK_BYTES)

    def sync(self) -> None:
        if self._file is not None:
            os.fdatasync(self._file.fileno())

    def compact(self, state: CursorState | None = None) -> None:
        """Rewrite the file as its state's fewest records (or as `state`'s: a group moved to a new
        incarnation's positions), atomically."""
        if state is not None:
            self.state = state
        data = b"".join(encode(r) for r in self.state.records())
        write_whole(self.path, data)
        self.close()
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 (kept open for appends)
        self._size = len(data)
        self._look_at = self._size + max(self._size, COMPACT_SLACK_BYTES)
        self._behind = False

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _append(self, record: list[Any]) -> None:
        self.state.apply(record)
        data = encode(record)
        if self._file is None:
            self._size += len(data)
            return
        try:
            self._file.write(data)
        except OSError as exc:  # a full disk: no part of it may stay (later records would be cut with it)
            if not self._behind:
                log.warning("cursor file %s: a record refused (%s); rewritten whole when the disk allows",
                            self.path, exc)
            self._behind = True
            with contextlib.suppress(OSError):  # if even this fails, recovery cuts there: acks undone, nothing lost
                os.ftruncate(self._file.fileno(), self._size)
            return
        self._size += len(data)

    def _state_size(self) -> int:
        return sum(len(encode(r)) for r in self.state.records())
