"""`roq`: the command line. Commands are thin: parse, check, call the library.

A user mistake or an unavailable cluster prints one line on stderr and exits
with a named code; tracebacks are for bugs only.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from roq.errors import Exit, QueueExistsError, RoqError, UserError, ZooKeeperUnavailableError
from roq.names import MAX_EXCHANGES

if TYPE_CHECKING:  # the commands import what they use: `roq --help` stays fast
    from roq.client.admin import Admin
    from roq.config import Config

DEFAULT_LOCAL_CONFIG = Path(".roq/cluster/config.toml")
# A printing group member holds one message unacked: each message a member holds when it stops (a
# closed pipe) goes back counting a delivery, so a larger prefetch and repeated `| head` runs could
# make dead letters of messages nobody read.
CLI_PREFETCH = 1
# With no configuration at all, ZooKeeper's default address is a guess: give up on it quickly.
GUESS_CONNECT_TIMEOUT = 2.5
HOW_TO_CONFIGURE = ("no cluster is configured here: point at one with --config FILE, ROQ_CONFIG=FILE or "
                    "ROQ_ZK_HOSTS=host:port, or start one in this directory with `roq cluster up`")


def fail(message: str, code: Exit) -> None:
    click.echo(f"roq: error: {message}", err=True)
    sys.exit(code)


def interrupted() -> None:
    click.echo("interrupted", err=True)
    sys.exit(Exit.INTERRUPTED)


def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except RoqError as exc:
            fail(_explained(exc), Exit.for_error(exc))  # one mapping for the command and the daemons
        except KeyboardInterrupt:
            interrupted()
    return wrapper


class RoqGroup(click.Group):
    """The `roq` group: a Ctrl-C that comes while click itself runs (between commands, in a group's
    own set-up) is "interrupted" and 130 too, not click's "Aborted!" and 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()


def _explained(exc: RoqError) -> str:
    """The error's line, plus how to name a cluster when none was named and ZooKeeper is not there."""
    ctx = click.get_current_context(silent=True)
    context = ctx.find_object(Context) if ctx else None
    if isinstance(exc, ZooKeeperUnavailableError) and context is not None and context.guessing:
        return f"{exc}; {HOW_TO_CONFIGURE}"
    return str(exc)


def check_settings(ctx: click.Context, param: click.Parameter, settings: tuple[str, ...]) -> tuple[str, ...]:
    """`--set` must name a known section.key: anything else is bad usage (exit 2), before anything runs.
    A bad value is a configuration error (exit 1), like the same value in a file."""
    from roq.config import Config
    sections = {name: set(keys) for name, keys in Config().to_dict().items()} if settings else {}
    for setting in settings:
        dotted, eq, _ = setting.partition("=")
        section, dot, key = dotted.partition(".")
        if not eq or not dot:
            fail(f"--set {setting!r}: expected SECTION.KEY=VALUE", Exit.USAGE)
        elif section not in sections:
            fail(f"--set {setting!r}: unknown section {section!r}; sections are {', '.join(sections)}", Exit.USAGE)
        elif key not in sections[section]:
            fail(f"--set {setting!r}: unknown key {section}.{key} (`roq config show` lists them)", Exit.USAGE)
    return settings


class Context:
    def __init__(self, config_path: str | None, settings: tuple[str, ...]) -> None:
        self.config_path = config_path
        self.settings = settings
        self._config: Config | None = None

    @property
    def source(self) -> str | None:
        if self.config_path:
            return self.config_path
        if os.environ.get("ROQ_CONFIG"):
            return os.environ["ROQ_CONFIG"]
        # The local cluster's file, so `roq queue ...` finds `roq cluster up`'s cluster.
        return str(DEFAULT_LOCAL_CONFIG) if DEFAULT_LOCAL_CONFIG.is_file() else None

    @property
    def guessing(self) -> bool:
        """Nothing names a cluster (no file, no ROQ_ZK_HOSTS, no --set zk.hosts): the default is a guess."""
        return (self.source is None and not os.environ.get("ROQ_ZK_HOSTS")
                and not any(s.startswith("zk.hosts=") for s in self.settings))

    @property
    def config(self) -> Config:
        if self._config is None:
            from roq.config import load_config
            guess = () if not self.guessing or os.environ.get("ROQ_ZK_CONNECT_TIMEOUT") else \
                (f"zk.connect_timeout={GUESS_CONNECT_TIMEOUT}",)  # the user's own --set still wins
            self._config = load_config(self.source, flags=(*guess, *self.settings))
        return self._config

    def admin(self) -> Admin:
        from roq.client.admin import Admin
        return Admin(self.config)


