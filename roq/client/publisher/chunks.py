"""The publisher's message log: unsent, in flight, confirmed (the replay window).

Every message a Publisher accepts gets the next sequence number and lives here until it is
confirmed and has aged out of the replay window. Messages move between the log's parts a chunk
(a batch's worth) at a time, never one by one:

    open (newest, [topic, payload, ...]) → unsent → sent (in flight) → replay (confirmed)

An ack confirms a prefix of sent and unsent (splitting a chunk when it ends inside one); a
welcome from an exchange says what it holds, and `rewind` queues everything above it to be
sent again, the replay window's part first. Not thread-safe: the Publisher holds its lock
around every call (the I/O thread and publish() share the log).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from itertools import accumulate

REPLAY_MERGE_SECONDS = 1.0  # confirmed messages merged into one replay chunk at most this far apart


class Chunk:
    """Consecutive messages first..last as one flat [topic, payload, ...] list: a batch's worth."""

    __slots__ = ("first", "flat", "size", "confirmed_at", "since")

    def __init__(self, first: int, flat: list[bytes], size: int | None = None) -> None:
        self.first = first
        self.flat = flat
        self.size = sum(map(len, flat)) if size is None else size
        self.confirmed_at = 0.0  # in the replay window: when its newest message was confirmed ...
        self.since = 0.0  # ... and its oldest

    @property
    def count(self) -> int:
        return len(self.flat) // 2

    @property
    def last(self) -> int:
        return self.first + len(self.flat) // 2 - 1

    def split_copy(self, count: int) -> Chunk:
        """A new chunk of the messages after the first `count` (this one stays as it is)."""
        return Chunk(self.first + count, self.flat[2 * count:])

    def split(self, count: int) -> Chunk:
        """Cut off and return the first `count` messages."""
        head = Chunk(self.first, self.flat[:2 * count])
        self.flat = self.flat[2 * count:]
        self.first += count
        self.size -= head.size
        return head


