"""`roq cluster` and `roq demo`: a whole cluster on this machine (roq/tools/cluster.py)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from roq.cli.context import Context, handle_errors, json_or, pass_ctx, shown_by
from roq.errors import Exit

if TYPE_CHECKING:
    from roq.config import Config


@click.group()
def cluster() -> None:
    """Run a whole cluster on this machine (ZooKeeper + GCMs + HCMs)."""


@cluster.command("up")
@click.option("--gcms", type=click.IntRange(1, 9), default=None, help="number of GCMs (default 2)")
@click.option("--hcms", type=click.IntRange(1, 32), default=None, help="number of HCMs (default 2)")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None)
@pass_ctx
@handle_errors
def cluster_up(ctx: Context, gcms: int | None, hcms: int | None, run_dir: str | None) -> None:
    """Start ZooKeeper, the GCMs and the HCMs in the background.

    Over a cluster of which a process died (ZooKeeper, a GCM, an HCM), it starts again what is
    missing. ZooKeeper keeps its port from the previous run when it is free.

    The settings it is started with persist in the run directory's config.toml: a later `up` there
    starts from them, with what it is given (--set, a file, the environment) applied on top and
    persisted; it prints what it kept and what changed."""
    from roq.tools.cluster import LocalCluster
    changes = {k: v for k, v in {"gcms": gcms, "hcms": hcms, "run_dir": run_dir}.items() if v is not None}
    cfg = _local_cluster_config(ctx, changes, say=click.echo)
    local = LocalCluster(cfg)
    state = local.up(progress=lambda text: click.echo(f"  {text}", err=True))
    if local.restarted:
        click.echo(f"restarted {', '.join(local.restarted)} in {state.run_dir}; the rest was running")
    counts = Counter(p["role"] for p in state.processes)
    click.echo(f"cluster up in {state.run_dir}: ZooKeeper at {state.zk_hosts}, "
               f"{counts['gcm']} GCMs, {counts['hcm']} HCMs")
    if local.queues_back:
        shown = ", ".join(local.queues_back[:10]) + (", ..." if len(local.queues_back) > 10 else "")
        click.echo(f"brought back {len(local.queues_back)} saved queue{'s' * (len(local.queues_back) != 1)}: {shown}")
    click.echo(f"configuration: {local.config_path}")


def _local_cluster_config(ctx: Context, changes: dict[str, Any], say: Callable[[str], None]) -> Config:
    """The settings a local cluster starts with: those its last `up` in the run directory was started
    with, under what this command gives (file, environment, --set, `changes` to [cluster]); says
    what it kept and what changed (roq/tools/cluster.py)."""
    from roq.tools.cluster import CONFIG_FILE, previous_settings, settings_report
    cfg = _base_config(ctx).replace(cluster=changes)
    previous = previous_settings(cfg.cluster.run_dir)
    if previous is not None:
        cfg = _base_config(ctx, base=previous).replace(cluster={**changes, "run_dir": cfg.cluster.run_dir})
    for line in settings_report(previous, cfg, Path(cfg.cluster.run_dir) / CONFIG_FILE):
        say(line)
    return cfg


def _base_config(ctx: Context, base: Config | None = None) -> Config:
    """`base` (the defaults unless given) + file + environment + flags, ignoring the local cluster's
    file unless it is `base`."""
    from roq.config import load_config
    return load_config(ctx.config_path or os.environ.get("ROQ_CONFIG"), flags=ctx.settings, base=base)


@cluster.command("down")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None)
@click.option("--purge", is_flag=True,
              help="also delete ZooKeeper's data (queues, rules), the logs and the hosts' data: the next "
                   "`up` starts empty")
@pass_ctx
@handle_errors
def cluster_down(ctx: Context, run_dir: str | None, purge: bool) -> None:
    """Stop the local cluster. Its queues and rules are kept for the next `up` unless --purge."""
    from roq.tools.cluster import LocalCluster
    local = LocalCluster(_base_config(ctx), run_dir)
    stopped = local.down()
    click.echo(f"stopped {stopped} processes" if stopped else "no local cluster was running")
    if purge:
        removed = local.purge()
        click.echo(f"purged {local.run_dir}: deleted {', '.join(p.name for p in removed)}" if removed
                   else f"nothing to purge in {local.run_dir}")
    elif local.kept_data():
        click.echo(f"kept ZooKeeper's data (queues, rules) in {local.kept_data()}: the next `roq cluster up` "
                   "here brings them back; `roq cluster down --purge` deletes it")


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@pass_ctx
@handle_errors
def cluster_status(ctx: Context, as_json: bool) -> None:
    """Show the leader, the GCMs, the hosts and the queues."""
    with ctx.admin() as admin:
        status = admin.status()
    json_or(status, as_json, shown_by("print_status"))



@click.command()
@click.option("--messages", "-n", type=click.IntRange(1, 10_000_000), default=200_000, show_default=True)
@click.option("--size", type=click.IntRange(1, 1 << 20), default=100, show_default=True, help="payload bytes")
@click.option("--keep", is_flag=True, help="leave the cluster running afterwards")
@pass_ctx
@handle_errors
def demo(ctx: Context, messages: int, size: int, keep: bool) -> None:
    """Start a local cluster, run a publish/subscribe round trip, print the figures."""
    from roq.tools.demo import run_demo
    ok = run_demo(_local_cluster_config(ctx, {}, say=lambda line: click.echo(line, err=True)), messages, size, keep)
    sys.exit(Exit.OK if ok else Exit.INTERNAL)