pass_ctx = click.make_pass_decorator(Context)


@click.group(cls=RoqGroup)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar=None,
              help="TOML configuration file (default: $ROQ_CONFIG, else ./.roq/cluster/config.toml if present)")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE", callback=check_settings,
              help="override a setting")
@click.version_option(package_name="roq")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, settings: tuple[str, ...]) -> None:
    """RoQ: an elastic publish/subscribe exchange cluster coordinated by ZooKeeper."""
    ctx.obj = Context(config_path, settings)
    import logging
    logging.basicConfig(level=logging.WARNING, format="roq: %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # reconnect chatter is not the user's concern


# ---------------------------------------------------------------- config

@main.group()
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


# ---------------------------------------------------------------- keys

@main.group()
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
    _json_or(table, as_json, _print_permissions)


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
    _json_or(answer, as_json, lambda shown: _say_permissions(shown, ""))


def _json_or(answer: Any, as_json: bool, view: Callable[[Any], None]) -> None:
    """The answer as JSON (--json), else through `view`."""
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    else:
        view(answer)


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


# ---------------------------------------------------------------- cluster

@main.group()
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
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    from roq.tools.views import print_status
    print_status(status)


# ---------------------------------------------------------------- queues

@main.group()
def queue() -> None:
    """Create, delete, list and inspect queues."""


@queue.command("create")
@click.argument("name")
@click.option("--exchanges", "-x", type=click.IntRange(1, MAX_EXCHANGES), default=None,
              help="exchanges serving it (default 1)")
@click.option("--replicas", type=click.IntRange(1, 2), default=None,
              help="2: each exchange copies its stream to a replica on another host (default: the "
                   "leader's gcm.default_replicas)")
@click.option("--if-not-exists", "exist_ok", is_flag=True,
              help="a queue of that name is success if it has the --exchanges and --replicas given "
                   "(else an error says what differs)")
@pass_ctx
@handle_errors
def queue_create(ctx: Context, name: str, exchanges: int | None, replicas: int | None, exist_ok: bool) -> None:
    """Create queue NAME served by --exchanges exchanges."""
    with ctx.admin() as admin:
        info = admin.create_queue(name, exchanges, replicas, exist_ok=exist_ok)
    replicated = info.get("replicas", 1) == 2
    hosts = ", ".join(f"{x['id']}@{x['host'] or 'unplaced'}"
                      + (f" (replica @{x.get('replica') or 'unplaced'})" if replicated else "")
                      for x in info["exchanges"])
    click.echo(f"{'queue ' + name + ' exists' if info.get('existed') else 'created queue ' + name}: {hosts}")


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


def _exchange_command(parent: click.Group, command: str, of_group: bool) -> Callable[[Callable[..., Any]], Any]:
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


@_exchange_command(queue, "purge", of_group=False)
def queue_purge(ctx: Context, queue_name: str, wait: float, as_json: bool) -> None:
    """Drop what QUEUE holds (admin): its retained messages and every consumer group's ready
    and delayed messages; those in flight at group members stay theirs.

    What a purge does to subscribers, replicas and journals: docs/work-queues.md, "Managing groups"."""
    with ctx.admin() as admin:
        status = admin.purge_queue(queue_name, wait=wait)
    _command_outcome(status, as_json, f"purged queue {queue_name}")


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
              help='machine-readable output: [{"name", "exchanges", "replicas", "placed", "running"}, ...]')
@pass_ctx
@handle_errors
def queue_list(ctx: Context, as_json: bool) -> None:
    """List the queues."""
    with ctx.admin() as admin:
        queues = admin.list_queues()
    if as_json:
        click.echo(json.dumps(queues, indent=2))
        return
    from roq.tools.views import print_queue_list
    print_queue_list(queues)


