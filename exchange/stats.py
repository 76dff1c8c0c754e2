"""Per-interval statistics of one exchange, reported to its HCM as a JSON line.

`Counters` are the running totals the forwarder increments; `snapshot()` turns them into the
typed report (`roq.records.ExchangeStats`), whose fields include every counter.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from dataclasses import asdict, dataclass, field

from roq import records

TOP_PUBLISHERS = 5
LATENCY_SAMPLES = 10_000


@dataclass
class Counters:
    msgs_in: int = 0
    bytes_in: int = 0
    msgs_out: int = 0  # forwarded into XPUB, once whatever the number of subscribers
    bytes_out: int = 0
    frames_out: int = 0
    duplicates: int = 0  # replayed messages already forwarded once
    rejected: int = 0  # single messages refused (too large, bad topic)
    malformed: int = 0  # whole frames refused
    fetches: int = 0  # retention fetches answered
    fetched_frames: int = 0
    busy: int = 0  # fetches refused: too many reply bytes not yet sent
    refused_batches: int = 0  # batches answered with resend (out of order, no hello on the connection)
    refused_hellos: int = 0  # hellos refused (token does not match the id, limits)
    internal_errors: int = 0  # frames whose handling failed unexpectedly (a bug; the exchange goes on)


@dataclass
class ExchangeStats:
    totals: Counters = field(default_factory=Counters)
    _last: Counters = field(default_factory=Counters)
    _last_time: float = field(default_factory=time.monotonic)
    publishers: dict[str, float] = field(default_factory=dict)  # id → last seen (monotonic)
    subscriptions: int = 0
    interval_by_publisher: dict[str, int] = field(default_factory=dict)  # messages since the last snapshot
    latencies_ns: list[int] = field(default_factory=list)  # batch send → arrival here, this interval
    subscribers: int = 0  # RoQ subscribers connected (their sync markers), set by the forwarder
    # Batch read → ack sent, since the start: a count per records.CONFIRM_BUCKETS bound, then above the last.
    confirm_counts: list[int] = field(default_factory=lambda: [0] * (len(records.CONFIRM_BUCKETS) + 1))
    confirm_seconds: float = 0.0
    _next_forget: float = 0.0

    def forget_idle(self, now: float, ttl: float) -> None:
        """Publishers unseen for `ttl` leave the activity table (checked once a second at most)."""
        if now < self._next_forget:
            return
        self._next_forget = now + 1.0
        horizon = now - ttl
        for pub in [p for p, seen in self.publishers.items() if seen < horizon]:
            del self.publishers[pub]

    def note_latency(self, nanoseconds: int) -> None:
        """One sample per batch; the first LATENCY_SAMPLES of an interval are kept."""
        if len(self.latencies_ns) < LATENCY_SAMPLES:
            self.latencies_ns.append(nanoseconds)

    def note_confirm(self, seconds: float) -> None:
        """One ack sent, `seconds` after its batch was read (bisect_left: a bound counts as within)."""
        self.confirm_counts[bisect_left(records.CONFIRM_BUCKETS, seconds)] += 1
        self.confirm_seconds += seconds

    def snapshot(self, active_window: float = 10.0) -> records.ExchangeStats:
        """Totals plus per-second rates since the previous snapshot (exchange/main.py adds the rest)."""
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-6)
        t, last = self.totals, self._last
        heaviest = sorted(self.interval_by_publisher.items(), key=lambda item: -item[1])[:TOP_PUBLISHERS]
        ordered = sorted(self.latencies_ns)
        latency_p50_ms = latency_p99_ms = None
        if ordered:  # publisher → exchange, on the wall clocks of both hosts
            latency_p50_ms = round(ordered[len(ordered) // 2] / 1e6, 3)
            latency_p99_ms = round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e6, 3)
        report = records.ExchangeStats(
            **asdict(t),
            msgs_in_per_s=round((t.msgs_in - last.msgs_in) / elapsed, 1),
            bytes_in_per_s=round((t.bytes_in - last.bytes_in) / elapsed, 1),
            msgs_out_per_s=round((t.msgs_out - last.msgs_out) / elapsed, 1),
            bytes_out_per_s=round((t.bytes_out - last.bytes_out) / elapsed, 1),
            drops=t.rejected + t.malformed,
            publishers=sum(1 for seen in self.publishers.values() if now - seen < active_window),
            subscriptions=self.subscriptions,
            subscribers=self.subscribers,
            # The heaviest publishers: the leader relocates one of them off an overloaded exchange.
            top_publishers=tuple((pub, round(count / elapsed, 1)) for pub, count in heaviest),
            latency_p50_ms=latency_p50_ms,
            latency_p99_ms=latency_p99_ms,
            confirm_buckets=tuple(self.confirm_counts),
            confirm_seconds_sum=round(self.confirm_seconds, 6),
        )
        self.interval_by_publisher = {}
        self.latencies_ns = []
        self._last = Counters(**asdict(t))
        self._last_time = now
        return report


def rss_bytes() -> int:
    """This process's resident memory (Linux), so a leak shows in the statistics."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
