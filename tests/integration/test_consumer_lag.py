"""Consumer lag: how far each durable subscriber is behind, in `roq stats` and its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.records import ClusterStats, ConsumerLag
from tests.integration.conftest import create
from tests.support.helpers import record_figures, wait_until

pytestmark = pytest.mark.integration


def lag_of(admin: Admin, queue: str, name: str) -> ConsumerLag | None:
    stats = ClusterStats.from_dict(admin.cluster_stats())
    found = [lag for lag in stats.queues[queue].subscribers if lag.name == name] if queue in stats.queues else []
    return found[0] if found else None


def publish(config, zk, count: int) -> None:
    """`count` messages through each of the two exchanges, one per frame: the lag counts whole
    frames (a frame partly taken counts as not taken), and here each message is one."""
    single = config.replace(client={"max_batch": 1})
    for x in ("x1", "x2"):
        with Publisher("lag", single, prefer=x) as pub:
            for i in range(count):
                pub.publish("t", i.to_bytes(4, "big"))
            pub.flush(30)


def test_a_durable_subscribers_lag_follows_what_it_took_and_grows_while_it_is_away(config, zk, paths, cluster,
                                                                                   tmp_path):
    create(config, zk, paths, "lag", 2)
    durable = config.replace(client={"state_dir": str(tmp_path / "state"), "position_save_interval": 0.2})
    with Admin(config) as admin:
        with Subscriber("lag", durable, durable="audit") as sub:
            sub.wait_connected(2)
            publish(config, zk, 500)
            wait_until(lambda: (lag := lag_of(admin, "lag", "audit")) is not None and lag.messages == 1_000,
                       timeout=15, message="a lag of the 1,000 messages not taken")
            behind = lag_of(admin, "lag", "audit")
            assert behind is not None and behind.frames >= 2
            for _ in range(600):
                assert sub.receive(timeout=10) is not None
            wait_until(lambda: (lag := lag_of(admin, "lag", "audit")) is not None and lag.messages == 400,
                       timeout=15, message="a lag of the 400 messages left")
            for _ in range(400):
                assert sub.receive(timeout=10) is not None
            wait_until(lambda: (lag := lag_of(admin, "lag", "audit")) == ConsumerLag(
                "audit", 0, 0, 0.0, lag.reported_ago if lag else -1), timeout=15, message="caught up")
        publish(config, zk, 100)  # while it is away
        wait_until(lambda: (lag := lag_of(admin, "lag", "audit")) is not None and lag.messages == 200,
                   timeout=15, message="the away subscriber's lag to grow")
        away = lag_of(admin, "lag", "audit")
    assert away is not None and away.seconds > 0
    cfg = tmp_path / "roq.toml"
    cfg.write_text(config.to_toml())
    view = subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(cfg), "stats", "--once"],
                          capture_output=True, text=True, timeout=60)
    assert view.returncode == 0, view.stderr
    assert "consumer lag" in view.stdout and "audit" in view.stdout
    raw = subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(cfg), "stats", "--json"],
                         capture_output=True, text=True, timeout=60)
    subscribers = json.loads(raw.stdout)["queues"]["lag"]["subscribers"]
    assert [(s["name"], s["messages"]) for s in subscribers] == [("audit", 200)]
    # Back again: it resumes from its position and the lag goes back to zero.
    with Admin(config) as admin, Subscriber("lag", durable, durable="audit") as sub:
        for _ in range(200):
            assert sub.receive(timeout=10) is not None
        wait_until(lambda: (lag := lag_of(admin, "lag", "audit")) is not None and lag.messages == 0,
                   timeout=15, message="caught up after the resume")
    record_figures("consumer lag", taken_then_away=200, away_seconds=away.seconds,
                   reported_ago_s=away.reported_ago)


def test_a_caught_up_subscriber_to_some_topics_is_not_behind_on_the_others(config, zk, paths, cluster, tmp_path):
    create(config, zk, paths, "filtered", 1)
    durable = config.replace(client={"state_dir": str(tmp_path / "state"), "position_save_interval": 0.2})
    with Admin(config) as admin, \
            Subscriber("filtered", durable, durable="orders", topics=["orders"]) as sub:
        sub.wait_connected(1)
        with Publisher("filtered", config.replace(client={"max_batch": 1})) as pub:
            pub.publish("orders", b"o")
            for i in range(200):
                pub.publish("clicks", i.to_bytes(4, "big"))  # not its topic
            pub.flush(30)
        assert sub.receive(timeout=10).payload == b"o"
        wait_until(lambda: (lag := lag_of(admin, "filtered", "orders")) is not None
                   and lag.messages == 0 and lag.frames == 0, timeout=15,
                   message="no lag for frames of topics it does not read")
