"""Consumer lag: how far behind this exchange's stream each durable subscriber is.

Durable subscribers report what they have taken (a `progress` report on the replay socket,
docs/protocol.md 5.5) each time they save their position. The exchange keeps the last report
per name and, at each statistics report, turns it into frames, messages and seconds behind
its stream: a subscriber that went away keeps its entry, and its lag grows, which is what an
operator wants to see. The table is bounded (names, age), and what it reports is the furthest
behind first.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from exchange.retention import Retention
from roq import protocol
from roq.records import ConsumerLag

MAX_CONSUMERS = 1_000  # names remembered, least recently reported forgotten first
FORGET_AFTER = 24 * 3600.0  # a name unreported this long is forgotten
REPORTED = 50  # names in one statistics report


class ConsumerProgress:
    def __init__(self, incarnation: str) -> None:
        self.incarnation = incarnation
        self._taken: OrderedDict[str, tuple[int, float]] = OrderedDict()  # name → (pos, reported at)

    def __len__(self) -> int:
        return len(self._taken)

    def report(self, progress: protocol.Progress, now: float | None = None) -> None:
        """A report about another incarnation (an ended one) says nothing about this stream."""
        if progress.incarnation != self.incarnation:
            return
        self._taken[progress.name] = (progress.pos, time.monotonic() if now is None else now)
        self._taken.move_to_end(progress.name)
        while len(self._taken) > MAX_CONSUMERS:
            self._taken.popitem(last=False)

    def lags(self, retention: Retention, now: float | None = None) -> tuple[ConsumerLag, ...]:
        now = time.monotonic() if now is None else now
        while self._taken and now - next(iter(self._taken.values()))[1] > FORGET_AFTER:
            self._taken.popitem(last=False)
        lags = []
        for name, (pos, reported_at) in self._taken.items():
            frames, messages, seconds = retention.behind(pos, now)
            lags.append(ConsumerLag(name=name, frames=frames, messages=messages, seconds=round(seconds, 3),
                                    reported_ago=round(now - reported_at, 3)))
        lags.sort(key=lambda lag: (-lag.messages, lag.name))
        return tuple(lags[:REPORTED])
