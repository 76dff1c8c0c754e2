"""`roq-hcm`: the Host Configuration Manager of one slave host.

Registers the host (ephemeral znode), watches the host's assignment list and
keeps one process per assignment running (hcm/supervisor.py): an exchange, or
for a `<q>~<x>~r` slot the replica of exchange <x>. On
session loss it re-registers and re-publishes endpoints once reconnected. On
SIGTERM/SIGINT it stops its exchanges (SIGTERM, grace, SIGKILL) before
leaving; on SIGKILL its children die with it (PR_SET_PDEATHSIG and stdin EOF).
Entry point, signals, exit codes and logging: roq/daemon.py.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

import click
from kazoo.protocol.states import KazooState

from exchange.journal import journals_kept
from hcm.hoststats import host_figures
from hcm.registration import HostRegistration
from hcm.supervisor import Supervisor
from roq.config import Config, load_config
from roq.daemon import Stop, run_daemon
from roq.errors import Exit, RoqError
from roq.metrics import Families, exchange_metrics, host_metrics, replica_metrics, serve_metrics
from roq.paths import Paths, is_replica_slot, primary_of, split_assignment
from roq.zk import start_client, stop_client

log = logging.getLogger(__name__)


class Hcm:
    def __init__(self, config: Config, stop: Stop | None = None) -> None:
        self.config = config
        self.paths = Paths(config.zk.root)
        self.host = config.host_name
        self.stopping = stop or Stop()
        self._session_lost = threading.Event()

    def run(self) -> Exit:
        self.client = start_client(self.config)
        address = self.config.hcm.advertise or self.config.hcm.bind
        self.registration = HostRegistration(self.client, self.paths, self.host, address,
                                             self.config.hcm.capacity, self.config.hcm.stats_heartbeat)
        self.supervisor = Supervisor(self.client, self.paths, self.config, self.host)
        self.stopping.also_wake(self.supervisor.changed)  # the loop leaves its tick wait at once
        self.figures = host_figures(self.config.hcm.data_dir)
        self._next_report = 0.0
        metrics = serve_metrics(self.config.hcm.metrics_port, self.config.hcm.bind, address, self._metrics)
        if metrics:
            self.registration.data["metrics"] = metrics
        # The leader waits longer for a lost host whose exchanges journal, or that keeps journals from
        # an earlier configuration (its exchanges serve them): its disk holds what nobody else has.
        self.registration.data["journal"] = self.config.exchange.journal
        self.registration.data["zone"] = self.config.hcm.zone  # placement spreads over zones (gcm/placement.py)
        self.registration.data["journals"] = journals_kept(self.config.hcm.data_dir)
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
        return Exit.OK

    def stop(self) -> None:
        self.stopping.set()

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
                self.figures = replace(host_figures(self.config.hcm.data_dir),
                                       exchanges=len(self.supervisor.children))
                self.registration.report(self.figures)
        except RoqError as exc:
            log.warning("tick failed: %s", exc)
        except Exception as exc:
            if not type(exc).__module__.startswith("kazoo"):
                raise
            log.warning("ZooKeeper trouble during tick: %r", exc)

    def _metrics(self) -> Families:
        """Prometheus: this host, and the exchanges and replicas it runs (only here: roq/metrics.py)."""
        out = Families()
        host_metrics(out, self.host, self.figures, self.config.hcm.capacity)
        for (queue, slot), child in list(self.supervisor.children.items()):
            failed = child.failed_until is not None
            if is_replica_slot(slot):
                replica_metrics(out, queue, primary_of(slot), self.host, child.stats, child.restarts, failed)
            else:
                exchange_metrics(out, queue, slot, self.host, child.stats, child.restarts, failed)
        return out

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
    run_daemon("roq-hcm", lambda: load_config(config_path, flags=settings),
               lambda config: f"hcm {config.host_name}", lambda config, stop: Hcm(config, stop).run())


if __name__ == "__main__":
    main()
