"""The leader's scaling decisions, on summaries (no cluster needed)."""

from __future__ import annotations

import pytest

from gcm.autoscaler import QueueState, summarise_queue
from gcm.rules import DEFAULT_RULES, check_rules, firing_rules, is_low
from roq.errors import UserError
from roq.records import QueueStats
from roq.state import ExchangeInfo, HostInfo


def summary(rates: list[float], publishers: int = 1) -> QueueStats:
    exchanges = [ExchangeInfo("q", f"x{i + 1}", f"h{i + 1}") for i in range(len(rates))]
    live = {f"x{i + 1}": {"stats": {"msgs_in_per_s": r, "publishers": publishers,
                                    "top_publishers": [["p", r]]}} for i, r in enumerate(rates)}
    return summarise_queue("q", exchanges, live, None, QueueState())


def test_rules_are_validated_and_merged_with_defaults() -> None:
    rules = check_rules({}, {"max_rate": 5000, "max_exchanges": 4})
    assert rules == dict(DEFAULT_RULES, max_rate=5000.0, max_exchanges=4)
    for bad, message in (({"max_rate": -1}, "from 0"), ({"speed": 1}, "unknown rule"),
                         ({"max_exchanges": 2.5}, "integer"), ({"max_cpu": "high"}, "number"),
                         ({"min_exchanges": 5, "max_exchanges": 3}, "--min must be <= --max"),
                         ({"max_rate": True}, "number")):
        with pytest.raises(UserError, match=message):
            check_rules({}, bad)
    with pytest.raises(UserError, match="map"):
        check_rules({}, ["max_rate", 1])


def test_a_rate_rule_fires_on_the_busy_exchange_only() -> None:
    rules = check_rules({}, {"max_rate": 1000})
    assert firing_rules(summary([500, 1500]), rules, {}) == ["x2 receives 1,500 msg/s > 1,000"]
    assert firing_rules(summary([500, 900]), rules, {}) == []


def test_host_rules_read_the_hcm_figures() -> None:
    rules = check_rules({}, {"max_cpu": 80, "max_memory": 90})
    hosts = {"h1": HostInfo("h1", "", 4, stats={"cpu_percent": 95, "memory_percent": 50})}
    assert firing_rules(summary([10]), rules, hosts) == ["host h1 CPU 95% > 80%"]


def test_scale_in_needs_room_below_the_limit_with_one_exchange_fewer() -> None:
    rules = check_rules({}, {"max_rate": 1000, "scale_in_below": 0.5})
    assert is_low(summary([200, 200]), rules, 2)  # 400 < 0.5 × 1000 × 1
    assert not is_low(summary([300, 300]), rules, 2)  # 600 would load one exchange to 60%
    # The thresholds leave a band where neither rule acts: no flapping around one value.
    steady = summary([450, 450, 450])
    assert not firing_rules(steady, rules, {}) and not is_low(steady, rules, 3)
    assert not is_low(summary([0, 0]), check_rules({}, {"max_cpu": 50}), 2)  # no rate rule: never


def test_summary_adds_up_the_exchanges() -> None:
    s = summary([100, 250], publishers=2)
    assert s.msgs_in_per_s == 350 and s.publishers == 4 and s.running == s.exchanges == 2


def test_rules_first_set_without_min_keep_the_queue_size() -> None:
    assert check_rules({}, {"max_rate": 50_000, "max_exchanges": 6}, size=2)["min_exchanges"] == 2
    assert check_rules({}, {"max_rate": 50_000, "min_exchanges": 1}, size=2)["min_exchanges"] == 1  # asked for
    assert check_rules({}, {"max_exchanges": 3}, size=5)["min_exchanges"] == 3  # never above --max
    stored = check_rules({}, {"max_rate": 100}, size=4)
    assert check_rules(stored, {"max_rate": 200}, size=1)["min_exchanges"] == 4  # later changes keep the floor
    with pytest.raises(UserError, match=r"--max-rate \(rule max_rate\) must be from 0"):
        check_rules({}, {"max_rate": -1})
