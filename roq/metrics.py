"""Prometheus `/metrics` of the daemons, built from their latest figures at each scrape.

Who exports what, so that a `sum()` over every target never counts anything twice
(docs/monitoring.md lists every metric):

* each HCM: its host (`roq_host_*`), and each exchange and replica it runs (`roq_exchange_*`,
  `roq_replica_*`, labelled queue, exchange and host); nobody else exports these;
* the leader GCM: the cluster and per-queue aggregates (`roq_cluster_*`, `roq_queue_*`), figures of
  its own that are not sums of any exchange counter; a backup exports none of them;
* every GCM: `roq_gcm_leader`; every daemon: prometheus_client's `process_*` and `python_info`.

Counters are Prometheus counters (`_total`), cumulative since the process that counts started: an
exchange's restart shows as a reset of its series (its labels name the exchange id, never the
incarnation), which `rate()` handles. No per-second rate is exported: `rate()` is Prometheus's job
(`roq stats` shows the exchanges' own). Ratios are 0-1 (`_ratio`), times in seconds.

A snapshot that fails is logged and the scrape answers with the process metrics only: a scrape never
takes a daemon down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from roq.records import CONFIRM_BUCKETS, ClusterStats, ExchangeStats, GroupStats, HostStats

log = logging.getLogger(__name__)

Labels = dict[str, str]
F = TypeVar("F", bound=Metric)


class Families:
    """The metric families of one scrape, one per name (its label names fixed by its first sample)."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())

    def gauge(self, name: str, help_text: str, labels: Labels, value: float) -> None:
        family = self._family(name, lambda: GaugeMetricFamily(name, help_text, labels=sorted(labels)))
        family.add_metric([labels[k] for k in sorted(labels)], float(value))

    def counter(self, name: str, help_text: str, labels: Labels, value: float) -> None:
        """`name` ends in `_total` (the exposition's name); the family takes it without."""
        family = self._family(name, lambda: CounterMetricFamily(name, help_text, labels=sorted(labels)))
        family.add_metric([labels[k] for k in sorted(labels)], float(value))

    def histogram(self, name: str, help_text: str, labels: Labels, bounds: Iterable[float],
                  counts: Iterable[int], total_seconds: float) -> None:
        """`counts`: per bound, the observations within it and above the previous one, then the
        ones above the last bound (one more count than bounds)."""
        family = self._family(name, lambda: HistogramMetricFamily(name, help_text, labels=sorted(labels)))
        cumulative, buckets = 0, []
        for bound, count in zip((*bounds, float("inf")), counts):
            cumulative += count
            buckets.append((floatToGoString(bound), float(cumulative)))
        family.add_metric([labels[k] for k in sorted(labels)], buckets, total_seconds)

    def _family(self, name: str, make: Callable[[], F]) -> F:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = make()
        return family  # type: ignore[return-value]  # the same name is always made by the same method


