"""`roq stats` and `roq pipeline`: the cluster's figures, live and through Spark."""

from __future__ import annotations

import json
import sys

import click

from roq.cli.context import Context, handle_errors, pass_ctx
from roq.errors import Exit, QueueExistsError, UserError


@click.command()
@click.option("--once", is_flag=True, help="print one view and exit")
@click.option("--json", "as_json", is_flag=True, help="print the leader's aggregates as JSON and exit")
@click.option("--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True)
@pass_ctx
@handle_errors
def stats(ctx: Context, once: bool, as_json: bool, interval: float) -> None:
    """Live view of queues, exchanges and hosts (Ctrl-C to leave)."""
    from roq.tools.views import live_stats, stats_view
    with ctx.admin() as admin:
        if as_json:
            click.echo(json.dumps(admin.cluster_stats(), indent=2))
        elif once:
            from roq.tools.views import out
            out().print(stats_view(admin.cluster_stats()))  # whole rows when piped
        else:
            live_stats(admin.cluster_stats, interval)


@click.group()
def pipeline() -> None:
    """The Spark statistics pipeline (needs the spark extra: pip install -e '.[spark]' from the checkout)."""


@pipeline.command("stats")
@click.option("--output", default=".roq/pipeline", show_default=True, type=click.Path(file_okay=False))
@click.option("--window", type=click.IntRange(1, 86400), default=10, show_default=True, help="seconds")
@click.option("--once", is_flag=True, help="aggregate what the exchanges retain now, then stop")
@click.option("--duration", type=float, default=0, help="stop after this many seconds (0 = until Ctrl-C)")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL")
@pass_ctx
@handle_errors
def pipeline_stats(ctx: Context, output: str, window: int, once: bool, duration: float, master: str) -> None:
    """Consume the cluster's statistics stream; write windowed aggregates to Parquet.

    Ctrl-C stops it cleanly (the running micro-batch finishes) and exits 130; --duration exits 0.
    The leader publishes the stream while queue gcm.stats_queue exists: a queue this command
    created is deleted when it ends (create it yourself to keep the stream going)."""
    from roq.spark.pipeline import require_extra, require_java, run_stats_job
    from roq.tools.own_queue import maybe_applied
    require_extra("pyspark", "pyarrow", "pandas")
    require_java()
    queue_name = ctx.config.gcm.stats_queue
    if not queue_name:
        raise UserError("gcm.stats_queue is empty: the statistics stream is off")
    created = False
    args = ["--seeds", ctx.config.cluster.seeds, "--root", ctx.config.zk.root, "--queue", queue_name,
            "--output", output, "--window", str(window), "--duration", str(duration), "--master", master]
    args += ["--once"] if once else []
    try:
        with ctx.admin() as admin:
            try:
                admin.create_queue(queue_name, exchanges=1)
            except QueueExistsError:
                pass
            except BaseException as exc:
                created = maybe_applied(exc)  # then delete it on the way out all the same
                raise
            else:
                created = True
                click.echo(f"created queue {queue_name}: the leader publishes statistics to it until this "
                           "pipeline ends", err=True)
        code = run_stats_job(args)
    finally:
        if created:  # also on Ctrl-C: nothing else would stop the leader's 6 records a second
            _delete_stats_queue(ctx, queue_name)
    if code == Exit.INTERRUPTED:
        raise KeyboardInterrupt
    if code:
        sys.exit(code)  # the driver said why, in one line
    click.echo(f"aggregates in {output}/exchanges and {output}/hosts", err=True)


def _delete_stats_queue(ctx: Context, queue_name: str) -> None:
    from roq.tools.own_queue import delete_queue_within
    if delete_queue_within(ctx.config, queue_name):  # bounded: a line says so if it could not
        click.echo(f"deleted queue {queue_name}: the leader no longer publishes statistics", err=True)


@pipeline.command("report")
@click.option("--input", "input_dir", default=".roq/pipeline", show_default=True,
              type=click.Path(file_okay=False))
@click.option("--out", default=".roq/pipeline/report.png", show_default=True, type=click.Path(dir_okay=False))
@handle_errors
def pipeline_report(input_dir: str, out: str) -> None:
    """Render the aggregates as a PNG chart and print a summary."""
    from roq.spark.pipeline import require_extra
    require_extra("pyarrow", "pandas", "matplotlib")
    from roq.spark.report import report
    click.echo(report(input_dir, out))
    click.echo(f"chart: {out}", err=True)
