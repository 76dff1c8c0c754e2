#!/usr/bin/env python3
"""Elasticity run (not in CI): a local cluster with default intervals, a load ramp, the timings.

Starts ZooKeeper, 2 GCMs and 3 HCMs, a queue of 1 exchange with the rules
max_rate=1500 msg/s per exchange, 1 to 3 exchanges; adds a 1,000 msg/s
publisher every 3 s up to 4, holds, stops the load and waits for the queue to
scale back in. Prints the scaling events with the time from the rule firing
to the new exchange carrying traffic, and the loss count. Bounded by --seconds.

    .venv/bin/python scripts/elasticity.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from roq.client.admin import Admin  # noqa: E402
from roq.client.subscriber import Subscriber  # noqa: E402
from roq.config import Config, load_config  # noqa: E402
from roq.tools.cluster import LocalCluster  # noqa: E402
from roq.tools.views import stats_view  # noqa: E402
from tests.support.helpers import PacedPublisher  # noqa: E402

console = Console()


@click.command()
@click.option("--publishers", type=click.IntRange(1, 8), default=4, show_default=True)
@click.option("--rate", type=float, default=1000, show_default=True, help="msg/s per publisher")
@click.option("--seconds", type=float, default=120, show_default=True, help="hard time limit")
def main(publishers: int, rate: float, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    local = LocalCluster(Config().replace(cluster={"hcms": 3}), Path(tempfile.mkdtemp(prefix="roq-elastic-")))
    local.up()
    pubs: list[PacedPublisher] = []
    try:
        config = load_config(local.config_path)
        with Admin(config) as admin:
            admin.create_queue("elastic", exchanges=1)
            admin.queue_rules("elastic", {"max_rate": 1500, "min_exchanges": 1, "max_exchanges": 3})
            got: dict[str, set[int]] = {}
            sub = Subscriber("elastic", config, callback=lambda m: got.setdefault(m.publisher, set()).add(
                int(m.payload)))
            sub.wait_connected()
            for _ in range(publishers):
                pubs.append(PacedPublisher("elastic", config, None, rate))
                time.sleep(3)  # the ramp's shape
            while len(admin.describe_queue("elastic")["exchanges"]) < 3 and time.monotonic() < deadline - 60:
                time.sleep(0.5)
            time.sleep(5)
            console.print(stats_view(admin.cluster_stats()))
            for p in pubs:
                p.stop()
            sent = sum(p.sent for p in pubs)
            while len(admin.describe_queue("elastic")["exchanges"]) > 1 and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(1)
            lost = sum(len(set(range(p.sent)) - got.get(p.pub.id, set())) for p in pubs)
            events = admin.cluster_stats()["queues"]["elastic"]["events"]
            sub.close()
        for e in events:
            if "reason" in e:
                total = e.get("rule_firing_for_s", 0) + e.get("carrying_traffic_after_s", 0)
                timing = f", rule firing → new exchange carrying traffic {total:.2f} s" \
                    if "carrying_traffic_after_s" in e else ""
                console.print(f"{e['from']} → {e['to']}: {e['reason']}{timing}")
            else:
                console.print(f"relocated {e['relocated']} {e['from']} → {e['to']}")
        console.print(f"sent {sent}, lost {lost}")
        sys.exit(1 if lost else 0)
    finally:
        for p in pubs:
            p.close()
        local.down()


if __name__ == "__main__":
    main()
