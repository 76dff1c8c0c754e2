"""What the console shows over time: a sampler thread asks the leader for `cluster.status` and
`cluster.stats` every `web.sample_interval` seconds, keeps the latest answers (every page and API
read is served from them, so a hundred open browsers cost the leader one request per interval),
the rates of each queue and host for `web.history_seconds`, and an event log.

The event log is the leader's (gcm/events.py, `cluster.events`): scaling and relocations, a new
leader, a host gone or back, an exchange moved to another host or restarted, a queue created or
deleted, including what happened before this process started. Each sample asks for the events after
the last one it has; when the leader's log is unreachable the console shows the events it already has.
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
        self._events_after = 0  # the number of the newest event in `events`
        # Queue → (description, rules), as the leader gave them since the last sample.
        self._details: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="web-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample_now(self) -> None:
        """One sample, in the caller's thread (after an admin action, so the page shows it at once).
        The events are read first: a reader that sees a sample's figures sees its events too (a new
        gateway's first answer would otherwise have figures and no events)."""
        try:
            status, stats = self.admin.status(), self.admin.cluster_stats()
        except RoqError as exc:
            with self._lock:
                self.error = str(exc)
            return
        self._read_events()
        with self._lock:
            self.status, self.stats, self.error = status, stats, None
            self._details.clear()  # asked again after each sample, and after each admin action
            self.sampled_at = time.time()
            self._record(stats)

    def _read_events(self) -> None:
        try:
            answer = self.admin.cluster_events(self._events_after)
            if answer.get("last", 0) < self._events_after:  # a log started anew (another cluster at this root)
                self._events_after = 0
                self.events.clear()
                answer = self.admin.cluster_events(0)
        except RoqError as exc:
            log.info("the leader's events could not be read: %s", exc)
            return
        new = [e for e in answer.get("events", []) if isinstance(e, dict) and isinstance(e.get("seq"), int)]
        with self._lock:  # two samples at once (an admin action's and the thread's) may read the same events
            new = [e for e in new if e["seq"] > self._events_after]
            self.events.extend(new)
            self._events_after = max([self._events_after, *(e["seq"] for e in new)])

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
