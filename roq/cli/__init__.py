"""`roq`: the command line, one module per command group. Commands are thin: parse, check, call
the library; each imports what it uses inside, so `roq --help` stays fast.

A user mistake or an unavailable cluster prints one line on stderr and exits with a named code
(roq/cli/context.py); tracebacks are for bugs only.
"""

from __future__ import annotations

import click

from roq.cli import backups, bench, cluster, groups, keys, pubsub, queues, show_config, stats, web_console
from roq.cli.context import Context, RoqGroup, check_settings
from roq.errors import Exit

__all__ = ["main", "Exit"]


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


for command in (show_config.config, keys.keys, cluster.cluster, queues.queue, groups.group, backups.backup,
                backups.restore, stats.stats, stats.pipeline, web_console.web, pubsub.publish, pubsub.subscribe,
                bench.bench, cluster.demo):
    main.add_command(command)
