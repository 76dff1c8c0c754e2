"""Idle clients against one local cluster: what they cost ZooKeeper and the GCMs, and how fast a
topology change reaches all of them (issue 36).

Starts the cluster of `roq cluster up` (1 ZooKeeper, 2 GCMs, 2 HCMs) in a scratch directory with one
queue of 2 exchanges, then connects two kinds of idle clients:

* real clients: `--processes` worker processes, each holding `--real-per-process` real
  `roq.client.Subscriber` objects (each its own metadata conversation, I/O thread and sockets);
* protocol-level clients: `--protocol` DEALER sockets in this process, each speaking
  docs/protocol.md section 8 by hand (`metadata.watch`, renewals at a third of the lease, pushes),
  for the counts one machine cannot hold as real objects.

It measures over `--idle` seconds with every client connected, against the same window before
any client: ZooKeeper's CPU (percent of one core, its process's CPU time) and its connections
(`mntr` zk_num_alive_connections: one per session); the GCMs' CPU. Then it scales the queue to 3
exchanges and reports how long until every client saw the third (the real ones by their
topology, the protocol ones by a push), from the scale request's answer.

    .venv/bin/python scripts/idle_clients.py --processes 4 --real-per-process 250 --protocol 9000

Figures on a busy machine say little: run it on a quiet one. Smoke run: the defaults (small).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import psutil  # noqa: E402
import zmq  # noqa: E402

from roq.client.admin import Admin  # noqa: E402
from roq.config import Config, load_config  # noqa: E402
from roq.protocol import decode_reply, encode_request  # noqa: E402
from roq.protocol.metadata import decode_push  # noqa: E402
from roq.tools.cluster import LocalCluster  # noqa: E402
from roq.tools.zkserver import four_letter  # noqa: E402

QUEUE = "idle"


def zk_connections(host: str, port: int) -> int:
    found = re.search(r"zk_num_alive_connections\s+(\d+)", four_letter(host, port, "mntr", timeout=5.0))
    if not found:
        raise RuntimeError("no zk_num_alive_connections in mntr (4lw.commands.whitelist)")
    return int(found.group(1))


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system + times.children_user + times.children_system
    return total


def cpu_percent(pids: list[int], seconds: float) -> float:
    """Percent of one core the processes used over `seconds` (sleeping meanwhile: a measurement)."""
    before = cpu_seconds(pids)
    time.sleep(seconds)
    return round(100 * (cpu_seconds(pids) - before) / seconds, 2)


# ------------------------------------------------------------------ real clients (worker processes)

def worker(config_path: str, count: int, ready: Any, go: Any, results: Any) -> None:
    """Hold `count` real subscribers; say when each saw x3 (wall clock)."""
    from roq.client import Subscriber
    config = load_config(config_path, env={})
    subs = [Subscriber(QUEUE, config, topics=["none"]) for _ in range(count)]
    ready.put(count)
    go.wait()
    seen: dict[int, float] = {}
    deadline = time.monotonic() + 60
    while len(seen) < count and time.monotonic() < deadline:
        for i, sub in enumerate(subs):
            if i not in seen and "x3" in sub.topology.snapshot():
                seen[i] = time.time()
        time.sleep(0.005)
    results.put(list(seen.values()) + [float("nan")] * (count - len(seen)))
    for sub in subs:
        sub.close()


# ------------------------------------------------------------------ protocol-level clients (this process)

class ProtocolClients:
    def __init__(self, seeds: list[str], count: int) -> None:
        self.context = zmq.Context()
        self.context.MAX_SOCKETS = count + 16  # libzmq's default is 1,023 sockets per context
        self.socks = []
        for i in range(count):
            sock = self.context.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(seeds[i % len(seeds)])
            self.socks.append(sock)
        self.ids = itertools.count(1)
        self.lease = 30.0
        self.renewed = 0.0

    def watch_all(self) -> None:
        """One watch per socket, every answer awaited (renewals too)."""
        for sock in self.socks:
            sock.send(encode_request(next(self.ids), "metadata.watch", {"queues": [QUEUE]}))
        for sock in self.socks:
            while True:
                if not sock.poll(10_000):
                    raise RuntimeError("a GCM did not answer a watch within 10 s")
                frame = sock.recv()
                if decode_push(frame) is None:
                    reply = decode_reply(frame)
                    if not reply.ok:
                        raise RuntimeError(f"watch refused: {reply.code} {reply.message}")
                    self.lease = float(reply.result["lease"])
                    break
        self.renewed = time.monotonic()

    def idle(self, seconds: float) -> None:
        """Stay registered (renew at a third of the lease), dropping pushes."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if time.monotonic() - self.renewed > self.lease / 3:
                self.watch_all()
            self.drain(lambda body: None)
            time.sleep(0.05)

    def drain(self, on_push: Any) -> None:
        for sock in self.socks:
            while sock.poll(0):
                push = decode_push(sock.recv())
                if push is not None:
                    on_push(push)

    def wait_for(self, exchange: str, timeout: float) -> list[float]:
        seen: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < len(self.socks) and time.monotonic() < deadline:
            for i, sock in enumerate(self.socks):
                while i not in seen and sock.poll(0):
                    push = decode_push(sock.recv())
                    if push is not None and exchange in push["exchanges"]:
                        seen[i] = time.time()
            time.sleep(0.002)
        return list(seen.values()) + [float("nan")] * (len(self.socks) - len(seen))

    def close(self) -> None:
        self.context.destroy(linger=0)


