#!/usr/bin/env python3
"""A new replica catches up from the primary's disk (issue 35 item 2): state transfer of hours of
data while confirms go on.

On a fresh local cluster of 3 hosts, one queue of one exchange with `replicas 2` and a disk
storage policy is filled with `--gigabytes` GB (`--size`-byte messages, batch API, confirmed: an
hour at 5,000 msg/s of 100 B is 1.8 GB of payload). A steady publisher then sends `--rate`
messages a second, each flushed on its own so its confirm time is measured. The replica's host is
killed (its HCM and exchanges, SIGKILL; its disk is not used again): the leader places a new replica
on the third host, which takes the memory tail at once (confirms wait for that) and the rest from
the primary's segment store by state transfer (docs/protocol.md 6.5), which confirms never wait for.

Reported: the seconds from the kill until the new replica runs, the transfer's seconds, bytes
and MB/s (the new replica's store on disk), and the steady publisher's confirm times (p50, p99, max)
before the kill, from the kill until the new replica ran (confirms wait for a replica: this is the
replacement), and during the transfer (the confirm times "before" are the baseline of the same
run); its messages sent, confirmed and left unconfirmed.

    .venv/bin/python bench/replica_catchup.py --gigabytes 2 --json out.json
    .venv/bin/python bench/replica_catchup.py --gigabytes 0.05 --memory-bytes 1000000  # smoke

Run it alone on the machine: other load changes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench.disk_catchup import fill_roq  # noqa: E402

QUEUE = "transfer"
RETENTION = 7 * 24 * 3600.0  # a week: nothing ages out during the run


class Steady:
    """A publisher sending `rate` messages a second, each flushed alone: its confirm times by phase
    (what `phase` said when the message was sent; "replacement" when it changed before the confirm)."""

    def __init__(self, config: Any, rate: float) -> None:
        from roq.client import Publisher
        self.pub = Publisher(QUEUE, config)
        self.rate = rate
        self.phase = "before"
        self.times: dict[str, list[float]] = {}
        self.sent = self.confirmed = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            phase, started = self.phase, time.perf_counter()
            self.pub.publish("steady", self.sent.to_bytes(8, "big"))
            self.sent += 1
            try:
                self.pub.flush(60)
            except Exception as exc:  # counted as not confirmed; the figures say so
                self.failed.append(repr(exc))
                continue
            self.confirmed = self.sent
            # A confirm that waited across a change of phase (the kill) counts as the replacement's.
            waited = phase if phase == self.phase else "replacement"
            self.times.setdefault(waited, []).append(time.perf_counter() - started)
            next_at += 1 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=120)
        self.pub.close()
        return {"sent": self.sent, "confirmed": self.confirmed, "unconfirmed": self.sent - self.confirmed,
                "errors": self.failed[:5],
                "confirm_ms": {phase: spread(times) for phase, times in self.times.items()}}


def spread(seconds: list[float]) -> dict[str, Any]:
    ordered = sorted(seconds)
    if not ordered:
        return {"count": 0}
    return {"count": len(ordered), "p50": round(ordered[len(ordered) // 2] * 1e3, 2),
            "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 2),
            "max": round(ordered[-1] * 1e3, 2)}


def fill(config: Any, gigabytes: float, size: int) -> dict[str, Any]:
    """`gigabytes` of `size`-byte messages, confirmed (disk_catchup's fill)."""
    messages = int(gigabytes * 1e9 / size)
    rate = fill_roq(config, QUEUE, messages, size)
    return {"messages": messages, "seconds": round(messages / rate, 1), "msg_per_s": round(rate),
            "mb_per_s": round(rate * size / 1e6)}


def kill_host(state: Any, host: str) -> None:
    """SIGKILL a host's HCM and everything it runs, as if the machine went away."""
    pid = next(p["pid"] for p in state.processes if p["name"] == host)
    victims = psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]
    for proc in victims:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from kazoo.client import KazooClient

    from roq.client import Admin
    from roq.config import Config, load_config
    from roq.paths import Paths
    from roq.records import ExchangeStats
    from roq.state import read_live
    from roq.tools.cluster import LocalCluster
    from roq.zk import read_json
    from tests.support.helpers import wait_until

    # A lost host holding a disk-retained queue's replica is waited for (journal_reassign_grace)
    # before the replica moves: here it never comes back, so the wait is short.
    cluster = LocalCluster(Config().replace(cluster={"gcms": 2, "hcms": 3},
                                            gcm={"journal_reassign_grace": 1.0},
                                            exchange={"retention_bytes": args.memory_bytes}), workdir / "cluster")
    state = cluster.up()
    zk = KazooClient(hosts=state.zk_hosts)
    zk.start(timeout=15)
    steady = None
    try:
        config = load_config(cluster.config_path, env={})
        paths = Paths(config.zk.root)
        with Admin(config) as admin:
            admin.create_queue(QUEUE, replicas=2, retention=RETENTION,
                               retention_bytes=int(args.gigabytes * 1e9 * 3) + (1 << 30))
            admin.wait_running(QUEUE, 1, timeout=60)
        wait_until(lambda: read_json(zk, paths.replica_live(QUEUE, "x1")), timeout=60, message="a replica")
        result: dict[str, Any] = {"gigabytes": args.gigabytes, "size": args.size,
                                  "fill": fill(config, args.gigabytes, args.size)}
        print("filled", result["fill"], file=sys.stderr, flush=True)
        steady = Steady(config, args.rate)
        steady.start()
        wait_until(lambda: steady.confirmed >= args.rate * 5, timeout=60, message="5 s of steady confirms")
        old = read_json(zk, paths.replica_live(QUEUE, "x1")) or {}
        steady.phase = "replacement"
        killed = time.monotonic()
        kill_host(state, str(old["host"]))

        def new_replica() -> dict[str, Any] | None:
            now = read_json(zk, paths.replica_live(QUEUE, "x1"))
            return now if now and now.get("host") != old["host"] else None

        wait_until(new_replica, timeout=120, interval=0.01, message="a new replica")
        placed = time.monotonic()
        steady.phase = "transfer"

        def transfer_done() -> bool:
            """The primary has no transfer under way and the new replica's store is as large as the
            primary's (figures of each one's stats tick, once a second)."""
            primary = ExchangeStats.from_dict(read_live(zk, paths, QUEUE)["x1"].get("stats"))
            replica = ExchangeStats.from_dict((new_replica() or {}).get("stats"))
            return (primary.transfer_end == 0 and replica.transferring == 0
                    and replica.stored_bytes >= 0.98 * primary.store_bytes > 0)

        wait_until(transfer_done, timeout=args.timeout, interval=0.1,
                   message="the state transfer to complete")
        done = time.monotonic()
        steady.phase = "after"
        wait_until(lambda: steady.confirmed >= steady.sent - 1 and len(steady.times.get("after", ())) > args.rate,
                   timeout=60, message="a second of confirms after the transfer")
        new = new_replica() or {}
        stored = directory_bytes(workdir / "cluster" / "data" / str(new["host"]) / "store" / QUEUE)
        result.update(replica_lost=old["host"], new_replica=new["host"],
                      new_replica_running_s=round(placed - killed, 2),
                      transfer_s=round(done - placed, 2), transferred_gb=round(stored / 1e9, 2),
                      transfer_mb_per_s=round(stored / max(done - placed, 1e-9) / 1e6))
        result["steady"] = steady.stop()
        steady = None
        return result
    finally:
        if steady is not None:
            steady.stop()
        zk.stop()
        zk.close()
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigabytes", type=float, default=0.05, help="payload on the primary's disk before")
    parser.add_argument("--size", type=int, default=1000, help="bytes per message of the fill")
    parser.add_argument("--rate", type=float, default=200.0, help="steady messages a second, each confirmed alone")
    parser.add_argument("--memory-bytes", type=int, default=64 << 20,
                        help="exchange.retention_bytes: the memory tail a new replica takes at once (the rest "
                             "comes by state transfer)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="for the transfer")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    # SIGTERM (a `timeout`) and SIGINT end the run with the cluster taken down, not left running.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(1))
    workdir = Path(tempfile.mkdtemp(prefix="roq-replica-catchup-"))
    result = {"load_before": os.getloadavg(), **measure(args, workdir), "load_after": os.getloadavg()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