class ChunkLog:
    def __init__(self, max_batch: int, max_batch_bytes: int, replay_seconds: float, replay_bytes: int) -> None:
        self.max_batch = max_batch
        self.max_batch_bytes = max_batch_bytes
        self.replay_seconds = replay_seconds
        self.replay_bytes = replay_bytes
        self.sent: deque[Chunk] = deque()  # awaiting an ack, oldest first
        self.unsent: deque[Chunk] = deque()  # sealed, not yet sent
        self.open: list[bytes] = []  # the newest messages as [topic, payload, ...] ...
        self.open_at = 0  # ... from this index on (the items before it are sealed) ...
        self.open_first = 1  # ... the first of which has this sequence number
        self.replay: deque[Chunk] = deque()  # confirmed, kept for resending after a move
        self.replay_size = 0
        self.resend: list[Chunk] = []  # confirmed, queued for the exchange we just joined
        self.next_seq = 1
        self.acked = 0  # every message up to here is confirmed
        self.in_flight: deque[int] = deque()  # last seq of each batch sent and not yet acked

    @property
    def unconfirmed(self) -> int:
        return self.next_seq - 1 - self.acked

    def lowest_held(self) -> int:
        """The lowest sequence number we may still send: a hello's from_seq."""
        return self.replay[0].first if self.replay else self.acked + 1

    def append(self, flat: list[bytes], count: int) -> None:
        """Queue `count` messages given as [topic, payload, ...]."""
        self.open += flat
        self.next_seq += count

    def take(self) -> Chunk | None:
        """The next batch to send (sealed from the open messages if nothing else waits); it is
        in flight from now on."""
        if not self.unsent:
            self.seal()
        if not self.unsent:
            return None
        chunk = self.unsent.popleft()
        self.sent.append(chunk)
        self.in_flight.append(chunk.last)
        return chunk

    def take_resend(self) -> list[Chunk]:
        resend, self.resend = self.resend, []
        return resend

    def full_batch_waiting(self) -> bool:
        """A batch's worth is ready: a sealed chunk, or open messages enough for a full batch."""
        if self.unsent:
            return True
        items = len(self.open) - self.open_at
        return items > 0 and items >= self._batch_items()

    def _batch_items(self) -> int:
        """How many open items (a topic and a payload per message) one batch can take, judged by
        the first message's size: sizing them all would cost a pass over up to 2 * max_batch."""
        first = len(self.open[self.open_at]) + len(self.open[self.open_at + 1])
        return 2 * min(self.max_batch, max(1, self.max_batch_bytes // max(1, first)))

    def open_count(self) -> int:
        """Messages not yet sealed into a chunk."""
        return (len(self.open) - self.open_at) // 2

    def open_messages(self) -> list[bytes]:
        """The messages not yet sealed into a chunk, as [topic, payload, ...]."""
        return self.open[self.open_at:]

    def seal(self) -> None:
        """Turn the oldest open messages into a chunk of at most one batch."""
        pending, start = self.open, self.open_at
        if len(pending) <= start:
            return
        limit = self.max_batch_bytes
        # Size only what can fit: with big messages a batch holds far fewer than max_batch, and
        # measuring all of them on every seal was the publisher's biggest cost (1000-B messages).
        items = min(len(pending) - start, self._batch_items())
        flat = pending if start == 0 and items == len(pending) else pending[start:start + items]
        size = sum(map(len, flat))  # one C-level pass; the cut below is the rare case
        if size > limit:
            ends = list(accumulate(map(len, flat)))
            items = max(2, (bisect_left(ends, limit) // 2 + 1) * 2)  # the message that crosses the limit goes too
            flat, size = flat[:items], ends[items - 1]
        self._consume_open(items)
        self.unsent.append(Chunk(self.open_first, flat, size))
        self.open_first += items // 2

    def _consume_open(self, items: int) -> None:
        """The first `items` open items are sealed. They are dropped from the list only once they are
        most of it: deleting a list's head shifts all the rest (100,000 items under backpressure)."""
        self.open_at += items
        if self.open_at == len(self.open):
            self.open, self.open_at = [], 0
        elif self.open_at > 4096 and 2 * self.open_at > len(self.open):
            del self.open[:self.open_at]
            self.open_at = 0

    def confirm(self, seq: int, now: float) -> bool:
        """Everything up to `seq` is confirmed (an ack, a welcome). False if that is nothing new."""
        if seq <= self.acked:
            self._done_in_flight()
            return False
        seq = min(seq, self.next_seq - 1)  # a fresh exchange says 0 (or an old position): only forward
        self._confirm(self.sent, seq, now)
        self._confirm(self.unsent, seq, now)
        while len(self.open) > self.open_at and self.open_first <= seq:  # a welcome can cover messages not yet sent
            self.seal()
            self._confirm(self.unsent, seq, now)
        self.trim_replay(now)
        self.acked = seq
        self._done_in_flight()
        return True

    def rewind(self, last: int, now: float) -> int:
        """The exchange holds everything up to `last`: queue all above it again, the replay
        window's part first. Returns how many confirmed messages will be resent."""
        self.unsent.extendleft(reversed(self.sent))
        self.sent.clear()
        self.in_flight.clear()
        self.trim_replay(now)
        resend = []
        for chunk in self.replay:
            if chunk.last <= last:
                continue
            resend.append(chunk.split_copy(last + 1 - chunk.first) if chunk.first <= last else chunk)
        self.resend = resend
        return sum(chunk.count for chunk in resend)

    def remember(self, chunk: Chunk, now: float) -> None:
        """Keep confirmed messages in the replay window. A slow publisher confirms one message per
        chunk: those are appended to the newest chunk (up to a batch, within REPLAY_MERGE_SECONDS),
        or the window would hold two objects per message for the garbage collector to walk (a
        40 ms pause at 150k). Messages are kept at least `replay_seconds`, at most
        REPLAY_MERGE_SECONDS longer."""
        self.replay_size += chunk.size
        tail = self.replay[-1] if self.replay else None
        if tail is not None and tail.last + 1 == chunk.first and now - tail.since < REPLAY_MERGE_SECONDS \
                and tail.count + chunk.count <= self.max_batch \
                and tail.size + chunk.size <= self.max_batch_bytes:
            tail.flat += chunk.flat  # the window's chunks are its own: resends copy them (merge)
            tail.size += chunk.size
            tail.confirmed_at = now
            return
        chunk.confirmed_at = chunk.since = now
        self.replay.append(chunk)

    def trim_replay(self, now: float) -> None:
        """Keep the replay window within its age and byte limits."""
        horizon = now - self.replay_seconds
        while self.replay and (self.replay[0].confirmed_at < horizon or self.replay_size > self.replay_bytes):
            self.replay_size -= self.replay.popleft().size

    def _confirm(self, chunks: deque[Chunk], seq: int, now: float) -> None:
        """Move the messages up to `seq` from `chunks` to the replay window."""
        keep = self.replay_seconds > 0
        while chunks and chunks[0].first <= seq:
            chunk = chunks[0]
            if chunk.last <= seq:
                chunks.popleft()
            else:
                chunk = chunk.split(seq - chunk.first + 1)
            if keep:
                self.remember(chunk, now)

    def _done_in_flight(self) -> None:
        while self.in_flight and self.in_flight[0] <= self.acked:
            self.in_flight.popleft()


def merge(chunks: list[Chunk], max_count: int, max_bytes: int) -> Iterator[tuple[int, list[bytes]]]:
    """Consecutive chunks as (first seq, flat) batches of at most max_count messages / about max_bytes."""
    first, size = 0, 0
    flat: list[bytes] = []
    for chunk in chunks:
        if flat and (len(flat) // 2 + chunk.count > max_count or size + chunk.size > max_bytes):
            yield first, flat
            flat, size = [], 0
        if not flat:
            first = chunk.first
        flat.extend(chunk.flat)  # a new list: the chunks stay as they are
        size += chunk.size
    if flat:
        yield first, flat
