"""What a subscriber has already handed to its application, and how it is saved.

`SeenSequences` holds one publisher's sequence numbers as sorted, disjoint
runs, so a message that arrives twice (a publisher replayed it through another
exchange, or a fetch from retention overlapped the live stream) is recognised
whatever the order of arrival. A `Checkpoint` adds, per exchange incarnation, the
stream position handled so far; saved to a file it lets a durable subscriber
resume after a restart. Its JSON form is what `Subscriber.position()` returns and
`position=` takes (the names of the public API and the file format stay "position").
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

from roq.errors import ConfigError

RUN_LIMIT = 10_000  # runs kept per publisher; older ones fold into the floor
SAVED_RUNS = 1_000  # runs written per publisher when a position is saved
# Publishers remembered: beyond PUBLISHER_LIMIT the least recently seen is forgotten, but only once
# unseen for FORGET_AFTER (longer than any replay window or retention: nothing of it can come
# back); beyond PUBLISHER_HARD_LIMIT the least recently seen goes whatever its age.
PUBLISHER_LIMIT = 100_000
PUBLISHER_HARD_LIMIT = 1_000_000
FORGET_AFTER = 600.0
STREAM_LIMIT = 1_000  # exchange incarnations remembered
FORMAT_VERSION = 1


class SeenSequences:
    """Sequence numbers already handed over, as runs [starts[i], ends[i]] (inclusive).

    Everything below `floor` counts as seen: runs beyond RUN_LIMIT are folded
    into it, oldest first."""

    __slots__ = ("floor", "starts", "ends", "touched")

    def __init__(self, floor: int = 0, runs: list[list[int]] | None = None) -> None:
        self.floor = floor
        self.touched = time.monotonic()
        self.starts = [r[0] for r in runs or ()]
        self.ends = [r[1] for r in runs or ()]

    def add_run(self, first: int, last: int) -> bool:
        """Record first..last when all of it lies above everything seen (the common case).
        Returns False, recording nothing, when the run needs the per-message path."""
        ends = self.ends
        if ends and first <= ends[-1] or first < self.floor:
            return False
        if ends and first == ends[-1] + 1:
            ends[-1] = last
        else:
            self.starts.append(first)
            ends.append(last)
            self._bound()
        return True

    def add(self, seq: int) -> bool:
        """Record one sequence number; False if it was already seen."""
        if self.add_run(seq, seq):
            return True
        if seq < self.floor:
            return False
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, seq) - 1  # the run starting at or before seq
        if i >= 0 and seq <= ends[i]:
            return False
        joins_left = i >= 0 and ends[i] + 1 == seq
        joins_right = i + 1 < len(starts) and starts[i + 1] == seq + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = seq
        elif joins_right:
            starts[i + 1] = seq
        else:
            starts.insert(i + 1, seq)
            ends.insert(i + 1, seq)
            self._bound()
        return True

    def _bound(self) -> None:
        while len(self.starts) > RUN_LIMIT:
            self.floor = self.ends[0] + 1
            del self.starts[0], self.ends[0]

    def to_json(self, runs: int = SAVED_RUNS) -> dict[str, Any]:
        cut = max(0, len(self.starts) - runs)
        floor = self.ends[cut - 1] + 1 if cut else self.floor
        return {"floor": floor, "runs": [[s, e] for s, e in zip(self.starts[cut:], self.ends[cut:])]}

    @classmethod
    def from_json(cls, data: Any) -> SeenSequences:
        floor, runs = data["floor"], data["runs"]
        if not isinstance(floor, int) or not all(
                isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) for r in runs):
            raise ValueError("bad runs")
        runs = sorted(runs)
        if any(a[1] >= b[0] for a, b in zip(runs, runs[1:])):
            raise ValueError("overlapping runs")
        return cls(floor, runs)


class Checkpoint:
    """Per publisher: sequences seen. Per exchange incarnation: position handled."""

    def __init__(self) -> None:
        self.publishers: OrderedDict[str, SeenSequences] = OrderedDict()  # least recently seen first
        self.streams: OrderedDict[str, int] = OrderedDict()
        # Incarnations running when a subscriber started "now" that it had not synced with yet: on
        # resume they start at their sync point too (nothing of them before it was ever its).
        self.start_at_sync: list[str] = []
        self.forgotten = 0  # publishers dropped beyond the limits

    def seen(self, publisher: str, now: float | None = None) -> SeenSequences:
        """The publisher's sequences, now the most recently seen."""
        publishers = self.publishers
        seqs = publishers.get(publisher)
        now = time.monotonic() if now is None else now
        if seqs is None:
            seqs = publishers[publisher] = SeenSequences()
            if len(publishers) > PUBLISHER_LIMIT:
                self._forget(now)
        else:
            publishers.move_to_end(publisher)
        seqs.touched = now
        return seqs

    def _forget(self, now: float) -> None:
        publishers = self.publishers
        while len(publishers) > PUBLISHER_LIMIT:
            oldest = next(iter(publishers.values()))
            if len(publishers) <= PUBLISHER_HARD_LIMIT and now - oldest.touched < FORGET_AFTER:
                return  # all of them may still send: keep them (bounded by the hard limit)
            publishers.popitem(last=False)
            self.forgotten += 1

    def advance(self, incarnation: str, pos: int) -> None:
        if pos > self.streams.get(incarnation, -1):
            self.streams[incarnation] = pos
            if len(self.streams) > STREAM_LIMIT:
                self.streams.popitem(last=False)

    def copy(self) -> Checkpoint:
        return Checkpoint.from_json(self.to_json())

    def to_json(self, max_publishers: int | None = None, max_runs: int | None = None) -> dict[str, Any]:
        """The position as plain data. Bounded (what a resume token of the HTTP gateway may hold):
        at most `max_publishers`, the most recently seen, and `max_runs` runs shared among them,
        each keeping its latest and folding the rest into its floor, as SAVED_RUNS does."""
        publishers: Iterable[tuple[str, SeenSequences]] = self.publishers.items()
        if max_publishers is not None and len(self.publishers) > max_publishers:
            publishers = list(islice(reversed(self.publishers.items()), max_publishers))[::-1]
        runs = SAVED_RUNS
        if max_runs is not None:
            publishers = list(publishers)
            runs = min(runs, run_share([len(seen.starts) for _, seen in publishers], max_runs))
        return {"version": FORMAT_VERSION,
                "publishers": {p: s.to_json(runs) for p, s in publishers},
                "streams": dict(self.streams), "start_at_sync": list(self.start_at_sync)}

    @classmethod
    def from_json(cls, data: Any) -> Checkpoint:
        checkpoint = cls()
        try:
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {data.get('version')!r}, expected {FORMAT_VERSION}")
            for publisher, seqs in data["publishers"].items():
                checkpoint.publishers[str(publisher)] = SeenSequences.from_json(seqs)
            for incarnation, pos in data["streams"].items():
                if not isinstance(pos, int) or pos < 0:
                    raise ValueError(f"bad position {pos!r}")
                checkpoint.streams[str(incarnation)] = pos
            pending = data.get("start_at_sync", [])  # absent in positions saved before it existed
            if not isinstance(pending, list) or not all(isinstance(inc, str) for inc in pending):
                raise ValueError(f"bad start_at_sync {pending!r}")
            checkpoint.start_at_sync = pending[:STREAM_LIMIT]
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a subscriber position: {exc}") from None
        return checkpoint


def run_share(counts: list[int], budget: int) -> int:
    """The most runs each publisher may keep so that all of them keep at most `budget` together
    (a publisher with fewer keeps all of its own, leaving the rest to the others)."""
    left, sharing = budget, len(counts)
    for count in sorted(counts):
        if count * sharing > left:
            return left // sharing
        left -= count
        sharing -= 1
    return max(counts, default=0)


def checkpoint_file(state_dir: str, queue: str, name: str) -> Path:
    return Path(state_dir) / queue / f"{name}.json"


def load_checkpoint(path: Path) -> Checkpoint | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: not a subscriber position ({exc})") from None
    return Checkpoint.from_json(data)


def save_checkpoint(path: Path, data: dict[str, Any]) -> None:
    """Write a checkpoint (`Checkpoint.to_json()` form) atomically: a crash leaves the old file or
    the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, separators=(",", ":"))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
