"""`roq web`: the web console and HTTP API (docs/http.md), and its tokens."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from roq.cli.context import Context, fail, handle_errors, pass_ctx
from roq.errors import Exit


@click.group(invoke_without_command=True)
@click.option("--bind", help="address to listen on (web.bind, default 127.0.0.1)")
@click.option("--port", type=click.IntRange(0, 65535), help="port (web.port, default 8080; 0 = any free one)")
@click.pass_context
@handle_errors
def web(click_ctx: click.Context, bind: str | None, port: int | None) -> None:
    """Serve the web console and HTTP API (docs/http.md) until Ctrl-C.

    `roq web token add NAME --role admin|client` makes the tokens web.auth asks for."""
    if click_ctx.invoked_subcommand is not None:
        return
    ctx = click_ctx.find_object(Context)
    assert ctx is not None
    overrides = {k: v for k, v in (("bind", bind), ("port", port)) if v is not None}
    config = ctx.config.replace(web=overrides) if overrides else ctx.config
    from roq.client.admin import Admin
    from roq.daemon import Stop, install_signal_handlers
    from roq_web.daemon import serve
    with Admin(config) as admin:  # as every command: one line, at once, when no GCM is at the seeds
        admin.call("ping")
    stop = Stop()  # the gateway asks the GCMs of cluster.seeds; it opens no ZooKeeper session
    install_signal_handlers(stop)
    code = serve(config, stop, announce=True)
    if stop.signal == signal.SIGINT:
        raise KeyboardInterrupt  # "interrupted", exit 130, as every command on Ctrl-C
    sys.exit(code)


@web.group()
def token() -> None:
    """Tokens for the console and HTTP API."""


@token.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(["admin", "client"]), required=True,
              help="admin: may change the cluster; client: may read, publish and subscribe")
@click.option("--file", "path", type=click.Path(dir_okay=False), help="tokens file (default: web.tokens_file)")
@pass_ctx
@handle_errors
def token_add(ctx: Context, name: str, role: str, path: str | None) -> None:
    """Make a token for NAME, print it once (only its hash is stored in the tokens file)."""
    from roq_web.auth import add_token
    path = path or ctx.config.web.tokens_file
    if not path:
        fail("give --file, or set web.tokens_file", Exit.USAGE)
    click.echo(add_token(Path(path), name, role))
    click.echo(f"token {name!r} ({role}) added to {path}: keep it secret, it is not shown again", err=True)
