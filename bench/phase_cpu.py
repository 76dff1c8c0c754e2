#!/usr/bin/env python3
"""The exchanges' CPU over the throughput phase of a compare.py run: a steadier A/B than msgs/s.

On a shared 2-vCPU machine a throughput figure moves ±25% between runs of the same code; the
CPU seconds an exchange spends on the same messages move much less, so a per-message cost
that grows by 5-10% shows within a few rounds. This runs one `compare.py` system of the tree
given, samples every process of that tree every 20 ms, and reports the exchanges' CPU seconds
from the moment the first bench workers start (once the cluster is up: machine.py's spinners
come before) to the exit of the last of them, before the latency run starts; then the workers'
CPU (their imports included) and the run's msgs/s.

    .venv/bin/python bench/phase_cpu.py --tree /path/to/checkout --system roq --messages 1000000

Run it alternately on two checkouts (each with its own .venv), nothing else running.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import click
import psutil


def kind(cmdline: str, tree: str) -> str | None:
    if not cmdline.startswith(tree):
        return None
    if "exchange.main" in cmdline:
        return "exchange"
    if "multiprocessing.spawn" in cmdline and "resource_tracker" not in cmdline:
        return "worker"
    return None


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def sample(tree: str) -> tuple[dict[int, float], dict[int, float]]:
    """CPU seconds of the tree's exchanges and bench workers, by pid."""
    exchanges: dict[int, float] = {}
    workers: dict[int, float] = {}
    for proc in psutil.process_iter():
        try:
            found = kind(" ".join(proc.cmdline()), tree)
            if found:
                (exchanges if found == "exchange" else workers)[proc.pid] = cpu_seconds(proc)
        except psutil.Error:
            continue
    return exchanges, workers


def measure(tree: str, system: str, messages: int, out: str) -> dict[str, object]:
    command = [f"{tree}/.venv/bin/python", "bench/compare.py", "--systems", system, "--sizes", "100",
               "--messages", str(messages), "--latency-messages", "500", "--out", out]
    run = subprocess.Popen(command, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_at = None
    start: dict[int, float] | None = None
    end: dict[int, float] | None = None
    phase_workers: dict[int, float] = {}
    while run.poll() is None and end is None:
        exchanges, workers = sample(tree)
        if exchanges and workers:
            first_at = first_at or time.monotonic()
            start = start if start is not None else exchanges
            for pid, cpu in workers.items():  # the throughput run's: those started within 1 s of the first
                if pid in phase_workers or time.monotonic() - first_at < 1.0:
                    phase_workers[pid] = cpu
        if start is not None and not set(workers) & set(phase_workers):
            end = exchanges
        time.sleep(0.02)
    text = run.communicate()[0]
    spent = sum(cpu - start.get(pid, 0.0) for pid, cpu in end.items()) if start and end else None
    return {"system": system, "messages": messages, "exchanges": len(end or {}),
            "exchange_cpu_s": spent and round(spent, 3),
            "exchange_cpu_us_per_message": spent and round(spent * 1e6 / messages, 3),
            "workers_cpu_s": sorted(round(cpu, 3) for cpu in phase_workers.values()),
            "msgs_per_s": re.findall(r"100 B:\s+([\d,]+) msg/s", text)}


@click.command()
@click.option("--tree", default=".", show_default=True, help="the checkout to run (its .venv and bench/)")
@click.option("--system", default="roq", show_default=True)
@click.option("--messages", default=1_000_000, show_default=True)
@click.option("--out", default="/tmp/phase_cpu", show_default=True, help="compare.py's output directory")
def main(tree: str, system: str, messages: int, out: str) -> None:
    print(json.dumps(measure(str(Path(tree).resolve()), system, messages, out)))


if __name__ == "__main__":
    main()
