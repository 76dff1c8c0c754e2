"""Consumer lag on the exchange: frames, messages and age behind a reported position."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from exchange.consumers import MAX_CONSUMERS, REPORTED, ConsumerProgress
from exchange.retention import TOMBSTONES, Retention
from roq import protocol
from roq.errors import ProtocolError
from roq.records import ClusterStats, ConsumerLag, ExchangeStats, ExchangeSummary, QueueStats
from roq.tools.views import stats_view
from tests.profiles import examples


@settings(max_examples=examples(200), deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=0, max_size=60), keep=st.integers(1, 60),
       pos=st.integers(0, 70))
def test_behind_counts_the_frames_and_messages_after_a_position(sizes, keep, pos):
    retention = Retention(seconds=1e9, max_bytes=10 * keep)  # each frame 10 bytes: `keep` retained
    for i, size in enumerate(sizes):
        retention.add(b"t", b"x" * 9, size, now=float(i))
    frames, messages, seconds = retention.behind(pos, now=100.0)
    lacking = sizes[pos:]  # frames at positions pos+1.. (position n is sizes[n-1])
    assert frames == len(lacking) and messages == sum(lacking)
    assert seconds == (100.0 - pos if lacking else 0.0)  # frame n was stored at n - 1, evicted or not
    small = Retention(seconds=1e9, max_bytes=10 * keep, tombstones=2)  # beyond the tombstones: at least
    for i, size in enumerate(sizes):
        small.add(b"t", b"x" * 9, size, now=float(i))
    frames, at_least, _ = small.behind(pos, now=100.0)
    assert frames == len(lacking) and at_least <= sum(lacking)
    assert small.behind(small.next_pos - 1) == (0, 0, 0.0)


def test_the_table_is_bounded_and_ignores_other_incarnations():
    retention = Retention(seconds=60, max_bytes=1 << 20)
    for _ in range(10):
        retention.add(b"t", b"body", 3, now=0.0)
    table = ConsumerProgress("x1.aa")
    table.report(protocol.Progress("old", "x1.zz", 0), now=0.0)  # an ended incarnation: not ours
    for i in range(MAX_CONSUMERS + 5):
        table.report(protocol.Progress(f"s{i}", "x1.aa", i % 11), now=1.0)
    assert len(table) == MAX_CONSUMERS
    lags = table.lags(retention, now=2.0)
    assert len(lags) == REPORTED and lags[0].messages == 30 and lags[0].frames == 10
    assert all(a.messages >= b.messages for a, b in zip(lags, lags[1:]))
    assert table.lags(retention, now=1e6) == ()  # unreported for a day: forgotten


def test_progress_reports_are_checked_field_by_field():
    report = protocol.decode_replay_request(protocol.encode_progress("audit", "x1.aa", 7))
    assert report == protocol.Progress("audit", "x1.aa", 7)
    for bad in (["progress", 3, "", "x1.aa", 7], ["progress", 3, "a" * 64, "x1.aa", 7],
                ["progress", 3, "audit", "", 7], ["progress", 3, "audit", "x1.aa", -1],
                ["progress", 3, "audit", "x1.aa"], ["progress", 3, 5, "x1.aa", 7]):
        with pytest.raises(ProtocolError, match="progress must be"):
            protocol.decode_replay_request(protocol.pack(bad))


def test_a_hostile_name_is_refused_and_names_are_shown_as_text(tmp_path):
    with pytest.raises(ProtocolError, match="progress must be"):
        protocol.decode_replay_request(protocol.encode_progress("[/x]", "x1.aa", 0))
    lag = ConsumerLag(name="[/x]", frames=1, messages=1)  # from a writer of another version, say
    summary = ExchangeSummary.of("x1", "h", True, 0, ExchangeStats(consumers=(lag,)))
    snapshot = ClusterStats(queues={"q": QueueStats.of("q", 1, (summary,), None, ())}).to_dict()
    with open(tmp_path / "out", "w") as sink:
        Console(file=sink, width=200).print(stats_view(snapshot))
    assert "[/x]" in (tmp_path / "out").read_text()


def test_lag_costs_the_same_however_far_behind_the_consumers_are():
    """It is computed for every name at every statistics report, on the forwarding thread."""
    retention = Retention(3600, 2_000_000)
    for _ in range(200_000):  # most of them evicted, into tombstones
        retention.add(b"t", b"x" * 100, 10, now=0.0)
    table = ConsumerProgress("x1.aa")
    for i in range(MAX_CONSUMERS):
        table.report(protocol.Progress(f"gone-{i}", "x1.aa", i * 150), now=1.0)
    started = time.perf_counter()
    lags = table.lags(retention, now=2.0)
    assert time.perf_counter() - started < 0.05  # 1,000 names: constant time each, no walk of the tombstones
    # Behind everything: its messages counted as far back as the tombstones reach (at least).
    assert lags[0] == ConsumerLag("gone-0", 200_000, 10 * (len(retention) + TOMBSTONES), 2.0, 1.0)
