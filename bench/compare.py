#!/usr/bin/env python3
"""RoQ against raw ZeroMQ, NATS, Redis and RabbitMQ: one invocation, same machine, same harness.

For each message size, each system gets two runs through roq.bench (one
publisher process, one subscriber process):
* throughput: `--messages` messages as fast as the publisher can send them;
* latency: `--latency-messages` messages paced at `--rate` per second, for p50/p99.
Ratios are against raw ZeroMQ PUB→SUB (one message per send, no broker): the
ceiling for a Python client. Writes JSON and a PNG chart to `--out`.

    .venv/bin/python bench/compare.py                   # everything, about 3 minutes
    .venv/bin/python bench/compare.py --smoke           # seconds: keeps the tools working (CI)
"""

from __future__ import annotations

import contextlib
import json
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench import servers  # noqa: E402
from roq.bench import RunResult, run  # noqa: E402

console = Console(stderr=True)
ADAPTERS = {"zeromq": "bench.peers.ZmqAdapter", "roq": "roq.bench.RoqAdapter", "nats": "bench.peers.NatsAdapter",
            "redis": "bench.peers.RedisAdapter", "rabbitmq": "bench.peers.RabbitAdapter"}
ALL = list(ADAPTERS)


@contextlib.contextmanager
def system_settings(system: str, workdir: Path) -> Iterator[dict[str, Any]]:
    """Start what the system needs; yield the adapter settings."""
    scratch = servers.scratch(workdir, system)
    if system == "zeromq":
        yield {"endpoint": f"tcp://127.0.0.1:{servers.free_port()}"}
    elif system == "roq":
        with roq_cluster(scratch) as settings:
            yield settings
    else:
        with getattr(servers, system)(scratch) as settings:
            yield settings


@contextlib.contextmanager
def roq_cluster(workdir: Path) -> Iterator[dict[str, Any]]:
    from roq.bench_cli import ensure_queue
    from roq.cluster import LocalCluster
    from roq.config import Config, load_config
    local = LocalCluster(Config(), workdir / "cluster")
    local.up()
    try:
        config = load_config(local.config_path)
        ensure_queue(config, "bench", 1)
        yield {"config": config.to_json(), "queue": "bench"}
    finally:
        local.down()


def measure(systems: list[str], sizes: list[int], messages: int, latency_messages: int,
            rate: float) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="roq-bench-") as tmp:
        for system in systems:
            console.print(f"[bold]{system}[/]")
            with system_settings(system, Path(tmp)) as settings:
                for size in sizes:
                    throughput = run(ADAPTERS[system], settings, size, messages, timeout=600)
                    latency = run(ADAPTERS[system], settings, size, latency_messages, rate=rate, timeout=600)
                    console.print(f"  {size:>5} B: {throughput.msgs_per_s:>10,.0f} msg/s, "
                                  f"p50 {latency.p50_us:,.0f} µs, p99 {latency.p99_us:,.0f} µs at {rate:,.0f}/s")
                    rows.append(row(system, size, throughput, latency))
    return rows


