"""Dead letters: messages a consumer group gave up on, published again by this exchange.

Each goes out as a new message of this incarnation's own publisher id on the group's
dead-letter topic, with the same payload, priority, key and headers, in a stream any subscriber
or group can read, and RoQ's headers saying where it came from (protocol section 7.4).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from exchange.groups import Group, Unit

# send(topic, publisher, sent_ns, seqs, payloads, size, attrs): exchange/fanout.py `Fanout.send`.
Send = Callable[[bytes, str, int, list[int], list[bytes], int, list[list[Any]]], int]


class DeadLetters:
    def __init__(self, publisher: str) -> None:
        self.publisher = publisher
        self._seq = 0
        self._dead: list[tuple[Group, Unit, str, int]] = []  # (group, unit, reason, when in ms)

    def collect(self, group: Group, unit: Unit, reason: str) -> None:
        """The groups' `on_dead`: published after the groups' turn, not in the middle of it; the
        time is when it was given up on."""
        self._dead.append((group, unit, reason, time.time_ns() // 1_000_000))

    def publish(self, send: Send) -> None:
        dead, self._dead = self._dead, []
        for group, unit, reason, at_ms in dead:
            first = self._seq + 1
            self._seq += unit.count
            payloads = unit.payloads[unit.idx:unit.idx + unit.count]
            common = {**(unit.headers or {}), "roq-topic": unit.topic, "roq-publisher": unit.publisher.encode(),
                      "roq-reason": reason.encode(), "roq-deliveries": b"%d" % unit.deliveries,
                      "roq-group": group.name.encode(), "roq-time": b"%d" % at_ms}
            attrs = [[i, unit.priority, 0, unit.key, {**common, "roq-seq": b"%d" % seq}]
                     for i, seq in enumerate(unit.seqs[unit.idx:unit.idx + unit.count])]
            send(group.settings.dead_letter, self.publisher, unit.sent_ns, list(range(first, first + unit.count)),
                 payloads, unit.size, attrs)
