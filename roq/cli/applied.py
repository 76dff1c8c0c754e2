"""Admin commands the exchanges apply (queue purge, group reset and delete): how they are declared
and how their outcome is told."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from roq.cli.context import fail, handle_errors, json_or, pass_ctx
from roq.errors import Exit


def exchange_command(parent: click.Group, command: str, of_group: bool) -> Callable[[Callable[..., Any]], Any]:
    """An admin command the exchanges apply: `roq PARENT COMMAND QUEUE [NAME]` with --wait and --json."""
    def make(func: Callable[..., Any]) -> Any:
        func = pass_ctx(handle_errors(func))
        func = click.option("--json", "as_json", is_flag=True, help="the command's status as JSON")(func)
        func = click.option("--wait", type=click.FloatRange(0, 600), default=10.0, show_default=True,
                            help="seconds to wait for every running exchange's result")(func)
        if of_group:
            func = click.argument("name")(func)
        return parent.command(command)(click.argument("queue_name", metavar="QUEUE")(func))
    return make


def command_outcome(status: dict[str, Any], as_json: bool, what: str) -> None:
    """Say what each exchange did with an admin command; exit 1 if one refused it (a group that
    gained a member), 3 if a running one did not answer in time."""
    def say(answer: dict[str, Any]) -> None:
        from roq.tools.views import command_lines
        for line in command_lines(answer, what):
            click.echo(line)
    json_or(status, as_json, say)
    refused = {x: r["refused"] for x, r in status["results"].items() if r.get("refused")}
    if refused:
        fail(f"refused by {', '.join(f'{x} ({why})' for x, why in refused.items())}", Exit.USER_ERROR)
    if status["waiting"]:
        fail(f"no result yet from {', '.join(status['waiting'])}: they apply command {status['id']} as soon as "
             "they can", Exit.UNAVAILABLE)
