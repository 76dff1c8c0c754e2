"""The failover figures of scripts/idle_clients.py --failover: the reactions the failover suites
assert, measured while every idle client stays connected (issue 36).

* exchange SIGKILL: a real publisher (1,000 msg/s, its message numbers as payloads) and a real
  subscriber on the idle queue; the exchange the publisher uses is killed. Figures: the seconds
  until every message sent before the kill is confirmed (elsewhere) and until the subscriber has
  all of them; lost and duplicated over the whole run.
* scale-out: the seconds from the scale's answer (the placement) until the publisher sees the new
  exchange, is on it and has a message confirmed there; it is asked to move the moment it sees it,
  as when it follows the leader's relocation.
* GCM leader SIGKILL: the seconds until another GCM leads, then a scale-out's seconds from its
  answer until every client saw the new exchange. Real clients leave the dead seed by themselves
  (ZeroMQ heartbeats); the protocol-level ones leave it when a renewal, sent at the kill, goes
  unanswered for ATTEMPT_TIMEOUT (as roq.client.metadata does).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient

from roq.client.admin import Admin
from roq.config import Config
from roq.paths import Paths
from roq.state import read_leader, read_live
from tests.support.helpers import SteadyTraffic, wait_until

RATE = 1000.0  # msg/s of the measuring publisher


def timed(condition: Callable[[], Any], timeout: float, message: str) -> float:
    started = time.monotonic()
    wait_until(condition, timeout=timeout, interval=0.005, message=message)
    return round(time.monotonic() - started, 3)


class Failover:
    """The three reactions, in order, on the cluster `idle_clients.measure` started."""

    def __init__(self, config: Config, state: Any, queue: str) -> None:
        self.config, self.state, self.queue = config, state, queue
        self.zk = KazooClient(hosts=state.zk_hosts)
        self.zk.start(timeout=15)
        self.paths = Paths(config.zk.root)
        self.traffic = SteadyTraffic(queue, config, rate=RATE, max_messages=10_000_000)
        self.figures: dict[str, Any] = {}

    def start(self) -> None:
        self.traffic.start()
        self.traffic.wait_for_more(int(RATE), timeout=30)

    def scale_used(self, exchange: str, scaled_at: float) -> None:
        """(b) from the scale's answer (wall clock `scaled_at`) until the publisher sends to `exchange`.
        It moves the way it follows the leader's relocation (exchange_link._follow_relocation): as
        soon as its topology shows the target, it is asked to move there."""
        pub = self.traffic.pub
        pub.prefer = exchange
        wait_until(lambda: exchange in read_live(self.zk, self.paths, self.queue), timeout=30, interval=0.01,
                   message=f"{exchange} running")
        live = time.time()  # the new exchange's start: the part no metadata path can shorten
        wait_until(lambda: exchange in pub.topology.snapshot(), timeout=30, interval=0.002,
                   message=f"the publisher to see {exchange}")
        seen = time.time()
        pub._request_move(f"scale-out measurement: {exchange} placed")
        wait_until(lambda: pub.exchange == exchange, timeout=30, interval=0.002, message=f"the publisher on {exchange}")
        on_it = time.time()
        confirmed = pub.confirmed
        wait_until(lambda: pub.confirmed > confirmed, timeout=30, interval=0.002, message="a message confirmed there")
        self.figures["scale_out"] = {"exchange_running_s": round(live - scaled_at, 3),
                                     "publisher_saw_new_exchange_s": round(seen - scaled_at, 3),
                                     "publisher_on_new_exchange_s": round(on_it - scaled_at, 3),
                                     "first_confirmed_there_s": round(time.time() - scaled_at, 3)}

    def kill_exchange(self) -> None:
        """(a) SIGKILL of the publisher's exchange: resent elsewhere, subscriber caught up."""
        pub, traffic = self.traffic.pub, self.traffic
        pub.prefer = None
        victim = pub.exchange
        pid = read_live(self.zk, self.paths, self.queue)[victim]["pid"]
        before = traffic.sent
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        confirmed_s = timed(lambda: pub.confirmed >= before, 60, "the messages sent before the kill confirmed")
        timed(lambda: all(i in traffic.counts for i in range(before)), 60,
              "the subscriber to have every message sent before the kill")
        self.figures["exchange_kill"] = {"exchange": victim, "sent_before_kill": before,
                                         "confirmed_elsewhere_s": confirmed_s,
                                         "subscriber_caught_up_s": round(time.monotonic() - started, 3),
                                         "moved_to": pub.exchange}

    def kill_leader(self) -> tuple[str, float]:
        """(c) SIGKILL of the GCM leader; returns the dead GCM's seed and when it died (monotonic)."""
        old = read_leader(self.zk, self.paths) or {}
        seeds = self.config.cluster.seeds.split(",")
        endpoint = old["endpoint"]
        name = f"gcm-{seeds.index(endpoint) + 1}"
        pid = next(p["pid"] for p in self.state.processes if p["name"] == name)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        elected_s = timed(lambda: (now := read_leader(self.zk, self.paths)) and now["endpoint"] != endpoint,
                          60, "a new leader")
        self.figures["leader_kill"] = {"killed": endpoint, "new_leader_s": elected_s}
        return endpoint, killed

    def scale(self, exchanges: int) -> float:
        """Scale the queue (retrying while no leader answers); the answer's wall-clock time."""
        def attempt() -> bool:
            try:
                with Admin(self.config) as admin:
                    admin.call("queue.scale", name=self.queue, exchanges=exchanges)
                return True
            except Exception:  # no leader yet, or it is still taking over
                return False
        wait_until(attempt, timeout=60, interval=0.2, message=f"the scale to {exchanges}")
        return time.time()

    def finish(self) -> dict[str, Any]:
        report = self.traffic.stop()
        self.figures["traffic"] = report
        return self.figures

    def close(self) -> None:
        self.traffic.close()
        self.zk.stop()
        self.zk.close()


def table(figures: dict[str, Any]) -> str:
    """The figures as aligned lines for the terminal."""
    rows = []
    for section, values in figures.items():
        for key, value in (values.items() if isinstance(values, dict) else [("", values)]):
            rows.append(f"  {section:<16} {key:<32} {value}")
    return "\n".join(rows)

