"""Prometheus `/metrics` for the daemons: gauges built from a snapshot at each scrape."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from roq.records import LOAD_FIELDS, ExchangeStats, ExchangeSummary, HostStats, QueueStats

log = logging.getLogger(__name__)

# One sample: (metric name, help text, labels, value).
Sample = tuple[str, str, dict[str, str], float]


class SnapshotCollector(Collector):
    """Asks `source` for samples at every scrape, so nothing is kept twice."""

    def __init__(self, source: Callable[[], Iterable[Sample]]) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        try:
            samples = list(self.source())
        except Exception as exc:  # a scrape must never take the daemon down
            log.warning("metrics snapshot failed: %r", exc)
            samples = []
        for name, help_text, labels, value in samples:
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(name, help_text, labels=sorted(labels))
            family.add_metric([labels[k] for k in sorted(labels)], float(value))
        yield from families.values()


def serve_metrics(port: int, bind: str, advertise: str, source: Callable[[], Iterable[Sample]]) -> str | None:
    """Start the endpoint (port 0 = a free one, -1 = off); returns its URL."""
    if port < 0:
        return None
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(source))
    server, _ = start_http_server(port, addr=bind, registry=registry)
    url = f"http://{advertise}:{server.server_port}/metrics"
    log.info("Prometheus metrics on %s", url)
    return url


def exchange_samples(queue: str, exchange: str, host: str,
                     stats: ExchangeStats | ExchangeSummary | Mapping[str, Any]) -> Iterator[Sample]:
    """The figures one exchange reports, as gauges labelled by queue, exchange and host.

    `stats`: its report (the HCM), or its row in the queue aggregate (the leader: the gauges that
    the row has). A map is the wire form of either, read key by key."""
    labels = {"queue": queue, "exchange": exchange, "host": host}
    for key, help_text in EXCHANGE_GAUGES.items():
        value = stats.get(key) if isinstance(stats, Mapping) else getattr(stats, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"roq_exchange_{key}", help_text, labels, value


def queue_samples(queue: QueueStats) -> Iterator[Sample]:
    """The leader's per-queue aggregate, as gauges labelled by queue."""
    labels = {"queue": queue.name}
    for key in QUEUE_GAUGES:
        yield f"roq_queue_{key}", f"queue {key.replace('_', ' ')}, summed over its exchanges", labels, \
            getattr(queue, key)


def host_samples(host: str, stats: HostStats, keys: Iterable[str]) -> Iterator[Sample]:
    """A host's figures (`keys`: HCM_HOST_GAUGES or LEADER_HOST_GAUGES), as gauges labelled by host."""
    for key in keys:
        yield f"roq_host_{key}", f"host {key.replace('_', ' ')}", {"host": host}, getattr(stats, key)


QUEUE_GAUGES = ("exchanges", "running", *LOAD_FIELDS)  # QueueStats fields
HCM_HOST_GAUGES = ("cpu_percent", "memory_percent", "memory_used_bytes", "load1", "exchanges")  # HostStats fields
LEADER_HOST_GAUGES = ("cpu_percent", "memory_percent", "capacity", "exchanges")  # HostSummary fields
EXCHANGE_GAUGES = {  # ExchangeStats fields
    "msgs_in_per_s": "messages received from publishers per second",
    "msgs_out_per_s": "messages sent to subscribers per second",
    "bytes_in_per_s": "payload bytes received per second",
    "bytes_out_per_s": "payload bytes sent per second",
    "publishers": "publishers active in the last 10 s",
    "subscriptions": "subscriptions of subscribers",
    "drops": "messages refused (too large, bad topic, malformed), total",
    "duplicates": "replayed messages dropped as already forwarded, total",
    "retained_bytes": "bytes in the retention buffer",
    "retained_frames": "frames in the retention buffer",
    "fetches": "retention fetches answered, total",
}
