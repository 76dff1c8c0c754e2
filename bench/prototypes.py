#!/usr/bin/env python3
"""A/B of issue 34's prototypes (item 5): each knob off and on, by turns, in one invocation.

The two goals still missed, and the design change measured for each (both knobs default to
today's behaviour):

* latency at 10k msg/s — `client.eager_in_flight` (with `client.eager_batch_messages`): a small
  batch goes while fewer than that many are in flight, instead of waiting for their acks;
* ≥ 25,000 one-message frames/s — `exchange.send_held_frames`: a publisher drain sends its
  deliveries back to back, then their acks, every that many frames, so libzmq's I/O thread is
  woken once for both rather than once for each;
* latency again — `client.caller_send`: publish() sends a batch from the application's thread when
  the publisher's I/O thread sleeps, instead of waking that thread (no thread hop).

Variants: `off` (today), `publisher` (the client knob), `exchange` (the exchange knob), `both`,
`caller` (client.caller_send), `caller-eager` (client.caller_send with the eager publisher: a small
batch may then go from the caller while others are in flight).
Every round runs each variant once, on a fresh local cluster (2 GCMs, 2 HCMs, one queue of one
exchange) configured with its knobs, which the clients read too; the order turns by one each
round, so load on a shared machine hits them alike. Per variant and round:

* the latency rows of bench/compare.py: `roq` (`publish()`) and `roq-batch` (`publish_many()`),
  `--latency-messages` 100-B messages paced at `--rate`, p50 and p99;
* `--frames`: one-message frames/s through the exchange (bench/frame_cost.py, a raw publisher with
  `--window` batches unacknowledged, one run per window given: 64 keeps the exchange busy, 1 is
  the paced case; the client knob plays no part there).

Ratios to `off` are taken within each round, then their median and spread. `--nats` adds NATS's
latency row to each round (the goal's yardstick). Writes prototypes.json to `--out`.

    .venv/bin/python bench/prototypes.py --repeat 5 --nats --out /tmp/prototypes
    .venv/bin/python bench/prototypes.py --variants off,caller,caller-eager --frames 0 --repeat 5 --nats \
        --out /tmp/caller    # the caller's send alone: latency rows only, about 5 minutes
    .venv/bin/python bench/prototypes.py --smoke     # seconds: the tool works, nothing measured
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench import compare  # noqa: E402
from roq.tools.bench import run  # noqa: E402

console = Console()
VARIANTS = ("off", "publisher", "exchange", "both", "caller", "caller-eager")
LATENCY_SYSTEMS = ("roq", "roq-batch")
SIZE = 100


def overrides(variant: str, eager_in_flight: int, eager_batch_messages: int,
              held_frames: int) -> dict[str, dict[str, Any]]:
    """The configuration sections a variant changes (none for `off`)."""
    out: dict[str, dict[str, Any]] = {}
    if variant in ("publisher", "both", "caller-eager"):
        out["client"] = {"eager_in_flight": eager_in_flight, "eager_batch_messages": eager_batch_messages}
    if variant in ("caller", "caller-eager"):
        out.setdefault("client", {})["caller_send"] = True
    if variant in ("exchange", "both"):
        out["exchange"] = {"send_held_frames": held_frames}
    return out


def one_variant(variant: str, knobs: dict[str, dict[str, Any]], workdir: Path, latency_messages: int, rate: float,
                frames: int, windows: list[int]) -> dict[str, Any]:
    """One variant's runs on its own fresh cluster."""
    from bench import frame_cost
    row: dict[str, Any] = {"variant": variant, "knobs": knobs, "load1": round(os.getloadavg()[0], 2)}
    with compare.roq_cluster(workdir, overrides=knobs) as settings:
        for system in LATENCY_SYSTEMS:
            result = run(compare.ADAPTERS[system], settings, SIZE, latency_messages, rate=rate, timeout=600)
            row[system] = {"p50_us": result.p50_us, "p99_us": result.p99_us, "p999_us": result.p999_us,
                           "lost": result.lost}
        for window in windows if frames else []:
            row[f"frames_w{window}"] = frame_cost.frames_run(settings, frames, window, False, False)
    return row


def nats_row(workdir: Path, latency_messages: int, rate: float) -> dict[str, Any]:
    with compare.system_settings("nats", workdir) as settings:
        result = run(compare.ADAPTERS["nats"], settings, SIZE, latency_messages, rate=rate, timeout=600)
    return {"variant": "nats", "nats": {"p50_us": result.p50_us, "p99_us": result.p99_us,
                                        "p999_us": result.p999_us, "lost": result.lost}}


def figures(row: dict[str, Any]) -> dict[str, float]:
    """A row's comparable figures, flat: roq.p50_us, roq-batch.p99_us, frames_per_s, ..."""
    out = {f"{system}.{field}": row[system][field] for system in LATENCY_SYSTEMS + ("nats",) if system in row
           for field in ("p50_us", "p99_us")}
    for key in sorted(k for k in row if k.startswith("frames_w")):
        window = key.removeprefix("frames_")
        out[f"frames_per_s.{window}"] = row[key]["frames_per_s"]
        out[f"cpu_us_per_frame.{window}"] = row[key]["cpu_per_frame"]["total_us"]
    return out


