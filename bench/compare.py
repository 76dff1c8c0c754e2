#!/usr/bin/env python3
"""RoQ against raw ZeroMQ, NATS, Redis and RabbitMQ: one invocation, same machine, same harness.

For each message size, each system gets two runs through roq.tools.bench (one
publisher process, one subscriber process):
* throughput: `--messages` messages as fast as the publisher can send them;
* latency: `--latency-messages` messages paced at `--rate` per second, for p50/p99.
RoQ is measured twice: message by message (`publish()`, `callback=`) and
through its batch API (`publish_many()`, `batch_callback=`, system
`roq-batch`). The cost of durability is measured the same way, each with both
APIs: `roq-replicated(-batch)` (a queue with replicas = 2: each frame copied to
a replica process on the other host before the publisher's ack) and
`roq-journal-fsync(-batch)` (exchange.journal = fsync: acks after the fsync;
the disk's own fsync latency is measured first and reported). Messages kept on
disk (issue 35), with `--systems`: `roq-disk(-batch)` (a queue with a disk storage
policy: frames in its segment store, acks before the store's fsync) beside
`nats-jetstream` (file storage, acks before its fsync), and `roq-disk-fsync(-batch)`
(exchange.store_sync = confirm: acks after the store's fsync) beside `rabbitmq-quorum`
(publisher confirms after the fsync); their goals are in `targets` (disk_targets). Ratios are
against raw ZeroMQ PUB→SUB, one message per send, no broker: the ceiling for
a single-message Python client; `zeromq-batch` (one msgpack list of payloads
per send) is shown for reference, and so is `python-hop`: raw ZeroMQ through
one minimal Python forwarding process
(bench/hop.py), the latency floor of any broker written in Python. Before
the runs, every CPU is spun for 2 s to measure how often the machine takes
it away (bench/machine.py): the figures are only as steady as that. `--repeat N` runs
every system N times, interleaved so that load on a shared machine hits them
alike, and reports medians with the spread; ratios are taken within each
round, then their median; the durable systems' cost, over the same API without
durability and over NATS, likewise. Writes JSON and a PNG chart to `--out`.

    .venv/bin/python bench/compare.py                   # everything once, about 8 minutes
    .venv/bin/python bench/compare.py --repeat 5 --out docs/bench
    .venv/bin/python bench/compare.py --smoke           # seconds: keeps the tools working (CI)
    .venv/bin/python bench/compare.py --repeat 3 --sizes 100,1000 --out docs/bench/i35 \
        --systems roq-disk,roq-disk-batch,nats-jetstream,roq-disk-fsync,roq-disk-fsync-batch,rabbitmq-quorum

`--curves` runs bench/curves.py instead: fan-out, fan-in, topics, message size, idle connections
and latency against rate, each point with RoQ beside raw ZeroMQ and NATS (`--only` picks curves).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench import machine, servers  # noqa: E402
from roq.tools.bench import RunResult, run  # noqa: E402

console = Console(stderr=True, width=150)  # the table with spreads is wide; logs are not a terminal
ROQ_SINGLE, ROQ_BATCH = "roq.tools.bench.RoqAdapter", "roq.tools.bench.RoqBatchAdapter"
ADAPTERS = {"zeromq": "bench.peers.ZmqAdapter", "zeromq-batch": "bench.peers.ZmqBatchAdapter",
            "python-hop": "bench.peers.PythonHopAdapter",
            "roq": ROQ_SINGLE, "roq-batch": ROQ_BATCH, "roq-batch-oneframe": ROQ_BATCH,
            "roq-replicated": ROQ_SINGLE, "roq-replicated-batch": ROQ_BATCH,
            "roq-journal-fsync": ROQ_SINGLE, "roq-journal-fsync-batch": ROQ_BATCH,
            "roq-disk": ROQ_SINGLE, "roq-disk-batch": ROQ_BATCH,
            "roq-disk-fsync": ROQ_SINGLE, "roq-disk-fsync-batch": ROQ_BATCH,
            "roq-disk-fsync-replicated": ROQ_SINGLE, "roq-disk-fsync-replicated-batch": ROQ_BATCH,
            "nats": "bench.peers.NatsAdapter", "redis": "bench.peers.RedisAdapter",
            "rabbitmq": "bench.peers.RabbitAdapter",
            "nats-jetstream": "bench.peers.JetStreamAdapter", "rabbitmq-quorum": "bench.peers.RabbitQuorumAdapter"}
# Messages kept on disk (issue 35): run with --systems, e.g. the RoQ ones beside JetStream's file storage
# and RabbitMQ's quorum queues (both with publisher confirms).
ON_DISK = ("nats-jetstream", "rabbitmq-quorum", "roq-disk", "roq-disk-batch", "roq-disk-fsync", "roq-disk-fsync-batch",
           "roq-disk-fsync-replicated", "roq-disk-fsync-replicated-batch")
ALL = [system for system in ADAPTERS if system not in ON_DISK]
# What each RoQ system runs with: the queue's `replicas` and configuration overrides. Durability
# (what a confirm costs when it means more), each with both APIs: replicas 2 (a replica process on
# the other host, an ack once it holds the frame) and `exchange.journal`. The batch API with every
# batch in one frame (client.payload_blocks off): the exchange then unpacks and packs each payload
# again, as before two-part batches (the zero-copy path it is compared with).
FSYNC = {"exchange": {"journal": "fsync"}}
# A queue with a disk storage policy (every queue created without its own: gcm.default_retention):
# frames in segment files (docs/segment-store.md); with store_sync = confirm an ack waits for their fsync.
DISK = {"gcm": {"default_retention": 86_400.0, "default_retention_bytes": 50 << 30}}
DISK_FSYNC = {**DISK, "exchange": {"store_sync": "confirm"}}
ROQ_SETUPS: dict[str, tuple[int, dict[str, dict[str, Any]]]] = {
    "roq": (1, {}), "roq-batch": (1, {}), "roq-batch-oneframe": (1, {"client": {"payload_blocks": False}}),
    "roq-replicated": (2, {}), "roq-replicated-batch": (2, {}),
    "roq-journal-fsync": (1, FSYNC), "roq-journal-fsync-batch": (1, FSYNC),
    "roq-disk": (1, DISK), "roq-disk-batch": (1, DISK), "roq-disk-fsync": (1, DISK_FSYNC),
    "roq-disk-fsync-batch": (1, DISK_FSYNC),
    # replicas 2 and store_sync = confirm: an ack waits for the fsync of both hosts' stores
    "roq-disk-fsync-replicated": (2, DISK_FSYNC), "roq-disk-fsync-replicated-batch": (2, DISK_FSYNC)}
# Each durable system against the RoQ system with the same API and no durability.
DURABLE = {"roq-replicated": "roq", "roq-replicated-batch": "roq-batch",
           "roq-journal-fsync": "roq", "roq-journal-fsync-batch": "roq-batch",
           "roq-disk": "roq", "roq-disk-batch": "roq-batch",
           "roq-disk-fsync": "roq", "roq-disk-fsync-batch": "roq-batch",
           "roq-disk-fsync-replicated": "roq", "roq-disk-fsync-replicated-batch": "roq-batch"}
# Issue 35's goals: confirmed publish to a disk-retained queue over its peer's (100 B and 1000 B).
DISK_GOALS = (("roq-disk", "nats-jetstream", 3.0), ("roq-disk-batch", "nats-jetstream", 3.0),
              ("roq-disk-fsync", "rabbitmq-quorum", 1.0), ("roq-disk-fsync-batch", "rabbitmq-quorum", 1.0))


@contextlib.contextmanager
def system_settings(system: str, workdir: Path) -> Iterator[dict[str, Any]]:
    """Start what the system needs; yield the adapter settings."""
    scratch = servers.scratch(workdir, system)
    if system.startswith("zeromq"):
        yield {"endpoint": f"tcp://127.0.0.1:{servers.free_port()}"}
    elif system in ROQ_SETUPS:
        replicas, overrides = ROQ_SETUPS[system]
        with roq_cluster(scratch, replicas, overrides) as settings:
            yield settings
    else:
        with getattr(servers, system.replace("-", "_"))(scratch) as settings:
            yield settings


@contextlib.contextmanager
def roq_cluster(workdir: Path, replicas: int = 1, overrides: dict[str, dict[str, Any]] | None = None,
                queue: str = "bench") -> Iterator[dict[str, Any]]:
    """A fresh local cluster (local_cluster) with one queue of one exchange."""
    from roq.tools.bench_cli import ensure_queue
    with local_cluster(workdir, overrides) as config:
        ensure_queue(config, queue, 1, replicas=replicas if replicas > 1 else None)
        yield {"config": config.to_json(), "queue": queue}


@contextlib.contextmanager
def local_cluster(workdir: Path, overrides: dict[str, dict[str, Any]] | None = None) -> Iterator[Any]:
    """A fresh local cluster (2 GCMs, 2 HCMs: a replica runs on the host its exchange does not), no
    queue yet; yields its roq.config.Config, which its clients read too. The hosts' journals go
    under `workdir` (hcm.data_dir). `overrides`: configuration sections to change,
    {"exchange": {"journal": "fsync"}}."""
    from roq.config import Config, load_config
    from roq.tools.cluster import LocalCluster
    local = LocalCluster(Config().replace(**overrides) if overrides else Config(), workdir / "cluster")
    local.up()
    try:
        yield load_config(local.config_path)
    finally:
        local.down()


def fsync_latency(directory: Path, count: int = 50, size: int = 64 << 10) -> dict[str, Any]:
    """What one write of `size` bytes plus fsync costs in `directory` (where the journals go)."""
    times = []
    with tempfile.NamedTemporaryFile(dir=directory, prefix="fsync-") as f:
        block = os.urandom(size)
        for _ in range(count):
            start = time.perf_counter()
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
            times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    return {"directory": str(directory), "write_bytes": size, "count": count,
            "p50_us": round(times[count // 2]), "p99_us": round(times[min(count - 1, int(count * 0.99))]),
            "max_us": round(times[-1])}


def measure(systems: list[str], sizes: list[int], messages: int, latency_messages: int, rate: float,
            round_no: int = 0) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="roq-bench-") as tmp:
        for system in systems:
            console.print(f"[bold]{system}[/] (round {round_no + 1}, load {os.getloadavg()[0]:.2f})")
            with system_settings(system, Path(tmp)) as settings:
                for size in sizes:
                    throughput = run(ADAPTERS[system], settings, size, messages, timeout=600)
                    latency = run(ADAPTERS[system], settings, size, latency_messages, rate=rate, timeout=600)
                    console.print(f"  {size:>5} B: {throughput.msgs_per_s:>10,.0f} msg/s, "
                                  f"p50 {latency.p50_us:,.0f} µs, p99 {latency.p99_us:,.0f} µs at {rate:,.0f}/s")
                    rows.append(row(system, size, throughput, latency, round_no))
    return rows


def row(system: str, size: int, throughput: RunResult, latency: RunResult, round_no: int = 0) -> dict[str, Any]:
    return {"system": system, "size": size, "round": round_no, "load1": round(os.getloadavg()[0], 2),
            "msgs_per_s": throughput.msgs_per_s, "mb_per_s": throughput.mb_per_s,
            "lost": throughput.lost + latency.lost, "paced_rate": latency.rate, "p50_us": latency.p50_us,
            "p99_us": latency.p99_us, "p999_us": latency.p999_us,
            "saturated_p50_us": throughput.p50_us, "throughput_run": throughput.to_json(),
            "latency_run": latency.to_json()}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's throughput over raw single-message ZeroMQ's of the same size and round."""
    base = {(r["size"], r.get("round", 0)): r["msgs_per_s"] for r in rows if r["system"] == "zeromq"}
    for r in rows:
        b = base.get((r["size"], r.get("round", 0)))
        r["vs_zeromq"] = round(r["msgs_per_s"] / b, 2) if b else None


