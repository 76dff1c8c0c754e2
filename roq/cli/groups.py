"""`roq group`: a queue's consumer groups (docs/work-queues.md)."""

from __future__ import annotations

import click

from roq.cli.applied import command_outcome, exchange_command
from roq.cli.context import Context, handle_errors, json_or, pass_ctx


@click.group()
def group() -> None:
    """List, show, reset and delete a queue's consumer groups (docs/work-queues.md)."""


@group.command("list")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--json", "as_json", is_flag=True, help="{group: figures}")
@pass_ctx
@handle_errors
def group_list(ctx: Context, queue_name: str, as_json: bool) -> None:
    """The consumer groups of QUEUE: members, ready, delayed, in flight, acked, lag."""
    with ctx.admin() as admin:
        groups = admin.list_groups(queue_name)
    from roq.tools.views import print_group_list
    json_or(groups, as_json, lambda shown: print_group_list(queue_name, shown))


@group.command("show")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def group_show(ctx: Context, queue_name: str, name: str, as_json: bool) -> None:
    """Consumer group NAME of QUEUE: its figures, in all and on each exchange."""
    _check_group(name)
    with ctx.admin() as admin:
        shown = admin.describe_group(queue_name, name)
    from roq.tools.views import print_group
    json_or(shown, as_json, print_group)


@exchange_command(group, "reset", of_group=True)
def group_reset(ctx: Context, queue_name: str, name: str, wait: float, as_json: bool) -> None:
    """Drop the ready and delayed messages of group NAME (admin). Its members stay, and keep what
    they hold."""
    _check_group(name)
    with ctx.admin() as admin:
        status = admin.reset_group(queue_name, name, wait=wait)
    command_outcome(status, as_json, f"reset group {name} of queue {queue_name}")


@exchange_command(group, "delete", of_group=True)
def group_delete(ctx: Context, queue_name: str, name: str, wait: float, as_json: bool) -> None:
    """Delete group NAME with its messages (admin); refused while it has members."""
    _check_group(name)
    with ctx.admin() as admin:
        status = admin.delete_group(queue_name, name, wait=wait)
    command_outcome(status, as_json, f"deleted group {name} of queue {queue_name}")


def _check_group(name: str) -> None:
    """A bad group name is one line, exit 1, before anything connects."""
    from roq.names import check_group_name
    check_group_name(name)
