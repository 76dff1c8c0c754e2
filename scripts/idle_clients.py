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

With `--failover` it then measures, every client still connected, the reactions the failover
suites assert (scripts/idle_failover.py): the SIGKILL of the exchange a real publisher uses (its
unconfirmed messages confirmed elsewhere, a real subscriber caught up, lost and duplicated), a
scale-out's new exchange used by the publisher, and the SIGKILL of the GCM leader (a new leader,
then the next topology change reaching every client). A table on stderr, `failover` in the JSON.

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
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import psutil  # noqa: E402
import zmq  # noqa: E402

from roq.client.admin import Admin  # noqa: E402
from roq.client.metadata import ATTEMPT_TIMEOUT  # noqa: E402
from roq.config import Config, load_config  # noqa: E402
from roq.protocol import decode_reply, encode_request  # noqa: E402
from roq.protocol.metadata import decode_push  # noqa: E402
from roq.tools.cluster import LocalCluster  # noqa: E402
from roq.tools.zkserver import four_letter  # noqa: E402
from scripts.idle_failover import Failover, table  # noqa: E402

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

def worker(config_path: str, count: int, ready: Any, rounds: Any, results: Any) -> None:
    """Hold `count` real subscribers; for each exchange id `rounds` names, say when each saw it
    (wall clock); None ends."""
    from roq.client import Subscriber
    config = load_config(config_path, env={})
    subs = [Subscriber(QUEUE, config, topics=["none"]) for _ in range(count)]
    ready.put(count)
    while (exchange := rounds.get()) is not None:
        seen: dict[int, float] = {}
        deadline = time.monotonic() + 60
        while len(seen) < count and time.monotonic() < deadline:
            for i, sub in enumerate(subs):
                if i not in seen and exchange in sub.topology.snapshot():
                    seen[i] = time.time()
            time.sleep(0.005)
        results.put(list(seen.values()) + [float("nan")] * (count - len(seen)))
    for sub in subs:
        sub.close()


# ------------------------------------------------------------------ protocol-level clients (this process)

def wait_for_descriptors(needed: int, timeout: float = 10.0) -> None:
    """Until `needed` more descriptors fit under this process's limit (closed sockets are reaped
    by libzmq's thread a moment later), or `timeout`."""
    import resource
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    deadline = time.monotonic() + timeout
    while len(os.listdir("/proc/self/fd")) + needed + 64 > limit and time.monotonic() < deadline:
        time.sleep(0.05)