class SnapshotCollector(Collector):
    """Asks `source` for the families at every scrape, so nothing is kept twice."""

    def __init__(self, source: Callable[[], Iterable[Metric]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self.source())
        except Exception as exc:  # a scrape must never take the daemon down
            log.warning("metrics snapshot failed: %r", exc)
            families = []
        yield from families


def serve_metrics(port: int, bind: str, advertise: str, source: Callable[[], Iterable[Metric]]) -> str | None:
    """Start the endpoint (port 0 = a free one, -1 = off), with this process's own metrics too;
    returns its URL."""
    if port < 0:
        return None
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(SnapshotCollector(source))
    server, _ = start_http_server(port, addr=bind, registry=registry)
    url = f"http://{advertise}:{server.server_port}/metrics"
    log.info("Prometheus metrics on %s", url)
    return url


# ---------------------------------------------------------------- an HCM's

# Metric name → (ExchangeStats field, help). Counters count since the exchange process started.
EXCHANGE_COUNTERS = {
    "roq_exchange_messages_in_total": ("msgs_in", "messages received from publishers, replays of messages "
                                                  "already forwarded excluded"),
    "roq_exchange_messages_out_total": ("msgs_out", "messages forwarded to subscribers (once each, whatever "
                                                    "the number of subscribers)"),
    "roq_exchange_bytes_in_total": ("bytes_in", "payload bytes accepted from publishers"),
    "roq_exchange_bytes_out_total": ("bytes_out", "payload bytes forwarded to subscribers (once each)"),
    "roq_exchange_frames_out_total": ("frames_out", "delivery frames forwarded (runs of messages, one topic or many)"),
    "roq_exchange_drops_total": ("drops", "messages refused (too large, bad topic) plus frames refused as "
                                          "malformed"),
    "roq_exchange_duplicates_total": ("duplicates", "replayed messages dropped as already forwarded"),
    "roq_exchange_fetches_total": ("fetches", "retention fetches answered"),
    "roq_exchange_fetched_frames_total": ("fetched_frames", "frames sent in answer to retention fetches"),
    "roq_exchange_busy_fetches_total": ("busy", "retention fetches refused: too many reply bytes unsent"),
    "roq_exchange_refused_batches_total": ("refused_batches", "batches answered with resend (out of order, "
                                                              "no hello)"),
    "roq_exchange_refused_hellos_total": ("refused_hellos", "publisher hellos refused (token, limits)"),
    "roq_exchange_refused_connections_total": ("refused_connections", "connections refused (CURVE, limits)"),
    "roq_exchange_refused_permission_total": ("refused_permission", "connections refused for a right the key "
                                                                    "lacks on the queue"),
    "roq_exchange_evicted_frames_total": ("evicted_frames", "frames evicted from the retention buffer"),
    "roq_exchange_expired_publishers_total": ("expired_publishers", "publisher sessions forgotten after "
                                                                    "exchange.publisher_ttl"),
    "roq_exchange_internal_errors_total": ("internal_errors", "frames whose handling failed unexpectedly "
                                                              "(a bug; the exchange went on)"),
    "roq_exchange_journal_errors_total": ("journal_errors", "failed attempts to write or sync the journal "
                                                            "(a full or failing disk)"),
}
EXCHANGE_GAUGES = {
    "roq_exchange_publishers": ("publishers", "publishers active in the last 10 s"),
    "roq_exchange_known_publishers": ("known_publishers", "publisher sessions the exchange holds"),
    "roq_exchange_subscribers": ("subscribers", "RoQ subscribers connected"),
    "roq_exchange_subscriptions": ("subscriptions", "topic subscriptions of the subscribers"),
    "roq_exchange_retained_bytes": ("retained_bytes", "bytes (topic and frame) in the retention buffer"),
    "roq_exchange_retained_frames": ("retained_frames", "frames in the retention buffer"),
    "roq_exchange_held_acks": ("held_acks", "acks waiting for the replica or the fsync'ed journal"),
    "roq_exchange_resident_memory_bytes": ("rss_bytes", "resident memory of the exchange process"),
    "roq_exchange_storage_full": ("storage_full", "1 while the fsync'ed journal's disk refuses writes (acks "
                                                  "and publishers held until it has room or the leader moves it)"),
}
STORE_GAUGES = {  # only for an exchange with a segment store (a queue with a disk storage policy)
    "roq_exchange_store_bytes": ("store_bytes", "bytes of segment and index files of its stores on its host "
                                                "(earlier incarnations' included)"),
    "roq_exchange_store_segments": ("store_segments", "segment files of its stores on its host"),
    "roq_exchange_store_oldest_position": ("store_oldest_pos", "this incarnation's oldest position on disk "
                                                               "(0: none yet)"),
}
CONFIRM_HISTOGRAM = "roq_exchange_confirm_seconds"
REPLICA_COUNTERS = {
    "roq_replica_fetches_total": ("fetches", "retention fetches answered from the copies"),
    "roq_replica_copied_frames_total": ("copied_frames", "frames its primary copied into it"),
    "roq_replica_refused_copies_total": ("refused_copies", "frames refused on repl: no or a wrong copy secret"),
    "roq_replica_refused_seals_total": ("refused_seals", "position requests refused: the incarnation still runs"),
}
REPLICA_GAUGES = {
    "roq_replica_retained_bytes": ("retained_bytes", "bytes (topic and frame) of the copies it holds"),
    "roq_replica_retained_frames": ("retained_frames", "frames of the copies it holds"),
    "roq_replica_resident_memory_bytes": ("rss_bytes", "resident memory of the replica process"),
}


def exchange_metrics(out: Families, queue: str, exchange: str, host: str, stats: ExchangeStats | None,
                     restarts: int, failed: bool) -> None:
    """One exchange an HCM runs: its latest report (None before the first) and its supervision."""
    labels = {"queue": queue, "exchange": exchange, "host": host}
    out.counter("roq_exchange_restarts_total", "restarts of the exchange process by its HCM", labels, restarts)
    out.gauge("roq_exchange_failed", "1 while the exchange crashed too often and is left alone", labels, failed)
    if stats is None:
        return
    _fields(out, EXCHANGE_COUNTERS, EXCHANGE_GAUGES, labels, stats)
    if stats.store_state:
        _store_metrics(out, labels, stats)
    for lag in stats.consumers:  # a durable subscriber's lag on this exchange: sum by subscriber for the queue's
        named = {**labels, "subscriber": lag.name}
        out.gauge("roq_exchange_consumer_lag_messages", "messages of the exchange's stream after what the durable "
                  "subscriber has taken (whole frames)", named, lag.messages)
        out.gauge("roq_exchange_consumer_lag_frames", "frames of the exchange's stream after what the durable "
                  "subscriber has taken", named, lag.frames)
        out.gauge("roq_exchange_consumer_lag_seconds", "how long the oldest message the durable subscriber has "
                  "not taken has waited", named, lag.seconds)
    for name, figures in stats.groups.items():  # consumer groups (docs/work-queues.md)
        _group_metrics(out, {**labels, "group": name}, figures)
    if len(stats.confirm_buckets) == len(CONFIRM_BUCKETS) + 1:  # else a report of another version
        out.histogram(CONFIRM_HISTOGRAM, "seconds from the exchange reading a batch to sending its ack "
                      "(with a replica or an fsync journal: until what it holds is durable)", labels,
                      CONFIRM_BUCKETS, stats.confirm_buckets, stats.confirm_seconds_sum)


def _store_metrics(out: Families, labels: Labels, stats: ExchangeStats) -> None:
    _fields(out, {}, STORE_GAUGES, labels, stats)
    out.gauge("roq_exchange_store_full", "1 while its segment store refuses writes, broke, or has too much "
              "waiting to be written (publishers held: storage_full)", labels, stats.store_state != "ok")
    if stats.store_oldest_time is not None:
        out.gauge("roq_exchange_store_oldest_timestamp_seconds", "Unix time the oldest frame on disk was "
                  "stored: time() minus it is how far back a replay from a time can go", labels,
                  stats.store_oldest_time)


GROUP_GAUGES = {
    "members": ("roq_group_members", "members of the consumer group connected to this exchange"),
    "ready": ("roq_group_ready_messages", "messages ready for the group's members"),
    "delayed": ("roq_group_delayed_messages", "messages waiting for their not-before time"),
    "in_flight": ("roq_group_in_flight_messages", "messages sent to members and not yet acked"),
    "oldest_ready_s": ("roq_group_lag_seconds", "how long the oldest ready message has waited"),
    "held_bytes": ("roq_group_held_bytes", "payload bytes the group holds"),
}
GROUP_COUNTERS = {
    "acked": ("roq_group_acked_total", "messages acked by the group's members"),
    "delivered": ("roq_group_delivered_total", "messages sent to members, redeliveries included"),
    "redelivered": ("roq_group_redelivered_total", "messages sent again (ack timeout, nack, member lost)"),
    "dead_lettered": ("roq_group_dead_lettered_total", "messages given up on, sent to the dead-letter topic"),
}


def _group_metrics(out: Families, labels: Labels, figures: GroupStats) -> None:
    for key, (metric, help_text) in GROUP_GAUGES.items():
        out.gauge(metric, help_text, labels, getattr(figures, key))
    for key, (metric, help_text) in GROUP_COUNTERS.items():
        out.counter(metric, help_text, labels, getattr(figures, key))


def replica_metrics(out: Families, queue: str, exchange: str, host: str, stats: ExchangeStats | None,
                    restarts: int, failed: bool) -> None:
    """The replica of `exchange` that an HCM runs (queues with replicas 2)."""
    labels = {"queue": queue, "exchange": exchange, "host": host}
    out.counter("roq_replica_restarts_total", "restarts of the replica process by its HCM", labels, restarts)
    out.gauge("roq_replica_failed", "1 while the replica crashed too often and is left alone", labels, failed)
    if stats is not None:
        _fields(out, REPLICA_COUNTERS, REPLICA_GAUGES, labels, stats)


def host_metrics(out: Families, host: str, figures: HostStats, capacity: int) -> None:
    labels = {"host": host}
    out.gauge("roq_host_cpu_ratio", "CPU use of the host (0-1) over the HCM's last measure interval", labels,
              figures.cpu_percent / 100)
    out.gauge("roq_host_memory_ratio", "memory of the host in use (0-1)", labels, figures.memory_percent / 100)
    out.gauge("roq_host_memory_used_bytes", "memory of the host in use", labels, figures.memory_used_bytes)
    out.gauge("roq_host_load1", "load average of the host over 1 minute", labels, figures.load1)
    out.gauge("roq_host_cpus", "CPUs of the host", labels, figures.cpus)
    out.gauge("roq_host_exchanges", "exchange and replica processes the HCM supervises", labels,
              figures.exchanges)
    out.gauge("roq_host_capacity", "exchanges and replicas the host takes (hcm.capacity)", labels, capacity)
    out.gauge("roq_host_data_free_bytes", "free bytes of the file system of hcm.data_dir (journals)", labels,
              figures.data_free_bytes)
    out.gauge("roq_host_data_total_bytes", "size of the file system of hcm.data_dir (0: unknown)", labels,
              figures.data_total_bytes)


def _fields(out: Families, counters: dict[str, tuple[str, str]], gauges: dict[str, tuple[str, str]],
            labels: Labels, stats: ExchangeStats) -> None:
    for name, (key, help_text) in counters.items():
        out.counter(name, help_text, labels, getattr(stats, key))
    for name, (key, help_text) in gauges.items():
        out.gauge(name, help_text, labels, getattr(stats, key))


# ---------------------------------------------------------------- the leader's

def leader_metrics(out: Families, stats: ClusterStats) -> None:
    """The leader's aggregates: what the cluster should run and runs, per queue and in all."""
    out.gauge("roq_cluster_hosts", "hosts registered (HCMs)", {}, len(stats.hosts))
    out.gauge("roq_cluster_queues", "queues", {}, len(stats.queues))
    out.gauge("roq_cluster_unplaced_exchanges", "exchanges not placed on any host", {},
              sum(1 for q in stats.queues.values() for x in q.by_exchange if x.host is None))
    for name, q in stats.queues.items():
        labels = {"queue": name}
        out.gauge("roq_queue_exchanges", "exchanges the queue has (its scale)", labels, q.exchanges)
        out.gauge("roq_queue_running", "exchanges of the queue running", labels, q.running)
        out.gauge("roq_queue_replicas", "copies of each message the queue keeps: 2 when each exchange has a "
                  "replica", labels, q.replicas)
        out.gauge("roq_queue_publishers", "publishers active in the last 10 s, over the queue's exchanges", labels,
                  q.publishers)
        out.gauge("roq_queue_subscriptions", "subscriptions, over the queue's exchanges", labels, q.subscriptions)
