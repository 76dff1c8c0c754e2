"""The statistics stream: while queue `gcm.stats_queue` exists, the leader publishes one JSON record
per exchange (topic "exchange") and per host (topic "host") every tick, from the figures the
autoscaler aggregated. The Spark statistics job (`roq pipeline stats`) consumes it. Best effort:
a backed-up stream drops records rather than hold the leader's tick.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from kazoo.client import KazooClient

from roq.config import Config
from roq.errors import RoqError
from roq.records import ClusterStats, ExchangeSample, HostSample

log = logging.getLogger(__name__)


class StatsStream:
    """The leader's publisher on queue `gcm.stats_queue`, opened while that queue exists."""

    def __init__(self, client: KazooClient, config: Config) -> None:
        self.client = client
        self.config = config
        self.queue = config.gcm.stats_queue
        self.publisher: Any = None
        self.dropped = 0  # records not queued because the publisher was backed up

    def publish(self, stats: ClusterStats) -> None:
        """Publish one tick's records without waiting (a backed-up record is counted in `dropped`);
        closes the publisher if the statistics queue is gone."""
        if not self.queue or self.queue not in stats.queues:
            self.close()
            return
        if self.publisher is None:
            from roq.client.publisher import Publisher
            self.publisher = Publisher(self.queue, self.config)
        for record in stats_records(stats):
            try:
                self.publisher.publish(record.kind, json.dumps(record.to_dict()).encode(), timeout=0)
            except RoqError:
                self.dropped += 1  # never hold the leader's tick for statistics

    def close(self) -> None:
        """Close the publisher, if open, within a second; unconfirmed records are given up."""
        if self.publisher is not None:
            publisher, self.publisher = self.publisher, None
            try:
                publisher.close(timeout=1)
            except RoqError as exc:  # unconfirmed statistics are not worth waiting for
                log.info("statistics stream closed with %s", exc)


def stats_records(stats: ClusterStats) -> Iterator[ExchangeSample | HostSample]:
    """The stream's records of one aggregate: one per running exchange, one per host, all at its time."""
    now = stats.time
    for name, q in stats.queues.items():
        for x in q.by_exchange:
            if x.running:
                yield ExchangeSample(ts=now, queue=name, exchange=x.id, host=x.host, msgs_in_per_s=x.msgs_in_per_s,
                                     msgs_out_per_s=x.msgs_out_per_s, bytes_in_per_s=x.bytes_in_per_s,
                                     bytes_out_per_s=x.bytes_out_per_s, publishers=x.publishers,
                                     subscriptions=x.subscriptions, drops=x.drops, latency_p50_ms=x.latency_p50_ms,
                                     latency_p99_ms=x.latency_p99_ms)
    for host, h in stats.hosts.items():
        yield HostSample(ts=now, host=host, cpu_percent=h.cpu_percent, memory_percent=h.memory_percent,
                         exchanges=h.exchanges)
