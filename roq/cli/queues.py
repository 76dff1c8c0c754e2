"""`roq queue`: create, delete, scale, list and inspect queues, and their autoscaling rules."""

from __future__ import annotations

import json
from typing import Any

import click

from roq.cli.applied import command_outcome, exchange_command
from roq.cli.context import Context, handle_errors, json_or, pass_ctx, shown_by
from roq.errors import UserError
from roq.names import MAX_EXCHANGES


class _Units(click.ParamType):
    """A command-line value in human units (roq/storage_policy.py): a bad one is a usage error
    (exit 2) that says which units work."""

    def __init__(self, name: str, parse_name: str) -> None:
        self.name, self._parse_name = name, parse_name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        from roq import storage_policy
        try:
            return getattr(storage_policy, self._parse_name)(value)
        except UserError as exc:
            self.fail(str(exc), param, ctx)


DURATION = _Units("duration", "parse_duration")
SIZE = _Units("size", "parse_size")
RETENTION_HELP = "how long frames wait on the exchanges' disks: 30m, 24h, 7d, 2w (0 = no age limit)"
RETENTION_BYTES_HELP = "bytes of frames each exchange keeps on disk: 512MiB, 50GiB, 1TB (0 = no size limit)"


@click.group()
def queue() -> None:
    """Create, delete, list and inspect queues."""


@queue.command("create")
@click.argument("name")
@click.option("--exchanges", "-x", type=click.IntRange(1, MAX_EXCHANGES), default=None,
              help="exchanges serving it (default 1)")
@click.option("--replicas", type=click.IntRange(1, 2), default=None,
              help="2: each exchange copies its stream to a replica on another host (default: the "
                   "leader's gcm.default_replicas)")
@click.option("--retention", type=DURATION, default=None,
              help=RETENTION_HELP + "; default: the leader's gcm.default_retention")
@click.option("--retention-bytes", type=SIZE, default=None,
              help=RETENTION_BYTES_HELP + "; default: the leader's gcm.default_retention_bytes")
@click.option("--if-not-exists", "exist_ok", is_flag=True,
              help="a queue of that name is success if it has the settings given (else an error says what "
                   "differs)")
@pass_ctx
@handle_errors
def queue_create(ctx: Context, name: str, exchanges: int | None, replicas: int | None, retention: float | None,
                 retention_bytes: int | None, exist_ok: bool) -> None:
    """Create queue NAME served by --exchanges exchanges.

    Without --retention and --retention-bytes (and with the leader's defaults 0) the queue keeps
    frames in its exchanges' memory only; with either, they wait on disk (docs/guarantees.md)."""
    with ctx.admin() as admin:
        info = admin.create_queue(name, exchanges, replicas, exist_ok=exist_ok, retention=retention,
                                  retention_bytes=retention_bytes)
    replicated = info.get("replicas", 1) == 2
    hosts = ", ".join(f"{x['id']}@{x['host'] or 'unplaced'}"
                      + (f" (replica @{x.get('replica') or 'unplaced'})" if replicated else "")
                      for x in info["exchanges"])
    from roq.storage_policy import policy_of
    click.echo(f"{'queue ' + name + ' exists' if info.get('existed') else 'created queue ' + name}: {hosts}; "
               f"{policy_of(info['settings']).describe()}")


@queue.command("delete")
@click.argument("name")
@click.option("--if-empty", is_flag=True, help="only if it holds no message: nothing retained, no group backlog")
@click.option("--if-unused", is_flag=True, help="only if no publisher, subscriber or group member uses it")
@pass_ctx
@handle_errors
def queue_delete(ctx: Context, name: str, if_empty: bool, if_unused: bool) -> None:
    """Delete queue NAME and stop its exchanges.

    --if-empty and --if-unused are judged by the leader from the exchanges' latest statistics
    (about a second old at most); when they do not hold, the queue is kept and the command fails."""
    with ctx.admin() as admin:
        admin.delete_queue(name, if_empty=if_empty, if_unused=if_unused)
    click.echo(f"deleted queue {name}")


@exchange_command(queue, "purge", of_group=False)
def queue_purge(ctx: Context, queue_name: str, wait: float, as_json: bool) -> None:
    """Drop what QUEUE holds (admin): its retained messages and every consumer group's ready
    and delayed messages; those in flight at group members stay theirs.

    What a purge does to subscribers, replicas and journals: docs/work-queues.md, "Managing groups"."""
    with ctx.admin() as admin:
        status = admin.purge_queue(queue_name, wait=wait)
    command_outcome(status, as_json, f"purged queue {queue_name}")


@queue.command("scale")
@click.argument("name")
@click.argument("exchanges", type=click.IntRange(1, MAX_EXCHANGES))
@pass_ctx
@handle_errors
def queue_scale(ctx: Context, name: str, exchanges: int) -> None:
    """Set the number of exchanges of queue NAME."""
    with ctx.admin() as admin:
        info = admin.scale_queue(name, exchanges)
    click.echo(f"queue {name} now has {len(info['exchanges'])} exchanges")


