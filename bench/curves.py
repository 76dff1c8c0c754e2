"""Curves: how the figures move as one thing about the load changes, RoQ beside raw ZeroMQ and NATS.

`bench/compare.py` measures one shape of load (1 publisher → 1 subscriber). `bench/compare.py
--curves` runs this module: six curves, each varying one thing, every point with every system,
same machine, same invocation, same harness (roq.tools.bench):

* fanout: 1 publisher → 1, 2, 4, 8 subscribers, 100 B; deliveries/s over all subscribers;
* fanin: 1, 2, 4 publishers → 1 subscriber, 100 B; RoQ through a queue of 2 exchanges, raw
  ZeroMQ the way round that takes several publishers (PUB connect → SUB bind);
* topics: messages spread round-robin over 1, 100, 10,000 topics, one prefix subscription
  (`bench/` in RoQ and ZeroMQ, `bench.>` in NATS), 100 B;
* sizes: 10 B to 64 KiB, 1 → 1; msgs/s and MB/s (fewer messages for big ones: a run carries at
  most ~400 MB, and at least 2,000 messages);
* connections: the broker's memory and CPU with 10, 100, 1,000 idle subscribers and as many idle
  publishers connected: RoQ's exchange process, a raw ZeroMQ XPUB/XSUB proxy (`zmq.proxy`, the
  broker-less pair's nearest analogue), nats-server; memory per connection = RSS growth / (2 N);
* latency: p50/p99/p99.9 at 1k, 10k, 50k msg/s, 1 → 1, 100 B, with `python-hop` too (raw ZeroMQ
  through one minimal Python forwarder: the floor of any broker written in Python).

RoQ is measured through both APIs, `roq` (publish(), callback) and `roq-batch` (publish_many(),
batch_callback), except for idle connections, where the API does not matter. Raw ZeroMQ is the
baseline of every ratio: each is taken within one round (same load), and the median over the
rounds is reported with its min–max; so is every figure. `--repeat N` runs N rounds, each running
every curve, so load on a shared machine hits all systems alike. Each curve gets its own RoQ
cluster (started for the RoQ systems, which run last) and every RoQ system its own queue, so
fresh exchange processes. Writes `curves.json` (every round, medians, spreads, ratios, settings,
the load before and after, and per curve the command that reproduces it) and `curves-<curve>.png`.

    .venv/bin/python bench/compare.py --curves --repeat 3 --out bench/results   # ~20 minutes, 2 vCPUs
    .venv/bin/python bench/compare.py --curves --only fanout,latency            # some curves
    .venv/bin/python bench/compare.py --curves --smoke                           # seconds (CI)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from bench import compare, machine, servers
from roq.tools.bench import RunResult, run

ROQ_SYSTEMS = ("roq", "roq-batch")
# RoQ last: its cluster is started for it and stopped with the curve, so it never runs beside the others.
THROUGHPUT_SYSTEMS = ("zeromq", "nats", "roq", "roq-batch")
LATENCY_SYSTEMS = ("zeromq", "python-hop", "nats", "roq", "roq-batch")
CONNECTION_SYSTEMS = ("zeromq", "nats", "roq")
BASELINE = "zeromq"
SIZE = 100  # bytes, wherever the size is not what varies


# ---------------------------------------------------------------- what one invocation runs


@dataclass(frozen=True)
class Scale:
    """The counts of a run: `FULL` measures, `SMOKE` only checks that everything works."""

    points: dict[str, tuple[int, ...]]
    messages: int  # per throughput run (fan-in: over all publishers)
    fanout_messages: int  # per fan-out run (each subscriber gets them all)
    topic_messages: int  # per topics run (RoQ over 10,000 topics is ~10 times slower than over one)
    min_messages: int  # the fewest in any run
    run_bytes: int  # the most payload bytes one message-size run carries
    latency_seconds: float  # a paced run lasts this long (at least min_messages)
    idle_seconds: float  # CPU and memory are sampled over this long
    clients_per_process: dict[str, int]  # idle connections held by one helper process, per system
    run_timeout: float
    connect_timeout: float  # for the broker to report every idle connection
    cluster_per_round: bool = False  # one RoQ cluster for every curve of a round, not one per curve


FULL = Scale(
    points={"fanout": (1, 2, 4, 8), "fanin": (1, 2, 4), "topics": (1, 100, 10_000),
            "sizes": (10, 100, 1000, 16384, 65536), "connections": (10, 100, 1000),
            "latency": (1000, 10_000, 50_000)},
    messages=200_000, fanout_messages=100_000, topic_messages=100_000, min_messages=2_000, run_bytes=400_000_000,
    latency_seconds=2.0, idle_seconds=3.0,
    # zmq.Context holds at most 1023 sockets; a RoQ client is a thread, a context and a few pipes.
    clients_per_process={"zeromq": 500, "nats": 250, "roq": 500},
    run_timeout=180.0, connect_timeout=180.0)
# The smoke run keeps every curve and system but only the first and last point of each (starting
# the processes of a run, not its messages, is what takes the time), and one RoQ cluster.
SMOKE = replace(FULL, points={**{name: (p[0], p[-1]) for name, p in FULL.points.items()}, "connections": (2, 8)},
                messages=2_000, fanout_messages=1_000, topic_messages=2_000, min_messages=200,
                run_bytes=4_000_000, latency_seconds=0.05, idle_seconds=0.3,
                clients_per_process={"zeromq": 8, "nats": 8, "roq": 4}, run_timeout=60.0, connect_timeout=60.0,
                cluster_per_round=True)


@dataclass(frozen=True)
class Column:
    header: str
    field: str
    fmt: str = "{:,.0f}"


@dataclass(frozen=True)
class Curve:
    name: str
    title: str
    axis: str  # what varies: the x axis
    systems: tuple[str, ...]
    figure: str  # the field the ratio to raw ZeroMQ is taken of
    label: str  # the figure's, in tables
    higher_is_better: bool
    columns: tuple[Column, ...]  # the table's, after the figure and its ratio
    panels: tuple[tuple[str, str, bool], ...]  # chart subplots: (field, label, log y axis)
    measure: Callable[[Point], dict[str, Any]]
    exchanges: int = 1  # in RoQ's queue
    x_base: int = 10  # of the logarithmic x axis

    @property
    def fields(self) -> list[str]:
        return list(dict.fromkeys([self.figure, *(c.field for c in self.columns), *(p[0] for p in self.panels)]))


@dataclass
class Point:
    """One measurement: a system at one point of a curve, with what was started for it."""

    curve: Curve
    system: str
    value: int
    settings: dict[str, Any]
    scale: Scale
    workdir: Path
    roq: RoqQueues

    def run(self, size: int, messages: int, publishers: int = 1, subscribers: int = 1, rate: float = 0.0,
            **settings: Any) -> RunResult:
        adapter = adapter_for(self.curve, self.system)
        return run(adapter, dict(self.settings, **settings), size, messages, publishers=publishers,
                   subscribers=subscribers, rate=rate, timeout=self.scale.run_timeout)


def adapter_for(curve: Curve, system: str) -> str:
    """compare.py's adapter, but raw ZeroMQ fan-in binds the subscriber (bench/peers.py)."""
    if curve.name == "fanin" and system == BASELINE:
        return "bench.peers.ZmqFanInAdapter"
    return compare.ADAPTERS[system]


