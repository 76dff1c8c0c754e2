"""A queue's scaling rules: their names, ranges and defaults, their validation, and when they fire.

A queue's rules (`roq queue rules`, stored with the queue) fire when one of its exchanges receives
more than `max_rate` msg/s or has more than `max_publishers` publishers, or a host running one of
them is above `max_cpu` / `max_memory` percent; load below `scale_in_below` × the limits of one
exchange fewer is low. What the leader does about it, and when: gcm.autoscaler. Pure functions:
the backup tool and the fuzz targets validate with `check_rules` too.
"""

from __future__ import annotations

import math
from typing import Any

from gcm.queues import MAX_EXCHANGES
from roq.errors import UserError
from roq.records import HostStats, QueueStats
from roq.state import HostInfo

RULE_LIMITS: dict[str, tuple[type, float, float]] = {  # name → (type, lowest, highest); 0 = off
    "max_rate": (float, 0, 1e9),
    "max_publishers": (int, 0, 1_000_000),
    "max_cpu": (float, 0, 100),
    "max_memory": (float, 0, 100),
    "min_exchanges": (int, 1, MAX_EXCHANGES),
    "max_exchanges": (int, 1, MAX_EXCHANGES),
    "scale_in_below": (float, 0, 1),
}
DEFAULT_RULES = {"max_rate": 0.0, "max_publishers": 0, "max_cpu": 0.0, "max_memory": 0.0,
                 "min_exchanges": 1, "max_exchanges": 8, "scale_in_below": 0.5}
# What a user types (`roq queue rules`): errors name the flag, the stored rule in parentheses.
RULE_FLAGS = {"max_rate": "--max-rate", "max_publishers": "--max-publishers", "max_cpu": "--max-cpu",
              "max_memory": "--max-memory", "min_exchanges": "--min", "max_exchanges": "--max",
              "scale_in_below": "--scale-in-below"}


def check_rules(current: dict[str, Any], changes: Any, size: int | None = None) -> dict[str, Any]:
    """`current` updated with `changes`, validated; raises UserError and changes nothing on bad input.

    `size`: the queue's exchanges now. Rules set on a queue that had none, without `min_exchanges`,
    get it as their floor (capped by `max_exchanges`): giving a queue rules never shrinks it below
    the size its operator chose; an explicit `min_exchanges` (even 1) does."""
    if not isinstance(changes, dict):
        raise UserError("rules must be a map of rule name to value")
    rules = dict(DEFAULT_RULES, **current)
    for name, value in changes.items():
        if name not in RULE_LIMITS:
            raise UserError(f"unknown rule {name!r}; rules are {', '.join(RULE_LIMITS)}")
        kind, low, high = RULE_LIMITS[name]
        flag = _flag(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (kind is int and value != int(value)):
            raise UserError(f"{flag} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        if not low <= value <= high:
            raise UserError(f"{flag} must be from {low:g} to {high:g}, got {value!r}")
        rules[name] = kind(value)
    if size is not None and not current and "min_exchanges" not in changes:
        rules["min_exchanges"] = max(1, min(size, rules["max_exchanges"]))
    if rules["min_exchanges"] > rules["max_exchanges"]:
        raise UserError(f"--min must be <= --max (got --min {rules['min_exchanges']}, --max {rules['max_exchanges']})")
    return rules


def _flag(name: str) -> str:
    return f"{RULE_FLAGS[name]} (rule {name})"


def firing_rules(summary: QueueStats, rules: dict[str, Any], hosts: dict[str, HostInfo]) -> list[str]:
    """Which scale-out rules fire now, in words."""
    reasons = []
    for x in summary.by_exchange:
        if rules["max_rate"] and x.msgs_in_per_s > rules["max_rate"]:
            reasons.append(f"{x.id} receives {x.msgs_in_per_s:,.0f} msg/s > {rules['max_rate']:,.0f}")
        if rules["max_publishers"] and x.publishers > rules["max_publishers"]:
            reasons.append(f"{x.id} has {x.publishers} publishers > {rules['max_publishers']}")
        host = hosts.get(x.host) if x.host else None
        figures = HostStats.from_dict(host.stats if host is not None else None)
        if rules["max_cpu"] and figures.cpu_percent > rules["max_cpu"]:
            reasons.append(f"host {x.host} CPU {figures.cpu_percent:.0f}% > {rules['max_cpu']:.0f}%")
        if rules["max_memory"] and figures.memory_percent > rules["max_memory"]:
            reasons.append(f"host {x.host} memory {figures.memory_percent:.0f}% > {rules['max_memory']:.0f}%")
    return sorted(set(reasons))


def is_low(summary: QueueStats, rules: dict[str, Any], count: int) -> bool:
    """Would one exchange fewer still be comfortably below the limits? Needs a rate or publisher rule."""
    fewer = count - 1
    checks = []
    if rules["max_rate"]:
        checks.append(summary.msgs_in_per_s < rules["scale_in_below"] * rules["max_rate"] * fewer)
    if rules["max_publishers"]:
        checks.append(summary.publishers <= rules["scale_in_below"] * rules["max_publishers"] * fewer)
    return bool(checks) and all(checks)