@queue.command("set")
@click.argument("name")
@click.option("--retention", type=DURATION, default=None, help=RETENTION_HELP)
@click.option("--retention-bytes", type=SIZE, default=None, help=RETENTION_BYTES_HELP)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output: the queue as `queue show --json`")
@pass_ctx
@handle_errors
def queue_set(ctx: Context, name: str, retention: float | None, retention_bytes: int | None, as_json: bool) -> None:
    """Change queue NAME's storage policy (admin). Its running exchanges take it at once, none is
    restarted: a shorter policy deletes what it no longer covers, a longer one keeps more from now on."""
    if retention is None and retention_bytes is None:
        raise click.UsageError("give --retention, --retention-bytes or both")
    with ctx.admin() as admin:
        info = admin.set_queue(name, retention, retention_bytes)
    from roq.storage_policy import policy_of
    json_or(info, as_json, lambda answer: click.echo(f"queue {name}: {policy_of(answer['settings']).describe()}"))


@queue.command("rebalance")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help='{"moves": [{queue, exchange, replica, from, to}], "waiting"}')
@pass_ctx
@handle_errors
def queue_rebalance(ctx: Context, name: str | None, as_json: bool) -> None:
    """Even the spread of queue NAME's exchanges and replicas over the hosts now (default: every
    queue), as the leader does by itself (gcm.rebalance). Moves lose nothing: publishers move and
    resend, subscribers follow."""
    with ctx.admin() as admin:
        answer = admin.rebalance(name)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    for move in answer["moves"]:
        what = "replica of " if move["replica"] else ""
        click.echo(f"moved {what}{move['queue']}/{move['exchange']}: {move['from']} -> {move['to']}")
    if answer.get("waiting"):
        click.echo(f"nothing moved: {answer['waiting']} (moves wait until every exchange runs where it is "
                   "placed); try again shortly")
    elif not answer["moves"]:
        click.echo(f"{'queue ' + name if name else 'every queue'} is already as even as the hosts allow")


@queue.command("list")
@click.option("--json", "as_json", is_flag=True,
              help='machine-readable output: [{"name", "exchanges", "replicas", "placed", "running", "retention", '
                   '"retention_bytes"}, ...]')
@pass_ctx
@handle_errors
def queue_list(ctx: Context, as_json: bool) -> None:
    """List the queues."""
    with ctx.admin() as admin:
        queues = admin.list_queues()
    json_or(queues, as_json, shown_by("print_queue_list"))


@queue.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True,
              help='machine-readable output: {"name", "settings", "replicas", "retention", "retention_bytes", '
                   '"exchanges": [{"id", "host", "live", "replica", "replica_live"}, ...]}; the figures of each '
                   'running exchange, consumer groups included, under live.stats')
@pass_ctx
@handle_errors
def queue_show(ctx: Context, name: str, as_json: bool) -> None:
    """Show queue NAME: its exchanges (and replicas), where they run, their endpoints, and its
    consumer groups (members, ready, in flight, acked, lag)."""
    with ctx.admin() as admin:
        info = admin.describe_queue(name)
    json_or(info, as_json, shown_by("print_queue"))


@queue.command("rules")
@click.argument("name")
# Out of range is a usage error (exit 2) like any other bad flag; the leader checks the rules again.
@click.option("--max-rate", type=click.FloatRange(0), help="msg/s one exchange may receive before the queue scales "
              "out (0 = off)")
@click.option("--max-publishers", type=click.IntRange(0), help="publishers per exchange before it scales out (0 = off)")
@click.option("--max-cpu", type=click.FloatRange(0, 100),
              help="CPU percent of a host running the queue before it scales out (0 = off)")
@click.option("--max-memory", type=click.FloatRange(0, 100),
              help="memory percent of such a host before it scales out (0 = off)")
@click.option("--min", "min_exchanges", type=click.IntRange(1, MAX_EXCHANGES), help="fewest exchanges")
@click.option("--max", "max_exchanges", type=click.IntRange(1, MAX_EXCHANGES), help="most exchanges")
@click.option("--scale-in-below", type=click.FloatRange(0, 1),
              help="scale in when one exchange fewer would run below this fraction of the limits")
@click.option("--clear", is_flag=True, help="remove all rules first (back to a fixed size)")
@click.option("--json", "as_json", is_flag=True,
              help="machine-readable output: the rules after any change, by their stored names "
                   "(max_rate, min_exchanges, ...)")
@pass_ctx
@handle_errors
def queue_rules(ctx: Context, name: str, clear: bool, as_json: bool, **values: Any) -> None:
    """Show or set the autoscaling rules of queue NAME."""
    changes = {k: v for k, v in values.items() if v is not None}
    with ctx.admin() as admin:
        rules = admin.queue_rules(name, changes if changes or clear else None, clear)
    json_or(rules, as_json, lambda answer: shown_by("print_rules")(name, answer))
