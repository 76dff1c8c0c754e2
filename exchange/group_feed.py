"""What the groups are offered of each frame this exchange retains.

After adopting the groups an earlier incarnation left (exchange/group_sync.py), a publisher's
resends up to its highest sequence number there are not new to the groups: they are left out,
for as long as a publisher may still resend (`exchange.publisher_ttl`).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from exchange.groups import Group, Groups


class GroupFeed:
    def __init__(self, groups: Groups) -> None:
        self.groups = groups
        self.adopted_high: dict[str, int] = {}  # publisher → highest seq of the adopted incarnation
        self._adopted_until = 0.0
        self.before_live: Callable[[int], None] | None = None  # GroupSpill.mark, with a disk policy

    def adopted(self, high: dict[str, int], until: float) -> None:
        """Leave out each publisher's messages up to `high` until `until` (monotonic)."""
        self.adopted_high = high
        self._adopted_until = until

    def offer(self, pos: int, topic: bytes, pub: str, sent_ns: int, seqs: list[int], payloads: list[bytes],
              attrs: list[tuple[Any, ...]] | None, only: Group | None = None,
              topics: list[bytes] | None = None) -> None:
        """A frame to the groups, without the messages an adopted group already had."""
        start = 0
        if only is None and self.before_live is not None:
            self.before_live(pos)
        if self.adopted_high:
            if time.monotonic() > self._adopted_until:
                self.adopted_high = {}  # no publisher resends that late
            elif pub in self.adopted_high:
                start = bisect_right(seqs, self.adopted_high[pub])
        self.groups.offer(pos, topic, pub, sent_ns, seqs, payloads, attrs, only=only, start=start, topics=topics)
