"""`roq config`: the effective configuration."""

from __future__ import annotations

import json

import click

from roq.cli.context import Context, handle_errors, pass_ctx


@click.group()
def config() -> None:
    """Inspect the configuration."""


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output: {section: {key: value}}")
@pass_ctx
@handle_errors
def config_show(ctx: Context, as_json: bool) -> None:
    """Print the effective configuration (file → environment → flags) as TOML, passwords hidden."""
    if as_json:
        click.echo(json.dumps(ctx.config.redacted().to_dict(), indent=2))
        return
    click.echo(f"# source: {ctx.source or 'defaults'}")
    click.echo(ctx.config.redacted().to_toml())
