"""Helpers for tests against a real ZooKeeper and real processes.

`wait_until` polls a condition with a deadline (never a bare sleep);
`Processes` starts GCM/HCM daemons with their own log files, tracks them,
and kills every one of them (and their process groups) in `stop_all()`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from roq.config import Config
from roq.zookeeper import stop_process_group

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.05,
               message: str = "condition") -> T:
    """Return the first truthy value of `condition()`, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # e.g. a node not there yet
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {message}{detail}")
        time.sleep(interval)


def fast_config(zk_hosts: str, root: str | None = None) -> Config:
    """Timing knobs shrunk so failures are noticed in about a second."""
    return Config().replace(
        zk={"hosts": zk_hosts, "root": root or f"/test-{uuid.uuid4().hex[:10]}", "session_timeout": 2.0},
        gcm={"tick": 0.2},
        hcm={"tick": 0.1, "restart_backoff": 0.2, "restart_backoff_max": 2.0, "stop_grace": 2.0,
             "capacity": 4},
        exchange={"stats_interval": 0.5},
        client={"request_timeout": 10.0, "confirm_timeout": 2.0},
        log={"level": "INFO"},
    )


class Processes:
    """Daemons started for one test; all killed at the end, logs kept for the report."""

    def __init__(self, config: Config, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "config.toml"
        self.config_path.write_text(config.to_toml())
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def start(self, role: str, name: str, *settings: str) -> subprocess.Popen[bytes]:
        module = {"gcm": "gcm.daemon", "hcm": "hcm.daemon"}[role]
        log = self.workdir / f"{name}.log"
        args = [sys.executable, "-m", module, "--config", str(self.config_path)]
        for setting in settings:
            args += ["--set", setting]
        with log.open("ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.procs[name] = proc
        self.logs[name] = log
        return proc

    def gcm(self, name: str) -> subprocess.Popen[bytes]:
        return self.start("gcm", name)

    def hcm(self, host: str) -> subprocess.Popen[bytes]:
        return self.start("hcm", host, f"hcm.host={host}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal only the daemon itself (not its group), as a crash or an operator would."""
        os.kill(self.procs[name].pid, sig)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)  # a test may have left it stopped
                except ProcessLookupError:
                    pass
            stop_process_group(proc.pid, grace=3.0)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()

    def dump_logs(self, lines: int = 60) -> str:
        parts = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            parts.append(f"----- {name} ({path}) -----\n" + "\n".join(text))
        return "\n".join(parts)
