"""Which exchange of its queue a publisher publishes to.

The one the application prefers while it runs; else the one the leader relocated it to (the
leader moves a heavy publisher off an overloaded exchange by naming it in the queue's relocations
znode); else the least loaded by its statistics, never one that just failed us while another
runs, and stale ones (frozen: silent, or statistics that stopped) and ones that cannot store
(their journal's disk full) last.
"""

from __future__ import annotations

import random
import time
from typing import Any

from roq.records import ExchangeStats

AVOID_SECONDS = 30.0  # an exchange that failed us is not chosen again for this long while others run
# An exchange is stale (chosen last) when its HCM says it stopped reporting (`silent`), or when its
# statistics are older than the newest of the queue's by more than its znode's `heartbeat` (the
# longest its HCM leaves unchanged statistics unwritten; 0 if absent) plus this many report intervals
# (its znode's `stats_interval`; our own exchange.stats_interval if absent).
STALE_STATS = 3.0

Live = dict[str, dict[str, Any]]  # exchange id → its live znode's data


class ExchangeChoice:
    def __init__(self, publisher_id: str, stats_interval: float) -> None:
        self.publisher_id = publisher_id
        self.stats_interval = stats_interval
        self._avoid: dict[tuple[str, str], float] = {}  # (xid, incarnation) → avoided until
        self.relocated_to: str | None = None  # where the leader asked us to publish
        self._relocation_seen = 0.0

    def avoid(self, xid: str, incarnation: str) -> None:
        self._avoid[(xid, incarnation)] = time.monotonic() + AVOID_SECONDS

    def relocation(self, relocations: dict[str, Any]) -> str | None:
        """The exchange the leader's relocations (publisher id → {to, from, at}) newly name for us, if any."""
        entry = relocations.get(self.publisher_id) if isinstance(relocations, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("at"), (int, float)) \
                or entry["at"] <= self._relocation_seen or not isinstance(entry.get("to"), str):
            return None
        self._relocation_seen = entry["at"]
        self.relocated_to = entry["to"]
        return self.relocated_to

    def connected(self, xid: str) -> None:
        if xid == self.relocated_to:
            self.relocated_to = None  # done; from now on it is just our exchange

    def choose(self, live: Live, prefer: str | None) -> tuple[str, dict[str, Any]] | None:
        if not live:
            return None
        if prefer in live:
            return prefer, live[prefer]
        relocated = self.relocated_to
        if relocated is not None and relocated in live:
            return relocated, live[relocated]
        now = time.monotonic()
        self._avoid = {key: until for key, until in self._avoid.items() if until > now}
        reports = {xid: ExchangeStats.from_dict(data.get("stats")) for xid, data in live.items()}
        newest = max((report.at or 0.0 for report in reports.values()), default=0.0)

        def rank(item: tuple[str, dict[str, Any]]) -> tuple[float, int, float, float]:
            xid, data = item
            stats = reports[xid]
            avoided_until = self._avoid.get((xid, str(data.get("incarnation", ""))), 0.0)
            # A frozen exchange stops reporting: its HCM says so, its statistics age, and it goes last;
            # so does one that cannot store what it takes (its journal's disk is full).
            stale = int(is_stale(data, stats, newest, self.stats_interval) or stats.storage_full)
            return (avoided_until, stale, stats.publishers, random.random())

        return min(live.items(), key=rank)


def is_stale(data: dict[str, Any], stats: ExchangeStats, newest: float, interval: float) -> bool:
    """Is this live exchange (its znode's `data`, the `stats` in it) frozen or stuck? Its HCM says it
    went `silent`; or its statistics' `at` lies more than STALE_STATS report intervals (the znode's
    `stats_interval`, else `interval`) plus the znode's `heartbeat` behind `newest`, the newest `at`
    of the queue's exchanges (their HCMs' clocks, not ours)."""
    if data.get("silent") is True:
        return True
    heartbeat = _seconds(data.get("heartbeat"), 0.0)  # absent: an HCM that rewrote them at every report
    return newest - (stats.at or 0.0) > STALE_STATS * _seconds(data.get("stats_interval"), interval) + heartbeat


def _seconds(value: Any, default: float) -> float:
    """A znode's duration, or `default` when it is not a number of seconds (absent: an older HCM)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return default
    return float(value)
