"""The retention buffer: recent delivery frames, kept for subscribers that come back.

Every frame the exchange sends to its subscribers gets the next position of
this incarnation's stream and is kept here, already encoded, until it is older
than `retention_seconds` or the buffer holds more than `retention_bytes`.
A subscriber that reconnects, restarts from a saved position, or finds a hole
in one of its prefix chains (exchange/chains.py), fetches the missing positions
from here. Positions are consecutive, so a lookup is an index computation.

A frame of many topics (exchange/grouping.py) is kept with its distinct topics and their message
counts, so that a fetch of a prefix longer than its routing topic finds it without decoding it.
An evicted frame leaves a tombstone (its topics and message counts, no payload)
for a while longer, so a subscriber that asks too late is told exactly how many
of its messages it lost, not just that it lost some.

A purge (`purge`, an admin's `roq queue purge`) raises a floor: frames below it are not served any
more (a fetch counts their messages as lost, exactly as for an eviction) and go at once unless
the replica still needs them (`protect_from`), then as soon as it has them.

With replicas (exchange/replication.py) the buffer is also what the exchange copies to its
replica: `protect_from` keeps frames the replica has not acknowledged from being evicted (they
are not yet confirmed to anyone, and the replica must get them all), and `entries` reads them.
A replica's copy of a stream is a Retention too, starting at the position it was first sent.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from itertools import islice
from typing import TypeVar

T = TypeVar("T")
# A frame's distinct topics with their message counts; None when all its messages have its routing topic.
TopicCounts = tuple[tuple[bytes, int], ...] | None

TOMBSTONES = 100_000  # evicted frames remembered for exact loss counts


class Retention:
    def __init__(self, seconds: float, max_bytes: int, tombstones: int = TOMBSTONES, first_pos: int = 1) -> None:
        self.seconds = seconds
        self.max_bytes = max_bytes
        # (stored at, routing topic, body, messages, topic counts)
        self._frames: deque[tuple[float, bytes, bytes, int, TopicCounts]] = deque()
        self._first_pos = first_pos  # position of _frames[0]
        self.protect_from: int | None = None  # frames at or above this position are never evicted
        self.floor = first_pos  # frames below this position were purged: never served, evicted once unprotected
        # Evicted: (routing topic, messages, messages before it, stored at, topic counts).
        self._tombs: deque[tuple[bytes, int, int, float, TopicCounts]] = deque(maxlen=tombstones)
        # Messages ever added, and before each retained frame: how far behind a reader is, in messages.
        self.messages_total = 0
        self._messages_before: deque[int] = deque()
        self.bytes = 0
        self.evicted = 0

    @property
    def next_pos(self) -> int:
        return self._first_pos + len(self._frames)

    @property
    def oldest(self) -> int:
        """Oldest position still retained (== next_pos when empty), purged frames kept for the replica included."""
        return self._first_pos

    @property
    def served_from(self) -> int:
        """Oldest position a reader may still fetch: the oldest retained, or the purge floor above it."""
        return min(max(self._first_pos, self.floor), self.next_pos)

    @property
    def served_frames(self) -> int:
        """Frames a reader may still fetch (those below the purge floor are kept only for the replica)."""
        return self.next_pos - self.served_from

    def __len__(self) -> int:
        return len(self._frames)

    def purge(self, upto: int | None = None) -> tuple[int, int]:
        """Serve nothing below `upto` (default: everything held now) and evict it as soon as nothing
        protects it. Returns (frames, messages) that were still served and are not any more."""
        upto = self.next_pos if upto is None else min(upto, self.next_pos)
        start = self.served_from
        if upto <= start:
            return 0, 0
        frames = upto - start
        messages = self._messages_at(upto) - self._messages_at(start)
        self.floor = upto
        self.trim()
        return frames, messages

    def _messages_at(self, pos: int) -> int:
        """Messages added before position `pos` (a retained position, or next_pos)."""
        index = pos - self._first_pos
        return self.messages_total if index >= len(self._messages_before) else self._messages_before[index]

    def add(self, topic: bytes, body: bytes, messages: int = 1, now: float | None = None,
            topics: TopicCounts = None) -> int:
        """Keep one frame of `messages` messages with routing topic `topic` (`topics`: its distinct
        topics and their counts when it has more than one); returns its position."""
        pos = self.next_pos
        self._frames.append((now if now is not None else time.monotonic(), topic, body, messages, topics))
        self._messages_before.append(self.messages_total)
        self.messages_total += messages
        self.bytes += len(topic) + len(body)
        if self.bytes > self.max_bytes:
            self.trim()
        return pos

    def trim(self, now: float | None = None) -> None:
        """Forget frames beyond the byte bound or older than the time bound."""
        horizon = (now if now is not None else time.monotonic()) - self.seconds
        frames = self._frames
        protected = self.protect_from
        while frames and (self.bytes > self.max_bytes or frames[0][0] < horizon or self._first_pos < self.floor) \
                and (protected is None or self._first_pos < protected):
            stored_at, topic, body, messages, topics = frames.popleft()
            self._tombs.append((topic, messages, self._messages_before.popleft(), stored_at, topics))
            self.bytes -= len(topic) + len(body)
            self._first_pos += 1
            self.evicted += 1

    def behind(self, pos: int, now: float | None = None) -> tuple[int, int, float]:
        """How far a reader that took every frame up to `pos` is behind: frames, messages, and
        seconds the oldest frame it lacks has been here; in constant time (it runs for every
        consumer at every report). Beyond the tombstones, messages and seconds are at least."""
        pos = max(pos, self.floor - 1)  # purged frames are nobody's backlog
        frames = self.next_pos - 1 - pos
        if frames <= 0:
            return 0, 0, 0.0
        now = now if now is not None else time.monotonic()
        first = pos + 1 - self._first_pos
        if first >= 0:
            before, stored_at = self._messages_before[first], self._frames[first][0]
        elif self._tombs:
            _, _, before, stored_at, _ = self._tombs[max(0, first + len(self._tombs))]
        elif self._frames:  # nothing evicted is remembered (a store that began past position 1)
            before, stored_at = self._messages_before[0], self._frames[0][0]
        else:
            return frames, 0, 0.0
        return frames, self.messages_total - before, max(0.0, now - stored_at)

    def position_at(self, stored_at: float) -> int:
        """The first retained position stored at or after `stored_at` (this buffer's clock:
        monotonic), next_pos if none is; times never decrease along the buffer, so a binary search."""
        frames = self._frames
        low, high = 0, len(frames)
        while low < high:
            middle = (low + high) // 2
            if frames[middle][0] < stored_at:
                low = middle + 1
            else:
                high = middle
        return self._first_pos + low

    def entries(self, start: int, max_bytes: int) -> list[list[object]]:
        """[topic, body, messages] of the frames from position `start` on (at least one if any),
        up to about `max_bytes`: what a replica is sent."""
        found: list[list[object]] = []
        size = 0
        for _, topic, body, messages, _ in _window(self._frames, max(start - self._first_pos, 0), len(self._frames)):
            if found and size + len(body) > max_bytes:
                break
            found.append([topic, body, messages])
            size += len(body)
        return found

    def read(self, after: int, before: int, prefixes: list[bytes],
             max_bytes: int) -> tuple[list[tuple[bytes, bytes]], int, bool]:
        """Frames with after < pos < before holding a message whose topic starts with one of
        `prefixes` (all if none). Returns (frames, scanned_to, done): every position up to
        `scanned_to` was looked at; `done` is False when `max_bytes` cut the page short (at least
        one frame is always returned, so paging makes progress)."""
        before = min(before, self.next_pos)
        start = max(after + 1, self.served_from)
        found: list[tuple[bytes, bytes]] = []
        size = 0
        wanted = tuple(prefixes)
        match_all = not prefixes or b"" in prefixes
        window = _window(self._frames, start - self._first_pos, max(start, before) - self._first_pos)
        for pos, (_, topic, body, _, topics) in enumerate(window, start):
            if match_all or topic.startswith(wanted) or (topics is not None and _holds(topics, wanted)):
                if found and size + len(body) > max_bytes:
                    return found, pos - 1, False
                found.append((topic, body))
                size += len(body)
        return found, max(after, before - 1), True

    def lost(self, after: int, before: int, prefixes: list[bytes]) -> tuple[int, bool]:
        """Messages of `prefixes` in frames after < pos < before that were evicted or purged, and
        whether that count is exact (the tombstones reach back to `after`)."""
        wanted = tuple(prefixes)
        match_all = not prefixes or b"" in prefixes
        # Purged but still held for the replica: lost to readers all the same.
        hidden = _window(self._frames, after + 1 - self._first_pos, min(before, self.served_from) - self._first_pos)
        count = sum(_messages_of(topic, messages, topics, wanted, match_all)
                    for _, topic, _, messages, topics in hidden)
        tomb_first = self._first_pos - len(self._tombs)
        upto = min(before, self._first_pos)
        if upto <= after + 1:
            return count, True
        start = max(after + 1, tomb_first)
        count += sum(_messages_of(topic, messages, topics, wanted, match_all)
                     for topic, messages, _, _, topics in _window(self._tombs, start - tomb_first, upto - tomb_first))
        return count, after + 1 >= tomb_first


def _holds(topics: tuple[tuple[bytes, int], ...], wanted: tuple[bytes, ...]) -> bool:
    """Some topic of a frame of many starts with one of `wanted`."""
    return any(topic.startswith(wanted) for topic, _ in topics)


def _messages_of(topic: bytes, messages: int, topics: TopicCounts, wanted: tuple[bytes, ...],
                 match_all: bool) -> int:
    """How many of a frame's messages have a topic starting with one of `wanted`."""
    if match_all or topic.startswith(wanted):
        return messages
    if topics is None:
        return 0
    return sum(count for each, count in topics if each.startswith(wanted))


def _window(items: deque[T], begin: int, end: int) -> Iterable[T]:
    """items[begin:end] of a deque, walked from its nearer end: reads near the tail (a replica's
    next page, a subscriber's recent hole) cost what they return, not the whole buffer."""
    size = len(items)
    begin, end = max(begin, 0), min(end, size)
    if begin >= end:
        return ()
    if begin <= size - end:
        return islice(items, begin, end)
    return reversed(list(islice(reversed(items), size - end, size - begin)))
