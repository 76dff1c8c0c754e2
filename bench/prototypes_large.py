#!/usr/bin/env python3
"""Issue 34 item 5: the next design changes for 64 KiB messages and the 1000 B batch API, each a
client setting measured against today's behaviour (its default) in the same rounds, beside raw
single-message ZeroMQ, with the CPU per message of every stage.

Each round starts one local cluster with one exchange. For each size, raw ZeroMQ runs first, then
every RoQ system once with the prototypes off and once with each on, in an order reversed every
other round. The prototypes are client settings, so one exchange serves every run of a round. Each
run measures, per message, the CPU of the publisher process, the exchange and the subscriber
process, split by thread: `main` (the application's thread; the exchange's loop), `zmq_io`
(libzmq's I/O threads) and `other` (RoQ's client I/O thread, pyzmq's garbage collector). Ratios
are taken within a round: against raw ZeroMQ's MB/s, and against the same system with the
prototypes off.

    .venv/bin/python bench/prototypes_large.py --repeat 5 --out docs/bench/i34-prototypes
    .venv/bin/python bench/prototypes_large.py --smoke --out /tmp/prototypes    # checks the tool works

`--profile` adds py-spy samples of the exchange's Python work (samples holding the GIL) to each
RoQ run's row in the JSON; it needs py-spy beside the interpreter or on PATH, and costs the
exchange some CPU, so the lead's figures come from a run without it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench import compare, servers  # noqa: E402
from bench.frame_cost import PySpy, ThreadCpu, _live_exchange  # noqa: E402
from bench.peers import ZmqAdapter  # noqa: E402
from roq.tools.bench import RoqAdapter, RoqBatchAdapter, run  # noqa: E402

console = Console(stderr=True, width=150)
# Each prototype: the client settings that switch it on (every default is today's behaviour).
KNOBS: dict[str, dict[str, Any]] = {
    "views": {"payload_views": True},  # large payloads handed out as read-only views, not copied to bytes
    "copy-send": {"zero_copy_send_bytes": 0},  # the publisher copies into libzmq (no pyzmq gc thread per part)
    "buffers": {"socket_buffer_bytes": 4 << 20},  # bigger kernel socket buffers on the clients' data sockets
    "big-frames": {"max_batch_bytes": 1 << 20},  # 4x the messages per frame: fewer per-frame costs
}
KNOBS["views+copy-send"] = {**KNOBS["views"], **KNOBS["copy-send"]}
KNOBS["all"] = {**KNOBS["views"], **KNOBS["copy-send"], **KNOBS["buffers"], **KNOBS["big-frames"]}
# Per size: the RoQ systems and the prototypes measured, and the messages per run.
CASES: dict[int, dict[str, Any]] = {
    65536: {"systems": ["roq", "roq-batch"], "knobs": ["views", "copy-send", "buffers", "big-frames", "all"],
            "messages": 30_000},
    1000: {"systems": ["roq-batch"], "knobs": ["big-frames", "copy-send", "buffers", "all"], "messages": 500_000},
}
ADAPTERS = {"zeromq": "bench.prototypes_large.CpuZmqAdapter", "roq": "bench.prototypes_large.CpuRoqAdapter",
            "roq-batch": "bench.prototypes_large.CpuRoqBatchAdapter"}


# ---------------------------------------------------------------- adapters that count their CPU


class _CpuMeter:
    """Mixin: the process's CPU by thread from the moment it is subscribed (or starts sending) to
    close(), written to settings["cpu_dir"]/<role>.json (µs in all, by thread kind)."""

    settings: dict[str, Any]
    _cpu: ThreadCpu | None = None
    _role = ""

    def _cpu_start(self, role: str) -> None:
        self._role, self._cpu = role, ThreadCpu(os.getpid())
        self._cpu.start()

    def _cpu_write(self) -> None:
        if self._cpu is not None and self.settings.get("cpu_dir"):
            path = Path(self.settings["cpu_dir"]) / f"{self._role}.json"
            path.write_text(json.dumps(self._cpu.stop(1)))
            self._cpu = None


def _metered(base: type) -> type:
    class Metered(_CpuMeter, base):  # type: ignore[valid-type, misc]
        def subscribe(self, on_payload: Any) -> None:
            super().subscribe(on_payload)
            self._cpu_start("sub")

        def subscribe_batches(self, on_payloads: Any) -> None:
            super().subscribe_batches(on_payloads)
            self._cpu_start("sub")

        def send_all(self, make_payload: Any, count: int, rate: float) -> None:
            self._cpu_start("pub")
            super().send_all(make_payload, count, rate)

        def send_batches(self, make_batch: Any, count: int, rate: float) -> None:
            self._cpu_start("pub")
            super().send_batches(make_batch, count, rate)

        def close(self) -> None:
            self._cpu_write()  # the publisher's drain (the acks of its last batches) is counted
            super().close()
    return Metered


CpuZmqAdapter = _metered(ZmqAdapter)
CpuRoqAdapter = _metered(RoqAdapter)
CpuRoqBatchAdapter = _metered(RoqBatchAdapter)


# ---------------------------------------------------------------- one round


def with_client(settings: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    """The cluster's adapter settings with client settings changed (the clients read them)."""
    from roq.config import config_from_json
    config = config_from_json(settings["config"])
    return {**settings, "config": config.replace(client=knobs).to_json()} if knobs else settings


