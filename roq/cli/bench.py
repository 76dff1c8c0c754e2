"""`roq bench`: throughput and latency of the running cluster (roq/tools/bench_cli.py)."""

from __future__ import annotations

import click

from roq.cli.context import Context, handle_errors, pass_ctx


@click.command()
@click.option("--queue", "queue_name", default="bench", show_default=True,
              help="queue to use; created (and deleted afterwards) if it does not exist")
@click.option("--exchanges", "-x", type=click.IntRange(1, 64), default=1, show_default=True,
              help="exchanges of the queue when it is created")
@click.option("--size", type=click.IntRange(9, 1 << 20), default=100, show_default=True, help="payload bytes")
@click.option("--messages", "-n", type=click.IntRange(1, 100_000_000), default=100_000, show_default=True,
              help="messages per publisher")
@click.option("--publishers", "-p", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--subscribers", "-s", type=click.IntRange(1, 64), default=1, show_default=True,
              help="each subscriber gets every message (fan-out)")
@click.option("--rate", type=click.FloatRange(0), default=0.0, show_default=True,
              help="total messages per second (0 = as fast as possible: the throughput, with latencies that are "
                   "mostly queueing; e.g. 10000 for the latency of a cluster that keeps up)")
@click.option("--batch", is_flag=True,
              help="use the batch API (Publisher.publish_many, Subscriber batch_callback) "
                   "instead of one call per message")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              is_flag=False, flag_value="-", help="also write the result as JSON to this file (- or no "
                                                 "FILE: stdout)")
@pass_ctx
@handle_errors
def bench(ctx: Context, queue_name: str, exchanges: int, size: int, messages: int, publishers: int,
          subscribers: int, rate: float, batch: bool, json_out: str | None) -> None:
    """Measure throughput and latency percentiles of the running cluster.

    By default at full rate: the throughput. Its latencies are then mostly time spent queueing (the
    output says so); pace it with --rate for the latency of a cluster that keeps up."""
    from roq.tools.bench_cli import run_bench
    run_bench(ctx.config, queue_name, exchanges, size, messages, publishers, subscribers, rate, json_out, batch)
