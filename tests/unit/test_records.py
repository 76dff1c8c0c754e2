"""The statistics records: their wire maps, and decoding whatever another version wrote."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import msgpack
import pytest

from exchange.stats import Counters
from exchange.stats import ExchangeStats as Accumulator
from gcm.autoscaler import QueueState, summarise_queue
from gcm.stats_stream import stats_records
from roq.metrics import (
    CONFIRM_HISTOGRAM,
    EXCHANGE_COUNTERS,
    EXCHANGE_GAUGES,
    REPLICA_COUNTERS,
    REPLICA_GAUGES,
    Families,
    exchange_metrics,
    leader_metrics,
)
from roq.records import (
    ClusterStats,
    ExchangeSample,
    ExchangeStats,
    ExchangeSummary,
    GroupStats,
    HostSample,
    HostStats,
    HostSummary,
    QueueStats,
    Record,
    group_totals,
)
from roq.state import ExchangeInfo

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"

# Maps as the code before the records wrote them (the wire shape old readers know).
OLD_EXCHANGE_REPORT = {
    "msgs_in": 500, "bytes_in": 2500, "msgs_out": 500, "bytes_out": 2500, "frames_out": 10, "duplicates": 3,
    "rejected": 1, "malformed": 2, "fetches": 4, "fetched_frames": 40, "busy": 1, "refused_batches": 2,
    "refused_hellos": 1, "internal_errors": 0, "msgs_in_per_s": 250.5, "bytes_in_per_s": 1250.0,
    "msgs_out_per_s": 250.5, "bytes_out_per_s": 1250.0, "drops": 3, "publishers": 2, "subscriptions": 3,
    "subscribers": 1, "top_publishers": [["p1", 200.0], ["p2", 50.5]], "latency_p50_ms": 0.25,
    "latency_p99_ms": 1.5, "refused_connections": 6, "refused_over_limit": 1, "retained_frames": 10,
    "retained_bytes": 3000, "evicted_frames": 0, "known_publishers": 2, "expired_publishers": 1,
    "tracked_prefixes": 1, "replay_held_bytes": 0, "rss_bytes": 40_000_000, "at": 1700000000.125,
}
OLD_HOST_FIGURES = {"cpu_percent": 12.5, "memory_percent": 40.0, "memory_used_bytes": 1 << 30, "load1": 0.5,
                    "cpus": 8, "at": 1700000000.5, "exchanges": 2}
OLD_QUEUE_KEYS = {"msgs_in_per_s", "msgs_out_per_s", "bytes_in_per_s", "bytes_out_per_s", "publishers",
                  "subscriptions", "drops", "retained_bytes", "name", "exchanges", "running", "by_exchange",
                  "rules", "events"}
OLD_ROW_KEYS = {"id", "host", "running", "restarts", "top_publishers", "latency_p50_ms", "latency_p99_ms",
                "msgs_in_per_s", "msgs_out_per_s", "bytes_in_per_s", "bytes_out_per_s", "publishers",
                "subscriptions", "drops", "retained_bytes"}


def documented_keys() -> set[str]:
    """The keys of the exchange statistics table in docs/protocol.md."""
    table = PROTOCOL.read_text().split("| key | meaning |", 1)[1].split("\n\n", 1)[0]
    return {key for line in table.splitlines()[2:] for key in re.findall(r"`(\w+)`", line.split("|")[1])}


def queue_summary() -> QueueStats:
    exchanges = [ExchangeInfo("q", "x1", "h1"), ExchangeInfo("q", "x2", "h2"), ExchangeInfo("q", "x3", None)]
    live = {"x1": {"restarts": 2, "stats": OLD_EXCHANGE_REPORT},
            "x2": {"stats": {"msgs_in_per_s": 100, "publishers": 1, "retained_bytes": 7}}}
    state = QueueState(events=[{"at": 1.0, "from": 1, "to": 2, "reason": "load"}])
    return summarise_queue("q", exchanges, live, {"max_rate": 1000.0}, state)


def cluster() -> ClusterStats:
    return ClusterStats(queues={"q": queue_summary()}, time=1700000000.0,
                        hosts={"h1": HostSummary.of(HostStats.from_dict(OLD_HOST_FIGURES), 4)})


@pytest.mark.parametrize("record", [ExchangeStats.from_dict(OLD_EXCHANGE_REPORT), HostStats.from_dict(OLD_HOST_FIGURES),
                                    queue_summary(), cluster(), ExchangeSample(ts=1.0, queue="q", exchange="x1",
                                                                               host="h1", msgs_in_per_s=5.0),
                                    HostSample(ts=1.0, host="h1", cpu_percent=3.0), ExchangeStats(), ClusterStats()],
                         ids=lambda record: type(record).__name__)
def test_records_survive_json_and_msgpack(record: Record) -> None:
    for dumps, loads in ((json.dumps, json.loads), (msgpack.packb, msgpack.unpackb)):
        assert type(record).from_dict(loads(dumps(record.to_dict()))) == record


def test_the_wire_maps_keep_the_keys_old_readers_know() -> None:
    report = ExchangeStats.from_dict(OLD_EXCHANGE_REPORT).to_dict()
    assert report.items() >= OLD_EXCHANGE_REPORT.items()
    # Each key added since the old readers, with what it serves.
    assert set(report) - set(OLD_EXCHANGE_REPORT) == {"held_acks", "replicated_to", "next_pos",  # replication
                                                      "confirm_buckets", "confirm_seconds_sum",  # confirm latency
                                                      "consumers",  # consumer lag
                                                      "groups",  # consumer groups
                                                      # a replica's copies and refusals, a full disk
                                                      "copies", "copied_frames", "refused_copies", "refused_seals",
                                                      "storage_full", "storage_error", "journal_errors",
                                                      "journal_pending_bytes",
                                                      "refused_permission", "permissions_version",  # permissions
                                                      # the segment store (its oldest time only when it holds one)
                                                      "store_state", "store_bytes", "store_segments",
                                                      "store_oldest_pos",
                                                      # disk copies and the state transfer to a new replica
                                                      "transfer_end", "transferred_to", "stored_bytes", "transferring",
                                                      "adopted",
                                                      # a start-up adoption of the groups (waiting, stalled)
                                                      "adopting_groups", "adoption_stalled_s",
                                                      "replica_error"}
    host = HostStats.from_dict(OLD_HOST_FIGURES).to_dict()
    assert host.items() >= OLD_HOST_FIGURES.items()
    assert set(host) - set(OLD_HOST_FIGURES) == {"data_free_bytes", "data_total_bytes"}  # a full disk
    summary = queue_summary().to_dict()
    assert set(summary) == OLD_QUEUE_KEYS | {"subscribers",  # consumer lag, added
                                             "replicas",  # the console lists each queue's
                                             "groups",  # consumer groups in the aggregate
                                             "store_bytes"}  # bytes on disk, summed
    assert all(set(row) == OLD_ROW_KEYS | {"consumers", "groups", "store_bytes", "store_state", "store_segments",
                                           "store_oldest_pos", "store_oldest_time"}  # the segment store
               for row in summary["by_exchange"])
    assert set(cluster().to_dict()["hosts"]["h1"]) == set(host) | {"capacity"}
    # Keys only some reports carry are left out while unknown; a row of the aggregate keeps them as null.
    assert not {"latency_p50_ms", "latency_p99_ms", "at", "store_oldest_time"} & set(ExchangeStats().to_dict())
    assert summary["by_exchange"][1]["latency_p99_ms"] is None and summary["rules"] == {"max_rate": 1000.0}


def test_the_exchange_statistics_are_the_documented_ones() -> None:
    assert {f.name for f in fields(ExchangeStats)} == documented_keys()
    assert {f.name for f in fields(Counters)} <= {f.name for f in fields(ExchangeStats)}


def test_the_exchange_snapshot_is_a_record() -> None:
    accumulator = Accumulator()
    accumulator.totals.msgs_in = accumulator.totals.rejected = 3
    accumulator.interval_by_publisher = {"p1": 1, "p2": 5}
    report = accumulator.snapshot()
    assert report.msgs_in == 3 and report.drops == 3 and [p for p, _ in report.top_publishers] == ["p2", "p1"]
    assert report.latency_p99_ms is None and "latency_p99_ms" not in report.to_dict()
    accumulator.note_latency(2_000_000)
    assert accumulator.snapshot().latency_p99_ms == 2.0


def test_the_queue_aggregate_sums_its_exchanges() -> None:
    q = queue_summary()
    assert (q.exchanges, q.running, q.msgs_in_per_s, q.publishers, q.retained_bytes) == (3, 2, 350.5, 3, 3007)
    x1, x2, x3 = q.by_exchange
    assert x1.top_publishers == (("p1", 200.0), ("p2", 50.5)) and x1.restarts == 2 and x1.latency_p50_ms == 0.25
    assert x3 == ExchangeSummary(id="x3") and q.events[0]["reason"] == "load"


@pytest.mark.parametrize("junk", [None, [], "stats", 5, 1.5, True, b"\x00", [("msgs_in", 1)]])
def test_anything_but_a_map_reads_as_the_defaults(junk: Any) -> None:
    for record in (ExchangeStats, HostStats, QueueStats, ClusterStats, HostSummary, ExchangeSample):
        assert record.from_dict(junk) == record()


def test_unknown_missing_and_mistyped_keys_take_the_defaults() -> None:
    stats = ExchangeStats.from_dict({
        "event": "stats", "from_the_future": {"x": 1}, 7: "not a name",  # unknown: ignored
        "msgs_in": "12", "msgs_in_per_s": True, "bytes_in_per_s": float("nan"), "msgs_out_per_s": math.inf,
        "publishers": 2.0, "drops": 1.5, "subscribers": None, "rss_bytes": [1],  # wrong type: default
        "top_publishers": [["a", 1], "junk", ["b"], [3, 4], ["c", "x"], ["d", 2.5, 9], ("e", 2.5)],
        "latency_p50_ms": "fast", "latency_p99_ms": 3, "at": None, "bytes_out_per_s": 7,
    })
    assert stats == ExchangeStats(publishers=2, top_publishers=(("a", 1.0), ("e", 2.5)), latency_p99_ms=3.0,
                                  bytes_out_per_s=7.0)
    assert isinstance(stats.bytes_out_per_s, float) and isinstance(stats.publishers, int)
    assert HostStats.from_dict({"cpu_percent": "95", "exchanges": -1, "cpus": 4.0}) == HostStats(exchanges=-1, cpus=4)


def test_nested_junk_is_dropped_where_it_lies() -> None:
    decoded = ClusterStats.from_dict({
        "queues": {"bad": "junk", 5: {}, "q": {"name": "q", "by_exchange": [1, {"id": "x1", "running": "yes"}, None],
                                               "rules": ["max_rate"], "events": [{"at": 1.0}, "junk"],
                                               "running": 1}},
        "hosts": [["h1", {}]], "time": "now"})
    assert decoded == ClusterStats(queues={"q": QueueStats(name="q", running=1, by_exchange=(ExchangeSummary(id="x1"),),
                                                           events=({"at": 1.0},))})
    assert ClusterStats.from_dict({"hosts": {"h1": {"capacity": "4", "cpu_percent": 5}}}).hosts == \
        {"h1": HostSummary(cpu_percent=5.0)}


def test_the_statistics_stream_and_its_spark_schema() -> None:
    from roq.spark.stats_job import record_schema
    samples = list(stats_records(cluster()))
    assert [(s.kind, getattr(s, "exchange", None)) for s in samples] == [("exchange", "x1"), ("exchange", "x2"),
                                                                          ("host", None)]
    assert samples[0].to_dict()["latency_p99_ms"] == 1.5 and samples[1].to_dict()["latency_p99_ms"] is None
    assert record_schema() == (
        "kind string, ts double, queue string, exchange string, host string, msgs_in_per_s double, "
        "msgs_out_per_s double, bytes_in_per_s double, bytes_out_per_s double, publishers long, "
        "subscriptions long, drops long, latency_p50_ms double, latency_p99_ms double, "
        "cpu_percent double, memory_percent double, exchanges long")


def test_metrics_name_record_fields() -> None:
    report_fields = {f.name for f in fields(ExchangeStats)}
    for table in (EXCHANGE_COUNTERS, EXCHANGE_GAUGES, REPLICA_COUNTERS, REPLICA_GAUGES):
        assert {key for key, _ in table.values()} <= report_fields
    assert all(name.endswith("_total") for name in (*EXCHANGE_COUNTERS, *REPLICA_COUNTERS))
    assert not any(name.endswith(("_total", "_per_s")) for name in (*EXCHANGE_GAUGES, *REPLICA_GAUGES))


def test_an_exchange_report_as_prometheus_families() -> None:
    accumulator = Accumulator()
    accumulator.totals.msgs_in = 7
    for seconds in (0.00005, 0.0001, 0.003, 9.0):  # a bound counts as within its bucket (le)
        accumulator.note_confirm(seconds)
    out = Families()
    exchange_metrics(out, "q", "x1", "h1", ExchangeStats.from_dict(accumulator.snapshot().to_dict()), 2, False)
    families = {family.name: family for family in out}
    labels = {"queue": "q", "exchange": "x1", "host": "h1"}
    messages = families["roq_exchange_messages_in"]  # a counter family: its sample is named ..._total
    assert messages.type == "counter" and [(s.name, s.labels, s.value) for s in messages.samples] == \
        [("roq_exchange_messages_in_total", labels, 7.0)]
    assert families["roq_exchange_restarts"].samples[0].value == 2.0
    buckets = {s.labels["le"]: s.value for s in families[CONFIRM_HISTOGRAM].samples if s.name.endswith("_bucket")}
    assert (buckets["0.0001"], buckets["0.001"], buckets["0.005"], buckets["2.5"], buckets["+Inf"]) == (2, 2, 3, 3, 4)
    assert {s.name: s.value for s in families[CONFIRM_HISTOGRAM].samples}["roq_exchange_confirm_seconds_sum"] == \
        pytest.approx(9.00315)
    # A report of a version without the histogram gives none, and no rate is exported.
    old = Families()
    exchange_metrics(old, "q", "x1", "h1", ExchangeStats.from_dict(OLD_EXCHANGE_REPORT), 0, False)
    assert CONFIRM_HISTOGRAM not in {family.name for family in old}
    assert not any("per_s" in family.name for family in old)


def test_the_leader_exports_aggregates_of_its_own() -> None:
    out = Families()
    leader_metrics(out, cluster())
    names = {family.name for family in out}
    assert names and all(name.startswith(("roq_queue_", "roq_cluster_")) for name in names)
    values = {(s.name, tuple(s.labels.values())): s.value for family in out for s in family.samples}
    assert values[("roq_queue_exchanges", ("q",))] == 3 and values[("roq_queue_running", ("q",))] == 2
    assert values[("roq_cluster_unplaced_exchanges", ())] == 1 and values[("roq_cluster_hosts", ())] == 1


def test_a_queue_s_groups_sum_messages_over_its_running_exchanges_and_count_members_once() -> None:
    """Every member joins every running exchange of its queue: members are the most at one exchange
    (not the sum), messages are summed, the lag is the oldest; an exchange that does not run adds
    nothing, whatever its last report said."""
    x1 = {"workers": {"members": 2, "ready": 5, "in_flight": 3, "acked": 10, "held_bytes": 80, "oldest_ready_s": 1.5,
                      "topics": ["jobs"]}}
    x2 = {"workers": {"members": 1, "ready": 1, "delayed": 2, "acked": 4, "dead_lettered": 1, "oldest_ready_s": 4.0,
                      "topics": ["jobs"]}, "audit": {"members": 0, "ready": 7}}
    exchanges = [ExchangeInfo("q", xid, "h1") for xid in ("x1", "x2", "x3")]
    live = {"x1": {"stats": {"groups": x1}}, "x2": {"stats": {"groups": x2}}}
    summary = summarise_queue("q", exchanges, live, None, QueueState())
    assert list(summary.groups) == ["audit", "workers"]
    workers = summary.groups["workers"]
    assert (workers.members, workers.ready, workers.delayed, workers.in_flight, workers.acked,
            workers.dead_lettered, workers.held_bytes) == (2, 6, 2, 3, 14, 1, 80)
    assert workers.oldest_ready_s == 4.0 and workers.topics == ("jobs",) and workers.backlog == 11
    assert summary.groups["audit"] == GroupStats(ready=7)
    assert summary.by_exchange[0].groups["workers"].members == 2 and summary.by_exchange[2].groups == {}
    # A stopped exchange's last report stays in nothing the leader adds up.
    gone = ExchangeSummary.of("x1", "h1", False, 0, ExchangeStats.from_dict({"groups": x1}))
    assert gone.groups == {} and group_totals([gone.groups]) == {}
    wire = json.loads(json.dumps(summary.to_dict()))
    assert wire["groups"]["workers"]["in_flight"] == 3 and QueueStats.from_dict(wire) == summary
