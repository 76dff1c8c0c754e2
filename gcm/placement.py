"""Choosing hosts for exchanges. Pure functions: no ZooKeeper, easy to test.

Rules, in order: never exceed a host's capacity; spread one queue's exchanges
over distinct hosts (so one host loss takes out as little of a queue as
possible); then least loaded (assigned / capacity); then by name, so the
result is deterministic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class HostLoad:
    name: str
    capacity: int
    assigned: int


def choose_hosts(count: int, hosts: Iterable[HostLoad],
                 queue_spread: Mapping[str, int] | None = None) -> list[str]:
    """Up to `count` host names for new exchanges; fewer if capacity runs out."""
    hosts = list(hosts)
    load = {h.name: h.assigned for h in hosts}
    capacity = {h.name: h.capacity for h in hosts}
    spread = Counter(queue_spread or {})
    picks: list[str] = []
    for _ in range(count):
        candidates = [name for name in load if load[name] < capacity[name]]
        if not candidates:
            break
        best = min(candidates, key=lambda n: (spread[n], load[n] / capacity[n], load[n], n))
        picks.append(best)
        load[best] += 1
        spread[best] += 1
    return picks


def host_loads(capacities: Mapping[str, int], placements: Iterable[str | None]) -> list[HostLoad]:
    """Loads of the live hosts given where every exchange is placed."""
    counts = Counter(p for p in placements if p in capacities)
    return [HostLoad(name, cap, counts[name]) for name, cap in sorted(capacities.items())]
