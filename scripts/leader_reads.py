#!/usr/bin/env python3
"""The leader GCM's ZooKeeper reads per second and its tick time, at --queues x --exchanges (not in CI).

Starts a standalone ZooKeeper (roq.tools.zkserver.ZooKeeperServer, with the `cons` four-letter word
allowed), two HCMs as processes (tests.support.helpers.Processes) and one GCM in this process, with the
default intervals (gcm.tick 1 s, exchange and host statistics every 1 s). The GCM runs here so
that its own KazooClient can be counted: every get, get_children and exists it sends, synchronous
or not, from the tick, a watch or a cache (`reads`), and every transaction or create/set/delete
(`writes`). The tick is timed around Reconciler.tick + Autoscaler.tick, the work the leader loop
does on each tick. ZooKeeper's own count of the packets it received on the leader's session
(`cons`) is printed beside it as a cross-check (it would also count pings and writes).

Creates the queues (timing each create, answered by the leader), waits until every exchange runs,
lets the cluster settle, then measures for --seconds. Bounded: every wait has a deadline;
everything started is stopped in `finally`.

    .venv/bin/python scripts/leader_reads.py                       # this tree
    .venv/bin/python scripts/leader_reads.py --tree /tmp/before    # another checkout's gcm/hcm/exchange/roq
    # e.g. mkdir /tmp/before && git archive b81f4b2 gcm hcm exchange roq | tar -x -C /tmp/before

Figures (50 queues x 2 exchanges, 30 s, a 2-core VM shared with other test runs; two runs each):

    tree                                   reads/s   reads/tick   tick ms median / p90 / max   create ms median
    b81f4b2, before the cache              353       459          289-301 / 339-385 / 431-660  18-19
    cache, autoscaler still reading ZK     439-445   451          246-304 / 352-399 / 412-872  39-42
    cache, autoscaler reading the cache    90-93     0              9-12 /  18-20 /  31-61   29-32

With the cache every read left is a TreeCache re-reading a znode whose watch fired: the 100
exchanges' and 2 hosts' statistics, each published about once a second. Without the autoscaler's
part its polling stays and the re-reads come on top. A create is answered once the cache shows it
(a few watch-and-read round trips), which costs it about 10 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

READ_CALLS = ("get_async", "get_children_async", "exists_async")
WRITE_CALLS = ("create_async", "set_async", "delete_async", "transaction")
SETTLE = 5.0  # seconds between the last exchange running and the measurement


class Counter:
    """Calls of the leader's KazooClient, and which of them its tick thread made inside a tick."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reads = 0
        self.writes = 0
        self.in_tick = threading.local()
        self.tick_reads = 0

    def wrap(self, client: Any) -> Any:
        for name in READ_CALLS + WRITE_CALLS:
            setattr(client, name, self._counting(getattr(client, name), name in READ_CALLS))
        return client

    def _counting(self, call: Any, read: bool) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                if read:
                    self.reads += 1
                    if getattr(self.in_tick, "on", False):
                        self.tick_reads += 1
                else:
                    self.writes += 1
            return call(*args, **kwargs)
        return counted

    def snapshot(self) -> tuple[int, int, int]:
        with self.lock:
            return self.reads, self.writes, self.tick_reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=50)
    parser.add_argument("--exchanges", type=int, default=2, help="per queue")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the measurement")
    parser.add_argument("--tree", type=Path, help="run gcm/hcm/exchange/roq from this directory instead")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    root = (args.tree or Path(__file__).resolve().parent.parent).resolve()
    output = args.json.resolve() if args.json else None
    # This process imports from `root` first, before the editable install's finder; the HCMs and
    # their exchanges (`python -m ...`, which puts the working directory first) from it too.
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    os.chdir(root)
    figures = measure(args.queues, args.exchanges, args.seconds)
    figures["tree"] = str(root)
    print(json.dumps(figures, indent=2))
    if output:
        output.write_text(json.dumps(figures, indent=2) + "\n")