# ---------------------------------------------------------------- the throughput and latency points


def run_row(result: RunResult, **extra: Any) -> dict[str, Any]:
    return {"msgs_per_s": result.msgs_per_s, "deliveries_per_s": round(result.msgs_per_s * result.subscribers, 1),
            "mb_per_s": result.mb_per_s, "p50_us": result.p50_us, "p99_us": result.p99_us,
            "p999_us": result.p999_us, "max_us": result.max_us, "lost": result.lost, "size": result.size,
            "messages": result.messages, "publishers": result.publishers, "subscribers": result.subscribers,
            "rate": result.rate, **extra, "run": result.to_json()}


def fanout_point(p: Point) -> dict[str, Any]:
    return run_row(p.run(SIZE, p.scale.fanout_messages, subscribers=p.value))


def fanin_point(p: Point) -> dict[str, Any]:
    """The same total over 1, 2, 4 publishers: each sends its share."""
    return run_row(p.run(SIZE, max(1, p.scale.messages // p.value), publishers=p.value))


def topics_point(p: Point) -> dict[str, Any]:
    return run_row(p.run(SIZE, p.scale.topic_messages, topics=p.value), topics=p.value)


def size_messages(size: int, scale: Scale) -> int:
    """scale.messages, fewer for big messages (at most scale.run_bytes a run), never under min_messages."""
    return max(scale.min_messages, min(scale.messages, scale.run_bytes // size))


def sizes_point(p: Point) -> dict[str, Any]:
    return run_row(p.run(p.value, size_messages(p.value, p.scale)))


def latency_messages(rate: int, scale: Scale) -> int:
    return max(scale.min_messages, int(rate * scale.latency_seconds))


def latency_point(p: Point) -> dict[str, Any]:
    return run_row(p.run(SIZE, latency_messages(p.value, p.scale), rate=p.value))


# ---------------------------------------------------------------- the connections points


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files to the hard limit (children inherit it);
    returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@dataclass
class IdleServer:
    """The process whose memory and CPU a connections point measures, and how it counts its clients."""

    pid: int
    settings: dict[str, Any]  # what the helper processes connect to
    connections: Callable[[], int]  # clients it has now (subscribers + publishers)
    counted_by: str


def connections_point(p: Point) -> dict[str, Any]:
    """N idle subscribers and N idle publishers: the broker's RSS, USS and CPU before and after."""
    n = p.value
    with idle_server(p) as server:
        before = sample(server.pid, p.scale.idle_seconds)
        started = time.monotonic()
        with idle_clients(p.system, server.settings, n, p.scale):
            wait_for(lambda: server.connections() >= 2 * n, p.scale.connect_timeout,
                     lambda: f"{p.system}: {server.connections()} of {2 * n} connections ({server.counted_by})")
            setup = time.monotonic() - started
            after = sample(server.pid, p.scale.idle_seconds)
    return {"connections": 2 * n, "setup_s": round(setup, 2), "counted_by": server.counted_by,
            "rss_before_mb": round(before["rss"] / 2**20, 2), "rss_after_mb": round(after["rss"] / 2**20, 2),
            "bytes_per_connection": round((after["rss"] - before["rss"]) / (2 * n)),
            "uss_bytes_per_connection": round((after["uss"] - before["uss"]) / (2 * n)),
            "cpu_before": before["cpu"], "cpu_after": after["cpu"], "before": before, "after": after}


def sample(pid: int, seconds: float) -> dict[str, Any]:
    """The process's CPU use (percent of one CPU) over `seconds` (a measurement window, nothing
    waits on it), then its memory (RSS, and USS: the pages only it holds)."""
    import psutil
    proc = psutil.Process(pid)
    proc.cpu_percent(None)
    time.sleep(seconds)
    cpu = proc.cpu_percent(None)
    memory = proc.memory_full_info()
    return {"cpu": round(cpu, 2), "rss": memory.rss, "uss": memory.uss, "seconds": seconds}


def wait_for(condition: Callable[[], bool], timeout: float, what: Callable[[], str], every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"after {timeout:.0f}s: {what()}")
        time.sleep(every)


def tcp_clients(pid: int, ports: set[int]) -> int:
    """Established TCP connections of process `pid` on its listening `ports`."""
    import psutil
    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port in ports)


@contextlib.contextmanager
def idle_server(p: Point) -> Iterator[IdleServer]:
    """A fresh broker for one connections point: a proxy process, a nats-server, a RoQ queue."""
    if p.system == BASELINE:
        with zmq_proxy_server() as server:
            yield server
    elif p.system == "nats":
        with nats_idle_server(servers.scratch(p.workdir, f"nats-idle-{p.value}")) as server:
            yield server
    else:
        with p.roq.queue(f"idle-{p.value}") as settings, roq_idle_server(settings) as server:
            yield server


def run_zmq_proxy(front: str, back: str) -> None:
    """XSUB (publishers connect) → XPUB (subscribers connect), forwarding in libzmq: a process for
    raw ZeroMQ's idle connections to land on. Runs until terminated."""
    import zmq
    raise_fd_limit()
    context = zmq.Context()
    xsub, xpub = context.socket(zmq.XSUB), context.socket(zmq.XPUB)
    xsub.bind(front)
    xpub.bind(back)
    zmq.proxy(xsub, xpub)


@contextlib.contextmanager
def zmq_proxy_server() -> Iterator[IdleServer]:
    front, back = servers.free_port(), servers.free_port()
    proc = mp.get_context("spawn").Process(target=run_zmq_proxy, daemon=True,
                                           args=(f"tcp://127.0.0.1:{front}", f"tcp://127.0.0.1:{back}"))
    proc.start()
    try:
        wait_for(lambda: proc.exitcode is not None or all(listening(port) for port in (front, back)), 30,
                 lambda: "the ZeroMQ proxy did not bind")
        if proc.exitcode is not None:
            raise RuntimeError(f"the ZeroMQ proxy exited with {proc.exitcode}")
        assert proc.pid is not None
        pid = proc.pid
        yield IdleServer(pid, {"pub_endpoint": f"tcp://127.0.0.1:{front}", "sub_endpoint": f"tcp://127.0.0.1:{back}"},
                         lambda: tcp_clients(pid, {front, back}), "TCP connections of the proxy")
    finally:
        proc.terminate()
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


@contextlib.contextmanager
def nats_idle_server(workdir: Path) -> Iterator[IdleServer]:
    with servers.nats(workdir) as settings:
        port, pid = int(settings["url"].rsplit(":", 1)[1]), settings["pid"]
        yield IdleServer(pid, settings, lambda: tcp_clients(pid, {port}), "TCP connections of nats-server")


@contextlib.contextmanager
def roq_idle_server(settings: dict[str, Any]) -> Iterator[IdleServer]:
    """The queue's one exchange: its pid from its live znode (written by its HCM from the
    exchange's ready event), checked against the process's command line; the clients it reports
    (RoQ subscribers by their sync markers, publishers by their hellos) from the same znode."""
    import psutil

    from roq.config import config_from_json
    from roq.paths import Paths
    from roq.state import read_live
    from roq.zk import start_client, stop_client
    config = config_from_json(settings["config"])
    client = start_client(config)
    paths, queue = Paths(config.zk.root), settings["queue"]
    try:
        live = read_live(client, paths, queue)
        if len(live) != 1:
            raise RuntimeError(f"queue {queue}: {len(live)} live exchanges, wanted 1")
        xid, data = next(iter(live.items()))
        pid = int(data["pid"])
        cmdline = psutil.Process(pid).cmdline()
        if "exchange.main" not in cmdline or queue not in cmdline:
            raise RuntimeError(f"pid {pid} of exchange {queue}/{xid} runs {cmdline}")

        def clients() -> int:
            stats = (read_live(client, paths, queue).get(xid) or {}).get("stats") or {}
            return int(stats.get("subscribers", 0)) + int(stats.get("known_publishers", 0))

        yield IdleServer(pid, settings, clients, "the exchange's own report (subscribers + known_publishers)")
    finally:
        stop_client(client)


@contextlib.contextmanager
def idle_clients(system: str, settings: dict[str, Any], n: int, scale: Scale) -> Iterator[None]:
    """N idle subscribers and N idle publishers, in helper processes of at most
    scale.clients_per_process each; until the block ends."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    chunk = scale.clients_per_process[system]
    helpers = []
    for role in ("sub", "pub"):
        for start in range(0, n, chunk):
            ready = ctx.Event()
            proc = ctx.Process(target=hold_idle_clients, args=(system, settings, role, min(chunk, n - start), ready,
                                                               stop), daemon=True)
            helpers.append((proc, ready))
    try:
        for proc, _ in helpers:
            proc.start()
        wait_for(lambda: all(ready.is_set() for _, ready in helpers) or any(p.exitcode for p, _ in helpers),
                 scale.connect_timeout, lambda: f"{system}: helper processes not ready")
        failed = [p.exitcode for p, _ in helpers if p.exitcode]
        if failed:
            raise RuntimeError(f"{system}: idle-client helper processes failed (exit codes {failed})")
        yield
    finally:
        stop.set()
        for proc, _ in helpers:
            if proc.pid is None:
                continue
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def hold_idle_clients(system: str, settings: dict[str, Any], role: str, count: int, ready: Any, stop: Any) -> None:
    """A helper process: open `count` idle clients ("sub" or "pub"), set `ready`, hold them until `stop`."""
    raise_fd_limit()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it sets `stop`)
    {"zeromq": hold_zmq, "nats": hold_nats, "roq": hold_roq}[system](settings, role, count, ready, stop)


def hold_zmq(settings: dict[str, Any], role: str, count: int, ready: Any, stop: Any) -> None:
    import zmq
    context = zmq.Context()
    sockets = []  # held: a socket no longer referenced is closed
    try:
        for _ in range(count):
            sock = context.socket(zmq.SUB if role == "sub" else zmq.PUB)
            sock.linger = 0
            if role == "sub":
                sock.setsockopt(zmq.SUBSCRIBE, b"bench/")
            sock.connect(settings["sub_endpoint" if role == "sub" else "pub_endpoint"])
            sockets.append(sock)
        ready.set()
        stop.wait()
    finally:
        context.destroy(linger=0)


def hold_nats(settings: dict[str, Any], role: str, count: int, ready: Any, stop: Any) -> None:
    import nats

    async def hold() -> None:
        clients = []
        try:
            for _ in range(count):
                nc = await nats.connect(settings["url"], allow_reconnect=False)
                clients.append(nc)
                if role == "sub":
                    await nc.subscribe("bench.>")
                else:
                    await nc.publish("bench.hello", b"hello")  # a publisher that has said something
                await nc.flush()
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        finally:
            await asyncio.gather(*(nc.close() for nc in clients), return_exceptions=True)

    asyncio.run(hold())


def hold_roq(settings: dict[str, Any], role: str, count: int, ready: Any, stop: Any) -> None:
    """RoQ clients as the exchange sees them, at the protocol level (docs/protocol.md): a subscriber
    is a SUB connection subscribed to its prefix, the beat and its own sync marker (answered with a
    `sync`); a publisher is a DEALER connection that said `hello` (answered with a `welcome`). The
    client library's own threads (an I/O thread and a ZeroMQ context per client) are left out: 2,000
    of them would measure this 2-vCPU machine, not the exchange."""
    import zmq

    from roq import protocol
    from roq.config import config_from_json
    from roq.paths import Paths
    from roq.state import read_live
    from roq.zk import start_client, stop_client
    config = config_from_json(settings["config"])
    zk = start_client(config)
    try:
        live = next(iter(read_live(zk, Paths(config.zk.root), settings["queue"]).values()))
    finally:
        stop_client(zk)
    context = zmq.Context()
    socks: list[zmq.Socket] = []
    try:
        for _ in range(count):
            socks.append(_idle_subscriber(context, live["sub"]) if role == "sub" else
                         _idle_publisher(context, live["pub"]))
        deadline = time.monotonic() + 60
        pending = list(socks)
        while pending and time.monotonic() < deadline:  # each has its sync or welcome
            pending = [sock for sock in pending if not _answered(sock, role, protocol)]
        if pending:
            raise RuntimeError(f"{len(pending)} of {count} idle {role} connections got no answer")
        ready.set()
        stop.wait()
    finally:
        for sock in socks:
            sock.close(linger=0)
        context.term()


def _idle_subscriber(context: Any, endpoint: str) -> Any:
    import uuid

    import zmq

    from roq import protocol
    sock = context.socket(zmq.SUB)
    for topic in (b"bench/", protocol.BEAT_TOPIC, protocol.sync_topic(uuid.uuid4().hex)):
        sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.connect(endpoint)
    return sock


def _idle_publisher(context: Any, endpoint: str) -> Any:
    import secrets

    import zmq

    from roq import protocol
    sock = context.socket(zmq.DEALER)
    sock.connect(endpoint)
    token = secrets.token_bytes(16)
    sock.send(protocol.encode_hello(protocol.publisher_id_for(token), token, 1))
    return sock


def _answered(sock: Any, role: str, protocol: Any) -> bool:
    """A subscriber's sync marker came back (its subscriptions are live), or a publisher's welcome."""
    while sock.poll(0):
        frames = sock.recv_multipart()
        if role == "pub" or frames[0].startswith(protocol.SYNC_PREFIX):
            return True
    return False


# ---------------------------------------------------------------- the curves


THROUGHPUT_COLUMNS = (Column("msgs/s per sub", "msgs_per_s"), Column("p50 µs", "p50_us"), Column("p99 µs", "p99_us"))
CURVES = {c.name: c for c in (
    Curve("fanout", f"fan-out: 1 publisher → N subscribers, {SIZE} B", axis="subscribers", systems=THROUGHPUT_SYSTEMS,
          figure="deliveries_per_s", label="deliveries/s", higher_is_better=True, columns=THROUGHPUT_COLUMNS,
          panels=(("deliveries_per_s", "deliveries/s, all subscribers", True),), measure=fanout_point, x_base=2),
    Curve("fanin", f"fan-in: N publishers → 1 subscriber, {SIZE} B (RoQ: a queue of 2 exchanges)", axis="publishers",
          systems=THROUGHPUT_SYSTEMS, figure="msgs_per_s", label="msgs/s", higher_is_better=True,
          columns=THROUGHPUT_COLUMNS[1:], panels=(("msgs_per_s", "msgs/s at the subscriber", True),),
          measure=fanin_point, exchanges=2, x_base=2),
    Curve("topics", f"topics: round-robin over N topics, one prefix subscription, 1 → 1, {SIZE} B", axis="topics",
          systems=THROUGHPUT_SYSTEMS, figure="msgs_per_s", label="msgs/s", higher_is_better=True,
          columns=THROUGHPUT_COLUMNS[1:], panels=(("msgs_per_s", "msgs/s", True),), measure=topics_point),
    Curve("sizes", "message size, 1 → 1", axis="bytes", systems=THROUGHPUT_SYSTEMS, figure="msgs_per_s",
          label="msgs/s", higher_is_better=True,
          columns=(Column("MB/s", "mb_per_s", "{:,.1f}"), Column("messages", "messages"), Column("p99 µs", "p99_us")),
          panels=(("msgs_per_s", "msgs/s", True), ("mb_per_s", "MB/s", True)), measure=sizes_point),
    Curve("connections", "idle connections: N subscribers + N publishers; the broker process", axis="N",
          systems=CONNECTION_SYSTEMS, figure="bytes_per_connection", label="RSS B/conn", higher_is_better=False,
          columns=(Column("USS B/conn", "uss_bytes_per_connection"),
                   Column("RSS MB before", "rss_before_mb", "{:,.1f}"),
                   Column("RSS MB after", "rss_after_mb", "{:,.1f}"),
                   Column("CPU % before", "cpu_before", "{:,.1f}"), Column("CPU % after", "cpu_after", "{:,.1f}"),
                   Column("setup s", "setup_s", "{:,.1f}")),
          panels=(("bytes_per_connection", "RSS bytes per connection", False),
                  ("rss_after_mb", "RSS MB, connected", False), ("cpu_after", "CPU % idle, connected", False)),
          measure=connections_point),
    Curve("latency", f"latency at a paced rate, 1 → 1, {SIZE} B", axis="msg/s", systems=LATENCY_SYSTEMS,
          figure="p99_us", label="p99 µs", higher_is_better=False,
          columns=(Column("p50 µs", "p50_us"), Column("p99.9 µs", "p999_us"), Column("msgs/s", "msgs_per_s")),
          panels=(("p50_us", "p50 µs", True), ("p99_us", "p99 µs", True), ("p999_us", "p99.9 µs", True)),
          measure=latency_point),
)}


class RoqQueues:
    """One local RoQ cluster for a curve, started when its first RoQ system needs it and stopped
    with the curve (close()); each RoQ system, and each connections point, gets a queue of its
    own, deleted after it: fresh exchange processes, none left running beside the next."""

    def __init__(self, workdir: Path, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.workdir, self.overrides = workdir, overrides
        self._stack = contextlib.ExitStack()
        self._config: Any = None

    @contextlib.contextmanager
    def queue(self, name: str, exchanges: int = 1) -> Iterator[dict[str, Any]]:
        from roq.client.admin import Admin
        from roq.tools.bench_cli import ensure_queue
        if self._config is None:
            self._config = self._stack.enter_context(compare.local_cluster(self.workdir, overrides=self.overrides))
        ensure_queue(self._config, name, exchanges)
        try:
            yield {"config": self._config.to_json(), "queue": name}
        finally:
            try:
                with Admin(self._config) as admin:
                    admin.delete_queue(name)
            except Exception as exc:  # the cluster goes with the curve anyway; keep the first error
                print(f"could not delete queue {name}: {exc}", file=sys.stderr)

    def close(self) -> None:
        self._stack.close()


@contextlib.contextmanager
def system_settings(curve: Curve, system: str, workdir: Path, roq: RoqQueues) -> Iterator[dict[str, Any]]:
    """Start what `system` needs for the whole curve; yield the adapter settings."""
    if curve.name == "connections":
        yield {}  # each point starts a fresh broker of its own (idle_server)
    elif system in ROQ_SYSTEMS:
        with roq.queue(f"{curve.name}-{system}", curve.exchanges) as settings:
            yield settings
    else:
        with compare.system_settings(system, workdir) as settings:
            yield settings


def cluster_overrides(scale: Scale) -> dict[str, dict[str, Any]]:
    """RoQ's configuration for the curves: by default an exchange refuses more than 256 connections
    per client address and socket, and the connections curve opens up to 1,000 per socket from here."""
    return {"security": {"max_connections_per_client": max(256, max(scale.points["connections"]) + 256)}}


def measure_curve(curve: Curve, scale: Scale, round_no: int, workdir: Path, log: Callable[[str], None],
                  shared: RoqQueues | None = None) -> list[dict[str, Any]]:
    """Every system at every point of one curve, once. A point that fails is recorded with its error.
    RoQ's systems run on `shared`'s cluster, or on one of the curve's own."""
    rows = []
    base = servers.scratch(workdir, f"{curve.name}-{round_no}")
    with contextlib.ExitStack() as stack:
        roq = shared or stack.enter_context(contextlib.closing(RoqQueues(base / "roq", cluster_overrides(scale))))
        for system in curve.systems:
            log(f"[bold]{curve.name}[/] {system} (round {round_no + 1}, load {os.getloadavg()[0]:.2f})")
            try:
                with system_settings(curve, system, servers.scratch(base, system), roq) as settings:
                    for value in scale.points[curve.name]:
                        rows.append(measure_point(Point(curve, system, value, settings, scale, base, roq),
                                                  round_no, log))
            except Exception as exc:  # the system could not start: its points are missing, said once
                log(f"  [red]{system} failed: {exc!r}[/]")
                rows.append({"curve": curve.name, "system": system, "point": None, "round": round_no,
                             "error": repr(exc)})
    return rows


def measure_point(p: Point, round_no: int, log: Callable[[str], None]) -> dict[str, Any]:
    row: dict[str, Any] = {"curve": p.curve.name, "system": p.system, "point": p.value, "round": round_no,
                           "load1": round(os.getloadavg()[0], 2)}
    started = time.monotonic()
    try:
        row.update(p.curve.measure(p))
    except Exception as exc:
        row["error"] = repr(exc)
        log(f"  {p.curve.axis} {p.value:>6,}: [red]{exc!r}[/]")
        return row
    row["seconds"] = round(time.monotonic() - started, 2)
    figure = row[p.curve.figure]
    log(f"  {p.curve.axis} {p.value:>6,}: {p.curve.label} {figure:,.0f}" +
        (f", lost {row['lost']}" if row.get("lost") else "") + f" ({row['seconds']:.1f} s)")
    return row


# ---------------------------------------------------------------- ratios, medians, tables, charts


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's figure over raw ZeroMQ's at the same point of the same curve and round (None
    where that is not a positive number: a proxy whose memory did not grow at a few connections)."""
    figure = {name: curve.figure for name, curve in CURVES.items()}
    base = {(r["curve"], r["point"], r["round"]): r.get(figure[r["curve"]]) for r in rows
            if r["system"] == BASELINE and "error" not in r}
    for r in rows:
        if "error" in r:
            continue
        b, value = base.get((r["curve"], r["point"], r["round"])), r.get(figure[r["curve"]])
        r["vs_zeromq"] = round(value / b, 3) if b and b > 0 and value is not None else None


def summarise(rows: list[dict[str, Any]], curve: Curve, points: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per system and point: the median of every figure over the rounds with its [min, max], the
    median of the within-round ratios to raw ZeroMQ, losses summed, errors listed."""
    out = []
    for system in curve.systems:
        for value in points:
            group = [r for r in rows if r["curve"] == curve.name and r["system"] == system
                     and r["point"] in (value, None)]  # None: the system failed before its points
            good = [r for r in group if "error" not in r]
            summary: dict[str, Any] = {"system": system, "point": value, "rounds": len(good),
                                       "errors": [r["error"] for r in group if "error" in r]}
            if good and "lost" in good[0]:
                summary["lost"] = sum(r["lost"] for r in good)
            summary.update(compare.medians(good, [*curve.fields, "vs_zeromq"]))
            out.append(summary)
    return out


def table(curve: Curve, summary: list[dict[str, Any]], repeat: int) -> Table:
    out = Table(title=f"{curve.title} (medians of {repeat} round(s); min–max; × raw ZeroMQ within rounds)")
    headers = ["system", curve.axis, curve.label, "× zeromq", *(c.header for c in curve.columns)]
    if any("lost" in r for r in summary):
        headers.append("lost")
    for header in headers:
        out.add_column(header, justify="left" if header == "system" else "right")
    for r in summary:
        if r["errors"] and not r["rounds"]:
            out.add_row(r["system"], f"{r['point']:,}", "[red]failed[/]", *[""] * (len(headers) - 3))
            continue
        cells = [r["system"], f"{r['point']:,}", compare._spread(r, curve.figure, "{:,.0f}"),
                 compare._spread(r, "vs_zeromq", "{:.2f}"),
                 *(compare._spread(r, c.field, c.fmt) for c in curve.columns)]
        if "lost" in headers:
            cells.append(str(r.get("lost", "-")))
        out.add_row(*cells)
    return out


def chart(curve: Curve, summary: list[dict[str, Any]], path: Path) -> None:
    """One subplot per panel and one for the ratio to raw ZeroMQ: a line per system through the
    medians, whiskers from the lowest to the highest round; logarithmic x (and y where it suits)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    panels = [*curve.panels, ("vs_zeromq", "× raw ZeroMQ (within rounds)", True)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (name, label, log_y) in zip(axes[0], panels):
        plotted: list[float] = []
        for system in curve.systems:
            rows = [r for r in summary if r["system"] == system and r.get(name) is not None]
            if not rows:
                continue
            xs, ys = [r["point"] for r in rows], [r[name] for r in rows]
            spans = [r.get(f"{name}_range") or [r[name]] * 2 for r in rows]
            errors = [[y - lo for y, (lo, _) in zip(ys, spans)], [hi - y for y, (_, hi) in zip(ys, spans)]]
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=system)
            plotted += ys
        ax.set_xscale("log", base=curve.x_base)
        points = sorted({r["point"] for r in summary})
        ax.set_xticks(points, [f"{p:,}" for p in points], fontsize=8)
        ax.minorticks_off()
        if log_y and plotted and min(plotted) > 0:
            ax.set_yscale("log")
        if name == "vs_zeromq":
            ax.axhline(1.0, linestyle="--", color="grey", linewidth=1)
            plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")  # 0.3, 1, 2: not 3×10⁻¹
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel(curve.axis)
        ax.set_title(label, fontsize=10)
        if plotted:
            ax.legend(fontsize=8)
    fig.suptitle(curve.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------- the time it takes

# For the estimate only: rough deliveries/s (1 → 1, 100 B, 2 vCPUs, on the low side), payload
# bytes/s for big messages, and fixed costs in seconds (a run's processes starting, a cluster).
RATE = {"zeromq": 300_000, "python-hop": 200_000, "roq": 150_000, "roq-batch": 250_000, "nats": 50_000}
BANDWIDTH = {"zeromq": 600e6, "python-hop": 300e6, "roq": 200e6, "roq-batch": 200e6, "nats": 120e6}
MANY_TOPICS_RATE = 150_000  # RoQ over 10,000 topics: a frame carries many topics (data path 3)
PER_RUN, PER_PROCESS, PER_CLUSTER, PER_QUEUE = 0.3, 0.3, 4.5, 1.0


def estimate_seconds(curves: list[Curve], scale: Scale, repeat: int) -> float:
    total = PER_CLUSTER if scale.cluster_per_round else 0.0
    for curve in curves:
        if not scale.cluster_per_round and any(s in ROQ_SYSTEMS for s in curve.systems):
            total += PER_CLUSTER
        for system in curve.systems:
            total += PER_QUEUE if system in ROQ_SYSTEMS else 0.5
            total += sum(point_seconds(curve.name, system, value, scale) for value in scale.points[curve.name])
    return total * repeat


def point_seconds(curve: str, system: str, value: int, scale: Scale) -> float:
    rate: float = RATE[system]
    start = PER_RUN + 2 * PER_PROCESS + (0.5 if system in ROQ_SYSTEMS else 0)
    if curve == "connections":
        helpers = 2 * math.ceil(value / scale.clients_per_process[system])
        per_client = 0.01 if system == "roq" else 0.001
        return 2 * scale.idle_seconds + PER_RUN + helpers * PER_PROCESS + 2 * value * per_client + \
            (PER_QUEUE if system == "roq" else 0.3)
    if curve == "fanout":  # all deliveries over N subscribers grow about as the square root of N here
        return start + (value - 1) * PER_PROCESS + scale.fanout_messages * value / (rate * math.sqrt(value))
    if curve == "fanin":
        return start + (value - 1) * PER_PROCESS + scale.messages / rate
    if curve == "sizes":
        return start + size_messages(value, scale) / min(rate, BANDWIDTH[system] / value)
    if curve == "latency":
        return start + latency_messages(value, scale) / value
    if value > 1 and system in ROQ_SYSTEMS:  # topics
        rate = MANY_TOPICS_RATE if value >= 1000 else rate / 2
    return start + scale.topic_messages / rate


# ---------------------------------------------------------------- the command


def command(names: list[str], repeat: int, out: Path, smoke: bool) -> str:
    only = f" --only {','.join(names)}" if names != list(CURVES) else ""
    return (f".venv/bin/python bench/compare.py --curves{only} --repeat {repeat}" + (" --smoke" if smoke else "") +
            f" --out {out}")


FDS_PER_ROQ_CLIENT = 2  # an idle RoQ connection (hold_roq): its socket's TCP connection and a mailbox share


def fd_note(scale: Scale, limits: tuple[int, int]) -> str | None:
    """Whether the open-file limit leaves room for the biggest connections point: the broker holds a
    descriptor per connection, a helper process one context's worth per RoQ client it holds."""
    biggest = max(scale.points["connections"])
    need = max(2 * biggest + 512, scale.clients_per_process["roq"] * FDS_PER_ROQ_CLIENT + 256)
    if limits[0] < need:
        return (f"open files limited to {limits[0]} (hard {limits[1]}), {need} wanted: {biggest} idle subscribers "
                "and publishers may not all connect")
    return None


def main(only: list[str], repeat: int, out_dir: Path, smoke: bool, console: Console) -> None:
    unknown = sorted(set(only) - set(CURVES))
    if unknown:
        raise click.BadParameter(f"unknown curves {unknown}; choose from {list(CURVES)}", param_hint="--only")
    names = [name for name in CURVES if not only or name in only]
    chosen = [CURVES[name] for name in names]
    scale = SMOKE if smoke else FULL
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds like Ctrl-C: servers are stopped
    servers.ensure_installed(["nats"])
    limits = raise_fd_limit()
    note = fd_note(scale, limits)
    if note:
        console.print(f"[yellow]{note}[/]")
    estimate = estimate_seconds(chosen, scale, repeat)
    console.print(f"curves {', '.join(names)}, {repeat} round(s): about {estimate / 60:.1f} minutes")
    started, load_before = time.time(), os.getloadavg()
    stalls = machine.stalls(0.5 if smoke else 2.0)  # before anything of ours runs
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="roq-curves-") as tmp:
        for round_no in range(repeat):
            with contextlib.closing(RoqQueues(Path(tmp) / f"roq-{round_no}", cluster_overrides(scale))) as shared:
                for curve in chosen:
                    rows += measure_curve(curve, scale, round_no, Path(tmp), console.print,
                                          shared if scale.cluster_per_round else None)
    elapsed = time.time() - started
    add_ratios(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "command": command(names, repeat, out_dir, smoke),
        "when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "elapsed_seconds": round(elapsed), "estimate_seconds": round(estimate),
        "machine": {"cpus": stalls["cpus"], "python": platform.python_version(), "platform": platform.platform(),
                    "stalls": stalls, "guest_halt_poll_ns": machine.halt_poll_ns(),
                    "open_files": {"soft": limits[0], "hard": limits[1], "note": note},
                    "load_before": [round(x, 2) for x in load_before],
                    "load_after": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"smoke": smoke, "repeat": repeat, "baseline": BASELINE, **asdict(scale)},
        "curves": {}, "rounds": rows}
    for curve in chosen:
        points = scale.points[curve.name]
        summary = summarise(rows, curve, points)
        console.print(table(curve, summary, repeat))
        chart_path = out_dir / f"curves-{curve.name}.png"
        chart(curve, summary, chart_path)
        report["curves"][curve.name] = {
            "title": curve.title, "command": command([curve.name], repeat, out_dir, smoke), "axis": curve.axis,
            "points": list(points), "systems": list(curve.systems), "figure": curve.figure,
            "higher_is_better": curve.higher_is_better, "chart": chart_path.name, "results": summary}
    (out_dir / "curves.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out_dir / 'curves.json'} and {len(chosen)} charts (curves-*.png) in {elapsed:.0f} s "
                  f"(estimated {estimate:.0f} s)")
    lost = [(r["curve"], r["system"], r["point"]) for r in rows if r["system"] in ROQ_SYSTEMS and r.get("lost")]
    if lost:
        console.print(f"[red]RoQ lost messages at {lost}[/]")
    failed = [(r["curve"], r["system"], r["point"]) for r in rows if "error" in r]
    if failed:
        console.print(f"[red]failed points: {failed}[/]")
        sys.exit(1)

