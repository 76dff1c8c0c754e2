"""Helpers for tests against a real ZooKeeper and real processes.

`wait_until` polls a condition with a deadline (never a bare sleep);
`Processes` starts GCM/HCM daemons with their own log files, tracks them,
and kills every one of them (and their process groups) in `stop_all()`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import zmq
from zmq.utils.monitor import recv_monitor_message

from roq.config import Config
from roq.security import HANDSHAKE_FAILED, secure_client
from roq.tools.zkserver import stop_process_group

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


OK, REFUSED = "ok", "refused"


def handshake(endpoint: str, kind: int = zmq.DEALER, config: Config | None = None,
              keypair: tuple[bytes, bytes] | None = None, server_key: bytes | None = None) -> str:
    """Connect one socket and report what its handshake came to, from its monitor events."""
    sock = zmq.Context.instance().socket(kind)
    sock.linger = 0
    if config is not None:
        secure_client(sock, config)
    elif keypair is not None:
        sock.curve_serverkey, (sock.curve_publickey, sock.curve_secretkey) = server_key, keypair
    monitor = sock.get_monitor_socket()
    try:
        sock.connect(endpoint)
        while monitor.poll(10_000):
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return OK
            if event & HANDSHAKE_FAILED:
                return REFUSED
        raise AssertionError(f"no handshake outcome from {endpoint} within 10 s")
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


def carry(queue: str, publisher: Config, subscriber: Config, count: int, topic: str = "t") -> list[bytes]:
    """Publish `count` numbered messages with one identity and return what a subscriber with another
    received (each within 10 s): an end-to-end check that both keys are let in where they need."""
    from roq.client import Publisher, Subscriber
    with Subscriber(queue, subscriber, topics=[topic]) as sub, Publisher(queue, publisher) as pub:
        pub.wait_for_subscribers(1, timeout=15)
        for i in range(count):
            pub.publish(topic, str(i).encode())
        pub.flush(timeout=15)
        return [sub.receive(timeout=10).payload for _ in range(count)]


SEED_GCMS = 3  # GCM control ports reserved per test: the clients' seeds (Processes gives them out)


# Settings of these sections in the environment (ROQ_CLIENT_CALLER_SEND=1, ROQ_EXCHANGE_SEND_HELD_FRAMES=16)
# reach the tests' own clients and exchanges, as they reach the daemons, which read the environment:
# how a test file runs with a knob on (docs/testing.md).
ENV_KNOB_SECTIONS = ("ROQ_CLIENT_", "ROQ_EXCHANGE_")


def fast_config(zk_hosts: str, root: str | None = None) -> Config:
    """Timing knobs shrunk so failures are noticed in about a second; seeds for the test's GCMs;
    then the environment's client and exchange settings (ENV_KNOB_SECTIONS)."""
    from roq.config import load_config
    from roq.tools.ports import free_port
    seeds = ",".join(f"tcp://127.0.0.1:{free_port('127.0.0.1')}" for _ in range(SEED_GCMS))
    knobs = {name: value for name, value in os.environ.items() if name.startswith(ENV_KNOB_SECTIONS)}
    return load_config(env=knobs, base=_fast_defaults(seeds, zk_hosts, root))


def _fast_defaults(seeds: str, zk_hosts: str, root: str | None) -> Config:
    return Config().replace(
        cluster={"seeds": seeds},
        zk={"hosts": zk_hosts, "root": root or f"/test-{uuid.uuid4().hex[:10]}", "session_timeout": 2.0},
        # Rebalancing off: a test about failover sees placements stay where failover put them; the
        # rebalancing tests turn it on (tests/integration/test_rebalance.py).
        gcm={"tick": 0.2, "rebalance": False},
        hcm={"tick": 0.1, "restart_backoff": 0.2, "restart_backoff_max": 2.0, "stop_grace": 2.0,
             "capacity": 4},
        exchange={"stats_interval": 0.5},
        client={"request_timeout": 10.0, "confirm_timeout": 2.0},
        log={"level": "INFO"},
    )


_SERVING = re.compile(r"serving the console at (http\S+)/ ")  # roq-web's line once it serves