@queue.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True,
              help='machine-readable output: {"name", "settings", "replicas", "exchanges": [{"id", "host", "live", '
                   '"replica", "replica_live"}, ...]}; the figures of each running exchange, consumer '
                   'groups included, under live.stats')
@pass_ctx
@handle_errors
def queue_show(ctx: Context, name: str, as_json: bool) -> None:
    """Show queue NAME: its exchanges (and replicas), where they run, their endpoints, and its
    consumer groups (members, ready, in flight, acked, lag)."""
    with ctx.admin() as admin:
        info = admin.describe_queue(name)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    from roq.tools.views import print_queue
    print_queue(info)


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
    if as_json:
        click.echo(json.dumps(rules, indent=2))
        return
    from roq.tools.views import print_rules
    print_rules(name, rules)


# ---------------------------------------------------------------- consumer groups

@main.group()
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
    _json_or(groups, as_json, lambda shown: print_group_list(queue_name, shown))


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
    _json_or(shown, as_json, print_group)


@_exchange_command(group, "reset", of_group=True)
def group_reset(ctx: Context, queue_name: str, name: str, wait: float, as_json: bool) -> None:
    """Drop the ready and delayed messages of group NAME (admin). Its members stay, and keep what
    they hold."""
    _check_group(name)
    with ctx.admin() as admin:
        status = admin.reset_group(queue_name, name, wait=wait)
    _command_outcome(status, as_json, f"reset group {name} of queue {queue_name}")


@_exchange_command(group, "delete", of_group=True)
def group_delete(ctx: Context, queue_name: str, name: str, wait: float, as_json: bool) -> None:
    """Delete group NAME with its messages (admin); refused while it has members."""
    _check_group(name)
    with ctx.admin() as admin:
        status = admin.delete_group(queue_name, name, wait=wait)
    _command_outcome(status, as_json, f"deleted group {name} of queue {queue_name}")


def _check_group(name: str) -> None:
    """A bad group name is one line, exit 1, before anything connects."""
    from gcm.commands import check_group_name
    check_group_name(name)


def _command_outcome(status: dict[str, Any], as_json: bool, what: str) -> None:
    """Say what each exchange did with an admin command; exit 1 if one refused it (a group that
    gained a member), 3 if a running one did not answer in time."""
    from roq.tools.views import command_lines
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        for line in command_lines(status, what):
            click.echo(line)
    refused = {x: r["refused"] for x, r in status["results"].items() if r.get("refused")}
    if refused:
        fail(f"refused by {', '.join(f'{x} ({why})' for x, why in refused.items())}", Exit.USER_ERROR)
    if status["waiting"]:
        fail(f"no result yet from {', '.join(status['waiting'])}: they apply command {status['id']} as soon as "
             "they can", Exit.UNAVAILABLE)


# ---------------------------------------------------------------- backups

@main.command()
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


@main.command()
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
    from roq.tools.backup import entries_text, load, plan, plural, restore_keys, restore_permissions, restore_queues
    loaded = load(file)
    if check:
        click.echo(f"{file}: valid {loaded.describe()}")
        return
    with ctx.admin() as admin:
        todo = plan(admin.zk, admin.paths, loaded, force)
        click.echo(f"restoring the {loaded.describe()} into {admin.paths.root}")
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


@main.command()
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


@main.group()
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
    require_extra("pyspark", "pyarrow", "pandas")
    require_java()
    queue_name = ctx.config.gcm.stats_queue
    if not queue_name:
        raise UserError("gcm.stats_queue is empty: the statistics stream is off")
    created = False
    with ctx.admin() as admin:
        try:
            admin.create_queue(queue_name, exchanges=1)
            created = True
            click.echo(f"created queue {queue_name}: the leader publishes statistics to it until this pipeline "
                       "ends", err=True)
        except QueueExistsError:
            pass
    args = ["--zk", ctx.config.zk.hosts, "--root", ctx.config.zk.root, "--queue", queue_name, "--output", output,
            "--window", str(window), "--duration", str(duration), "--master", master] + (["--once"] if once else [])
    try:
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
    from roq.errors import QueueNotFoundError
    with ctx.admin() as admin:
        try:
            admin.delete_queue(queue_name)
        except QueueNotFoundError:
            return  # deleted meanwhile: the stream has stopped all the same
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