class ProtocolClients:
    def __init__(self, seeds: list[str], count: int) -> None:
        self.context = zmq.Context()
        # libzmq's default is 1,023 sockets per context; a move to another seed opens the new socket
        # before the reaper has counted the old one out, so room for every client twice.
        self.context.MAX_SOCKETS = 2 * count + 16
        self.seeds = seeds
        self.socks = [self._connect(seeds[i % len(seeds)]) for i in range(count)]
        self.endpoints = [seeds[i % len(seeds)] for i in range(count)]
        self.ids = itertools.count(1)
        self.lease = 30.0
        self.renewed = 0.0
        self.by_answer = 0  # of the last wait_for: clients that learnt the change from a watch's answer
        self.moved_at = 0.0  # when leave() sent the moved clients' watches; their answers' delays:
        self.answer_delays: list[float] = []

    def _connect(self, endpoint: str) -> zmq.Socket[bytes]:
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(endpoint)
        return sock

    def leave(self, dead: str) -> None:
        """Every client of the GCM at `dead` renews there, waits ATTEMPT_TIMEOUT for the answer that
        does not come and watches on the next seed instead (roq.client.metadata's way)."""
        mine = [i for i, endpoint in enumerate(self.endpoints) if endpoint == dead]
        for i in mine:
            self.socks[i].send(encode_request(next(self.ids), "metadata.watch", {"queues": [QUEUE]}))
        time.sleep(ATTEMPT_TIMEOUT)  # the client's timeout: nothing answers a dead GCM
        other = next(seed for seed in self.seeds if seed != dead)
        moving = [i for i in mine if not self._answered(self.socks[i])]
        for i in moving:  # closed first: libzmq's reaper frees their descriptors before new ones open
            self.socks[i].close(linger=0)
        wait_for_descriptors(len(moving) * 2)
        self.moved_at, self.answer_delays = time.time(), []
        for i in moving:
            self.socks[i], self.endpoints[i] = self._connect(other), other
            self.socks[i].send(encode_request(next(self.ids), "metadata.watch", {"queues": [QUEUE]}))

    @staticmethod
    def _answered(sock: zmq.Socket[bytes]) -> bool:
        """Has a reply come (pushes read meanwhile are dropped: the new seed's watch repairs them)?"""
        replied = False
        while sock.poll(0):
            replied = decode_push(sock.recv()) is None or replied
        return replied

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
        self.by_answer = 0
        deadline = time.monotonic() + timeout
        while len(seen) < len(self.socks) and time.monotonic() < deadline:
            for i, sock in enumerate(self.socks):
                while i not in seen and sock.poll(0):
                    frame = sock.recv()
                    if decode_push(frame) is None and self.moved_at:
                        self.answer_delays.append(time.time() - self.moved_at)
                    if exchange in self._exchanges_in(frame):
                        seen[i] = time.time()
                        self.by_answer += decode_push(frame) is None
            time.sleep(0.002)
        return list(seen.values()) + [float("nan")] * (len(self.socks) - len(seen))

    @staticmethod
    def _exchanges_in(frame: bytes) -> dict[str, Any]:
        """The exchanges a push or a watch's answer shows (a client moved to another seed learns the
        topology from its watch's answer when that comes after the change)."""
        push = decode_push(frame)
        if push is not None:
            return dict(push["exchanges"])
        reply = decode_reply(frame)
        body = reply.result.get("queues", {}).get(QUEUE, {}) if reply.ok and isinstance(reply.result, dict) else {}
        return dict(body.get("exchanges") or {})

    def close(self) -> None:
        self.context.destroy(linger=0)


# ------------------------------------------------------------------ the run

def while_idle(protocol: ProtocolClients, pids: list[int], seconds: float) -> float:
    """CPU of `pids` over `seconds` while the protocol-level clients stay registered."""
    out: list[float] = []
    thread = threading.Thread(target=lambda: out.append(cpu_percent(pids, seconds)))
    thread.start()
    protocol.idle(seconds)
    thread.join()
    return out[0]


def scale(config: Config, exchanges: int) -> float:
    """Scale the idle queue; the wall-clock time of the answer."""
    with Admin(config) as admin:
        admin.call("queue.scale", name=QUEUE, exchanges=exchanges)
    return time.time()


