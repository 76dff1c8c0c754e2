#!/usr/bin/env python3
"""Chaos run (not in CI): kill random exchanges and hosts under load, then account.

Starts its own ZooKeeper, 2 GCMs and 3 HCMs on this machine, a queue of 2
exchanges, and a steady publisher and subscriber. Every few seconds it
SIGKILLs a random exchange process or a random HCM (restarting the HCM at
once under the same host name). Bounded: --kills kills or --seconds seconds,
whichever comes first. Prints sent / confirmed / delivered / lost /
duplicated / longest pause. Exit code 1 if anything confirmed was lost.

    .venv/bin/python scripts/chaos.py --kills 20 --interval 4 --rate 2000
"""

from __future__ import annotations

import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from roq.client.admin import Admin
from roq.state import read_hosts, read_leader, read_live
from roq.testing import Processes, SteadyTraffic, fast_config, wait_until
from roq.zk import start_client, stop_client
from roq.zookeeper import ZooKeeperServer

console = Console()
HOSTS = ("host-1", "host-2", "host-3")


def kill_something(procs: Processes, zk, paths, rng: random.Random) -> str:  # type: ignore[no-untyped-def]
    live = read_live(zk, paths, "chaos")
    if live and rng.random() < 0.6:
        xid = rng.choice(sorted(live))
        os.kill(live[xid]["pid"], signal.SIGKILL)
        return f"exchange {xid} (pid {live[xid]['pid']}) on {live[xid]['host']}"
    host = rng.choice(HOSTS)
    procs.kill(host, signal.SIGKILL)
    procs.procs[host].wait(timeout=10)
    procs.hcm(host)
    return f"host {host} (HCM and its exchanges)"


@click.command()
@click.option("--kills", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--interval", type=float, default=4.0, show_default=True, help="seconds between kills")
@click.option("--seconds", type=float, default=150.0, show_default=True, help="hard time limit")
@click.option("--rate", type=float, default=2000.0, show_default=True, help="messages per second")
@click.option("--seed", type=int, default=None)
def main(kills: int, interval: float, seconds: float, rate: float, seed: int | None) -> None:
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="roq-chaos-"))
    server = ZooKeeperServer(workdir / "zk")
    server.start()
    config = fast_config(server.connect_string)
    procs = Processes(config, workdir / "daemons")
    zk = start_client(config)
    from roq.paths import Paths
    paths = Paths(config.zk.root)
    traffic = None
    try:
        procs.gcm("gcm-1")
        procs.gcm("gcm-2")
        for host in HOSTS:
            procs.hcm(host)
        wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 3, timeout=30,
                   message="cluster")
        with Admin(config, zk) as admin:
            admin.create_queue("chaos", exchanges=2)
        wait_until(lambda: len(read_live(zk, paths, "chaos")) == 2, timeout=30, message="exchanges")
        traffic = SteadyTraffic("chaos", config, zk, rate=rate, max_messages=int(rate * seconds * 1.2))
        traffic.start()
        deadline = time.monotonic() + seconds
        done = 0
        next_kill = time.monotonic() + interval
        while done < kills and time.monotonic() < deadline:
            if time.monotonic() < next_kill:
                time.sleep(0.05)
                continue
            what = kill_something(procs, zk, paths, rng)
            done += 1
            next_kill = time.monotonic() + interval
            console.print(f"kill {done:2d}: {what}; delivered so far {traffic.received()}")
        traffic.wait_for_more(int(rate), timeout=60)
        report = traffic.stop(flush_timeout=60)
    finally:
        if traffic is not None:
            traffic.close()
        stop_client(zk)
        procs.stop_all()
        server.stop()
    table = Table("kills", "sent", "confirmed", "delivered", "lost", "duplicated", "publisher moves",
                  "longest pause (s)", title="chaos summary")
    table.add_row(str(done), *(str(report[k]) for k in ("sent", "confirmed", "received", "lost", "duplicated",
                                                         "publisher_moves", "longest_pause_s")))
    console.print(table)
    sys.exit(1 if report["lost"] or report["duplicated"] else 0)


if __name__ == "__main__":
    main()
