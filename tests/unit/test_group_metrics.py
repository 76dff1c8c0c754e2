"""Consumer groups in an exchange's Prometheus series (docs/monitoring.md)."""

from __future__ import annotations

from roq.metrics import GROUP_COUNTERS, GROUP_GAUGES, Families, exchange_metrics
from roq.records import ExchangeStats


def test_each_group_gets_its_series_and_bad_figures_read_as_zero() -> None:
    figures = {"members": 2, "ready": 5, "delayed": 0, "in_flight": 3, "acked": 10, "delivered": 13,
               "redelivered": 1, "dead_lettered": 0, "held_bytes": 800, "oldest_ready_s": 0.5}
    # As the HCM reads a report: every group's figures typed, whatever the exchange wrote.
    stats = ExchangeStats.from_dict({"groups": {"workers": figures, "odd": {"ready": "many", "acked": True},
                                                "junk": 3}})
    out = Families()
    exchange_metrics(out, "q", "x1", "h1", stats, 0, False)
    samples = {(s.name, s.labels.get("group")): s.value for family in out for s in family.samples}
    for key, (metric, _) in {**GROUP_GAUGES, **GROUP_COUNTERS}.items():
        assert samples[(metric, "workers")] == figures[key]
        assert samples[(metric, "odd")] == 0  # a figure of the wrong type is never exported as it came
    assert not any(group == "junk" for _, group in samples)  # not a map: no group at all