def spread(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {"count": len(ordered), "p50": round(ordered[len(ordered) // 2], 3) if ordered else None,
            "max": round(ordered[-1], 3) if ordered else None}


def reach(protocol: ProtocolClients, results: Any, workers: int, exchange: str, since: float) -> dict[str, Any]:
    """How long after `since` every client saw `exchange` (the workers were told to look for it)."""
    times = protocol.wait_for(exchange, 60) if protocol.socks else []
    missed_protocol = sum(1 for t in times if t != t)
    for _ in range(workers):
        times += results.get(timeout=120)
    delays = sorted(t - since for t in times if t == t)
    return {"clients": len(times), "missed": sum(1 for t in times if t != t), "missed_protocol": missed_protocol,
            "protocol_by_answer": protocol.by_answer,
            "moved_watch_answered_s": spread(protocol.answer_delays),
            "p50_s": round(delays[len(delays) // 2], 3) if delays else None,
            "p99_s": round(delays[max(0, int(len(delays) * 0.99) - 1)], 3) if delays else None,
            "all_s": round(delays[-1], 3) if delays else None}


def failovers(failover: Failover, protocol: ProtocolClients, rounds: list[Any], results: Any) -> dict[str, Any]:
    """(a) the publisher's exchange killed, (c) the GCM leader killed then a scale-out reaching
    every client; (b) was measured with the first scale-out."""
    failover.kill_exchange()
    # A fresh lease for the protocol-level clients, as real ones renew by themselves: the phases
    # since the last renewal may otherwise outlast it (30 s) and their watches lapse.
    protocol.watch_all()
    dead, _ = failover.kill_leader()
    try:
        protocol.leave(dead)
    except zmq.ZMQError as exc:  # the figures so far are kept; say what stopped the rest
        failover.figures["leader_kill"]["error"] = f"moving the protocol-level clients: {exc}"
        return failover.finish()
    for mine in rounds:
        mine.put("x4")
    scaled_at = failover.scale(4)
    failover.figures["leader_kill"]["next_change_reached_all"] = reach(protocol, results, len(rounds), "x4",
                                                                       scaled_at)
    return failover.finish()


def measure(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    # Every client here comes from one address: security.max_connections_per_client (256 per address
    # and socket) would refuse all but the first few hundred.
    cluster = LocalCluster(Config().replace(cluster={"gcms": 2, "hcms": 2},
                                            security={"max_connections_per_client": 0}), run_dir)
    state = cluster.up(progress=lambda text: print(f"  {text}", file=sys.stderr))
    workers: list[multiprocessing.Process] = []
    rounds: list[Any] = []
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
        ready, results = ctx.Queue(), ctx.Queue()
        rounds = [ctx.Queue() for _ in range(args.processes)]
        for mine in rounds:
            proc = ctx.Process(target=worker, args=(str(cluster.config_path), args.real_per_process, ready, mine,
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
        failover = Failover(config, state, QUEUE) if args.failover else None
        if failover is not None:
            failover.start()
        protocol.drain(lambda body: None)
        for mine in rounds:
            mine.put("x3")
        scaled_at = scale(config, 3)
        used = None
        if failover is not None:  # beside the clients' clocks: the protocol ones stamp pushes when read
            used = threading.Thread(target=failover.scale_used, args=("x3", scaled_at))
            used.start()
        change = reach(protocol, results, len(workers), "x3", scaled_at)
        if used is not None:
            used.join()
        result = {
            "real_clients": args.processes * args.real_per_process, "worker_processes": args.processes,
            "protocol_clients": args.protocol, "idle_seconds": args.idle, "before": before,
            "with_clients": with_clients, "topology_change": change,
        }
        if failover is not None:
            try:
                result["failover"] = failovers(failover, protocol, rounds, results)
            finally:
                failover.close()
            print(table(result["failover"]), file=sys.stderr)
        result["load1"] = round(os.getloadavg()[0], 2)
        return result
    finally:
        if protocol is not None:
            protocol.close()
        for mine in rounds if workers else ():
            mine.put(None)
        for proc in workers:
            proc.join(timeout=10)
            proc.terminate()
        cluster.down()


def more_open_files(wanted: int = 65_536) -> None:
    """Each protocol-level client holds 2 descriptors (its socket's mailbox and TCP connection), and a
    move to another seed opens the new one before libzmq's reaper closes the old: 9,600 clients need
    more than the usual 20,000. Raised as far as the system lets (root may raise the hard limit)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for limit in ((wanted, max(hard, wanted)), (min(wanted, hard), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            return
        except (ValueError, OSError):
            continue


def main() -> None:
    more_open_files()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="worker processes of real clients")
    parser.add_argument("--real-per-process", type=int, default=10, help="real Subscriber objects per worker")
    parser.add_argument("--protocol", type=int, default=100, help="protocol-level clients in this process")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="seconds of each CPU window; a multiple of a third of gcm.metadata_lease (10 s) "
                             "holds as many renewal rounds in each window (30 for figures)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the queue runs, before measuring")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument("--failover", action="store_true",
                        help="with every client connected, also measure the failover reactions "
                             "(scripts/idle_failover.py): exchange SIGKILL, scale-out, GCM leader SIGKILL")
    args = parser.parse_args()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="roq-idle-clients-"))
    result = measure(args, run_dir.absolute())
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