def measure(queues: int, exchanges: int, seconds: float) -> dict[str, Any]:
    import logging

    import gcm.daemon
    from gcm.autoscaler import Autoscaler
    from gcm.reconciler import Reconciler
    from roq.client.admin import Admin
    from roq.config import Config
    from roq.paths import Paths
    from roq.state import read_hosts, read_leader, read_live
    from roq.zk import start_client, stop_client
    try:
        from roq.tools.zkserver import ZooKeeperServer, four_letter
        from tests.support.helpers import Processes, wait_until
    except ImportError:  # a checkout from before roq/tools/ (b81f4b2, to measure "before")
        from roq.testing import Processes, wait_until
        from roq.zookeeper import ZooKeeperServer, four_letter

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    class Server(ZooKeeperServer):
        def write_config(self) -> Path:
            cfg = super().write_config()
            cfg.write_text(re.sub(r"4lw\.commands\.whitelist=.*", "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons",
                                  cfg.read_text()))
            return cfg

    counter = Counter()
    original_start = gcm.daemon.start_client
    gcm.daemon.start_client = lambda *a, **k: counter.wrap(original_start(*a, **k))
    ticks: list[float] = []
    tick_reads: list[int] = []
    rec_tick, auto_tick = Reconciler.tick, Autoscaler.tick
    current: list[tuple[float, int]] = []  # when the running tick started, and the tick reads by then

    def reconcile(self: Any, *a: Any, **k: Any) -> Any:
        current[:] = [(time.perf_counter(), counter.snapshot()[2])]
        counter.in_tick.on = True
        try:
            return rec_tick(self, *a, **k)
        except BaseException:  # the autoscaler does not run: this tick is not counted
            counter.in_tick.on = False
            current.clear()
            raise

    def autoscale(self: Any, *a: Any, **k: Any) -> Any:
        try:
            return auto_tick(self, *a, **k)
        finally:
            counter.in_tick.on = False
            if current:
                ticks.append(time.perf_counter() - current[0][0])
                tick_reads.append(counter.snapshot()[2] - current[0][1])

    Reconciler.tick = reconcile
    Autoscaler.tick = autoscale

    work = Path(tempfile.mkdtemp(prefix="roq-leader-reads-"))
    server = Server(work / "zookeeper")
    server.start()
    per_host = -(-queues * exchanges // 2)
    import socket
    with socket.socket() as probe:  # the GCM in this process: the clients' seed
        probe.bind(("127.0.0.1", 0))
        seed_port = probe.getsockname()[1]
    config = Config().replace(
        zk={"hosts": server.connect_string, "root": f"/reads-{uuid.uuid4().hex[:8]}"},
        gcm={"metrics_port": -1, "port": seed_port},
        cluster={"seeds": f"tcp://127.0.0.1:{seed_port}"},
        hcm={"capacity": per_host + 2, "metrics_port": -1},
        log={"level": "WARNING"},
    )
    paths = Paths(config.zk.root)
    procs = Processes(config, work / "daemons")
    zk = start_client(config)
    leader = gcm.daemon.Gcm(config)
    thread = threading.Thread(target=leader.run, name="gcm", daemon=True)
    try:
        thread.start()
        for host in ("host-1", "host-2"):
            procs.hcm(host)
        wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 2, timeout=60,
                   message="the leader and both hosts")
        creates = []
        with Admin(config) as admin:
            for i in range(queues):
                started = time.perf_counter()
                admin.create_queue(f"q{i}", exchanges=exchanges)
                creates.append(time.perf_counter() - started)
        total = queues * exchanges
        wait_until(lambda: sum(len(read_live(zk, paths, f"q{i}")) for i in range(queues)) == total,
                   timeout=max(120.0, total * 2.0), interval=1.0, message=f"all {total} exchanges running")
        time.sleep(SETTLE)  # measured figures: let the creates' catch-up ticks pass
        session = leader.client.client_id[0]
        first_ticks = len(ticks)
        zk_before = _received(four_letter(server.host, server.port, "cons"), session)
        before = counter.snapshot()
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        after = counter.snapshot()
        zk_after = _received(four_letter(server.host, server.port, "cons"), session)
        window = ticks[first_ticks:]
        window_reads = tick_reads[first_ticks:]
        return {
            "queues": queues, "exchanges_per_queue": exchanges, "seconds": round(elapsed, 1),
            "reads_per_s": round((after[0] - before[0]) / elapsed, 1),
            "writes_per_s": round((after[1] - before[1]) / elapsed, 2),
            "zk_packets_received_per_s": round((zk_after - zk_before) / elapsed, 1) if zk_before >= 0 else None,
            "ticks": len(window),
            "reads_per_tick": round(statistics.mean(window_reads), 1) if window_reads else None,
            "tick_ms_median": round(statistics.median(window) * 1000, 2) if window else None,
            "tick_ms_p90": round(sorted(window)[int(0.9 * (len(window) - 1))] * 1000, 2) if window else None,
            "tick_ms_max": round(max(window) * 1000, 2) if window else None,
            "create_ms_median": round(statistics.median(creates) * 1000, 1),
            "create_ms_max": round(max(creates) * 1000, 1),
            "gcm_from": str(Path(gcm.daemon.__file__).parent),
        }
    finally:
        leader.stop()
        thread.join(timeout=30)
        procs.stop_all()
        stop_client(zk)
        server.stop()


def _received(cons: str, session: int) -> int:
    """Packets ZooKeeper received on one session, from the `cons` four-letter word; -1 if not listed."""
    for line in cons.splitlines():
        sid = re.search(r"sid=0x([0-9a-f]+)", line)
        if sid and int(sid.group(1), 16) == session:
            match = re.search(r"recved=(\d+)", line)
            return int(match.group(1)) if match else -1
    return -1


if __name__ == "__main__":
    main()
