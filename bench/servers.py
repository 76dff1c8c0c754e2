"""Peer servers for the comparison, from Debian's packages: installed if missing, started on
free loopback ports in a scratch directory, stopped afterwards (nothing is left running)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from roq.tools.ports import free_port

PACKAGES = {"nats": "nats-server", "redis": "redis-server", "rabbitmq": "rabbitmq-server",
            "nats-jetstream": "nats-server", "rabbitmq-quorum": "rabbitmq-server"}
BINARIES = {"nats": "/usr/sbin/nats-server", "redis": "/usr/bin/redis-server",
            "rabbitmq": "/usr/lib/rabbitmq/bin/rabbitmq-server"}
BINARIES.update({"nats-jetstream": BINARIES["nats"], "rabbitmq-quorum": BINARIES["rabbitmq"]})


def ensure_installed(systems: list[str]) -> None:
    missing = [PACKAGES[s] for s in systems if s in PACKAGES and not Path(BINARIES[s]).exists()]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"missing {' '.join(missing)}: install them (apt-get install) or run as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Debian's scripts would start system-wide services: forbid that while installing.
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    if not had_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", *missing], env=env, check=True,
                       stdout=subprocess.DEVNULL)
    finally:
        if not had_policy:
            policy.unlink()


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not open port {port} in {timeout:.0f}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def _spawn(args: list[str], workdir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = (workdir / "server.log").open("ab")
    return subprocess.Popen(args, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)


@contextlib.contextmanager
def python_hop(workdir: Path) -> Iterator[dict[str, Any]]:
    """bench/hop.py, the minimal Python forwarder, between two free ports."""
    front, back = free_port(), free_port()
    proc = _spawn([sys.executable, str(Path(__file__).with_name("hop.py")), f"tcp://127.0.0.1:{front}",
                   f"tcp://127.0.0.1:{back}"], workdir)
    try:
        wait_port(front, proc, "bench/hop.py")
        yield {"front": f"tcp://127.0.0.1:{front}", "endpoint": f"tcp://127.0.0.1:{back}"}
    finally:
        _stop(proc)


@contextlib.contextmanager
def nats(workdir: Path) -> Iterator[dict[str, Any]]:
    port = free_port()
    proc = _spawn([BINARIES["nats"], "-a", "127.0.0.1", "-p", str(port)], workdir)
    try:
        wait_port(port, proc, "nats-server")
        yield {"url": f"nats://127.0.0.1:{port}", "pid": proc.pid}  # its pid: what bench/curves.py measures
    finally:
        _stop(proc)


@contextlib.contextmanager
def nats_jetstream(workdir: Path) -> Iterator[dict[str, Any]]:
    """nats-server with JetStream, its file store under `workdir` (default sync: the OS flushes; the
    server acknowledges a publish once stored, before fsync)."""
    port = free_port()
    proc = _spawn([BINARIES["nats"], "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(workdir / "jetstream")],
                  workdir)
    try:
        wait_port(port, proc, "nats-server -js")
        yield {"url": f"nats://127.0.0.1:{port}", "pid": proc.pid}
    finally:
        _stop(proc)


@contextlib.contextmanager
def redis(workdir: Path) -> Iterator[dict[str, Any]]:
    port = free_port()
    # No persistence; no output-buffer limit for pub/sub clients (default would disconnect a slow one).
    proc = _spawn([BINARIES["redis"], "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--client-output-buffer-limit", "pubsub 0 0 0",
                   "--dir", str(workdir)], workdir)
    try:
        wait_port(port, proc, "redis-server")
        yield {"port": port}
    finally:
        _stop(proc)


@contextlib.contextmanager
def rabbitmq(workdir: Path) -> Iterator[dict[str, Any]]:
    port, dist_port = free_port(), free_port()
    node = f"roqbench{port}@localhost"
    (workdir / "plugins").write_text("[].\n")
    epmd_before = _epmd_running()
    env = dict(os.environ, HOME=str(workdir), RABBITMQ_NODENAME=node, RABBITMQ_NODE_PORT=str(port),
               RABBITMQ_DIST_PORT=str(dist_port), RABBITMQ_MNESIA_BASE=str(workdir / "mnesia"),
               RABBITMQ_LOG_BASE=str(workdir / "log"), RABBITMQ_ENABLED_PLUGINS_FILE=str(workdir / "plugins"),
               RABBITMQ_PID_FILE=str(workdir / "pid"), RABBITMQ_CONFIG_FILE=str(workdir / "rabbitmq"))
    proc = _spawn([BINARIES["rabbitmq"]], workdir, env)
    try:
        wait_port(port, proc, "rabbitmq-server", timeout=90)
        yield {"port": port}
    finally:
        subprocess.run(["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", node, "stop"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
        _stop(proc)
        if not epmd_before:
            subprocess.run(["pkill", "-x", "epmd"], check=False)


rabbitmq_quorum = rabbitmq  # the same server; the adapter declares a quorum queue


def _epmd_running() -> bool:
    return subprocess.run(["pgrep", "-x", "epmd"], stdout=subprocess.DEVNULL).returncode == 0


def scratch(base: Path, name: str) -> Path:
    path = base / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


if __name__ == "__main__":
    ensure_installed(list(PACKAGES))
    print("bench servers installed: " + ", ".join(PACKAGES.values()))
