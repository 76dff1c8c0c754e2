"""A whole cluster on one machine: ZooKeeper, GCMs and HCMs as background processes.

`roq cluster up` starts it in `cluster.run_dir` (default ./.roq/cluster) and
writes `config.toml` there, which every later `roq` command run from the
same directory picks up. Each process gets its own process group and log
file; `down` stops them all (SIGTERM, grace, SIGKILL). `up` over a running
cluster whose processes all run refuses; over one with a dead process
(ZooKeeper, a GCM, an HCM) it starts again what is missing, with the
cluster's own settings, and says what it restarted (`repair`). A fresh `up`
tears down what it started if any part fails to come up. ZooKeeper's data
stays in the run directory, so the next `up` there brings the queues back (it
names them); `purge` deletes it with the logs, the hosts' data and the state
(`roq cluster down --purge`). ZooKeeper keeps the port of the previous run
when it is free (clients configured for it keep working).

The settings a cluster was started with persist with it, in that `config.toml`:
the next `up` in the same run directory starts from them (`previous_settings`),
under whatever the command gives now (a file, the environment, `--set`), which is
applied and persisted too; `settings_report` is what `up` says about both. A
plain `up` thus never starts a cluster that ran with `exchange.journal = fsync`
without its journals. A file that cannot be read is refused with a clear error,
never replaced by the defaults in silence.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from roq.config import Config, load_config
from roq.errors import ConfigError, RoqError, UnavailableError, UserError
from roq.tools.ports import bindable, free_port
from roq.tools.zkserver import ZooKeeperServer, find_zookeeper, stop_process_group

STATE_FILE = "cluster.json"
CONFIG_FILE = "config.toml"
ZOOKEEPER_DIR, DATA_DIR = "zookeeper", "data"  # ZooKeeper's data and logs; the hosts' (journals)
# Settings every `up` sets anew, whatever the last one had: its own ZooKeeper, where it runs.
NOT_CARRIED = frozenset({("zk", "hosts"), ("cluster", "run_dir")})


@dataclass
class ClusterState:
    run_dir: str
    zk_hosts: str
    processes: list[dict[str, Any]] = field(default_factory=list)  # {role, name, pid, log}

    def save(self) -> None:
        Path(self.run_dir, STATE_FILE).write_text(json.dumps(self.__dict__, indent=2))

    @classmethod
    def load(cls, run_dir: str | Path) -> ClusterState | None:
        try:
            return cls(**json.loads(Path(run_dir, STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def alive(self) -> list[dict[str, Any]]:
        return [p for p in self.processes if pid_alive(p["pid"])]


def previous_settings(run_dir: str | Path) -> Config | None:
    """The settings the last `up` in `run_dir` was started with (its config.toml alone, without this
    process's environment), or None if there is none. A file that cannot be read is a UserError."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return load_config(path, env={})
    except ConfigError as exc:
        raise UserError(f"the settings of the previous `roq cluster up` cannot be read ({exc}): fix {path}, or "
                        "delete it to start with the defaults (`roq cluster down --purge` deletes all it left)") \
            from None


def settings_report(previous: Config | None, config: Config, path: str | Path) -> list[str]:
    """What `up` says about its settings: those it kept from the previous `up` (where they are not
    the defaults) and those this command changed (persisted in `path` from now on)."""
    if previous is None:
        return []
    old, new, default = (c.redacted().to_dict() for c in (previous, config, Config()))
    keys = [(section, key) for section, values in new.items() for key in values
            if (section, key) not in NOT_CARRIED]
    kept = [f"  {s}.{k} = {json.dumps(new[s][k])}" for s, k in keys if new[s][k] == old[s][k] != default[s][k]]
    changed = [f"  {s}.{k} = {json.dumps(new[s][k])} (was {json.dumps(old[s][k])})" for s, k in keys
               if new[s][k] != old[s][k]]
    lines = [f"settings kept from the previous `roq cluster up` ({path}):", *kept] if kept else []
    if changed:
        lines += [f"settings changed by this command, persisted in {path}:", *changed]
    return lines


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is not alive
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class LocalCluster:
    def __init__(self, config: Config, run_dir: str | Path | None = None) -> None:
        self.run_dir = Path(run_dir or config.cluster.run_dir).absolute()
        self.base_config = config
        self.restarted: list[str] = []  # what the last `up` started again in a running cluster
        self.queues_back: list[str] = []  # saved queues the last `up` found in ZooKeeper's kept data

    @property
    def config_path(self) -> Path:
        return self.run_dir / CONFIG_FILE

    def up(self, timeout: float = 60.0, progress: Any = None) -> ClusterState:
        say = progress or (lambda text: None)
        existing = ClusterState.load(self.run_dir)
        if existing and existing.alive():
            return self.repair(existing, timeout, say)
        find_zookeeper()  # precondition: fail before forking anything
        kept = self.kept_data() is not None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        c = self.base_config.cluster
        zk = ZooKeeperServer(self.run_dir / ZOOKEEPER_DIR, port=c.zk_port or self._previous_port() or free_port())
        state = ClusterState(str(self.run_dir), zk.connect_string)
        try:
            say(f"starting ZooKeeper on {zk.connect_string}")
            zk.start()
            state.processes.append({"role": "zookeeper", "name": "zookeeper", "pid": zk.pid,
                                    "log": str(zk.log_path)})
            state.save()
            config = with_seeds(self.base_config.replace(zk={"hosts": zk.connect_string}), c.gcms)
            self.config_path.write_text(config.to_toml())
            self._seeds = config.cluster.seeds
            for role, name in self._daemons(c.gcms, c.hcms):
                state.processes.append(self._spawn(role, name))
            state.save()
            say(f"waiting for a leader and {c.hcms} hosts")
            queues = self._wait_ready(config, state, c.hcms, timeout)
        except BaseException:
            self.down(state)
            raise
        if kept:
            self.queues_back = queues
        return state

    def repair(self, state: ClusterState, timeout: float = 60.0, say: Any = None) -> ClusterState:
        """Start again, with the cluster's own settings (its config.toml), whichever of its processes
        died: ZooKeeper (on its port, with its data), GCMs, HCMs; and the GCMs and HCMs this command
        asks for beyond what runs (--gcms, --hcms). Refused when all run, or when this command
        changes other settings (they would apply to some processes and not others)."""
        say = say or (lambda text: None)
        running = previous_settings(self.run_dir)
        if running is None:
            raise UserError(f"a cluster is running in {self.run_dir} without its {CONFIG_FILE}: "
                            "`roq cluster down`, then `roq cluster up`")
        c = self.base_config.cluster
        wanted = self.base_config.replace(zk={"hosts": running.zk.hosts}, cluster=asdict(running.cluster))
        if wanted != running:
            raise UserError(f"a cluster is running in {self.run_dir} with other settings: stop it first "
                            "(`roq cluster down`), then `roq cluster up` with the new ones")
        gcms, hcms = max(c.gcms, running.cluster.gcms), max(c.hcms, running.cluster.hcms)
        alive = {p["name"] for p in state.alive()}
        missing = [(role, name) for role, name in [("zookeeper", "zookeeper"), *self._daemons(gcms, hcms)]
                   if name not in alive]
        if not missing:
            raise UserError(f"a cluster is already running in {self.run_dir}, all of it (`roq cluster down` "
                            "stops it)")
        if (gcms, hcms) != (running.cluster.gcms, running.cluster.hcms) or not running.cluster.seeds:
            running = with_seeds(running.replace(cluster={"gcms": gcms, "hcms": hcms}), gcms)
            self.config_path.write_text(running.to_toml())
        self._seeds = running.cluster.seeds
        processes = [p for p in state.processes if p["name"] in alive]
        for role, name in missing:
            if role == "zookeeper":
                port = int(state.zk_hosts.rsplit(":", 1)[1])
                zk = ZooKeeperServer(self.run_dir / ZOOKEEPER_DIR, port=port)
                say(f"starting ZooKeeper again on {zk.connect_string}")
                zk.start()
                processes.append({"role": "zookeeper", "name": "zookeeper", "pid": zk.pid, "log": str(zk.log_path)})
            else:
                say(f"starting {name} again")
                processes.append(self._spawn(role, name))
            self.restarted.append(name)
            state.processes = processes  # saved at once: a later failure leaves what runs known to `down`
            state.save()
        say(f"waiting for a leader and {hcms} hosts")
        self.queues_back = self._wait_ready(running, state, hcms, timeout)
        return state

    _seeds = ""  # cluster.seeds of the cluster being started: one per GCM, in order

    @staticmethod
    def _daemons(gcms: int, hcms: int) -> list[tuple[str, str]]:
        return [*(("gcm", f"gcm-{i}") for i in range(1, gcms + 1)), *(("hcm", f"host-{i}") for i in range(1, hcms + 1))]

    def _previous_port(self) -> int | None:
        """The port ZooKeeper had in the previous run here, if it is free now."""
        try:
            previous = previous_settings(self.run_dir)
        except UserError:
            return None
        if previous is None:
            return None
        try:
            host, port = previous.zk.hosts.split(",")[0].rsplit(":", 1)
            return int(port) if bindable(host, int(port)) else None
        except ValueError:
            return None

    def _spawn(self, role: str, name: str) -> dict[str, Any]:
        log_path = self.run_dir / f"{name}.log"
        module = {"gcm": "gcm.daemon", "hcm": "hcm.daemon"}[role]
        extra: list[str] = []
        if role == "hcm":  # each host its own data directory, as on separate machines (journals: hcm.data_dir)
            extra = ["--set", f"hcm.host={name}", "--set", f"hcm.data_dir={self.run_dir / DATA_DIR / name}"]
        if role == "gcm":  # gcm-N listens where the N-th seed says: the clients' way in
            extra = ["--set", f"gcm.port={self._seeds.split(',')[int(name.rsplit('-', 1)[1]) - 1].rpartition(':')[2]}"]
        with log_path.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", module, "--config", str(self.config_path), *extra],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        return {"role": role, "name": name, "pid": proc.pid, "log": str(log_path)}

    def _wait_ready(self, config: Config, state: ClusterState, hosts: int, timeout: float) -> list[str]:
        """Until a leader answers with `hosts` hosts, through the seeds as any client (no ZooKeeper
        session of ours); the queues it names."""
        from roq.client.admin import Admin
        deadline = time.monotonic() + timeout
        with Admin(config) as admin:
            while time.monotonic() < deadline:
                dead = [p["name"] for p in state.processes if not pid_alive(p["pid"])]
                if dead:
                    raise RoqError(f"{', '.join(dead)} exited during start-up; see the logs in {self.run_dir}")
                try:
                    status = admin.call("cluster.status", timeout=min(2.0, max(0.1, deadline - time.monotonic())))
                    if len(status["hosts"]) >= hosts:
                        return list(status["queues"])
                except UnavailableError:  # no GCM listens yet, no leader yet: not ready
                    pass
                time.sleep(0.1)
        raise RoqError(f"cluster not ready after {timeout:.0f}s; see the logs in {self.run_dir}")

    def down(self, state: ClusterState | None = None) -> int:
        """Stop every process of the cluster; returns how many were running."""
        state = state or ClusterState.load(self.run_dir)
        if state is None:
            return 0
        running = state.alive()
        # Daemons first so the HCMs stop their exchanges while ZooKeeper is still there.
        for proc in sorted(running, key=lambda p: p["role"] == "zookeeper"):
            stop_process_group(proc["pid"], grace=8.0)
        try:
            Path(state.run_dir, STATE_FILE).unlink()
        except OSError:
            pass
        return len(running)

    def status(self) -> ClusterState | None:
        return ClusterState.load(self.run_dir)

    def kept_data(self) -> Path | None:
        """ZooKeeper's data directory, if a cluster left one here (queues, rules, ...)."""
        path = self.run_dir / ZOOKEEPER_DIR
        return path if path.is_dir() else None

    def purge(self) -> list[Path]:
        """Delete what the stopped cluster left in the run directory; returns what was deleted.

        Only what `up` writes (the directory itself if that leaves it empty); a running cluster
        is refused."""
        existing = ClusterState.load(self.run_dir)
        if existing and existing.alive():
            raise UserError(f"a cluster is running in {self.run_dir}: stop it first (`roq cluster down`)")
        ours = [self.run_dir / ZOOKEEPER_DIR, self.run_dir / DATA_DIR, self.config_path, self.run_dir / STATE_FILE,
                *sorted(self.run_dir.glob("*.log"))]
        removed = [path for path in ours if path.exists()]
        for path in removed:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        if self.run_dir.is_dir() and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()
        return removed


def with_seeds(config: Config, gcms: int) -> Config:
    """`config` with a seed per GCM (`cluster.seeds`): those it names, then free local ports."""
    seeds = [s for s in config.cluster.seeds.split(",") if s]
    while len(seeds) < gcms:
        seeds.append(f"tcp://127.0.0.1:{free_port()}")
    return config.replace(cluster={"seeds": ",".join(seeds)})
