"""The main job a newcomer runs: a local cluster and a publish/subscribe round trip.

Starts the cluster (unless one is running here), creates a queue with two
exchanges on two hosts, starts a subscriber on all of them and a publisher,
sends N messages with a progress bar, and reports sent/confirmed/delivered
counts and throughput. Returns False if anything was lost. A cluster it
started is stopped afterwards (unless `keep`) without its queue, so the next
`roq cluster up` here does not bring the demo's queue back.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.config import Config, load_config
from roq.errors import QueueNotFoundError, RoqError
from roq.tools.cluster import ClusterState, LocalCluster

QUEUE = "demo"
console = Console(stderr=True)


def run_demo(base: Config, messages: int, size: int, keep: bool) -> bool:
    local = LocalCluster(base)
    existing = ClusterState.load(local.run_dir)
    started = not (existing and existing.alive())
    if started:
        console.print("[bold]starting a local cluster[/] (ZooKeeper, 2 GCMs, 2 HCMs)")
        local.up(progress=lambda text: console.print(f"  {text}"))
    config = load_config(local.config_path)
    try:
        return _round_trip(config, messages, size)
    finally:
        if started and not keep:
            console.print("stopping the local cluster")
            _forget_queue(config)
            local.down()


def _forget_queue(config: Config) -> None:
    try:
        with Admin(config) as admin:
            admin.delete_queue(QUEUE)
    except RoqError as exc:  # the cluster stops anyway; the queue would only come back with it
        console.print(f"could not delete queue {QUEUE}: {exc}")


def _round_trip(config: Config, messages: int, size: int) -> bool:
    with Admin(config) as admin:
        try:
            admin.delete_queue(QUEUE)
        except QueueNotFoundError:
            pass
        info = admin.create_queue(QUEUE, exchanges=2)
        console.print("queue [bold]demo[/]: " + ", ".join(f"{x['id']} on {x['host']}" for x in info["exchanges"]))
        admin.wait_running(QUEUE, 2)
    payload = b"x" * size
    # Callback style: the subscriber counts as it receives; nothing piles up in its inbox.
    with Subscriber(QUEUE, config, topics=["demo"], callback=lambda msg: None) as sub, \
            Publisher(QUEUE, config) as pub:
        sub.wait_connected(2)
        pub.wait_for_subscribers(1)
        start = time.perf_counter()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as progress:
            sent_bar = progress.add_task("published", total=messages)
            recv_bar = progress.add_task("delivered", total=messages)
            for i in range(messages):
                pub.publish("demo", payload)
                if i % 2000 == 0:
                    progress.update(sent_bar, completed=i)
                    progress.update(recv_bar, completed=sub.received)
            progress.update(sent_bar, completed=messages)
            deadline = time.monotonic() + 60
            while sub.received < messages and time.monotonic() < deadline:
                progress.update(recv_bar, completed=sub.received)
                time.sleep(0.05)
            progress.update(recv_bar, completed=sub.received)
        elapsed = time.perf_counter() - start
        pub.flush(30)
        delivered = sub.received
        confirmed = pub.confirmed
    rate = delivered / elapsed if elapsed else 0.0
    console.print(f"sent {messages}, confirmed {confirmed}, delivered {delivered}, "
                  f"duplicates dropped {sub.duplicates}, lost {messages - delivered}")
    console.print(f"throughput: {rate:,.0f} msg/s end to end ({size}-byte payloads, "
                  f"{rate * size / 1e6:,.1f} MB/s) in {elapsed:.2f}s")
    return delivered == messages and confirmed == messages
