"""`roq-gcm`: one Global Configuration Manager.

Starts its control API, then contends for leadership. As leader it runs the
reconciler on every tick and whenever hosts or queues change; as backup it
answers `not_leader` with the leader's endpoint. SIGTERM/SIGINT step down
cleanly (the leader record is removed so a backup takes over at once). An
unexpected error in the leader loop stops the daemon with `Exit.INTERNAL`
rather than leaving a leader that does nothing. Entry point, signals, exit
codes and logging: roq/daemon.py.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import click

from gcm.api import PEER, ControlServer, Handler, unknown_op
from gcm.autoscaler import Autoscaler
from gcm.backups import BackupService
from gcm.commands import CommandLog
from gcm.events import EventLog
from gcm.leader import Leadership
from gcm.metadata import MetadataService
from gcm.metadata_cache import MetadataCache
from gcm.permissions import PermissionManager
from gcm.queues import QueueManager
from gcm.reconciler import Reconciler
from gcm.stats_stream import StatsStream
from gcm.view import exchanges_only, replicas_only
from roq.config import Config, load_config
from roq.daemon import Stop, run_daemon
from roq.errors import Exit, NotLeaderError, RoqError, UnavailableError, UserError, ZooKeeperUnavailableError
from roq.metrics import Families, leader_metrics, serve_metrics
from roq.paths import Paths
from roq.permissions import RIGHTS
from roq.state import queue_names, read_hosts, read_leader
from roq.storage_policy import POLICY_ARGS, StoragePolicy
from roq.zk import ensure_base_paths, start_client, stop_client

log = logging.getLogger(__name__)


class Gcm:
    def __init__(self, config: Config, stop: Stop | None = None) -> None:
        self.config = config
        self.paths = Paths(config.zk.root)
        self.id = f"gcm-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.stopping = stop or Stop()
        self.wake = threading.Event()
        self.stopping.also_wake(self.wake)  # the leader loop leaves its tick wait at once
        self.write_lock = threading.Lock()
        self.failed: BaseException | None = None
        self.reconciler: Reconciler | None = None

    def run(self) -> Exit:
        self.client = start_client(self.config)
        ensure_base_paths(self.client, self.paths)
        advertise = self.config.gcm.advertise or self.config.gcm.bind
        if advertise in ("0.0.0.0", "*"):
            advertise = socket.gethostname()
        self.api = ControlServer(self.config, self.config.gcm.bind, self.config.gcm.port, advertise, self._route,
                                 lambda: self.permissions.table())
        self.metadata = MetadataService(self.id, self.config.gcm, lambda q: self.metadata_cache.body(q),
                                        lambda: self.metadata_cache.ready, self.api.push)
        self.metadata_cache = MetadataCache(self.client, self.paths, self.metadata.dirty)
        identity = {"id": self.id, "endpoint": self.api.endpoint, "pid": os.getpid(),
                    "host": socket.gethostname()}
        metrics = serve_metrics(self.config.gcm.metrics_port, self.config.gcm.bind, advertise, self._metrics)
        if metrics:
            identity["metrics"] = metrics
        self.leadership = Leadership(self.client, self.paths, identity, self.stopping)
        self.queues = QueueManager(self.client, self.paths, self.leadership.fence, self.write_lock,
                                   self.config.gcm.max_queues, self.config.gcm.default_replicas,
                                   self.config.gcm.min_free_bytes,
                                   StoragePolicy(self.config.gcm.default_retention,
                                                 self.config.gcm.default_retention_bytes))
        self.autoscaler = Autoscaler(self.client, self.paths, self.leadership.fence, self.queues,
                                     self.write_lock, self.config.autoscale, StatsStream(self.client, self._own_seed()))
        self.events = EventLog(self.client, self.paths, self.leadership.fence, self.write_lock)
        self.permissions = PermissionManager(self.client, self.paths, self.leadership.fence, self.write_lock,
                                             self.config.security)
        self.backups = BackupService(self.client, self.paths, self.config.zk.hosts, self.queues, self.autoscaler,
                                     self.permissions)
        self.commands = CommandLog(self.client, self.paths, self.leadership.fence, self.write_lock, self.queues.cache)
        self.client.ChildrenWatch(self.paths.hosts, self._on_change)
        self.client.ChildrenWatch(self.paths.queues, self._on_change)
        self.metadata_cache.start()
        self.metadata.start()
        self.api.start()
        log.info("GCM %s serving the control API on %s", self.id, self.api.endpoint)
        elector = threading.Thread(target=self._guard, args=(self.leadership.run, self._lead),
                                   name="election", daemon=True)
        elector.start()
        while not self.stopping.wait(0.5):
            pass
        self.leadership.cancel()
        elector.join(timeout=self.config.zk.session_timeout + 5)
        self.api.stop()
        self.metadata.stop()
        self.metadata_cache.close()
        stop_client(self.client)
        if self.failed:
            log.error("GCM stopped after an unexpected error: %r", self.failed)
            return Exit.INTERNAL
        return Exit.OK

    def stop(self) -> None:
        self.stopping.set()

    def _own_seed(self) -> Config:
        """The configuration the leader's own clients (the statistics stream) use: this GCM is their seed."""
        return self.config.replace(cluster={"seeds": self.api.endpoint})

    def _guard(self, target: Any, *args: Any) -> None:
        """Run a managed thread; an unexpected error stops the daemon loudly."""
        try:
            target(*args)
        except BaseException as exc:
            log.exception("managed thread %s failed", threading.current_thread().name)
            self.failed = exc
            self.stop()

    def _on_change(self, _children: list[str]) -> None:
        self.wake.set()  # watches only hand work to the leader loop

    # ------------------------------------------------------------ leader loop

    def _lead(self, epoch: int) -> None:
        self.reconciler = Reconciler(self.client, self.paths, self.leadership.fence, self.queues,
                                     self.write_lock, self.config.gcm.reassign_grace,
                                     self.config.gcm.journal_reassign_grace, self.config.gcm.storage_full_grace,
                                     self.config.gcm)
        self.autoscaler.states.clear()  # a new term starts with fresh timers
        self.events.start_term(self.id, epoch)
        with self.write_lock:
            self.queues.view.invalidate()  # another leader may have changed placements since our last term
        while self.leadership.should_lead():
            if self.leadership.can_write():
                try:
                    self.autoscaler.tick(self.reconciler.tick())
                    self.events.tick(self.autoscaler.stats, self.reconciler.take_rebalanced())
                    self.leadership.fence.prune_keys()
                except RoqError as exc:
                    log.warning("reconcile tick failed: %s", exc)
                except Exception as exc:
                    if not self.leadership.should_lead():
                        break
                    if type(exc).__module__.startswith("kazoo"):
                        log.warning("reconcile tick interrupted: %r", exc)
                    else:
                        raise
            self.wake.wait(self.config.gcm.tick)
            self.wake.clear()
        self.autoscaler.stats_stream.close()

    # ------------------------------------------------------------ control API

    def _route(self, op: str) -> Handler:
        if op == "ping":
            return self._ping
        if op == "metadata.get":  # every GCM answers from its cache, ZooKeeper up or not
            return lambda a: self.metadata.get(a, PEER.get())
        if op == "metadata.watch":
            return lambda a: self.metadata.watch(a, PEER.get())
        handler = {
            "cluster.status": self._status,
            "queue.create": lambda a: self.queues.create(**_args(a, ["name"], ["exchanges", "replicas", "exist_ok",
                                                                               *POLICY_ARGS])),
            "queue.set": lambda a: self.queues.set_policy(**_args(a, ["name"], POLICY_ARGS)),
            "queue.delete": lambda a: self.queues.delete(**_args(a, ["name"], ["if_empty", "if_unused"])),
            "queue.purge": lambda a: self.commands.issue("queue.purge", **_args(a, ["name"])),
            "group.reset": lambda a: self.commands.issue("group.reset", **_args(a, ["name", "group"])),
            "group.delete": lambda a: self.commands.issue("group.delete", **_args(a, ["name", "group"])),
            "queue.command": lambda a: self.commands.status(**_args(a, ["name", "id"], rename={"id": "command_id"})),
            "queue.scale": lambda a: self.queues.scale(**_args(a, ["name", "exchanges"])),
            "queue.list": lambda a: self.queues.list(**_args(a, [])),
            "queue.describe": lambda a: self.queues.describe(**_args(a, ["name"])),
            "queue.rules": lambda a: self.autoscaler.set_rules(**_args(a, ["name"], ["rules", "clear"])),
            "queue.rebalance": lambda a: self._rebalance(**_args(a, [], ["name"])),
            "cluster.stats": self._stats,
            "cluster.events": lambda a: self.events.after(**_args(a, [], ["after"])),
            "keys.grant": lambda a: self.permissions.grant(**_args(a, ["name"], [*RIGHTS, "admin"])),
            "keys.revoke": lambda a: self.permissions.revoke(**_args(a, ["name"], [*RIGHTS, "admin", "all"])),
            "keys.reset": lambda a: self.permissions.reset(**_args(a, ["name"])),
            "keys.list": lambda a: self.permissions.list(**_args(a, [])),
            "keys.show": lambda a: self.permissions.show(**_args(a, ["name"])),
            "backup.export": lambda a: self.backups.export(**_args(a, [])),
            "restore": lambda a: self.backups.restore(**_args(a, ["document"], ["force", "dry_run"])),
        }.get(op) or unknown_op(op)
        if not self.client.connected:
            # Reads would block until ZooKeeper is back; answer now instead.
            raise ZooKeeperUnavailableError("this GCM has lost its ZooKeeper connection; retry shortly")
        if not self.leadership.is_leader:
            leader = read_leader(self.client, self.paths)
            endpoint = leader.get("endpoint") if leader else None
            raise NotLeaderError(f"this GCM is a backup; the leader is {endpoint or 'not elected yet'}",
                                 endpoint)
        if not self.leadership.can_write():
            raise UnavailableError("the leader lost its ZooKeeper connection; retry shortly")
        return handler

    def _rebalance(self, name: Any = None) -> dict[str, Any]:
        if self.reconciler is None:
            raise UnavailableError("the leader is starting; retry shortly")
        return self.reconciler.rebalance_now(name)

    def _metrics(self) -> Families:
        """Prometheus: whether this GCM leads; the leader adds its cluster and per-queue aggregates
        (the exchanges' and hosts' own figures are their HCMs', roq/metrics.py)."""
        out = Families()
        leading = self.leadership.is_leader
        out.gauge("roq_gcm_leader", "1 on the leader GCM, 0 on a backup", {"gcm": self.id}, leading)
        if leading:
            leader_metrics(out, self.autoscaler.stats)
        return out

    def _stats(self, args: dict[str, Any]) -> dict[str, Any]:
        """Aggregated at the request from the cache, so figures are as fresh as ZooKeeper's (the
        tick's own copy, for rules and /metrics, may be a tick older)."""
        _args(args, [])
        return self.autoscaler.aggregate().to_dict()

    def _ping(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "leader": self.leadership.is_leader, "epoch": self.leadership.epoch}

    def _status(self, args: dict[str, Any]) -> dict[str, Any]:
        _args(args, [])
        hosts = read_hosts(self.client, self.paths)
        with self.write_lock:
            slots = self.queues.all_placements()
        placements, replicas = exchanges_only(slots), replicas_only(slots)
        assigned: dict[str, int] = {}
        for host in slots.values():  # a replica takes a host's capacity like an exchange
            if host:
                assigned[host] = assigned.get(host, 0) + 1
        return {
            "leader": {"id": self.id, "endpoint": self.api.endpoint, "epoch": self.leadership.epoch,
                       "pid": os.getpid()},
            "gcms": self.leadership.contenders(),
            "hosts": [{"name": h.name, "address": h.address, "capacity": h.capacity, "pid": h.pid,
                       "exchanges": assigned.get(h.name, 0), "metrics": h.metrics, "zone": h.zone}
                      for h in hosts.values()],
            "queues": queue_names(self.client, self.paths),
            "exchanges": len(placements),
            "unplaced": sum(1 for h in placements.values() if h is None or h not in hosts),
            "replicas": len(replicas),
            "unplaced_replicas": sum(1 for h in replicas.values() if h is None or h not in hosts),
            "moves": self.reconciler.moves if self.reconciler else 0,
            "rebalanced": self.reconciler.rebalanced if self.reconciler else 0,
            "time": time.time(),
        }


def _args(args: dict[str, Any], required: Sequence[str], optional: Sequence[str] = (),
          rename: dict[str, str] | None = None) -> dict[str, Any]:
    """`args` checked against the names an operation takes; `rename`: wire name → the handler's."""
    unknown = set(args) - set(required) - set(optional)
    missing = [k for k in required if k not in args]
    if unknown:
        raise UserError(f"unknown argument(s): {', '.join(sorted(map(str, unknown)))}")
    if missing:
        raise UserError(f"missing argument(s): {', '.join(missing)}")
    return {(rename or {}).get(k, k): v for k, v in args.items()}


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML configuration file")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE", help="override a setting")
def main(config_path: str | None, settings: tuple[str, ...]) -> None:
    """Run a Global Configuration Manager (leader or backup)."""
    run_daemon("roq-gcm", lambda: load_config(config_path, flags=settings), "gcm",
               lambda config, stop: Gcm(config, stop).run())


if __name__ == "__main__":
    main()