@contextmanager
def lone_exchange(config: Config, queue: str) -> Iterator[dict[str, Any]]:
    """One exchange process with no HCM (exchange x1 of `queue`), its `ready` line yielded; killed after."""
    proc = subprocess.Popen([sys.executable, "-m", "exchange.main", "--queue", queue, "--id", "x1",
                             "--config-json", config.to_json(), "--no-watch-stdin"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready"
        out = proc.stdout
        threading.Thread(target=lambda: [None for _ in out], daemon=True).start()  # keep its pipe drained
        yield ready
    finally:
        proc.kill()
        proc.wait()


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
        # The seeds' ports, given to GCMs in the order they first start (a restart keeps its port).
        self._seed_ports = [s.rpartition(":")[2] for s in config.cluster.seeds.split(",") if s]
        self.gcm_ports: dict[str, str] = {}

    def start(self, role: str, name: str, *settings: str) -> subprocess.Popen[bytes]:
        module = {"gcm": "gcm.daemon", "hcm": "hcm.daemon", "web": "roq_web.daemon"}[role]
        log = self.workdir / f"{name}.log"
        args = [sys.executable, "-m", module, "--config", str(self.config_path)]
        if role == "hcm":  # each host its own files (journals), in the test's directory
            settings = (f"hcm.data_dir={self.workdir / name / 'data'}", *settings)
        if role == "gcm" and not any(s.startswith("gcm.port=") for s in settings):
            port = self.gcm_ports.get(name) or (self._seed_ports[len(self.gcm_ports)]
                                                 if len(self.gcm_ports) < len(self._seed_ports) else "0")
            self.gcm_ports[name] = port
            settings = (f"gcm.port={port}", *settings)
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

    def web(self, name: str = "web", *settings: str, timeout: float = 30.0) -> str:
        """Start a roq-web process on a free port; its URL once it serves."""
        self.start("web", name, "web.port=0", *settings)

        def url() -> str | None:
            found = _SERVING.search(self.logs[name].read_text(errors="replace"))
            return found.group(1) if found else None
        return wait_until(url, timeout=timeout, message=f"{name} serving")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal only the daemon itself (not its group), as a crash or an operator would."""
        os.kill(self.procs[name].pid, sig)

    def wait_gone(self, name: str, timeout: float = 15.0) -> None:
        """Wait until daemon `name` and every process it started (its process group: an HCM's
        exchanges and replicas) have exited. A signal takes effect when the kernel next runs the
        process, and an HCM's children die after it (PR_SET_PDEATHSIG, stdin EOF): on a loaded
        machine they may go on working for a while after kill() returned."""
        proc = self.procs[name]
        wait_until(lambda: proc.poll() is not None and not _group_running(proc.pid), timeout=timeout,
                   message=f"{name} and the processes it started to exit")

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


def _group_running(pgid: int) -> bool:
    """Does a process of group `pgid` still run (zombies do not: nothing may reap them here)?"""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: whether the group can still be signalled
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


class SteadyTraffic:
    """A publisher at a steady rate and a subscriber, with exact accounting.

    Payloads are the publisher's message numbers, so the report can say which
    confirmed messages never arrived (lost) and which arrived twice at the
    application (duplicated). Bounded: at most `max_messages`.
    """

    def __init__(self, queue: str, config: Config, rate: float = 1000.0,
                 max_messages: int = 1_000_000) -> None:
        import threading
        from collections import Counter

        from roq.client.subscriber import Subscriber

        self.counts: Counter[int] = Counter()
        self._lock = threading.Lock()
        self.sub = Subscriber(queue, config, callback=self._on_message)
        self.load = PacedPublisher(queue, config, rate, max_messages, start=False)
        self.pub = self.load.pub
        self.longest_pause = 0.0
        self._last_arrival = time.monotonic()

    def _on_message(self, msg: object) -> None:
        now = time.monotonic()
        with self._lock:
            self.counts[int(msg.payload)] += 1
            self.longest_pause = max(self.longest_pause, now - self._last_arrival)
            self._last_arrival = now

    @property
    def sent(self) -> int:
        return self.load.sent

    def start(self, subscriptions: int = 1, timeout: float = 30.0) -> None:
        self.sub.wait_connected(timeout=timeout)
        self.pub.wait_for_subscribers(subscriptions, timeout=timeout)
        self._last_arrival = time.monotonic()
        self.load.start()

    def received(self) -> int:
        with self._lock:
            return len(self.counts)

    def wait_for_more(self, count: int, timeout: float) -> float:
        """Wait until `count` more distinct messages arrived; returns the seconds it took."""
        started = time.monotonic()
        target = self.received() + count
        wait_until(lambda: self.received() >= target, timeout=timeout,
                   message=f"{count} more messages to arrive")
        return time.monotonic() - started

    def stop(self, flush_timeout: float = 30.0) -> dict[str, float]:
        self.load.stop(flush_timeout)
        confirmed = self.pub.confirmed
        if confirmed:
            wait_until(lambda: all(i in self.counts for i in range(confirmed)), timeout=flush_timeout,
                       message="every confirmed message to arrive")
        return self.report()

    def report(self) -> dict[str, float]:
        with self._lock:
            confirmed = self.pub.confirmed
            return {
                "sent": self.sent,
                "confirmed": confirmed,
                "received": len(self.counts),
                "lost": sum(1 for i in range(confirmed) if i not in self.counts),
                "duplicated": sum(1 for c in self.counts.values() if c > 1),
                "publisher_moves": self.pub.moves,
                "replayed": self.pub.replayed,
                "dropped_duplicates": self.sub.duplicates,
                "longest_pause_s": round(self.longest_pause, 2),
            }

    def close(self) -> None:
        self.load.close()
        self.sub.close()


FIGURES: list[tuple[str, dict[str, object]]] = []  # printed at the end of the test session


def znodes(zk: Any, path: str) -> dict[str, tuple[bytes, int]]:
    """Every znode under `path` with its data and version: to prove a refused change left it as it was."""
    found: dict[str, tuple[bytes, int]] = {}
    if zk.exists(path):
        data, stat = zk.get(path)
        found[path] = (data, stat.version)
        for child in zk.get_children(path):
            found.update(znodes(zk, f"{path}/{child}"))
    return found


def zookeeper_connections(server: Any) -> int:
    """ZooKeeper's own count of client connections (one per session), by the `mntr` word; `server`
    has `host` and `port` (roq.tools.zkserver.ZooKeeperServer, the session's `zookeeper` fixture)."""
    import socket
    with socket.create_connection((server.host, server.port), timeout=5) as conn:
        conn.sendall(b"mntr")
        text = b"".join(iter(lambda: conn.recv(65536), b"")).decode()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("zk_num_alive_connections")))


def most_connections_while(server: Any, run: Callable[[], T]) -> tuple[T, int]:
    """`run()`'s result and the most ZooKeeper connections seen while it ran (polled, plus once after)."""
    done = threading.Event()
    seen = [zookeeper_connections(server)]

    def poll() -> None:
        while not done.is_set():
            seen.append(zookeeper_connections(server))
            done.wait(0.02)
    watcher = threading.Thread(target=poll, name="mntr", daemon=True)
    watcher.start()
    try:
        result = run()
    finally:
        done.set()
        watcher.join(timeout=10)
    return result, max(seen)


def record_figures(name: str, **values: object) -> None:
    """Keep a scenario's measured figures for the session's summary (and print them now)."""
    FIGURES.append((name, values))
    print(f"\n[{name}] {values}")


class PacedPublisher:
    """One publisher sending its message numbers (as text) at a steady rate on its own thread.

    Bounded: at most `max_messages`. `start=False` leaves starting to the caller."""

    def __init__(self, queue: str, config: Config, rate: float, max_messages: int = 10_000_000,
                 start: bool = True) -> None:
        from roq.client.publisher import Publisher
        self.pub = Publisher(queue, config)
        self.rate = rate
        self.max_messages = max_messages
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paced-publisher", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set() and self.sent < self.max_messages:
            delay = start + self.sent / self.rate - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)  # pacing the rate, not synchronising
                continue
            self.pub.publish("load", str(self.sent).encode(), timeout=60)
            self.sent += 1

    def stop(self, flush_timeout: float = 30.0) -> None:
        """Stop sending and wait until everything sent is confirmed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=70)
        self.pub.flush(flush_timeout)

    def close(self) -> None:
        self._stop.set()
        self.pub.close(timeout=0)


class SmallDiskUnavailable(Exception):
    """A small filesystem could not be mounted here (not root, no `mount`, not permitted)."""


def mount_small_disk(path: Path, size_bytes: int, inodes: int | None = None) -> Path:
    """Mount a tmpfs of `size_bytes` (and at most `inodes` files and directories) at `path` (made
    if missing): a real filesystem that fills up, for tests of what happens on a full disk.
    SmallDiskUnavailable when this machine does not allow it; `unmount_small_disk` undoes it."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        raise SmallDiskUnavailable("mounting a tmpfs needs root")
    options = f"size={size_bytes},mode=0700" + (f",nr_inodes={inodes}" if inodes else "")
    _mount(["-t", "tmpfs", "-o", options, "tmpfs", str(path)])
    return path


