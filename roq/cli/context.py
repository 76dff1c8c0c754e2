"""What every `roq` command shares: the configuration it runs with, the admin client, and how
an error ends it (one line on stderr, a named exit code; tracebacks are for bugs only)."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from roq.errors import Exit, NoSeedsError, RoqError, ZooKeeperUnavailableError

if TYPE_CHECKING:  # the commands import what they use: `roq --help` stays fast
    from roq.client.admin import Admin
    from roq.config import Config

DEFAULT_LOCAL_CONFIG = Path(".roq/cluster/config.toml")
# With no configuration at all, ZooKeeper's default address is a guess: give up on it quickly.
GUESS_CONNECT_TIMEOUT = 2.5
HOW_TO_CONFIGURE = ("no cluster is configured here: point at one with --config FILE, ROQ_CONFIG=FILE or "
                    "ROQ_SEEDS=tcp://host:port, or start one in this directory with `roq cluster up`")


def fail(message: str, code: Exit) -> None:
    click.echo(f"roq: error: {message}", err=True)
    sys.exit(code)


def interrupted() -> None:
    from roq.interrupts import interrupt_handled
    interrupt_handled()
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

    def main(self, *args: Any, **kwargs: Any) -> Any:
        from roq.interrupts import take_ctrl_c
        take_ctrl_c()  # even if started with SIGINT ignored: `roq bench` would run on, its queue left
        return super().main(*args, **kwargs)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:  # while click parses `roq`'s own options
            interrupted()
            raise  # not reached: interrupted() exits

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()
        except RuntimeError as exc:  # Python 3.11 wraps one that comes as a class is made (a lazy import)
            if isinstance(exc.__cause__, KeyboardInterrupt):
                interrupted()
            raise


def _explained(exc: RoqError) -> str:
    """The error's line, plus how to name a cluster when none was named and ZooKeeper is not there."""
    ctx = click.get_current_context(silent=True)
    context = ctx.find_object(Context) if ctx else None
    if isinstance(exc, (ZooKeeperUnavailableError, NoSeedsError)) and context is not None and context.guessing:
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
        """Nothing names a cluster (no file, no seeds, no ZooKeeper): the defaults are a guess."""
        named = ("ROQ_SEEDS", "ROQ_CLUSTER_SEEDS", "ROQ_ZK_HOSTS")
        return (self.source is None and not any(os.environ.get(v) for v in named)
                and not any(s.startswith(("zk.hosts=", "cluster.seeds=")) for s in self.settings))

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


def shown_by(name: str) -> Callable[..., None]:
    """roq/tools/views.py's `name`, imported when it is called: `roq --help` stays fast."""
    def show(*args: Any) -> None:
        from roq.tools import views
        getattr(views, name)(*args)
    return show


def json_or(answer: Any, as_json: bool, view: Callable[[Any], None]) -> None:
    """The answer as JSON (--json), else through `view`."""
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    else:
        view(answer)
