"""Acks that wait until what they confirm is durable (replicated, and fsync'ed with the journal).

Without a replica and without an fsync journal, an ack leaves as soon as the batch was forwarded.
Otherwise it is held here with the stream position the exchange had reached when the batch was
handled (`required`: every frame below it must be durable, which covers the batch's own frames
and any frame an earlier, duplicate-trimmed batch of the same publisher relied on), and released,
in order, once the durable position reaches it. Per publisher `confirmed` is the highest sequence
number released: a `welcome` names that, never more, because a publisher takes a welcome as an
ack.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class HeldAck:
    required: int  # release once every position below this is durable
    route: bytes
    publisher: str
    seq: int
    received: float = 0.0  # monotonic: when the batch was read (the confirm-latency histogram)


class ConfirmGate:
    def __init__(self) -> None:
        self._held: deque[HeldAck] = deque()
        self.confirmed: dict[str, int] = {}  # publisher → highest seq released (pruned with its session)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, required: int, route: bytes, publisher: str, seq: int, received: float = 0.0) -> None:
        self._held.append(HeldAck(required, route, publisher, seq, received))

    def release(self, durable: int) -> Iterator[HeldAck]:
        """The held acks whose positions are all durable now, oldest first."""
        held, confirmed = self._held, self.confirmed
        while held and held[0].required <= durable:
            ack = held.popleft()
            if ack.seq > confirmed.get(ack.publisher, 0):
                confirmed[ack.publisher] = ack.seq
            yield ack

    def welcome_seq(self, publisher: str, floor: int) -> int:
        """What a welcome may name: confirmed, or `floor` (below the publisher's own from_seq)."""
        return max(self.confirmed.get(publisher, 0), floor)

    def forget(self, publishers: set[str]) -> None:
        for publisher in publishers:
            self.confirmed.pop(publisher, None)