def row(system: str, size: int, throughput: RunResult, latency: RunResult) -> dict[str, Any]:
    return {"system": system, "size": size, "msgs_per_s": throughput.msgs_per_s, "mb_per_s": throughput.mb_per_s,
            "lost": throughput.lost + latency.lost, "paced_rate": latency.rate, "p50_us": latency.p50_us,
            "p99_us": latency.p99_us, "p999_us": latency.p999_us,
            "saturated_p50_us": throughput.p50_us, "throughput_run": throughput.to_json(),
            "latency_run": latency.to_json()}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {r["size"]: r["msgs_per_s"] for r in rows if r["system"] == "zeromq"}
    for r in rows:
        r["vs_zeromq"] = round(r["msgs_per_s"] / base[r["size"]], 2) if base.get(r["size"]) else None


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The goals of issue 6, as ratios within this run (100-byte messages)."""
    by = {(r["system"], r["size"]): r for r in rows}
    roq, nats, zmq = by.get(("roq", 100)), by.get(("nats", 100)), by.get(("zeromq", 100))
    found: dict[str, Any] = {}
    if roq and nats:
        ratio = roq["msgs_per_s"] / nats["msgs_per_s"]
        found["roq_vs_nats"] = {"ratio": round(ratio, 2), "goal": 2.0, "met": ratio >= 2.0}
    if roq and zmq:
        ratio = roq["msgs_per_s"] / zmq["msgs_per_s"]
        found["roq_vs_raw_zeromq"] = {"ratio": round(ratio, 2), "goal": 1.5, "met": ratio >= 1.5}
    if roq:
        found["roq_p99_us_at_rate"] = {"value": roq["p99_us"], "rate": roq["paced_rate"], "goal": 1000,
                                       "met": roq["p99_us"] <= 1000}
    return found


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="pub/sub, 1 publisher → 1 subscriber, same machine")
    for column in ("system", "size", "msgs/s", "× zeromq", "MB/s", "p50 µs", "p99 µs", "lost"):
        out.add_column(column, justify="left" if column == "system" else "right")
    for r in rows:
        out.add_row(r["system"], f"{r['size']} B", f"{r['msgs_per_s']:,.0f}", f"{r['vs_zeromq'] or 0:.2f}",
                    f"{r['mb_per_s']:,.1f}", f"{r['p50_us']:,.0f}", f"{r['p99_us']:,.0f}", str(r["lost"]))
    return out


def chart(rows: list[dict[str, Any]], path: Path, rate: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sizes = sorted({r["size"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(1, len(sizes))
    for i, size in enumerate(sizes):
        values = {r["system"]: r for r in rows if r["size"] == size}
        xs = [j + i * width for j in range(len(systems))]
        left.bar(xs, [values[s]["msgs_per_s"] / 1000 if s in values else 0 for s in systems], width,
                 label=f"{size} B")
        right.bar(xs, [values[s]["p99_us"] if s in values else 0 for s in systems], width, label=f"{size} B")
    for ax, title in ((left, "throughput (k msgs/s, higher is better)"),
                      (right, f"p99 latency at {rate:,.0f} msg/s (µs, log, lower is better)")):
        ax.set_xticks([j + width * (len(sizes) - 1) / 2 for j in range(len(systems))], systems)
        ax.set_title(title, fontsize=10)
        ax.legend()
    right.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command()
@click.option("--systems", default=",".join(ALL), show_default=True, help="comma-separated subset")
@click.option("--sizes", default="100,1000", show_default=True, help="payload sizes in bytes")
@click.option("--messages", type=click.IntRange(100), default=200_000, show_default=True,
              help="messages in each throughput run")
@click.option("--latency-messages", type=click.IntRange(100), default=30_000, show_default=True)
@click.option("--rate", type=click.FloatRange(1), default=10_000, show_default=True, help="paced rate for latency")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--smoke", is_flag=True, help="tiny counts: checks that every tool works, measures nothing")
def main(systems: str, sizes: str, messages: int, latency_messages: int, rate: float, out: str,
         smoke: bool) -> None:
    chosen = [s.strip() for s in systems.split(",") if s.strip()]
    unknown = set(chosen) - set(ADAPTERS)
    if unknown:
        raise click.BadParameter(f"unknown systems {sorted(unknown)}; choose from {ALL}", param_hint="--systems")
    size_list = [int(s) for s in sizes.split(",")]
    # SIGTERM unwinds like Ctrl-C, so every server started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if smoke:
        messages, latency_messages, rate = 2_000, 500, 2_000
    servers.ensure_installed(chosen)
    started = time.time()
    rows = measure(chosen, size_list, messages, latency_messages, rate)
    add_ratios(rows)
    console.print(table(rows))
    found = targets(rows)
    for name, goal in found.items():
        console.print(f"{name}: {goal}")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
              "machine": {"cpus": _cpus(), "python": platform.python_version(), "platform": platform.platform()},
              "settings": {"messages": messages, "latency_messages": latency_messages, "rate": rate,
                           "publishers": 1, "subscribers": 1},
              "results": rows, "targets": found}
    (out_dir / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
    chart(rows, out_dir / "compare.png", rate)
    console.print(f"wrote {out_dir / 'compare.json'} and {out_dir / 'compare.png'}")
    if any(r["lost"] for r in rows):
        console.print("[red]some system lost messages in this run[/]")


def _cpus() -> int:
    import os
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
