"""`roq bench` against a running cluster: a queue, the harness of roq.tools.bench, a table and JSON.

Throughput is measured at full rate (the default); latency means what it says at a rate the cluster
keeps up with (--rate), and the output says so. Ctrl-C at any point stops the worker processes
(within roq.tools.bench.WORKER_STOP_WAIT), deletes the queue if `roq bench` created it (within
roq.tools.own_queue.CLEANUP_WAIT, else a line says it is left) and leaves through
`KeyboardInterrupt` (the command prints "interrupted" and exits 130)."""

from __future__ import annotations

import json
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from roq.client.admin import Admin
from roq.config import Config
from roq.errors import QueueNotFoundError, RequestTimeoutError
from roq.tools.bench import RunResult, run
from roq.tools.own_queue import delete_queue_within, maybe_applied

console = Console(stderr=True)


def run_bench(config: Config, queue: str, exchanges: int, size: int, messages: int, publishers: int,
              subscribers: int, rate: float, json_out: str | None, batch: bool = False) -> RunResult:
    """One run of the harness; `batch` measures the batch API (publish_many, batch_callback)."""
    adapter = "roq.tools.bench.RoqBatchAdapter" if batch else "roq.tools.bench.RoqAdapter"
    created = False
    try:
        created = ensure_queue(config, queue, exchanges)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("deliveries", total=messages * publishers * subscribers)
            result = run(adapter, {"config": config.to_json(), "queue": queue}, size, messages,
                         publishers, subscribers, rate,
                         on_progress=lambda done, total: progress.update(task, completed=done))
    finally:
        if created:
            delete_queue_within(config, queue)
    from roq.tools.views import out
    out(stderr=True).print(result_table([result]))  # whole rows when stderr is not a terminal
    note = latency_note(result)
    if note:
        out(stderr=True).print(note, highlight=False)
    if json_out:
        text = json.dumps(result.to_json(), indent=2)
        if json_out == "-":
            sys.stdout.write(text + "\n")
        else:
            with open(json_out, "w") as out:
                out.write(text + "\n")
    return result


PACED_RATE = 10_000  # msg/s: the rate docs/benchmarks.md measures latency at
KEPT_UP = 0.9  # a paced run delivering less than this share of --rate could not keep up


def latency_note(result: RunResult) -> str | None:
    """Why the latency figures are what they are, when they are mostly time spent waiting in queues."""
    if not result.rate:
        return ("note: at full rate (no --rate) each message waits behind the others in the publisher, the "
                "sockets and the subscriber, so these latencies are mostly that wait: they measure a saturated "
                f"cluster. For the latency of one that keeps up, pace it: --rate {PACED_RATE} (p50 about 0.7 ms "
                "on 2 vCPUs, docs/benchmarks.md).")
    if result.msgs_per_s < KEPT_UP * result.rate:
        return (f"note: the cluster delivered {result.msgs_per_s:,.0f} msg/s, below --rate {result.rate:,.0f}: "
                "messages queued up, and these latencies are mostly that wait. Try a lower --rate.")
    return None


def ensure_queue(config: Config, queue: str, exchanges: int, replicas: int | None = None,
                 timeout: float = 30.0) -> bool:
    """Create the queue if needed and wait for its exchanges (and, with `replicas` 2, for every
    exchange's replica: until then nothing is confirmed); True if we created it. Should that fail or
    a Ctrl-C come meanwhile, the queue is deleted again (see delete_queue_within)."""
    asked = created = False
    try:
        with Admin(config) as admin:
            try:
                admin.describe_queue(queue)
                return False
            except QueueNotFoundError:
                asked = True
            admin.create_queue(queue, exchanges=exchanges, replicas=replicas)
            created = True
            info = admin.wait_running(queue, exchanges, timeout=timeout)
            if replicas == 2:
                _wait_replicas(admin, queue, [x["id"] for x in info["exchanges"]], timeout)
    except BaseException as exc:  # Ctrl-C or a time-out: the caller never learns it created the queue
        if created or (asked and maybe_applied(exc)):
            delete_queue_within(config, queue)
        raise
    return True


def _wait_replicas(admin: Admin, queue: str, xids: list[str], timeout: float) -> None:
    """Until the replica of each of `xids` runs, as the GCMs tell it (no ZooKeeper session)."""
    from roq.client.metadata import MetadataClient
    from roq.client.topology import QueueTopology
    metadata = MetadataClient(admin.config)
    topology = QueueTopology(metadata, queue)
    try:
        deadline = time.monotonic() + timeout
        while not all(xid in topology.replicas for xid in xids):
            if time.monotonic() > deadline:
                raise RequestTimeoutError(f"the replicas of queue {queue!r} were not running after {timeout:.0f}s")
            time.sleep(0.1)
    finally:
        topology.close()
        metadata.close()


def result_table(results: list[RunResult], baseline: RunResult | None = None) -> Table:
    table = Table(title="benchmark")
    for column in ("system", "size", "pub×sub", "rate", "msgs/s", "MB/s", "p50 µs", "p99 µs", "p99.9 µs",
                   "lost"):
        table.add_column(column, justify="left" if column == "system" else "right")
    if baseline:
        table.add_column("× raw", justify="right")
    for r in results:
        row = [r.system, str(r.size), f"{r.publishers}×{r.subscribers}", f"{r.rate:,.0f}" if r.rate else "max",
               f"{r.msgs_per_s:,.0f}", f"{r.mb_per_s:,.1f}", f"{r.p50_us:,.0f}", f"{r.p99_us:,.0f}",
               f"{r.p999_us:,.0f}", str(r.lost)]
        if baseline:
            row.append(f"{r.msgs_per_s / baseline.msgs_per_s:.2f}" if baseline.msgs_per_s else "-")
        table.add_row(*row)
    return table