MEDIAN_FIELDS = ("msgs_per_s", "mb_per_s", "vs_zeromq", "p50_us", "p99_us", "p999_us")


def summarise(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per system and size: the median of every figure over the rounds, with its spread
    (min, max) beside it; losses are summed, so one lost message in any round shows."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rounds:
        groups.setdefault((r["system"], r["size"]), []).append(r)
    summary = []
    for (system, size), group in groups.items():
        out: dict[str, Any] = {"system": system, "size": size, "rounds": len(group),
                               "lost": sum(r["lost"] for r in group), "paced_rate": group[0]["paced_rate"]}
        out.update(medians(group, MEDIAN_FIELDS))
        summary.append(out)
    return summary


def medians(group: list[dict[str, Any]], fields: Iterable[str]) -> dict[str, Any]:
    """Per field, the median over the rounds of a group and its [min, max] (None when no round has it)."""
    out: dict[str, Any] = {}
    for name in fields:
        values = [r[name] for r in group if r.get(name) is not None]
        out[name] = statistics.median(values) if values else None
        out[f"{name}_range"] = [min(values), max(values)] if values else None
    return out


def within_rounds(rounds: list[dict[str, Any]], system: str, baseline: str, field: str, size: int = 100,
                  diff: bool = False) -> list[float]:
    """system's `field` over baseline's (minus it with `diff`), one value per round that ran both."""
    by = {(r["system"], r.get("round", 0)): r[field] for r in rounds if r["size"] == size}
    if diff:
        return [by[(system, n)] - by[(baseline, n)] for (name, n) in by if name == system and (baseline, n) in by]
    return [by[(system, n)] / by[(baseline, n)] for (name, n) in by if name == system and by.get((baseline, n))]


def ratio_within_rounds(rounds: list[dict[str, Any]], system: str, baseline: str, size: int = 100,
                        field: str = "msgs_per_s") -> dict[str, Any]:
    """Median and spread of system/baseline `field` (throughput), each ratio taken within one round."""
    ratios = within_rounds(rounds, system, baseline, field, size)
    if not ratios:
        return {}
    return {"ratio": round(statistics.median(ratios), 2), "range": [round(min(ratios), 2), round(max(ratios), 2)],
            "rounds": len(ratios)}


def p50_over_within_rounds(rounds: list[dict[str, Any]], system: str, baseline: str,
                           size: int = 100) -> dict[str, Any]:
    """Median and spread of system's p50 minus baseline's at the paced rate, in µs, within rounds."""
    diffs = within_rounds(rounds, system, baseline, "p50_us", size, diff=True)
    if not diffs:
        return {}
    return {"value": round(statistics.median(diffs)), "range": [round(min(diffs)), round(max(diffs))],
            "rounds": len(diffs), "rate": next(r["paced_rate"] for r in rounds if r["system"] == system)}


def _key(system: str) -> str:
    return system.replace("-", "_")


def durability_targets(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The cost of replication and of the journal (100 B, 1 → 1), within rounds: each
    durable system's throughput over the same API's without durability and over NATS's, and its p50
    at the paced rate minus that one's. Replication has goals (≥ 0.6×, ≥ 3× NATS, p50 ≤ +500 µs)
    for either API; the fsync journal's figures are reported without one."""
    found: dict[str, Any] = {}
    for system, baseline in DURABLE.items():
        goals = system.startswith("roq-replicated")
        for key, against, goal in (("vs_" + _key(baseline), baseline, 0.6), ("vs_nats", "nats", 3.0)):
            ratio = ratio_within_rounds(rounds, system, against)
            if ratio and goals:
                met = sum(r >= goal for r in within_rounds(rounds, system, against, "msgs_per_s"))
                ratio = dict(ratio, goal=goal, met=ratio["ratio"] >= goal, rounds_met=met)
            if ratio:
                found[f"{_key(system)}_{key}"] = ratio
        over = p50_over_within_rounds(rounds, system, baseline)
        if over and goals:
            met = sum(d <= 500 for d in within_rounds(rounds, system, baseline, "p50_us", diff=True))
            over = dict(over, goal=500, met=over["value"] <= 500, rounds_met=met)
        if over:
            found[f"{_key(system)}_p50_us_over_{_key(baseline)}"] = over
    return found


def targets(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The throughput goals against NATS and raw ZeroMQ (100-byte messages, 1 → 1), as ratios within each round. RoQ's
    batch API is what the goals are judged on; its single-message figures are given beside.
    Then the cost of durability (durability_targets)."""
    found: dict[str, Any] = {}
    for key, baseline, goal in (("vs_nats", "nats", 2.0), ("vs_raw_zeromq", "zeromq", 1.5)):
        for system in ("roq-batch", "roq"):
            ratio = ratio_within_rounds(rounds, system, baseline)
            if ratio:
                found[f"{system.replace('-', '_')}_{key}"] = dict(ratio, goal=goal, met=ratio["ratio"] >= goal)
    for system in ("roq-batch", "roq", "python-hop"):  # python-hop: the floor of any Python broker
        p99s = [r["p99_us"] for r in rounds if r["system"] == system and r["size"] == 100]
        if p99s:
            median = statistics.median(p99s)
            found[f"{system.replace('-', '_')}_p99_us_at_rate"] = {
                "value": median, "range": [min(p99s), max(p99s)], "rounds": len(p99s),
                "rate": next(r["paced_rate"] for r in rounds if r["system"] == system), "goal": 1000,
                "met": median <= 1000, "rounds_met": sum(p <= 1000 for p in p99s)}
    found.update(durability_targets(rounds))
    found.update(zero_copy_targets(rounds))
    found.update(disk_targets(rounds))
    return found


def disk_targets(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 35: a disk-retained queue's confirmed publish against JetStream's file storage (which acks
    before its fsync) and, with store_sync = confirm, against RabbitMQ's quorum queues (which fsync
    before confirming), at 100 B and 1000 B, within rounds."""
    found: dict[str, Any] = {}
    for system, peer, goal in DISK_GOALS:
        for size in (100, 1000):
            ratio = ratio_within_rounds(rounds, system, peer, size)
            if ratio:
                met = sum(r >= goal for r in within_rounds(rounds, system, peer, "msgs_per_s", size))
                found[f"{_key(system)}_vs_{_key(peer)}_{size}"] = dict(ratio, goal=goal, met=ratio["ratio"] >= goal,
                                                                       rounds_met=met)
    return found


def zero_copy_targets(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Zero-copy forwarding, within rounds: the batch API over raw single-message ZeroMQ at 1000 B (goal 1.0)
    and 64 KiB (0.8); at 100 B over the same API with one-frame batches (not worse: 1.0); and each
    RoQ API's p99 at the paced rate over NATS's (at most 1.2)."""
    found: dict[str, Any] = {}
    # (key, system, baseline, size, field, goal, whether the goal is a floor or a ceiling)
    for key, system, baseline, size, field, goal, floor in (
            ("roq_batch_vs_raw_zeromq_1000", "roq-batch", "zeromq", 1000, "msgs_per_s", 1.0, True),
            ("roq_batch_vs_raw_zeromq_65536", "roq-batch", "zeromq", 65536, "msgs_per_s", 0.8, True),
            ("roq_batch_vs_oneframe_100", "roq-batch", "roq-batch-oneframe", 100, "msgs_per_s", 1.0, True),
            ("roq_p99_over_nats", "roq", "nats", 100, "p99_us", 1.2, False),
            ("roq_batch_p99_over_nats", "roq-batch", "nats", 100, "p99_us", 1.2, False)):
        ratio = ratio_within_rounds(rounds, system, baseline, size, field)
        if ratio:
            met = sum(_meets(r, goal, floor) for r in within_rounds(rounds, system, baseline, field, size))
            found[key] = dict(ratio, goal=goal, met=_meets(ratio["ratio"], goal, floor), rounds_met=met)
    return found


def _meets(ratio: float, goal: float, floor: bool) -> bool:
    return ratio >= goal if floor else ratio <= goal


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="pub/sub, 1 publisher → 1 subscriber, same machine (medians; min–max over rounds)")
    for column in ("system", "size", "msgs/s", "× zeromq", "MB/s", "p50 µs", "p99 µs", "lost"):
        out.add_column(column, justify="left" if column == "system" else "right")
    for r in rows:
        out.add_row(r["system"], f"{r['size']} B", _spread(r, "msgs_per_s", "{:,.0f}"),
                    _spread(r, "vs_zeromq", "{:.2f}"), f"{r['mb_per_s']:,.1f}", _spread(r, "p50_us", "{:,.0f}"),
                    _spread(r, "p99_us", "{:,.0f}"), str(r["lost"]))
    return out


def _spread(r: dict[str, Any], name: str, fmt: str) -> str:
    value, span = r.get(name), r.get(f"{name}_range")
    if value is None:
        return "-"
    text = fmt.format(value)
    if span and r.get("rounds", 1) > 1:
        text += f" ({fmt.format(span[0])}–{fmt.format(span[1])})"
    return text


def chart(rows: list[dict[str, Any]], path: Path, rate: float) -> None:
    """Bars of the medians, whiskers from the lowest to the highest round, both axes logarithmic."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sizes = sorted({r["size"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    width = 0.8 / max(1, len(sizes))
    for i, size in enumerate(sizes):
        values = {r["system"]: r for r in rows if r["size"] == size}
        xs = [j + i * width for j in range(len(systems)) if systems[j] in values]
        present = [values[s] for s in systems if s in values]
        for ax, name, scale in ((left, "msgs_per_s", 1000), (right, "p99_us", 1)):
            medians = [r[name] / scale for r in present]
            spans = [r.get(f"{name}_range") or [r[name]] * 2 for r in present]
            errors = [[m - lo / scale for m, (lo, _) in zip(medians, spans)],
                      [hi / scale - m for m, (_, hi) in zip(medians, spans)]]
            ax.bar(xs, medians, width, yerr=errors, capsize=2, label=f"{size} B")
    for ax, title in ((left, "throughput (k msgs/s, log, higher is better)"),
                      (right, f"p99 latency at {rate:,.0f} msg/s (µs, log, lower is better)")):
        ax.set_xticks([j + width * (len(sizes) - 1) / 2 for j in range(len(systems))], systems, fontsize=8,
                      rotation=25, ha="right")
        ax.set_title(title, fontsize=10)
        ax.set_yscale("log")
        ax.legend()
    right.axhline(1000, linestyle="--", color="grey", linewidth=1)  # the 1 ms goal
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
@click.option("--repeat", type=click.IntRange(1, 50), default=1, show_default=True,
              help="rounds; medians and spread are reported")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--smoke", is_flag=True, help="tiny counts: checks that every tool works, measures nothing")
@click.option("--workqueue", is_flag=True,
              help="work queues instead (bench/workqueue.py): 1 producer, 4 workers, acks, 100-B messages")
@click.option("--curves", "curves", is_flag=True,
              help="curves instead (bench/curves.py): fan-out, fan-in, topics, message size, connections, "
                   "latency against rate; RoQ beside raw ZeroMQ and NATS")
@click.option("--only", default="", help="with --curves: comma-separated curves to run (default: all)")
def main(systems: str, sizes: str, messages: int, latency_messages: int, rate: float, repeat: int, out: str,
         smoke: bool, workqueue: bool, curves: bool, only: str) -> None:
    if workqueue:
        work_queues(2_000 if smoke else messages, repeat, Path(out))
        return
    if curves:
        from bench import curves as curve_bench
        curve_bench.main([c.strip() for c in only.split(",") if c.strip()], repeat, Path(out), smoke, console)
        return
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
    stalls = machine.stalls(0.5 if smoke else 2.0)  # before anything of ours runs
    halt_poll = machine.halt_poll_ns()
    console.print(f"CPU stalls before the runs: {stalls}; guest halt polling: {halt_poll} ns")
    fsync = None
    if any(ROQ_SETUPS.get(s, (1, {}))[1] in (FSYNC, DISK_FSYNC) for s in chosen):
        fsync = fsync_latency(Path(tempfile.gettempdir()))  # where measure() puts the journals
        console.print(f"fsync of 64 KiB in {fsync['directory']}: p50 {fsync['p50_us']} µs, "
                      f"p99 {fsync['p99_us']} µs")
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    for round_no in range(repeat):
        rounds += measure(chosen, size_list, messages, latency_messages, rate, round_no)
    add_ratios(rounds)
    rows = summarise(rounds)
    console.print(table(rows))
    found = targets(rounds)
    for name, goal in found.items():
        console.print(f"{name}: {goal}")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
              "machine": {"cpus": stalls["cpus"], "python": platform.python_version(), "platform": platform.platform(),
                          "stalls": stalls, "guest_halt_poll_ns": halt_poll, "fsync": fsync,
                          "load_before": [round(x, 2) for x in load_before],
                          "load_after": [round(x, 2) for x in os.getloadavg()]},
              "settings": {"messages": messages, "latency_messages": latency_messages, "rate": rate,
                           "publishers": 1, "subscribers": 1, "repeat": repeat},
              "results": rows, "targets": found, "rounds": rounds}
    (out_dir / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
    chart(rows, out_dir / "compare.png", rate)
    console.print(f"wrote {out_dir / 'compare.json'} and {out_dir / 'compare.png'}")
    if any(r["lost"] for r in rows):
        console.print("[red]some system lost messages in this run[/]")


def work_queues(messages: int, repeat: int, out_dir: Path) -> None:
    """The work-queue rows: RoQ's consumer groups, RabbitMQ with manual acks, NATS queue groups."""
    from bench import workqueue
    servers.ensure_installed(["rabbitmq", "nats"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    rows = workqueue.measure(list(workqueue.SYSTEMS), messages, repeat, log=console.print)
    summary = []
    result = Table("system", "msg/s (median)", "spread", "acks", "lost", "duplicates",
                   title=f"work queues: 1 producer, {workqueue.WORKERS} workers, {workqueue.SIZE}-B messages, "
                         f"prefetch {workqueue.PREFETCH}, {messages:,} messages, {repeat} round(s)")
    for name in workqueue.SYSTEMS:
        runs = [r for r in rows if r["system"] == name]
        rates = [r["msgs_per_s"] for r in runs]
        summary.append({"system": name, "msgs_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
                        "acks": runs[0]["acks"], "lost": sum(r["lost"] for r in runs),
                        "duplicates": sum(r["duplicates"] for r in runs)})
        row = summary[-1]
        result.add_row(name, f"{row['msgs_per_s']:,.0f}", f"{row['min']:,}-{row['max']:,}",
                       "yes" if row["acks"] else "no (at most once)", str(row["lost"]), str(row["duplicates"]))
    console.print(result)
    found = workqueue.ratios(rows)
    for name, value in found.items():
        console.print(f"{name}: {value}x (median of the ratios within each round)")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "workqueue.json").write_text(json.dumps({"settings": {"messages": messages, "repeat": repeat,
                                                                     "workers": workqueue.WORKERS,
                                                                     "prefetch": workqueue.PREFETCH,
                                                                     "size": workqueue.SIZE},
                                                        "results": summary, "ratios": found, "rounds": rows},
                                                       indent=2) + "\n")
    console.print(f"wrote {out_dir / 'workqueue.json'}")
    if any(r["lost"] for r in summary if r["acks"]):
        console.print("[red]a system with acks lost messages in this run[/]")


if __name__ == "__main__":
    main()
