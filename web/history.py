"""What the console shows over time: a sampler thread asks the leader for `cluster.status` and
`cluster.stats` every `web.sample_interval` seconds, keeps the latest answers (every page and API
read is served from them, so a hundred open browsers cost the leader one request per interval),
the rates of each queue and host for `web.history_seconds`, and an event log.

The event log merges the autoscaler's own events (scaling, relocations) with what the sampler sees
change between two samples: a new leader, a host gone or back, an exchange moved to another host
or restarted, a queue created or deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from roq.client.admin import Admin
from roq.errors import RoqError

log = logging.getLogger(__name__)

EVENT_LIMIT = 200


class Series:
    """One queue's or host's samples: timestamps and two values each, bounded in count."""

    def __init__(self, size: int) -> None:
        self.t: deque[float] = deque(maxlen=size)
        self.a: deque[float] = deque(maxlen=size)
        self.b: deque[float] = deque(maxlen=size)

    def add(self, t: float, a: float, b: float) -> None:
        self.t.append(t)
        self.a.append(a)
        self.b.append(b)

    def since(self, start: float, names: tuple[str, str]) -> dict[str, list[float]]:
        keep = [i for i, t in enumerate(self.t) if t >= start]
        return {"t": [round(self.t[i], 3) for i in keep], names[0]: [round(self.a[i], 2) for i in keep],
                names[1]: [round(self.b[i], 2) for i in keep]}


class Sampler:
    def __init__(self, admin: Admin, interval: float, history_seconds: float) -> None:
        self.admin = admin
        self.interval = interval
        self.size = max(2, int(history_seconds / interval) + 1)
        self._lock = threading.Lock()
        self.status: dict[str, Any] | None = None
        self.stats: dict[str, Any] | None = None
        self.error: str | None = None  # why the last sample failed (shown on the page)
        self.sampled_at = 0.0
        self.queues: dict[str, Series] = {}
        self.hosts: dict[str, Series] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENT_LIMIT)
        # Queue → (description, rules), as the leader gave them since the last sample.
        self._details: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._scaling_seen_until: dict[str, float] = {}  # queue → time of the last autoscaler event logged
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="web-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample_now(self) -> None:
        """One sample, in the caller's thread (after an admin action, so the page shows it at once)."""
        try:
            status, stats = self.admin.status(), self.admin.cluster_stats()
        except RoqError as exc:
            with self._lock:
                self.error = str(exc)
            return
        with self._lock:
            self._note_changes(self.status, status, self.stats, stats)
            self.status, self.stats, self.error = status, stats, None
            self._details.clear()  # asked again after each sample, and after each admin action
            self.sampled_at = time.time()
            self._record(stats)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_now()
            except Exception:  # a bug here must not end the console's only source of data
                log.exception("sampling the cluster failed")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def _record(self, stats: dict[str, Any]) -> None:
        now = stats.get("time") or time.time()
        for name, q in stats.get("queues", {}).items():
            self.queues.setdefault(name, Series(self.size)).add(now, q.get("msgs_in_per_s", 0.0),
                                                                 q.get("msgs_out_per_s", 0.0))
        for name, h in stats.get("hosts", {}).items():
            self.hosts.setdefault(name, Series(self.size)).add(now, h.get("cpu_percent", 0.0),
                                                                h.get("memory_percent", 0.0))
        for gone in set(self.queues) - set(stats.get("queues", {})):
            del self.queues[gone]
        for gone in set(self.hosts) - set(stats.get("hosts", {})):
            del self.hosts[gone]

    def queue_details(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The queue's description and rules from the leader, asked at most once per sample: a queue
        page polled by many browsers costs the leader two requests per interval."""
        with self._lock:
            cached = self._details.get(name)
        if cached is None:
            cached = (self.admin.describe_queue(name), self.admin.queue_rules(name))
            with self._lock:
                self._details[name] = cached
        return cached

    def history(self, seconds: float) -> dict[str, Any]:
        start = time.time() - seconds
        with self._lock:
            return {"interval": self.interval,
                    "queues": {n: s.since(start, ("in", "out")) for n, s in self.queues.items()},
                    "hosts": {n: s.since(start, ("cpu", "mem")) for n, s in self.hosts.items()}}

    def snapshot(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | None, float]:
        with self._lock:
            return self.status, self.stats, self.error, self.sampled_at

    def recent_events(self, queue: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            events = list(self.events)
        if queue is not None:
            events = [e for e in events if e.get("queue") == queue]
        return sorted(events, key=lambda e: e["time"])

    # ------------------------------------------------------------ events

    def _event(self, when: float, kind: str, detail: str, queue: str | None = None) -> None:
        self.events.append({"time": when, "kind": kind, "detail": detail, "queue": queue})

    def _note_changes(self, old_status: dict[str, Any] | None, status: dict[str, Any],
                      old_stats: dict[str, Any] | None, stats: dict[str, Any]) -> None:
        now = time.time()
        self._note_scaling(stats)
        if old_status is None or old_stats is None:
            return
        old_leader, leader = (old_status.get("leader") or {}).get("id"), (status.get("leader") or {}).get("id")
        if leader != old_leader:
            self._event(now, "leader", f"{leader or 'nobody'} is the leader (was {old_leader or 'nobody'})")
        old_hosts = {h["name"] for h in old_status.get("hosts", [])}
        hosts = {h["name"] for h in status.get("hosts", [])}
        for host in sorted(old_hosts - hosts):
            self._event(now, "host lost", f"host {host} is gone")
        for host in sorted(hosts - old_hosts):
            self._event(now, "host joined", f"host {host} joined")
        old_queues, queues = old_stats.get("queues", {}), stats.get("queues", {})
        for name in sorted(set(queues) - set(old_queues)):
            self._event(now, "queue created", f"queue {name} created", name)
        for name in sorted(set(old_queues) - set(queues)):
            self._event(now, "queue deleted", f"queue {name} deleted", name)
        for name, q in queues.items():
            if name in old_queues:
                self._note_exchanges(now, name, old_queues[name], q)

    def _note_exchanges(self, now: float, queue: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        before = {x["id"]: x for x in old.get("by_exchange", [])}
        for x in new.get("by_exchange", []):
            was = before.get(x["id"])
            if was is None:
                continue
            if was.get("host") != x.get("host"):
                self._event(now, "failover", f"exchange {x['id']} moved from {was.get('host') or 'nowhere'} "
                                             f"to {x.get('host') or 'nowhere'}", queue)
            elif x.get("restarts", 0) > was.get("restarts", 0):
                self._event(now, "restart", f"exchange {x['id']} restarted on {x.get('host')}", queue)

    def _note_scaling(self, stats: dict[str, Any]) -> None:
        for name, q in stats.get("queues", {}).items():
            seen_until = self._scaling_seen_until.get(name, 0.0)
            for e in q.get("events", []):
                at = e.get("at", 0.0)
                if at <= seen_until:
                    continue
                self._scaling_seen_until[name] = max(self._scaling_seen_until.get(name, 0.0), at)
                if "relocated" in e:
                    detail = f"publisher {e['relocated']} moved from {e.get('from')} to {e.get('to')}"
                    self._event(at, "relocation", detail, name)
                else:
                    detail = f"scaled from {e.get('from')} to {e.get('to')} exchanges: {e.get('reason', '')}"
                    self._event(at, "scaling", detail, name)
        for gone in set(self._scaling_seen_until) - set(stats.get("queues", {})):
            del self._scaling_seen_until[gone]
