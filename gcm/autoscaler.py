"""The leader's elasticity: per-queue rules, scaling out and in, relocating publishers.

Every leader tick:
* `aggregate` sums what the exchanges and HCMs report (per queue and per
  host); `cluster.stats`, `roq stats` and the leader's /metrics serve it.
* A queue's rules (`roq queue rules`, stored with the queue; when they
  fire: gcm.rules) are judged on that sum. A rule that keeps firing for
  `autoscale.scale_out_after` adds an exchange (placed on the least loaded
  host).
* Load that stays below `scale_in_below` × the limits of one exchange fewer
  for `autoscale.scale_in_after` removes the newest exchange. Its publishers
  are told to move before it stops, and they resend their replay window, so
  nothing is lost.
* After any scaling action, a queue is left alone for `autoscale.cooldown`.
  That, and the gap between the scale-out and scale-in thresholds, keeps it
  from flapping.
* An exchange above its rate limit for `autoscale.relocate_after` sheds its
  heaviest publisher to the lightest exchange of the queue, if that makes
  the two more even. The leader writes `<root>/relocations/<queue>` and the
  publisher moves itself, with its replay window.
* The sum is also published on the statistics stream (gcm.stats_stream).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient, TransactionRequest

from gcm.fence import LeaderFence
from gcm.queues import QueueManager

# The rules have a module of their own; the names the backup tool, the views and the fuzz targets
# import from here stay importable.
from gcm.rules import DEFAULT_RULES, RULE_FLAGS, check_rules, firing_rules, is_low
from gcm.stats_stream import StatsStream
from roq.config import AutoscaleConfig
from roq.errors import QueueNotFoundError
from roq.names import check_queue_name
from roq.paths import Paths
from roq.records import ClusterStats, ExchangeStats, ExchangeSummary, HostStats, HostSummary, QueueStats
from roq.state import HostInfo, exchange_order, queue_names, read_hosts, read_live, read_queue
from roq.zk import encode, read_json

__all__ = ["DEFAULT_RULES", "RULE_FLAGS", "Autoscaler", "QueueState", "check_rules", "summarise_queue"]

log = logging.getLogger(__name__)

RELOCATION_TTL = 60.0  # seconds a relocation entry stays for its publisher to see
EVENT_LIMIT = 20  # scaling events kept per queue, for `roq stats`


@dataclass
class QueueState:
    """What the leader remembers between ticks about one queue."""
    firing_since: float | None = None
    low_since: float | None = None
    overloaded_since: float | None = None
    last_action: float = 0.0
    last_relocation: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    waiting_for: dict[str, Any] | None = None  # a scale-out whose new exchange has not carried traffic yet


class Autoscaler:
    """Aggregates the cluster's figures and applies each queue's rules on the leader's tick; its
    writes are fenced and taken under `write_lock`."""

    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence, queues: QueueManager,
                 write_lock: threading.Lock, config: AutoscaleConfig, stats_stream: StatsStream) -> None:
        self.client = client
        self.paths = paths
        self.fence = fence
        self.queues = queues
        self.write_lock = write_lock
        self.config = config
        self.states: dict[str, QueueState] = {}
        self.stats = ClusterStats()  # replaced whole each tick: readers on other threads see one tick's
        self.stats_stream = stats_stream

    # ------------------------------------------------------------ rules (control API)

    def set_rules(self, name: Any, rules: Any = None, clear: Any = False) -> dict[str, Any]:
        """`queue.rules`: show (no `rules`), change or `clear` queue `name`'s rules; returns them as
        they stand. Raises QueueNotFoundError or UserError (nothing written); a retry changes nothing."""
        name = check_queue_name(name)
        with self.write_lock:
            info = read_queue(self.client, self.paths, name)
            if info is None:
                raise QueueNotFoundError(f"queue {name!r} does not exist")
            settings = dict(info.settings)
            current = {} if clear is True else dict(settings.get("rules") or {})
            unset = dict(DEFAULT_RULES, min_exchanges=max(1, min(len(info.exchanges), DEFAULT_RULES["max_exchanges"])))
            if rules is None and clear is not True:  # a queue without rules shows the floor rules would get
                return dict(DEFAULT_RULES, **current) if current else unset
            if self.fence.already_applied():  # a retry of a change made: the rules as they are
                return dict(DEFAULT_RULES, **(settings.get("rules") or {}))
            if clear is True and not rules:  # back to a fixed size: no rules at all, not the defaults
                settings.pop("rules", None)
                merged = unset
            else:
                merged = check_rules(current, rules or {}, size=len(info.exchanges))
                settings["rules"] = merged

            def build(txn: TransactionRequest) -> None:
                txn.set_data(self.paths.queue(name), encode(settings))

            self.fence.write(build)
        log.info("rules of queue %s: %s", name, merged)
        return merged

    # ------------------------------------------------------------ the tick

    def tick(self, hosts: dict[str, HostInfo]) -> None:
        """`hosts`: as the reconciler just read them."""
        now = time.monotonic()
        self.stats = stats = self.aggregate(hosts)
        for name, summary in stats.queues.items():
            rules = summary.rules
            state = self.states.setdefault(name, QueueState())
            if rules and self.config.enabled:
                self._note_traffic_on_new(state, read_live(self.queues.cache, self.paths, name), now)
                self._apply(name, state, summary, rules, hosts, now)
        for gone in set(self.states) - set(stats.queues):
            del self.states[gone]
        self.stats_stream.publish(stats)

    def aggregate(self, hosts: dict[str, HostInfo] | None = None) -> ClusterStats:
        """The cluster's figures as the leader's cache holds them now: what the exchanges and hosts last
        wrote to ZooKeeper (`cluster.stats` answers with a fresh one, not the last tick's). Through the
        cache: polling every queue each tick was most of the leader's ZooKeeper reads."""
        cache = self.queues.cache
        if hosts is None:
            hosts = read_hosts(cache, self.paths)
        queues: dict[str, QueueStats] = {}
        for name in queue_names(cache, self.paths):
            info = read_queue(cache, self.paths, name)
            if info is None:
                continue
            live = read_live(cache, self.paths, name)
            state = self.states.get(name) or QueueState()  # read only: the API's thread calls this too
            queues[name] = summarise_queue(name, info.exchanges, live, info.settings.get("rules"), state,
                                           info.replicas)
        return ClusterStats(
            queues=queues, time=time.time(),
            hosts={h.name: HostSummary.of(HostStats.from_dict(h.stats), h.capacity) for h in hosts.values()})

    def _apply(self, name: str, state: QueueState, summary: QueueStats, rules: dict[str, Any],
               hosts: dict[str, HostInfo], now: float) -> None:
        count = summary.exchanges
        if count < rules["min_exchanges"] or count > rules["max_exchanges"]:
            target = min(max(count, rules["min_exchanges"]), rules["max_exchanges"])
            self._scale(name, state, summary, count, target, "outside min/max exchanges", now)
            return
        reasons = firing_rules(summary, rules, hosts)
        if reasons:
            state.low_since = None
            state.firing_since = state.firing_since or now
            if now - state.firing_since >= self.config.scale_out_after and count < rules["max_exchanges"] \
                    and summary.running == count and self._cooled(state, now):
                self._scale(name, state, summary, count, count + 1, "; ".join(reasons), now)
        else:
            state.firing_since = None
            if count > rules["min_exchanges"] and is_low(summary, rules, count):
                state.low_since = state.low_since or now
                if now - state.low_since >= self.config.scale_in_after and self._cooled(state, now):
                    self._scale(name, state, summary, count, count - 1, "load low", now)
            else:
                state.low_since = None
        self._maybe_relocate(name, state, summary, rules, now)

    def _cooled(self, state: QueueState, now: float) -> bool:
        return now - state.last_action >= self.config.cooldown

    def _scale(self, name: str, state: QueueState, summary: QueueStats, count: int, target: int, reason: str,
               now: float) -> None:
        log.info("autoscaling queue %s from %d to %d exchanges: %s", name, count, target, reason)
        self.queues.scale(name, target)
        event = {"at": time.time(), "from": count, "to": target, "reason": reason}
        if state.firing_since is not None:
            event["rule_firing_for_s"] = round(now - state.firing_since, 2)
        state.last_action = now
        state.firing_since = state.low_since = None
        if target > count:
            # The new exchange is the one with the highest id; remember it to time the scale-out,
            # and send it the busiest exchange's heaviest publisher, which moves the moment it runs.
            info = read_queue(self.client, self.paths, name)
            newest = max((x.id for x in info.exchanges), key=exchange_order) if info else None
            state.waiting_for = {"exchange": newest, "since": now, "event": event}
            busiest = max(summary.by_exchange, key=lambda x: x.msgs_in_per_s, default=None)
            if newest and busiest and self._shed(name, state, busiest, newest, 0.0, now):
                event["relocated_ahead"] = True
        state.events = (state.events + [event])[-EVENT_LIMIT:]

    def _note_traffic_on_new(self, state: QueueState, live: dict[str, Any], now: float) -> None:
        """Time from the scale-out decision to the new exchange carrying traffic."""
        waiting = state.waiting_for
        if not waiting:
            return
        stats = ExchangeStats.from_dict((live.get(waiting["exchange"]) or {}).get("stats"))
        if stats.msgs_in_per_s > 0:
            waiting["event"]["carrying_traffic_after_s"] = round(now - waiting["since"], 2)
            state.waiting_for = None
        elif now - waiting["since"] > 120:
            state.waiting_for = None

    def _maybe_relocate(self, name: str, state: QueueState, summary: QueueStats, rules: dict[str, Any],
                        now: float) -> None:
        limit = rules["max_rate"]
        exchanges = [x for x in summary.by_exchange if x.running]
        if not limit or len(exchanges) < 2:
            state.overloaded_since = None
            return
        heavy = max(exchanges, key=lambda x: x.msgs_in_per_s)
        light = min(exchanges, key=lambda x: x.msgs_in_per_s)
        if heavy.msgs_in_per_s <= limit:
            state.overloaded_since = None
            return
        state.overloaded_since = state.overloaded_since or now
        if now - state.overloaded_since < self.config.relocate_after or \
                now - state.last_relocation < self.config.relocate_cooldown:
            return
        self._shed(name, state, heavy, light.id, light.msgs_in_per_s, now)

    def _shed(self, name: str, state: QueueState, heavy: ExchangeSummary, target: str, target_rate: float,
              now: float) -> bool:
        """Relocate the heaviest publisher of `heavy` whose move makes the two exchanges more even."""
        gap = heavy.msgs_in_per_s - target_rate
        movable = [(pub, rate) for pub, rate in heavy.top_publishers if 0 < rate < gap]
        if not movable:
            return False  # moving any publisher would only move the overload
        publisher, rate = max(movable, key=lambda item: item[1])
        self._relocate(name, publisher, heavy.id, target)
        state.last_relocation = now
        state.overloaded_since = None
        state.events = (state.events + [{"at": time.time(), "relocated": publisher, "from": heavy.id,
                                         "to": target, "rate": rate}])[-EVENT_LIMIT:]
        return True

    def _relocate(self, queue: str, publisher: str, source: str, target: str) -> None:
        path = self.paths.relocations(queue)
        entries = {p: e for p, e in (read_json(self.client, path) or {}).items()
                   if isinstance(e, dict) and time.time() - e.get("at", 0) < RELOCATION_TTL}
        entries[publisher] = {"to": target, "from": source, "at": time.time()}
        exists = self.client.exists(path) is not None

        def build(txn: TransactionRequest) -> None:
            if exists:
                txn.set_data(path, encode(entries))
            else:
                txn.create(path, encode(entries))

        with self.write_lock:
            self.fence.write(build)
        log.info("relocating publisher %s of queue %s from %s to %s", publisher, queue, source, target)


# ---------------------------------------------------------------- pure functions (unit-tested)


def summarise_queue(name: str, exchanges: list[Any], live: dict[str, Any], rules: dict[str, Any] | None,
                    state: QueueState, replicas: int = 1) -> QueueStats:
    """One queue's figures from its exchanges' `live` znodes (a missing one counts as not running)."""
    by_exchange = []
    for x in sorted(exchanges, key=lambda x: exchange_order(x.id)):
        data = live.get(x.id) or {}
        restarts = data.get("restarts")
        restarts = restarts if isinstance(restarts, int) else 0
        by_exchange.append(ExchangeSummary.of(x.id, x.host, x.id in live, restarts,
                                              ExchangeStats.from_dict(data.get("stats"))))
    return QueueStats.of(name, len(exchanges), tuple(by_exchange), rules, tuple(state.events), replicas)