class GilProfile(PySpy):
    """py-spy samples of the exchange's threads that hold the GIL (its Python work, idle waits
    left out) from start to stop()."""

    def __init__(self, pid: int) -> None:
        self.out = Path(tempfile.mkstemp(prefix="roq-pyspy-", suffix=".txt")[1])
        self.proc = subprocess.Popen([_py_spy() or "py-spy", "record", "--pid", str(pid), "--duration", "3600",
                                      "--rate", "250", "--gil", "--format", "raw", "--output", str(self.out),
                                      "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes what it sampled, then exits
        return super().stop()


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def measured(system: str, settings: dict[str, Any], size: int, messages: int,
             exchange_pid: int | None, profile: bool = False) -> dict[str, Any]:
    """One run with the CPU of each stage, µs per message (and with `profile`, where the
    exchange's Python time goes)."""
    with tempfile.TemporaryDirectory(prefix="roq-cpu-") as cpu_dir:
        meter = ThreadCpu(exchange_pid) if exchange_pid else None
        spy = GilProfile(exchange_pid) if exchange_pid and profile and _py_spy() else None
        if meter:
            meter.start()
        result = run(ADAPTERS[system], {**settings, "cpu_dir": cpu_dir}, size, messages, timeout=600)
        profiled = spy.stop() if spy else None
        cpu: dict[str, Any] = {}
        for role in ("pub", "sub"):
            path = Path(cpu_dir) / f"{role}.json"
            if path.exists():
                cpu[role] = per_message(json.loads(path.read_text()), result.received)
        if meter:
            cpu["exchange"] = meter.stop(max(result.received, 1))
    row = {"msgs_per_s": result.msgs_per_s, "mb_per_s": result.mb_per_s, "lost": result.lost, "cpu_us": cpu}
    return {**row, "exchange_profile": profiled} if profiled else row


def per_message(totals: dict[str, Any], messages: int) -> dict[str, Any]:
    """ThreadCpu.stop(1)'s µs in all, as µs per message."""
    per = max(messages, 1)
    out: dict[str, Any] = {name: {k: round(v / per, 2) for k, v in split.items()}
                           for name, split in totals.items() if isinstance(split, dict)}
    out["total_us"] = round(totals["total_us"] / per, 2)
    return out


def one_round(round_no: int, sizes: list[int], knobs: dict[int, list[str]], messages: dict[int, int],
              workdir: Path, profile: bool = False) -> list[dict[str, Any]]:
    rows = []
    with compare.roq_cluster(servers.scratch(workdir, f"round{round_no}")) as settings:
        pid = int(_live_exchange(settings)["pid"])
        for size in sizes:
            load = round(os.getloadavg()[0], 2)
            raw = measured("zeromq", {"endpoint": f"tcp://127.0.0.1:{servers.free_port()}"}, size,
                           messages[size], None)
            rows.append({"round": round_no, "size": size, "system": "zeromq", "variant": "-", "load1": load, **raw})
            variants = ["off", *knobs[size]]
            if round_no % 2:
                variants.reverse()
            for system in CASES[size]["systems"]:
                for variant in variants:
                    row = measured(system, with_client(settings, KNOBS.get(variant, {})), size, messages[size], pid,
                                   profile)
                    row.update({"round": round_no, "size": size, "system": system, "variant": variant,
                                "load1": round(os.getloadavg()[0], 2), "vs_zeromq": ratio(row, raw)})
                    rows.append(row)
                    console.print(f"  {size:>6} B {system:<10} {variant:<16} {row['mb_per_s']:>7.1f} MB/s "
                                  f"{row['vs_zeromq']:.2f}x raw  cpu µs/msg {_cpu_line(row['cpu_us'])}")
    return rows


def ratio(row: dict[str, Any], base: dict[str, Any]) -> float:
    return round(row["mb_per_s"] / base["mb_per_s"], 3) if base["mb_per_s"] else 0.0


def _cpu_line(cpu: dict[str, Any]) -> str:
    return " ".join(f"{stage} {cpu[stage]['total_us']:.1f}" for stage in ("pub", "exchange", "sub") if stage in cpu)


# ---------------------------------------------------------------- summary


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, system and variant: medians over rounds of MB/s, × raw ZeroMQ and × the same
    system with the prototypes off (both within rounds), and of each stage's CPU per message."""
    off = {(r["round"], r["size"], r["system"]): r["mb_per_s"] for r in rows if r["variant"] == "off"}
    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["size"], r["system"], r["variant"]), []).append(r)
    out = []
    for (size, system, variant), group in groups.items():
        vs_off = [r["mb_per_s"] / off[(r["round"], size, system)] for r in group
                  if off.get((r["round"], size, system))]
        summary = {"size": size, "system": system, "variant": variant, "rounds": len(group),
                   "lost": sum(r["lost"] for r in group), "mb_per_s": _median(r["mb_per_s"] for r in group),
                   "vs_zeromq": _spread([r["vs_zeromq"] for r in group if "vs_zeromq" in r]),
                   "vs_off": _spread(vs_off) if variant != "off" else None}
        for stage in ("pub", "exchange", "sub"):
            summary[f"{stage}_cpu_us"] = _median(r["cpu_us"][stage]["total_us"] for r in group if stage in r["cpu_us"])
        out.append(summary)
    return sorted(out, key=lambda s: (-s["size"], s["system"], s["variant"]))