def _mount(arguments: list[str]) -> None:
    try:
        done = subprocess.run(["mount", *arguments], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SmallDiskUnavailable(f"cannot run mount: {exc}") from None
    if done.returncode != 0:
        raise SmallDiskUnavailable(f"mount {' '.join(arguments)} failed: {done.stderr.strip()}")


def unmount_small_disk(path: Path) -> None:
    """Unmount what mount_small_disk mounted; lazily if a process still holds a file there (it is
    released when the last one closes)."""
    for options in ([], ["-l"]):
        done = subprocess.run(["umount", *options, str(path)], capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return


@contextmanager
def advertised(config: Config, queue: str, ready: dict[str, Any]) -> Iterator[None]:
    """`queue` in ZooKeeper with the lone exchange of `ready` (lone_exchange) as its x1, and a seed
    (MetadataOnlyGcm) at the config's first seed: the client library can use that exchange."""
    from roq.paths import Paths
    from roq.zk import encode, start_client, stop_client
    zk = start_client(config)
    seed = MetadataOnlyGcm(config)
    try:
        paths = Paths(config.zk.root)
        zk.ensure_path(paths.queue(queue))
        zk.ensure_path(paths.live_queue(queue))
        data = {k: ready[k] for k in ("pub", "sub", "replay", "work", "incarnation", "pid") if k in ready}
        zk.create(paths.live_exchange(queue, "x1"), encode({**data, "host": "local", "stats": {}}), ephemeral=True)
        yield
    finally:
        seed.close()
        stop_client(zk)


class MetadataOnlyGcm:
    """The metadata half of a real GCM (gcm/metadata_cache.py, gcm/metadata.py on a real control
    socket) in this process, at the config's first seed: for tests that write a queue's topology
    into ZooKeeper by hand, with no leader to place anything, yet whose clients need a seed."""

    def __init__(self, config: Config) -> None:
        from gcm.api import PEER, ControlServer, unknown_op
        from gcm.metadata import MetadataService
        from gcm.metadata_cache import MetadataCache
        from roq.paths import Paths
        from roq.zk import start_client
        self.client = start_client(config)
        port = int(config.cluster.seeds.split(",")[0].rpartition(":")[2])
        self.api = ControlServer(config, "127.0.0.1", port, "127.0.0.1", lambda op: {
            "metadata.get": lambda a: self.service.get(a, PEER.get()),
            "metadata.watch": lambda a: self.service.watch(a, PEER.get())}.get(op) or unknown_op(op))
        self.service = MetadataService("gcm-test", config.gcm, lambda q: self.cache.body(q),
                                       lambda: self.cache.ready, self.api.push)
        self.cache = MetadataCache(self.client, Paths(config.zk.root), self.service.dirty)
        self.cache.start()
        self.service.start()
        self.api.start()

    def close(self) -> None:
        from roq.zk import stop_client
        self.api.stop()
        self.service.stop()
        self.cache.close()
        stop_client(self.client)
