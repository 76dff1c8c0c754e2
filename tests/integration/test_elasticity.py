"""Elasticity: rules scale a queue out and in under a real load, relocation, no flapping."""

from __future__ import annotations

import time

import pytest

from roq.client.admin import Admin
from roq.client.subscriber import Subscriber
from roq.state import read_live
from tests.integration.conftest import create, start_cluster
from tests.support.helpers import PacedPublisher, record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.solo]  # loads or times the machine: run alone

FAST_HOSTS = ("exchange.stats_interval=0.5", "hcm.stats_interval=0.5")
FAST_LEADER = ("gcm.tick=0.5", "autoscale.scale_out_after=1", "autoscale.scale_in_after=4", "autoscale.cooldown=2",
               "autoscale.relocate_after=1", "autoscale.relocate_cooldown=1")


class Counting:
    """A subscriber that records every (publisher, number) it gets."""

    def __init__(self, queue: str, config, zk) -> None:
        self.got: dict[str, list[int]] = {}
        self.sub = Subscriber(queue, config, callback=self._on)
        self.sub.wait_connected()

    def _on(self, msg) -> None:
        self.got.setdefault(msg.publisher, []).append(int(msg.payload))

    def assert_everything_once(self, publishers: list[PacedPublisher]) -> int:
        for p in publishers:
            wait_until(lambda p=p: len(self.got.get(p.pub.id, [])) >= p.sent, timeout=30,
                       message=f"all {p.sent} messages of {p.pub.id}")
            assert p.pub.confirmed == p.sent
            assert sorted(self.got[p.pub.id]) == list(range(p.sent)), "lost or repeated messages"
        return sum(p.sent for p in publishers)


def elastic_queue(config, zk, paths, procs, exchanges: int, rules: dict | None = None) -> None:
    """A cluster with fast statistics and a fast leader, and the queue "elastic" with `rules`."""
    start_cluster(procs, zk, paths, *FAST_HOSTS, gcm_settings=FAST_LEADER)
    create(config, zk, paths, "elastic", exchanges)
    if rules:
        set_rules(config, zk, rules)


def set_rules(config, zk, rules: dict) -> None:
    with Admin(config) as admin:
        admin.queue_rules("elastic", rules)


def exchange_count(config, zk) -> int:
    with Admin(config) as admin:
        return len(admin.describe_queue("elastic")["exchanges"])


@pytest.mark.timeout(150)
def test_a_load_ramp_scales_out_to_three_exchanges_and_back_in(config, zk, paths, procs):
    elastic_queue(config, zk, paths, procs, 1, {"max_rate": 1500, "min_exchanges": 1, "max_exchanges": 3,
                                                "scale_in_below": 0.5})
    sink = Counting("elastic", config, zk)
    publishers: list[PacedPublisher] = []
    ramp_started = time.monotonic()
    try:
        for _ in range(4):  # 1,000 msg/s more every 2 s, up to 4,000 msg/s
            publishers.append(PacedPublisher("elastic", config, rate=1000))
            time.sleep(2)  # the ramp's pace (load shape), not synchronisation
        wait_until(lambda: len([x for x in read_live(zk, paths, "elastic").values()
                                if (x.get("stats") or {}).get("msgs_in_per_s", 0) > 0]) >= 3,
                   timeout=40, message="three exchanges carrying traffic")
        with Admin(config) as admin:
            events = [e for e in admin.cluster_stats()["queues"]["elastic"]["events"] if "reason" in e]
        watched_s = time.monotonic() - ramp_started
        for p in publishers:
            p.stop()
        total = sink.assert_everything_once(publishers)
        wait_until(lambda: exchange_count(config, zk) == 1, timeout=60, message="scaled back in to 1")
    finally:
        for p in publishers:
            p.close()
        sink.sub.close()
    outs = [e for e in events if e["to"] > e["from"]]
    assert len(outs) >= 2 and all(e["to"] <= 3 for e in events)
    times = [round(e["rule_firing_for_s"] + e["carrying_traffic_after_s"], 2)
             for e in outs if "carrying_traffic_after_s" in e]
    record_figures("autoscale ramp", messages=total, lost=0, scale_outs=len(outs),
                   rule_fired_to_new_exchange_carrying_traffic_s=times,
                   decision_to_traffic_s=[e.get("carrying_traffic_after_s") for e in outs])
    # How fast is a figure, not a pass mark (it depends on the machine's load). What must hold: the new
    # exchanges did carry traffic, and each time lies inside the window this test watched (load on to
    # events read; the 0.1 s covers rounding), so the figures are measurements, not garbage.
    assert times and all(0 < t <= watched_s + 0.1 for t in times), (times, watched_s)


@pytest.mark.timeout(90)
def test_the_leader_relocates_the_heaviest_publisher_without_loss(config, zk, paths, procs):
    elastic_queue(config, zk, paths, procs, 1)
    sink = Counting("elastic", config, zk)
    heavy = PacedPublisher("elastic", config, rate=1200)
    light = PacedPublisher("elastic", config, rate=500)
    try:
        wait_until(lambda: heavy.pub.exchange == light.pub.exchange == "x1", message="both on x1")
        # A second exchange, and x1 is now over its limit.
        set_rules(config, zk, {"max_rate": 1500, "min_exchanges": 2, "max_exchanges": 2})
        wait_until(lambda: heavy.pub.exchange == "x2", timeout=30, message="the heavy publisher relocated")
        time.sleep(1)  # traffic keeps flowing across the move (load shape)
        heavy.stop()
        light.stop()
        total = sink.assert_everything_once([heavy, light])
    finally:
        heavy.close()
        light.close()
        sink.sub.close()
    assert heavy.pub.relocations == 1 and light.pub.exchange == "x1" and light.pub.relocations == 0
    record_figures("relocation", messages=total, lost=0, moved="heavy (1,200 msg/s) x1 → x2")


@pytest.mark.timeout(90)
def test_a_steady_load_between_the_thresholds_never_flaps(config, zk, paths, procs):
    # Out above 1,000 msg/s on an exchange; in only below 0.5 × 1,000 in total. 700 msg/s is neither.
    elastic_queue(config, zk, paths, procs, 2, {"max_rate": 1000, "min_exchanges": 1, "max_exchanges": 4,
                                                "scale_in_below": 0.5})
    sink = Counting("elastic", config, zk)
    load = PacedPublisher("elastic", config, rate=700)
    try:
        deadline = time.monotonic() + 12  # three times scale_in_after plus the cooldown
        while time.monotonic() < deadline:
            assert exchange_count(config, zk) == 2
            time.sleep(0.5)  # sampling the size over the window
        with Admin(config) as admin:
            assert admin.cluster_stats()["queues"]["elastic"]["events"] == []
        load.stop()
        sink.assert_everything_once([load])
    finally:
        load.close()
        sink.sub.close()