def _median(values: Any) -> float | None:
    found = list(values)
    return round(statistics.median(found), 2) if found else None


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def table(summary: list[dict[str, Any]]) -> Table:
    t = Table(title="prototypes: MB/s, ratios within rounds, CPU µs per message by stage")
    for name in ("bytes", "system", "prototype", "MB/s", "× raw ZeroMQ", "× off", "pub µs", "exchange µs",
                 "sub µs", "lost"):
        t.add_column(name, justify="left" if name in ("system", "prototype") else "right")
    for s in summary:
        t.add_row(f"{s['size']:,}", s["system"], s["variant"], _fmt(s["mb_per_s"], "{:,.1f}"),
                  _range(s["vs_zeromq"]), _range(s["vs_off"]), _fmt(s["pub_cpu_us"], "{:.1f}"),
                  _fmt(s["exchange_cpu_us"], "{:.1f}"), _fmt(s["sub_cpu_us"], "{:.1f}"), str(s["lost"]))
    return t


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else spec.format(value)


def _range(spread: dict[str, float] | None) -> str:
    return "–" if not spread else f"{spread['median']:.2f} ({spread['min']:.2f}–{spread['max']:.2f})"


@click.command()
@click.option("--sizes", default="65536,1000", show_default=True, help="of " + ", ".join(map(str, CASES)))
@click.option("--knobs", "knob_list", default="", help="prototypes to run (comma-separated; default: each size's own)")
@click.option("--repeat", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--messages-scale", type=click.FloatRange(0.001, 10), default=1.0, show_default=True,
              help="multiplies each size's messages per run")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--smoke", is_flag=True, help="one round, few messages: checks that the tool works, measures nothing")
@click.option("--profile", is_flag=True, help="py-spy samples (GIL held) of the exchange in each RoQ run, in the JSON")
def main(sizes: str, knob_list: str, repeat: int, messages_scale: float, out: str, smoke: bool,
         profile: bool) -> None:
    chosen = [int(s) for s in sizes.split(",") if s]
    if unknown := [s for s in chosen if s not in CASES] + [k for k in knob_list.split(",") if k and k not in KNOBS]:
        raise click.UsageError(f"unknown sizes or prototypes: {unknown}; sizes {list(CASES)}, prototypes {list(KNOBS)}")
    knobs = {size: [k for k in knob_list.split(",") if k] or CASES[size]["knobs"] for size in chosen}
    scale, repeat = (0.02, 1) if smoke else (messages_scale, repeat)
    messages = {size: max(500, int(CASES[size]["messages"] * scale)) for size in chosen}
    rows: list[dict[str, Any]] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="roq-prototypes-") as tmp:
        for round_no in range(repeat):
            console.print(f"[bold]round {round_no + 1}[/] (load {os.getloadavg()[0]:.2f})")
            rows += one_round(round_no, chosen, knobs, messages, Path(tmp), profile)
    summary = summarise(rows)
    console.print(table(summary))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "prototypes_large.json").write_text(json.dumps(
        {"started": started, "repeat": repeat, "messages": messages, "knobs": {k: KNOBS[k] for ks in knobs.values()
                                                                               for k in ks},
         "summary": summary, "rounds": rows}, indent=1))
    console.print(f"wrote {out_dir / 'prototypes_large.json'}")


if __name__ == "__main__":
    main()
