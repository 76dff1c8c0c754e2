"""`roq keys`: CURVE keys and what each key may do (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from roq.cli.context import Context, fail, handle_errors, json_or, pass_ctx
from roq.errors import Exit


@click.group()
def keys() -> None:
    """CURVE keys for an authenticated, encrypted cluster, and what each may do (docs/security.md)."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--client", "clients", multiple=True, metavar="NAME", help="a publisher/subscriber key (repeatable)")
@click.option("--admin", "admins", multiple=True, metavar="NAME", help="an administrator key (repeatable)")
@handle_errors
def keys_generate(directory: str, clients: tuple[str, ...], admins: tuple[str, ...]) -> None:
    """Create DIRECTORY's server keypair if missing, plus new client and admin keypairs.

    Nothing is ever overwritten. Daemons need server.key_secret, clients/*.key and admins/*.key;
    a client needs server.key and its own NAME.key_secret (set security.identity = "clients/NAME")."""
    from roq.security import generate_keys
    for path in generate_keys(directory, list(clients), list(admins)):
        click.echo(f"wrote {path}")
    exposed = _unignored_git_tree(Path(directory))
    if exposed:
        click.echo(f"roq: warning: {directory} is inside the git work tree {exposed} and not ignored: its "
                   f"secret keys could be committed (add it to {exposed}/.gitignore, or keep keys elsewhere)",
                   err=True)


def _rights_command(command: str, admin_help: str) -> Callable[[Callable[..., Any]], Any]:
    """`roq keys COMMAND NAME` with --publish, --subscribe, --consume (repeatable queue patterns)
    and --admin."""
    def make(func: Callable[..., Any]) -> Any:
        func = pass_ctx(handle_errors(func))
        func = click.option("--admin", is_flag=True, help=admin_help)(func)
        for right, verb in (("consume", "consume (consumer groups) from"),
                            ("subscribe", "subscribe to (and fetch from)"), ("publish", "publish to")):
            func = click.option(f"--{right}", multiple=True, metavar="PATTERN",
                                help=f"queues (a name, or a pattern with * and ?) the key may {verb}; repeatable")(func)
        return keys.command(command)(click.argument("name")(func))
    return make


@_rights_command("grant", "may administer the cluster (as a key under admins/)")
def keys_grant(ctx: Context, name: str, publish: tuple[str, ...], subscribe: tuple[str, ...],
               consume: tuple[str, ...], admin: bool) -> None:
    """Give key NAME (clients/NAME.key or admins/NAME.key) rights on the queues matching PATTERNs.

    Adds to what NAME has; a key without an entry has security.default_permissions. Enforced at the
    exchanges' handshakes with security.curve on (docs/security.md "Permissions")."""
    if not (publish or subscribe or consume or admin):
        fail("name at least one right: --publish, --subscribe, --consume (PATTERN) or --admin", Exit.USAGE)
    _check_rights(name, publish, subscribe, consume)
    with ctx.admin() as client:
        answer = client.grant(name, publish, subscribe, consume, admin)
    _say_permissions(answer, "granted" if answer["changed"] else "unchanged (it had them)")


@_rights_command("revoke", "may no longer administer (a key under admins/ still does)")
def keys_revoke(ctx: Context, name: str, publish: tuple[str, ...], subscribe: tuple[str, ...],
                consume: tuple[str, ...], admin: bool) -> None:
    """Take PATTERNs (as they were granted) from key NAME; with none named, every right.

    A key whose rights are all revoked keeps an empty entry: it may use no queue, whatever
    security.default_permissions says (`roq keys reset NAME` removes the entry). Connections the key
    opened before stay until they close; new ones are refused."""
    _check_rights(name, publish, subscribe, consume)
    with ctx.admin() as client:
        answer = client.revoke(name, publish, subscribe, consume, admin)
    _say_permissions(answer, "revoked" if answer["changed"] else "unchanged")


@keys.command("reset")
@click.argument("name")
@pass_ctx
@handle_errors
def keys_reset(ctx: Context, name: str) -> None:
    """Remove key NAME's entry: it gets security.default_permissions again."""
    _check_rights(name, (), (), ())
    with ctx.admin() as client:
        answer = client.reset_permissions(name)
    _say_permissions(answer, "entry removed" if answer["changed"] else "had no entry")


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help='{"default", "enforced", "version", "keys": [...]}')
@pass_ctx
@handle_errors
def keys_list(ctx: Context, as_json: bool) -> None:
    """Every key's permissions (admin only)."""
    with ctx.admin() as client:
        table = client.permissions()
    json_or(table, as_json, _print_permissions)


def _print_permissions(table: dict[str, Any]) -> None:
    from roq.tools.views import print_permissions
    print_permissions(table)
    _warn_unenforced(table)


@keys.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@handle_errors
def keys_show(ctx: Context, name: str, as_json: bool) -> None:
    """What key NAME may do (an admin may show any key, a key its own)."""
    _check_rights(name, (), (), ())
    with ctx.admin() as client:
        answer = client.key_permissions(name)
    json_or(answer, as_json, lambda shown: _say_permissions(shown, ""))


def _check_rights(name: str, *patterns: tuple[str, ...]) -> None:
    """Names and patterns checked here, before any connection: a typo is one line, exit 1."""
    from roq.permissions import check_key_name, check_pattern
    check_key_name(name)
    for pattern in (p for group in patterns for p in group):
        check_pattern(pattern)


def _say_permissions(answer: dict[str, Any], what: str) -> None:
    from roq.permissions import Entry, describe
    entry = Entry.from_json(answer["entry"]) if answer.get("entry") is not None else None
    where = answer.get("certificate")
    admin = " (admin: its certificate is under admins/)" if where and where.startswith("admins/") else ""
    click.echo(f"key {answer['name']}{': ' + what if what else ''}: {describe(entry, answer['default'])}{admin}")
    if answer["enforced"] and where is None:
        click.echo(f"roq: warning: the leader has no certificate clients/{answer['name']}.key or "
                   f"admins/{answer['name']}.key: no connection uses these rights until one is made", err=True)
    _warn_unenforced(answer)


def _warn_unenforced(answer: dict[str, Any]) -> None:
    if not answer["enforced"]:
        click.echo("roq: warning: the cluster runs without security.curve: there are no key identities, so "
                   "permissions are kept but enforced only once security.curve is on", err=True)


def _unignored_git_tree(directory: Path) -> str | None:
    """The git work tree holding `directory` if git would not ignore a file in it; None otherwise
    (not in a work tree, ignored, or no git here)."""
    import subprocess
    probe = directory.absolute() / "server.key_secret"
    try:
        top = subprocess.run(["git", "-C", str(directory), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, timeout=10)
        if top.returncode != 0:
            return None
        ignored = subprocess.run(["git", "-C", str(directory), "check-ignore", "-q", str(probe)],
                                 capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return None if ignored.returncode == 0 else top.stdout.strip()