# ---------------------------------------------------------------- web

@main.group(invoke_without_command=True)
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
    from roq.client.admin import ZK_REFUSED_FOR
    from roq.daemon import Stop, install_signal_handlers
    from roq.zk import start_client, stop_client
    from web.daemon import serve
    # As every command: one line, at once, when no ZooKeeper listens (roq-web, a daemon, waits for it).
    # Logging stays as main() set it: warnings, without the ZooKeeper client's reconnect chatter.
    zk = start_client(config, refused_for=ZK_REFUSED_FOR)
    stop = Stop()
    try:
        install_signal_handlers(stop)
        code = serve(config, stop, announce=True, zk=zk)
    finally:
        stop_client(zk)
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
    from web.auth import add_token
    path = path or ctx.config.web.tokens_file
    if not path:
        fail("give --file, or set web.tokens_file", Exit.USAGE)
    click.echo(add_token(Path(path), name, role))
    click.echo(f"token {name!r} ({role}) added to {path}: keep it secret, it is not shown again", err=True)


# ---------------------------------------------------------------- data

@main.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("message", required=False)
@click.option("--topic", "-t", default="default", show_default=True)
@click.option("--file", "-f", "source", type=click.File("rb"), default=None,
              help="publish each line of FILE as one message (default: stdin, when no MESSAGE is given)")
@click.option("--priority", type=click.IntRange(0, 255), default=None,
              help="0 (first, the default) to 255: the order consumer groups take messages in")
@click.option("--delay", type=click.FloatRange(0, 1e9), default=None, metavar="SECONDS",
              help="consumer groups take each message no sooner than this after it is published")
@click.option("--key", default=None, help="fairness key: consumer groups serve keys in turn")
@click.option("--header", "-H", "headers", multiple=True, metavar="KEY=VALUE",
              help="a header of every message (repeatable); subscribers see them with --format json")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=30.0, show_default=True,
              help="the most seconds the command waits for the cluster in all: connecting, room, confirms")
@pass_ctx
@handle_errors
def publish(ctx: Context, queue_name: str, message: str | None, topic: str, source: Any, priority: int | None,
            delay: float | None, key: str | None, headers: tuple[str, ...], timeout: float) -> None:
    """Publish MESSAGE to QUEUE, or each line of --file (or stdin) as one message.

    The headers, priority, delay and key apply to every message. --timeout bounds all the waiting
    for the cluster (not the reading of the input): the command ends within it once its input has."""
    from roq.names import check_queue_name, check_topic
    from roq.tools.data_cli import Attributes, argument_bytes, lines_of, parse_headers, publish_messages
    if message is not None and source is not None:
        raise click.UsageError("give a MESSAGE or --file, not both")
    try:  # checked before anything connects
        check_queue_name(queue_name)
        check_topic(topic)
        attributes = Attributes(priority, delay, key, parse_headers(headers))
    except UserError as exc:
        raise click.BadParameter(str(exc)) from None
    payloads: Iterable[bytes]
    if message is not None:
        payloads = [argument_bytes(message)]
    else:
        payloads = lines_of(source if source is not None else sys.stdin.buffer)
    sent, confirmed = publish_messages(ctx.config, queue_name, topic, payloads, attributes, timeout)
    click.echo(f"published {sent} message{'s' if sent != 1 else ''} to {queue_name}, {confirmed} confirmed",
               err=True)


@main.command()
@click.argument("queue_name", metavar="QUEUE")
@click.option("--topic", "-t", "topics", multiple=True, help="topic prefix (repeatable; default: all)")
@click.option("--count", "-n", type=click.IntRange(0), default=0, help="stop after N messages (0 = forever)")
@click.option("--timeout", type=click.FloatRange(0), default=0.0, help="stop after N idle seconds (0 = never)")
@click.option("--format", "output", type=click.Choice(["text", "json", "base64"]), default="text", show_default=True,
              help="text: topic<TAB>payload, escaped to one line; json: one object per message, headers included; "
                   "base64: topic<TAB>payload in base64")
@click.option("--durable", metavar="NAME", default=None,
              help="resume where the subscriber of this name stopped (position under client.state_dir)")