def ratios(rounds: list[list[dict[str, Any]]], variant: str, baseline: str = "off") -> dict[str, Any]:
    """Per figure: the median of variant/baseline within each round, with its [min, max]."""
    per: dict[str, list[float]] = {}
    for rows in rounds:
        by = {r["variant"]: figures(r) for r in rows}
        if variant not in by or baseline not in by:
            continue
        for name, value in by[variant].items():
            base = by[baseline].get(name)
            if base:
                per.setdefault(name, []).append(value / base)
    return {name: {"ratio": round(statistics.median(v), 3), "range": [round(min(v), 3), round(max(v), 3)],
                   "rounds": len(v)} for name, v in per.items()}


def medians(rounds: list[list[dict[str, Any]]], variant: str) -> dict[str, Any]:
    values: dict[str, list[float]] = {}
    for rows in rounds:
        for r in rows:
            if r["variant"] == variant:
                for name, value in figures(r).items():
                    values.setdefault(name, []).append(value)
    return {name: {"median": statistics.median(v), "range": [min(v), max(v)]} for name, v in values.items()}


def show(row: dict[str, Any]) -> str:
    parts = [f"{name} {value:,.0f}" for name, value in figures(row).items()]
    return f"{row['variant']:>12} (load {row.get('load1', os.getloadavg()[0]):.1f}): " + ", ".join(parts)


@click.command()
@click.option("--variants", default=",".join(VARIANTS), show_default=True,
              help="comma-separated; `off` is the baseline")
@click.option("--repeat", type=click.IntRange(1, 50), default=5, show_default=True)
@click.option("--rate", type=click.FloatRange(1), default=10_000, show_default=True, help="paced rate for latency")
@click.option("--latency-messages", type=click.IntRange(100), default=30_000, show_default=True)
@click.option("--frames", "frame_count", type=click.IntRange(0), default=40_000, show_default=True,
              help="one-message frames per frames run (0: no frames run)")
@click.option("--windows", default="64,1", show_default=True,
              help="frames runs: batches in flight, one run per comma-separated value")
@click.option("--eager-in-flight", type=click.IntRange(1, 4), default=4, show_default=True)
@click.option("--eager-batch-messages", type=click.IntRange(1), default=8, show_default=True)
@click.option("--held-frames", type=click.IntRange(1, 256), default=16, show_default=True)
@click.option("--nats", is_flag=True, help="NATS's latency row in each round too")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--smoke", is_flag=True, help="tiny counts: checks that the tool works, measures nothing")
def main(variants: str, repeat: int, rate: float, latency_messages: int, frame_count: int, windows: str,
         eager_in_flight: int, eager_batch_messages: int, held_frames: int, nats: bool, out: str,
         smoke: bool) -> None:
    chosen = [v.strip() for v in variants.split(",") if v.strip()]
    window_list = [int(w) for w in windows.split(",") if w.strip()]
    unknown = set(chosen) - set(VARIANTS)
    if unknown or "off" not in chosen:
        raise click.BadParameter(f"choose from {VARIANTS}, `off` included", param_hint="--variants")
    if smoke:
        repeat, latency_messages, rate, frame_count = min(repeat, 1), 500, 2_000, min(frame_count, 2_000)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds: every cluster started here stops
    if nats:
        compare.servers.ensure_installed(["nats"])
    started, load_before = time.time(), os.getloadavg()
    rounds: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="roq-prototypes-") as tmp:
        for round_no in range(repeat):
            console.print(f"[bold]round {round_no + 1}[/] (load {os.getloadavg()[0]:.2f})")
            turn = round_no % len(chosen)
            rows = []
            for variant in chosen[turn:] + chosen[:turn]:
                knobs = overrides(variant, eager_in_flight, eager_batch_messages, held_frames)
                rows.append(one_variant(variant, knobs, Path(tmp) / f"{variant}-{round_no}", latency_messages, rate,
                                        frame_count, window_list))
                console.print("  " + show(rows[-1]))
            if nats:
                rows.append(nats_row(Path(tmp) / f"nats-{round_no}", latency_messages, rate))
                console.print("  " + show(rows[-1]))
            rounds.append(rows)
    summary = {variant: {"medians": medians(rounds, variant),
                         **({"vs_off": ratios(rounds, variant)} if variant != "off" else {})}
               for variant in chosen + (["nats"] if nats else [])}
    for variant in chosen:
        if variant != "off":
            console.print(f"[bold]{variant} / off[/] within rounds: " + ", ".join(
                f"{name} {r['ratio']:.2f} ({r['range'][0]:.2f}–{r['range'][1]:.2f})"
                for name, r in summary[variant]["vs_off"].items()))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
              "command": " ".join(["bench/prototypes.py"] + sys.argv[1:]),
              "settings": {"rate": rate, "latency_messages": latency_messages, "frames": frame_count,
                           "windows": window_list,
                           "eager_in_flight": eager_in_flight, "eager_batch_messages": eager_batch_messages,
                           "held_frames": held_frames, "repeat": repeat, "size": SIZE},
              "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
              "summary": summary, "rounds": rounds}
    (out_dir / "prototypes.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out_dir / 'prototypes.json'}")
    if any(r.get(s, {}).get("lost") for rows in rounds for r in rows for s in LATENCY_SYSTEMS + ("nats",)):
        console.print("[red]some run lost messages[/]")


if __name__ == "__main__":
    main()
