"""`roq backup` and `roq restore` (docs/backup.md)."""

from __future__ import annotations

import click

from roq.cli.context import Context, handle_errors, pass_ctx


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--keys-dir", type=click.Path(file_okay=False), default=None,
              help="where the public keys are read (default: security.keys_dir; none: no keys)")
@pass_ctx
@handle_errors
def backup(ctx: Context, file: str, keys_dir: str | None) -> None:
    """Write the queues (exchanges, replicas, rules, settings), the permissions and the public keys to FILE.

    One versioned JSON file, replaced atomically, mode 0600 (docs/backup.md). No secret key, no
    password, no message. Reads ZooKeeper only: a reader identity will do, no leader is needed."""
    from roq.client.admin import ZK_REFUSED_FOR
    from roq.paths import Paths
    from roq.tools.backup import take, write
    from roq.zk import start_client, stop_client
    cfg = ctx.config
    client = start_client(cfg, refused_for=ZK_REFUSED_FOR)
    try:
        taken = take(client, Paths(cfg.zk.root), cfg.zk.hosts, keys_dir or cfg.security.keys_dir or None,
                     warn=lambda text: click.echo(f"roq: warning: {text}", err=True))
    finally:
        stop_client(client)
    write(file, taken)
    click.echo(f"wrote {file}: {taken.describe()}")


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True,
              help="restore into a cluster that has queues: create the missing ones, keep the others as they are")
@click.option("--keys-dir", type=click.Path(file_okay=False), default=None,
              help="where missing public keys are written (default: security.keys_dir; none: keys not restored)")
@click.option("--check", is_flag=True, help="only validate FILE and say what it holds; contact nothing")
@pass_ctx
@handle_errors
def restore(ctx: Context, file: str, force: bool, keys_dir: str | None, check: bool) -> None:
    """Rebuild the queues, permissions and public keys of backup FILE on an empty cluster.

    The whole file is checked first; a cluster with any queue or permission entry is refused without
    --force, and nothing changes. The leader grants the permissions, then creates the queues and
    places their exchanges anew; public keys are written only where missing (a different one is
    reported, never overwritten)."""
    from roq.tools.backup import entries_text, load, plural
    from roq.tools.restore import plan, restore_keys, restore_permissions, restore_queues
    loaded = load(file)
    if check:
        click.echo(f"{file}: valid {loaded.describe()}")
        return
    from roq.client.admin import ZK_REFUSED_FOR
    from roq.paths import Paths
    from roq.zk import start_client, stop_client
    paths = Paths(ctx.config.zk.root)
    client = start_client(ctx.config, refused_for=ZK_REFUSED_FOR)  # an operator's reader identity
    try:
        todo = plan(client, paths, loaded, force)
    finally:
        stop_client(client)
    with ctx.admin() as admin:
        click.echo(f"restoring the {loaded.describe()} into {paths.root}")
        target = keys_dir or ctx.config.security.keys_dir
        if not any(loaded.keys.files()):
            keys = "none in the backup"
        elif not target:
            keys = "not restored (no security.keys_dir nor --keys-dir)"
        else:
            report = restore_keys(target, loaded.keys)
            for relative in report.differ:
                click.echo(f"kept {target}/{relative}: it holds another key than the backup's", err=True)
            keys = (f"{len(report.written)} written into {target}, {len(report.same)} already there, "
                    f"{len(report.differ)} different (kept)")
        granted = restore_permissions(admin, todo, click.echo)
        created = restore_queues(admin, todo, click.echo)
    click.echo(f"restored {plural(created, 'queue')} ({len(todo.keep)} kept as they were), "
               f"{entries_text(granted)} ({len(todo.kept_entries)} kept as they were); "
               f"public keys: {keys}")