@click.option("--from", "start_from", metavar="beginning|now|FILE", default=None,
              help="where to start when there is no saved position: beginning (all the exchanges still "
                   "retain), now (the default), or a position FILE (a durable subscriber's saved one)")
@click.option("--group", metavar="NAME", default=None,
              help="join consumer group NAME: each message goes to one member of the group, acked once "
                   "the reader has its line (docs/work-queues.md)")
@click.option("--prefetch", type=click.IntRange(1, 100_000), default=None,
              help=f"with --group: unacked messages held per exchange (default {CLI_PREFETCH}; with --exec, "
                   "--concurrency)")
@click.option("--exec", "command", metavar="CMD", default=None,
              help="with --group: run CMD (/bin/sh -c) for each message, payload on stdin, attributes in ROQ_* "
                   "variables; ack when it exits 0, nack otherwise")
@click.option("--concurrency", type=click.IntRange(1, 256), default=None,
              help="with --exec: commands run at once (default 1)")
@pass_ctx
@handle_errors
def subscribe(ctx: Context, queue_name: str, topics: tuple[str, ...], count: int, timeout: float, output: str,
              durable: str | None, start_from: str | None, group: str | None, prefetch: int | None,
              command: str | None, concurrency: int | None) -> None:
    """Print the messages of QUEUE, one per line: topic<TAB>payload (--format text), a JSON object
    (--format json: headers, publisher, seq, time too) or topic<TAB>base64 (--format base64).

    A payload never spans two lines: text escapes backslash, LF and CR as \\\\, \\n and \\r.
    A new subscriber starts now: add --from beginning for what was published before. A --durable
    subscriber resumes from its saved position; --from only says where a new name starts.
    With --group it is a member of a consumer group: it prints its share, acking each message once
    its line is read (written, flushed, and out of the pipe), or with --exec runs a command for each."""
    from roq.client.subscriber import Subscriber
    from roq.tools.data_cli import formatter
    if command is not None and group is None:
        raise click.UsageError("--exec needs --group")
    if concurrency is not None and command is None:
        raise click.UsageError("--concurrency needs --exec")
    if group is not None:
        if durable is not None or start_from is not None:
            raise click.UsageError("--group takes no --durable or --from: the group keeps its own state")
        if command is not None and output != "text":
            raise click.UsageError("--format is for printing: --exec gives the command the payload itself")
        _work(ctx, queue_name, topics, count, timeout, group, prefetch, command, concurrency or 1, formatter(output))
        return
    if prefetch is not None:
        raise click.UsageError("--prefetch needs --group")
    start, position = _start_point(ctx, queue_name, durable, start_from)
    with Subscriber(queue_name, ctx.config, topics, durable=durable, start=start, position=position) as sub:
        # the with-block saves a durable position
        received, interrupted = _print_messages(sub, count, timeout, formatter(output))
        stats = sub.stats()
    click.echo(f"received {received} message{'s' if received != 1 else ''} (duplicates dropped "
               f"{stats.duplicates}, recovered frames {stats.recovered_frames}, unrecoverable gaps "
               f"{stats.gaps})", err=True)
    if interrupted:
        click.echo("interrupted", err=True)
        sys.exit(Exit.INTERRUPTED)


def _work(ctx: Context, queue_name: str, topics: tuple[str, ...], count: int, timeout: float, group: str,
          prefetch: int | None, command: str | None, concurrency: int, line: Callable[[Any], bytes]) -> None:
    """`roq subscribe --group`: print this member's share, or run `command` for each message
    (roq/tools/work_cli.py). Nothing is acked that the reader or the command did not finish."""
    from roq.client.group_member import GroupMember
    from roq.tools.work_cli import LineOut, Stop, exec_share, print_share
    out = LineOut(sys.stdout.buffer) if command is None else None
    prefetch = prefetch or (concurrency if command is not None else CLI_PREFETCH)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(Exit.OK))  # leaves through the with-block below
    stop, done, interrupted = Stop.DONE, 0, False
    with GroupMember(queue_name, ctx.config, topics, group=group, prefetch=prefetch, auto_ack=False) as sub:
        try:
            if out is not None:
                done, stop = print_share(sub, out, count, timeout, line)
            else:
                assert command is not None
                done = exec_share(sub, command, concurrency, count, timeout)
        except KeyboardInterrupt:
            interrupted = True
        stats = sub.stats()  # leaving the group gives what was not done back to the other members at once
    if stop is Stop.PIPE_CLOSED:  # nothing more can go there, not even at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    what = "printed" if out is not None else "ran the command for"
    click.echo(f"{what} {done} messages of group {group} (acked {stats.acked}, nacked {stats.nacked}, "
               f"redelivered to us {stats.redelivered}){'; ' + stop.value if stop is not Stop.DONE else ''}",
               err=True)
    if interrupted:
        click.echo("interrupted", err=True)
        sys.exit(Exit.INTERRUPTED)


