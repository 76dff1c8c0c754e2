"""What hostile HTTP clients cost the gateway, which must stay bounded: peak RSS and CPU of `roq-web`.

Starts a real ZooKeeper, a GCM, an HCM and one `roq-web` process (auth off, a free port) in a
scratch directory, then runs each scenario against the gateway and reports, per scenario, the
answers it gave, the gateway process's RSS before and after, its peak RSS (the kernel's
high-water mark, VmHWM, reset before each scenario through /proc/PID/clear_refs) and the CPU
seconds it used:

* `newlines-1`: one `POST ?split=lines` whose body is 50 MiB of newlines;
* `newlines-3`: three of them at once;
* `token-72k-4`: four SSE streams resumed with a 262K-character token that names 72,000 made-up
  publishers, each reading the 3,000 messages published meanwhile (over HTTP, 1,000 per request);
* `token-1k-4`: the same with a token naming 1,000 made-up publishers (the most a token may
  name since the limits), to show what a token the gateway accepts costs;
* `no-token-4`: the same without a token (from the beginning), what four honest streams cost.

    .venv/bin/python scripts/gateway_limits.py [--json out.json] [--only newlines-1,token-72k-4]

The code measured is the one this script's checkout holds (its parent directory goes first on
sys.path and on PYTHONPATH for the daemons), so an export of an older commit can be measured
with its own copy of this script. Needs Linux (/proc) and ZooKeeper.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from roq.client.admin import Admin  # noqa: E402
from roq.paths import Paths  # noqa: E402
from roq.state import read_hosts, read_leader, read_live  # noqa: E402
from roq.tools.zkserver import ZooKeeperServer  # noqa: E402
from roq.zk import start_client, stop_client  # noqa: E402
from tests.support.helpers import Processes, fast_config, wait_until  # noqa: E402
from tests.support.hostile import forged_token, post_newlines  # noqa: E402

BODY_BYTES = 50 << 20
STREAM_MESSAGES = 3_000


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc: this needs Linux")


def measure(pid: int, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    process = psutil.Process(pid)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the high-water mark starts again from now
    before, cpu = process.memory_info().rss, process.cpu_times()
    outcome = run()
    after, cpu_after = process.memory_info().rss, process.cpu_times()
    mib = 1 << 20
    return {**outcome, "rss_before_mb": round(before / mib), "rss_after_mb": round(after / mib),
            "peak_rss_mb": round(peak_rss(pid) / mib),
            "cpu_s": round(cpu_after.user + cpu_after.system - cpu.user - cpu.system, 2)}


def read_stream(url: str, queue: str, token: str | None, want: int, opened: threading.Barrier,
                out: list[str]) -> None:
    """One SSE client resuming with `token` (none: from the beginning): counts message events up to `want`."""
    got = 0
    params: dict[str, Any] = {"limit": want} if token else {"limit": want, "from": "beginning"}
    try:
        with httpx.stream("GET", f"{url}/api/queues/{queue}/stream", params=params,
                          headers={"Last-Event-ID": token} if token else {},
                          timeout=httpx.Timeout(60, read=60)) as response:
            opened.wait()
            if response.status_code != 200:
                out.append(f"{response.status_code} {response.read().decode()[:100]}")
                return
            for line in response.iter_lines():
                got += line == "event: message"
        out.append(f"200, {got} messages")
    except (httpx.HTTPError, threading.BrokenBarrierError) as exc:
        out.append(f"{type(exc).__name__} after {got} messages: {exc}")


def streams_with_token(url: str, queue: str, token: str | None, streams: int) -> dict[str, Any]:
    results: list[str] = []
    opened = threading.Barrier(streams + 1, timeout=60)
    readers = [threading.Thread(target=read_stream, args=(url, queue, token, STREAM_MESSAGES, opened, results))
               for _ in range(streams)]
    for reader in readers:
        reader.start()
    opened.wait()  # every stream answered (200 or a refusal) before anything is published
    for first in range(0, STREAM_MESSAGES, 1000):
        body = "".join(f"m{i}\n" for i in range(first, first + 1000)).encode()
        httpx.post(f"{url}/api/queues/{queue}/messages", params={"topic": "t", "split": "lines"}, content=body,
                   timeout=60).raise_for_status()
    for reader in readers:
        reader.join(120)
    return {"token_chars": len(token or ""), "streams": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the figures to this file too")
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="roq-gw-limits-") as scratch:
        work = Path(scratch)
        zookeeper = ZooKeeperServer(work / "zookeeper")
        zookeeper.start()
        config = fast_config(zookeeper.connect_string)  # INFO: the gateway logs its address
        procs = Processes(config, work / "daemons")
        zk = start_client(config)
        try:
            results = run_scenarios(config, procs, zk, [s for s in args.only.split(",") if s])
        finally:
            procs.stop_all()
            stop_client(zk)
            zookeeper.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


def run_scenarios(config: Any, procs: Processes, zk: Any, only: list[str]) -> dict[str, Any]:
    paths = Paths(config.zk.root)
    procs.start("gcm", "gcm-0")
    procs.start("hcm", "host-1", "hcm.host=host-1")
    wait_until(lambda: read_leader(zk, paths) and read_hosts(zk, paths), timeout=30, message="cluster")
    scenarios: dict[str, Callable[[str, str], dict[str, Any]]] = {
        "newlines-1": lambda url, q: {"answers": post_newlines(url, q, 1)},
        "newlines-3": lambda url, q: {"answers": post_newlines(url, q, 3)},
        "token-72k-4": lambda url, q: streams_with_token(url, q, forged_token(72_000), 4),
        "token-1k-4": lambda url, q: streams_with_token(url, q, forged_token(1_000), 4),
        "no-token-4": lambda url, q: streams_with_token(url, q, None, 4),
    }
    results: dict[str, Any] = {}
    with Admin(config) as admin:
        for n, (name, run) in enumerate(scenarios.items()):
            if only and name not in only:
                continue
            queue = f"limits-{n}"  # a fresh queue each: nothing retained from another scenario
            admin.create_queue(queue, 1)
            wait_until(lambda q=queue: read_live(zk, paths, q), timeout=30, message=f"{queue} running")
            url = procs.web(f"web-{name}")  # a fresh gateway each: figures of this scenario alone
            try:
                results[name] = measure(procs.procs[f"web-{name}"].pid, lambda q=queue, r=run, u=url: r(u, q))
            finally:
                procs.kill(f"web-{name}", signal.SIGTERM)
                procs.procs[f"web-{name}"].wait(30)
                admin.delete_queue(queue)  # a host runs 4 exchanges at most (hcm.capacity)
            print(name, json.dumps(results[name]), file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
