"""Finding, starting and health-checking a standalone ZooKeeper server.

Used by `roq cluster up` and by the test session. The server is Debian's
`zookeeper` package (or a tarball under $ZOOKEEPER_HOME), started in the
foreground in its own process group with its own data directory and port.
If it fails to answer `ruok` in time, the start raises with its log tail.

Its zoo.cfg: a 500 ms tick, so sessions from 1 s (2 ticks) to 60 s are granted (RoQ's short
default session timeout for fast failover, and long ones under a debugger); and autopurge, which
keeps the newest 3 snapshots and their logs and deletes the rest every hour, so a long-running
`roq cluster up` does not fill its disk (the deployed ensemble's zoo.cfg,
ansible/roles/zookeeper/templates/zoo.cfg.j2, does the same).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from roq.errors import RoqError
from roq.tools.ports import free_port
from roq.tools.process_groups import stop_groups

DEBIAN_HOME = Path("/usr/share/zookeeper")


class ZooKeeperNotInstalledError(RoqError):
    code = "zookeeper_missing"


def find_zookeeper() -> Path:
    """The zkServer.sh to run: $ZOOKEEPER_HOME first, then Debian's package."""
    candidates = []
    if os.environ.get("ZOOKEEPER_HOME"):
        candidates.append(Path(os.environ["ZOOKEEPER_HOME"]) / "bin" / "zkServer.sh")
    candidates.append(DEBIAN_HOME / "bin" / "zkServer.sh")
    for script in candidates:
        if script.is_file():
            return script
    raise ZooKeeperNotInstalledError(
        "ZooKeeper is not installed: run `apt-get install zookeeper` (or set ZOOKEEPER_HOME); "
        "`make demo` and `make test` install it for you"
    )


def four_letter(host: str, port: int, word: str = "ruok", timeout: float = 1.0) -> str:
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while data := s.recv(4096):
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def is_healthy(host: str, port: int) -> bool:
    try:
        return four_letter(host, port, "ruok") == "imok"
    except OSError:
        return False


class ZooKeeperServer:
    """One standalone server: `start()`, `connect_string`, `stop()`, `log_tail()`."""

    def __init__(self, base_dir: str | os.PathLike[str], port: int = 0, host: str = "127.0.0.1",
                 tick_ms: int = 500) -> None:
        self.base_dir = Path(base_dir)
        self.host = host
        self.port = port or free_port(host)
        # A short tick lets clients use short session timeouts (min = 2 ticks).
        self.tick_ms = tick_ms
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "zookeeper.log"

    def write_config(self) -> Path:
        data = self.base_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.base_dir / "zoo.cfg"
        cfg.write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={self.host}\n"
            "maxClientCnxns=0\n"
            f"minSessionTimeout={2 * self.tick_ms}\n"
            "maxSessionTimeout=60000\n"
            "autopurge.snapRetainCount=3\n"
            "autopurge.purgeInterval=1\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,mntr\n"
        )
        return cfg

    def start(self, timeout: float = 30.0) -> None:
        script = find_zookeeper()
        cfg = self.write_config()
        if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
            raise ZooKeeperNotInstalledError("ZooKeeper needs Java: install a JRE (Java 17 works)")
        env = dict(os.environ, ZOO_LOG_DIR=str(self.base_dir), JVMFLAGS="-Xmx256m")
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                ["bash", str(script), "start-foreground", str(cfg)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.base_dir, env=env, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RoqError(f"ZooKeeper exited with code {self.process.returncode}:\n{self.log_tail()}")
            if is_healthy(self.host, self.port):
                return
            time.sleep(0.1)
        self.stop()
        raise RoqError(f"ZooKeeper did not answer ruok within {timeout:.0f}s:\n{self.log_tail()}")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self, grace: float = 5.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        stop_process_group(self.process.pid, grace)
        self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no ZooKeeper log)"


def stop_process_group(pid: int, grace: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace` (roq/tools/process_groups.py:
    zombies count as gone); its leader reaped if it is our child."""
    stop_groups([pid], grace, kill_wait=grace)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