def _print_messages(sub: Any, count: int, timeout: float, line: Callable[[Any], bytes]) -> tuple[int, bool]:
    """Print messages, one `line(msg)` each, until `count` or `timeout` idle seconds; (printed, interrupted)."""
    received = 0
    out = sys.stdout.buffer
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(Exit.OK))  # SIGTERM leaves through the caller's with-block
    try:
        while not count or received < count:
            msg = sub.receive(timeout=timeout or None)
            if msg is None:
                break
            out.write(line(msg))
            out.flush()
            received += 1
    except KeyboardInterrupt:
        return received, True
    except BrokenPipeError:  # `roq subscribe ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return received, False


def _start_point(ctx: Context, queue_name: str, durable: str | None,
                 start_from: str | None) -> tuple[str, dict[str, Any] | None]:
    """`--from` as (start, position): a saved durable position wins over it."""
    from roq.client.subscriber.checkpoint import checkpoint_file, load_checkpoint
    from roq.names import check_subscriber_name
    if durable is not None and start_from is not None:
        saved = checkpoint_file(ctx.config.client.state_dir, queue_name, check_subscriber_name(durable))
        if saved.is_file():
            click.echo(f"roq: note: {durable!r} resumes from its saved position ({saved}); --from applies "
                       f"to a new name only (delete that file to start over)", err=True)
            return "now", None
    choice = (start_from or "now").lower()
    if choice in ("now", "beginning"):
        return choice, None
    path = Path(start_from or "")
    position = load_checkpoint(path) if path.is_file() else None
    if position is None:
        raise click.BadParameter(f"expected beginning, now or a position file; there is no file {start_from!r}",
                                 param_hint="--from")
    return "now", position.to_json()


@main.command()
@click.option("--queue", "queue_name", default="bench", show_default=True,
              help="queue to use; created (and deleted afterwards) if it does not exist")
@click.option("--exchanges", "-x", type=click.IntRange(1, 64), default=1, show_default=True,
              help="exchanges of the queue when it is created")
@click.option("--size", type=click.IntRange(9, 1 << 20), default=100, show_default=True, help="payload bytes")
@click.option("--messages", "-n", type=click.IntRange(1, 100_000_000), default=100_000, show_default=True,
              help="messages per publisher")
@click.option("--publishers", "-p", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--subscribers", "-s", type=click.IntRange(1, 64), default=1, show_default=True,
              help="each subscriber gets every message (fan-out)")
@click.option("--rate", type=click.FloatRange(0), default=0.0, show_default=True,
              help="total messages per second (0 = as fast as possible: the throughput, with latencies that are "
                   "mostly queueing; e.g. 10000 for the latency of a cluster that keeps up)")
@click.option("--batch", is_flag=True,
              help="use the batch API (Publisher.publish_many, Subscriber batch_callback) "
                   "instead of one call per message")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              is_flag=False, flag_value="-", help="also write the result as JSON to this file (- or no "
                                                 "FILE: stdout)")
@pass_ctx
@handle_errors
def bench(ctx: Context, queue_name: str, exchanges: int, size: int, messages: int, publishers: int,
          subscribers: int, rate: float, batch: bool, json_out: str | None) -> None:
    """Measure throughput and latency percentiles of the running cluster.

    By default at full rate: the throughput. Its latencies are then mostly time spent queueing (the
    output says so); pace it with --rate for the latency of a cluster that keeps up."""
    from roq.tools.bench_cli import run_bench
    run_bench(ctx.config, queue_name, exchanges, size, messages, publishers, subscribers, rate, json_out, batch)


@main.command()
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


if __name__ == "__main__":
    main()
