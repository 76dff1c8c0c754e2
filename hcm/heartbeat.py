"""When the HCM writes statistics to ZooKeeper: on a material change, else as a heartbeat.

The HCM receives a report from every exchange each `exchange.stats_interval` and measures its host
each `hcm.stats_interval`, but writing them all to `live/<q>/<x>`, `replicas/<q>/<x>` and
`hosts/<host>` every time made an idle cluster a steady stream of ZooKeeper transactions (7 a
second for 2 hosts and 5 queues, each one logged to disk and sent to every watcher). The rule:

* a znode's statistics are written when they changed materially since the last write
  (`exchange_changed`, `host_changed`), never more often than the interval of the reports;
* otherwise at least every `hcm.stats_heartbeat` seconds (a liveness heartbeat: the figures that
  ride along, and the `at` of the report, are at most that old); the znode says how long that is,
  `"heartbeat": seconds` (and the report interval, `"stats_interval"`), so clients judge the age
  of `stats.at` against it;
* an exchange that stops reporting for `SILENT_AFTER` report intervals (frozen, stuck) is a change
  too: its znode is written once with `"silent": true` and its last report (whose `at` ages), and
  nothing more until it reports again. Publishers rank such an exchange last at once
  (roq/client/publisher/exchange_choice.py) instead of waiting for its `at` to age past the heartbeat. The HCM does
  not judge silence on a tick that comes late (it was held up itself, and has not read the
  reports that came meanwhile): see hcm/endpoints.py.

An idle cluster thus writes one heartbeat per znode per `hcm.stats_heartbeat` (and a host's
znode when the machine's CPU or memory use moves, whatever moves it); scripts/zk_growth.py
measures it. Writes that do carry news still go out at once, at most once per report interval.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from roq.records import ExchangeStats, HostStats

SILENT_AFTER = 3.0  # report intervals without a report before an exchange is written as silent
HOST_STEP_PERCENT = 5.0  # CPU or memory use must move this many points (from the last write) to count

# Gauges that drift while the exchange does nothing (memory, frames ageing out of retention): they
# are written along with the next write, and by the heartbeat at the latest, but never cause one.
# Every other figure (the counters, rates, publishers, subscriptions, subscribers, top publishers,
# latency, held acks, replication progress) moves only when the exchange works or its clients change.
QUIET_EXCHANGE_FIELDS = frozenset({"at", "rss_bytes", "retained_frames", "retained_bytes", "evicted_frames",
                                   "tracked_prefixes", "replay_held_bytes",
                                   # retried twice a second while a disk is full: `storage_full` carries the news
                                   "journal_errors", "journal_pending_bytes"})
# Consumer lag and consumer groups: their counts move with work, their seconds age with the clock
# (only those drift).
_EXCHANGE_TRIGGERS = tuple(f.name for f in fields(ExchangeStats)
                           if f.name not in QUIET_EXCHANGE_FIELDS | {"consumers", "groups"})


def exchange_changed(written: ExchangeStats | None, report: ExchangeStats | None) -> bool:
    """Does `report` differ materially from the statistics last `written`?"""
    if report is None:
        return False
    if written is None:
        return True
    return any(getattr(written, name) != getattr(report, name) for name in _EXCHANGE_TRIGGERS) \
        or _lag_counts(written) != _lag_counts(report) or _group_counts(written) != _group_counts(report)


def _group_counts(stats: ExchangeStats) -> dict[str, Any]:
    """Every figure of every group but its lag's seconds (which grow by themselves while it waits)."""
    return {name: replace(figures, oldest_ready_s=0.0) for name, figures in stats.groups.items()}


def _lag_counts(stats: ExchangeStats) -> list[tuple[str, int, int]]:
    return [(lag.name, lag.frames, lag.messages) for lag in stats.consumers]


def host_changed(written: HostStats | None, figures: HostStats) -> bool:
    """Does the host's `figures` differ materially from the figures last `written`: another number
    of exchanges or CPUs, CPU, memory or data disk use `HOST_STEP_PERCENT` points away, or the data
    disk's free bytes halved or doubled (so a big disk running out is seen before it is out)? (The
    leader's rules on `max_cpu` and `max_memory`, and its check of a journaling host's free space,
    thus see a figure at most that far off, or a heartbeat old.)"""
    if written is None:
        return True
    return (written.exchanges != figures.exchanges or written.cpus != figures.cpus
            or abs(written.cpu_percent - figures.cpu_percent) >= HOST_STEP_PERCENT
            or abs(written.memory_percent - figures.memory_percent) >= HOST_STEP_PERCENT
            or abs(_disk_percent(written) - _disk_percent(figures)) >= HOST_STEP_PERCENT
            or _halved_or_doubled(written.data_free_bytes, figures.data_free_bytes))


def _halved_or_doubled(before: int, now: int) -> bool:
    low, high = sorted((before, now))
    return high >= 2 * low and high - low >= 1 << 20  # a MiB at least: no write per page near zero


def _disk_percent(figures: HostStats) -> float:
    """Free space of the data disk in percent of its size (100 when unknown)."""
    if figures.data_total_bytes <= 0:
        return 100.0
    return 100.0 * figures.data_free_bytes / figures.data_total_bytes


def write_due(written_at: float | None, now: float, changed: bool, heartbeat: float,
              min_interval: float = 0.0) -> bool:
    """Write a znode's statistics now? Always when never written (`written_at` None); on a change once
    `min_interval` has passed since the last write; else when the heartbeat is due. Times: monotonic."""
    if written_at is None:
        return True
    elapsed = now - written_at
    return elapsed >= heartbeat or (changed and elapsed >= min_interval)
