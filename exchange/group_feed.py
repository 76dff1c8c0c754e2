"""What the groups are offered of each frame this exchange retains.

After adopting the groups an earlier incarnation left (exchange/group_sync.py), a publisher's
resends up to its highest sequence number there are not new to the groups: they are left out of
the frames retained from then on (`live_from`) for as long as a publisher may still resend
(`exchange.publisher_ttl`). The rule is by position, so a group that reads those frames back from
disk later (exchange/group_spill.py) leaves out the same messages, and the backlog forwarded again
at the adoption (below `live_from`) is never left out.
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
        self.live_from = 0  # the first position retained after the adoption
        self.closed_at = 0  # the first position retained after the resend window closed (0: open)
        self.before_live: Callable[[int], None] | None = None  # GroupSpill.mark, with a disk policy

    def adopted(self, high: dict[str, int], until: float, live_from: int) -> None:
        """Leave out each publisher's messages up to `high` in frames from `live_from` on that were
        retained until `until` (monotonic)."""
        self.adopted_high = high
        self._adopted_until = until
        self.live_from, self.closed_at = live_from, 0

    def _resent_from(self, pos: int, pub: str, seqs: list[int]) -> int:
        """How many of the frame's first messages are resends of adopted ones."""
        if pos < self.live_from or (self.closed_at and pos >= self.closed_at) or pub not in self.adopted_high:
            return 0
        return bisect_right(seqs, self.adopted_high[pub])

    def offer(self, pos: int, topic: bytes, pub: str, sent_ns: int, seqs: list[int], payloads: list[bytes],
              attrs: list[tuple[Any, ...]] | None, only: Group | None = None,
              topics: list[bytes] | None = None) -> None:
        """A frame to the groups, without the messages an adopted group already had."""
        start = 0
        if only is None and self.before_live is not None:
            self.before_live(pos)
        if self.adopted_high:
            if only is None and not self.closed_at and time.monotonic() > self._adopted_until:
                self.closed_at = pos  # no publisher resends that late
            start = self._resent_from(pos, pub, seqs)
        self.groups.offer(pos, topic, pub, sent_ns, seqs, payloads, attrs, only=only, start=start, topics=topics)
