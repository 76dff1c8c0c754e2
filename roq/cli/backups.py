"""`roq backup` and `roq restore` (docs/backup.md): both through the leader's control API
(`backup.export`, `restore`: docs/protocol.md section 2), never ZooKeeper."""

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
    password, no message. The leader answers (an admin key, or the daemons' own, with CURVE on)."""
    from roq.tools.backup import fetch, write
    cfg = ctx.config
    with ctx.admin() as admin:
        taken = fetch(admin, keys_dir or cfg.security.keys_dir or None,
                      warn=lambda text: click.echo(f"roq: warning: {text}", err=True))
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
    from roq.tools.restore import apply, plan, report_kept, restore_keys
    loaded = load(file)
    if check:
        click.echo(f"{file}: valid {loaded.describe()}")
        return
    with ctx.admin() as admin:
        todo = plan(admin, loaded, force)  # the leader's dry run: refused here, nothing has changed
        click.echo(f"restoring the {loaded.describe()} into {todo['root']}")
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
        report_kept(todo, click.echo)
        granted, created = apply(admin, loaded, click.echo)
    click.echo(f"restored {plural(len(created), 'queue')} ({len(todo['kept'])} kept as they were), "
               f"{entries_text(len(granted))} ({len(todo['kept_entries'])} kept as they were); "
               f"public keys: {keys}")