# ------------------------------------------------------------------ the run

def while_idle(protocol: ProtocolClients, pids: list[int], seconds: float) -> float:
    """CPU of `pids` over `seconds` while the protocol-level clients stay registered."""
    import threading
    out: list[float] = []
    thread = threading.Thread(target=lambda: out.append(cpu_percent(pids, seconds)))
    thread.start()
    protocol.idle(seconds)
    thread.join()
    return out[0]


def measure(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    # Every client here comes from one address: security.max_connections_per_client (256 per address
    # and socket) would refuse all but the first few hundred.
    cluster = LocalCluster(Config().replace(cluster={"gcms": 2, "hcms": 2},
                                            security={"max_connections_per_client": 0}), run_dir)
    state = cluster.up(progress=lambda text: print(f"  {text}", file=sys.stderr))
    workers: list[multiprocessing.Process] = []
    protocol: ProtocolClients | None = None
    try:
        config = load_config(cluster.config_path, env={})
        host, port = state.zk_hosts.rsplit(":", 1)
        zk_pid = next(p["pid"] for p in state.processes if p["role"] == "zookeeper")
        gcm_pids = [p["pid"] for p in state.processes if p["role"] == "gcm"]
        with Admin(config) as admin:
            admin.create_queue(QUEUE, exchanges=2)
        time.sleep(args.settle)  # measurement: let start-up work finish
        before = {"zk_connections": zk_connections(host, int(port)),
                  "zk_cpu_percent": cpu_percent([zk_pid], args.idle),
                  "gcms_cpu_percent": cpu_percent(gcm_pids, args.idle)}
        print(f"  before any client: {before}", file=sys.stderr)
        ctx = multiprocessing.get_context("spawn")
        ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        for _ in range(args.processes):
            proc = ctx.Process(target=worker, args=(str(cluster.config_path), args.real_per_process, ready, go,
                                                     results), daemon=True)
            proc.start()
            workers.append(proc)
        for _ in workers:
            ready.get(timeout=300)
        protocol = ProtocolClients(config.cluster.seeds.split(","), args.protocol)
        if args.protocol:
            protocol.watch_all()
        print(f"  {args.processes * args.real_per_process} real and {args.protocol} protocol-level clients "
              "connected", file=sys.stderr)
        with_clients = {"zk_connections": zk_connections(host, int(port))}
        zk_cpu = while_idle(protocol, [zk_pid], args.idle)
        gcm_cpu = while_idle(protocol, gcm_pids, args.idle)
        with_clients.update(zk_cpu_percent=zk_cpu, gcms_cpu_percent=gcm_cpu,
                            zk_connections_after=zk_connections(host, int(port)))
        print(f"  with the clients: {with_clients}", file=sys.stderr)
        protocol.drain(lambda body: None)
        go.set()
        with Admin(config) as admin:
            admin.call("queue.scale", name=QUEUE, exchanges=3)
        scaled_at = time.time()
        times = protocol.wait_for("x3", 60) if args.protocol else []
        for _ in workers:
            times += results.get(timeout=120)
        delays = sorted(t - scaled_at for t in times if t == t)
        missed = sum(1 for t in times if t != t)
        return {
            "real_clients": args.processes * args.real_per_process, "worker_processes": args.processes,
            "protocol_clients": args.protocol, "idle_seconds": args.idle, "before": before,
            "with_clients": with_clients,
            "topology_change": {"clients": len(times), "missed": missed,
                                "p50_s": round(delays[len(delays) // 2], 3) if delays else None,
                                "p99_s": round(delays[int(len(delays) * 0.99) - 1], 3) if delays else None,
                                "all_s": round(delays[-1], 3) if delays else None},
            "load1": round(os.getloadavg()[0], 2),
        }
    finally:
        if protocol is not None:
            protocol.close()
        for proc in workers:
            proc.terminate()
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="worker processes of real clients")
    parser.add_argument("--real-per-process", type=int, default=10, help="real Subscriber objects per worker")
    parser.add_argument("--protocol", type=int, default=100, help="protocol-level clients in this process")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of each CPU window")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the queue runs, before measuring")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="roq-idle-clients-"))
    result = measure(args, run_dir.absolute())
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
