"""`roq-hcm`: the Host Configuration Manager of one slave host.

Registers the host (ephemeral znode), watches the host's assignment list and
keeps one exchange process per assignment running (hcm/supervisor.py). On
session loss it re-registers and re-publishes endpoints once reconnected. On
SIGTERM/SIGINT it stops its exchanges (SIGTERM, grace, SIGKILL) before
leaving; on SIGKILL its children die with it (PR_SET_PDEATHSIG and stdin EOF).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click
from kazoo.protocol.states import KazooState

import time
from collections.abc import Iterator

from hcm.hoststats import host_figures
from hcm.registration import HostRegistration
from hcm.supervisor import Supervisor
from roq.config import Config, load_config
from roq.errors import RoqError
from roq.logs import configure
from roq.metrics import Sample, exchange_samples, serve_metrics
from roq.paths import Paths, split_assignment
from roq.zk import start_client, stop_client

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


class Hcm:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.paths = Paths(config.zk.root)
        self.host = config.host_name
        self.stopping = threading.Event()
        self._session_lost = threading.Event()

    def run(self) -> int:
        self.client = start_client(self.config)
        address = self.config.hcm.advertise or self.config.hcm.bind
        self.registration = HostRegistration(self.client, self.paths, self.host, address,
                                             self.config.hcm.capacity)
        self.supervisor = Supervisor(self.client, self.paths, self.config, self.host)
        self.figures = host_figures()
        self._next_report = 0.0
        metrics = serve_metrics(self.config.hcm.metrics_port, self.config.hcm.bind, address, self._samples)
        if metrics:
            self.registration.data["metrics"] = metrics
        self.client.add_listener(self._on_state)
        self.registration.try_register()
        self.client.ChildrenWatch(self.paths.host_assignments(self.host), self._on_assignments)
        log.info("HCM for host %s running", self.host)
        try:
            while not self.stopping.is_set():
                self._tick()
                self.supervisor.changed.wait(self.config.hcm.tick)
                self.supervisor.changed.clear()
        finally:
            log.info("stopping the exchanges of host %s", self.host)
            self.supervisor.stop_all()
            self.registration.unregister()
            stop_client(self.client)
        return EXIT_OK

    def stop(self) -> None:
        self.stopping.set()
        if hasattr(self, "supervisor"):
            self.supervisor.changed.set()

    def _tick(self) -> None:
        if self._session_lost.is_set() and self.client.connected:
            self._session_lost.clear()
            self.registration.session_lost()
            self.supervisor.session_lost()
        try:
            if self.client.connected and not self.registration.registered:
                self.registration.try_register()
            self.supervisor.tick()
            if time.monotonic() >= self._next_report:
                self._next_report = time.monotonic() + self.config.hcm.stats_interval
                self.figures = dict(host_figures(), exchanges=len(self.supervisor.children))
                self.registration.report(self.figures)
        except RoqError as exc:
            log.warning("tick failed: %s", exc)
        except Exception as exc:
            if not type(exc).__module__.startswith("kazoo"):
                raise
            log.warning("ZooKeeper trouble during tick: %r", exc)

    def _samples(self) -> Iterator[Sample]:
        labels = {"host": self.host}
        for key in ("cpu_percent", "memory_percent", "memory_used_bytes", "load1", "exchanges"):
            if isinstance(self.figures.get(key), (int, float)):
                yield f"roq_host_{key}", f"host {key.replace('_', ' ')}", labels, self.figures[key]
        for (queue, xid), child in list(self.supervisor.children.items()):
            yield "roq_exchange_restarts", "restarts of the exchange process", \
                {"queue": queue, "exchange": xid, "host": self.host}, child.restarts
            yield from exchange_samples(queue, xid, self.host, child.stats or {})

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._session_lost.set()
        self.supervisor.changed.set()

    def _on_assignments(self, names: list[str] | None) -> None:
        self.supervisor.set_desired({split_assignment(n) for n in names or []})


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML configuration file")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE", help="override a setting")
def main(config_path: str | None, settings: tuple[str, ...]) -> None:
    """Run the Host Configuration Manager of this host."""
    try:
        config = load_config(config_path, flags=settings)
    except RoqError as exc:
        click.echo(f"roq-hcm: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    configure(config.log.level, f"hcm {config.host_name}")
    hcm = Hcm(config)
    signal.signal(signal.SIGTERM, lambda *_: hcm.stop())
    signal.signal(signal.SIGINT, lambda *_: hcm.stop())
    try:
        sys.exit(hcm.run())
    except RoqError as exc:
        log.error("%s", exc)
        sys.exit(EXIT_FAILED)


if __name__ == "__main__":
    main()
