#!/usr/bin/env python3
"""Where RoQ's latency goes, stage by stage, at a paced rate (to find what the tail is made of).

One invocation, same machine, 100-byte messages paced at `--rate` (10,000/s), each run in its own
publisher and subscriber processes, interleaved over `--repeat` rounds:

* `zeromq`: raw PUB → SUB, one message per send: two processes, no broker (the floor of floors);
* `python-hop`: raw PUSH → bench/hop.py → SUB: the least any broker written in Python adds;
* `exchange`: a raw publisher (one two-part batch of what fell due, sent from the application's
  own thread, its acks read as they come) → RoQ's exchange → a raw SUB that decodes deliveries:
  RoQ's exchange without RoQ's client library;
* `roq`: `Publisher.publish_many` → the exchange → `Subscriber(batch_callback=...)`: the whole
  client library. Its latency is split at the batch's `sent_ns` (the moment the publisher's I/O
  thread sent it) into `publisher` (publish_many → sent: the hand-over to the I/O thread) and
  `delivery` (sent → the subscriber's callback).

So `exchange - python-hop` is what the exchange's work adds over a bare Python hop, and `roq -
exchange` what the client library's threads add. Writes stages.json to `--out`.

With `--frames`, instead: how many one-message frames per second one exchange forwards and its
CPU per frame by thread, with `--profile` (py-spy) and `--syscalls` (strace) splits
(bench/frame_cost.py); writes frames.json.

    .venv/bin/python bench/stages.py --repeat 3 --out docs/bench    # about 3 minutes
    .venv/bin/python bench/stages.py --smoke --out /tmp/stages      # seconds: keeps the tool working (CI)
    .venv/bin/python bench/stages.py --frames --profile --syscalls --repeat 3 --out /tmp/frames
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import secrets
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench import compare  # noqa: E402
from roq.tools.bench import pace, percentile, run  # noqa: E402

console = Console(stderr=True, width=150)
STAMP = struct.Struct("<q")  # the payload starts with its creation time (CLOCK_MONOTONIC, ns)
SIZE = 100
PAD = b"x" * (SIZE - STAMP.size)
PERCENTILES = {"p50_us": 0.5, "p90_us": 0.9, "p99_us": 0.99, "p999_us": 0.999}
# Wall clock minus monotonic clock in this process: sent_ns (wall) → monotonic, to a few µs.
WALL_OFFSET = time.time_ns() - time.monotonic_ns()


def percentiles(values: list[int]) -> dict[str, float]:
    """Latencies in ns → percentiles in µs."""
    ordered = sorted(values)
    if not ordered:
        return {}
    return {**{name: round(percentile(ordered, f), 1) for name, f in PERCENTILES.items()}, "count": len(ordered)}


def paced(rate: float, count: int, send: Any) -> None:
    """roq.tools.bench.pace, with the payloads of what fell due built and stamped here."""
    pace(count, rate, lambda n: send([STAMP.pack(time.monotonic_ns()) + PAD for _ in range(n)]))


def pub_sub_run(subscriber: Any, publisher: Any, sub_args: tuple[Any, ...], pub_args: tuple[Any, ...],
                timeout: float, on_go: Any = None) -> Any:
    """Run `subscriber(*sub_args, out)` and `publisher(*pub_args, go)` in processes of their own;
    start the measured messages once the subscriber saw a warm-up one (`on_go()` first: where a
    measurement starts); return what it reports."""
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=subscriber, args=(*sub_args, out)),
             ctx.Process(target=publisher, args=(*pub_args, go))]
    for proc in procs:
        proc.start()
    try:
        if out.get(timeout=60) != "warm":
            raise RuntimeError("the subscriber saw no warm-up message")
        if on_go is not None:
            on_go()
        go.set()
        return out.get(timeout=timeout)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


# ---------------------------------------------------------------- the exchange with raw clients


def raw_subscriber(endpoint: str, count: int, out: Any) -> None:
    import zmq

    from roq import protocol
    sock = zmq.Context().socket(zmq.SUB)
    sock.rcvhwm = 0
    sock.setsockopt(zmq.SUBSCRIBE, b"bench")
    sock.connect(endpoint)
    latencies: list[int] = []
    warm = False
    while len(latencies) < count and sock.poll(5000):
        _, body = sock.recv_multipart()
        now = time.monotonic_ns()
        for payload in protocol.decode_delivery(body).payloads:
            (created,) = STAMP.unpack_from(payload)
            if created:
                latencies.append(now - created)
            elif not warm:
                warm = True
                out.put("warm")
    out.put(latencies)


def welcomed_dealer(endpoint: str) -> tuple[Any, str]:
    """A raw publisher's DEALER connected to `endpoint`, its hello answered; and its publisher id."""
    import zmq

    from roq import protocol
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    token = secrets.token_bytes(16)
    pid = protocol.publisher_id_for(token)
    sock.send(protocol.encode_hello(pid, token, 1))
    sock.recv()
    return sock, pid


def raw_publisher(endpoint: str, count: int, rate: float, go: Any) -> None:
    from roq import protocol
    sock, pid = welcomed_dealer(endpoint)
    seq = 1

    def send(payloads: list[bytes]) -> None:
        nonlocal seq
        sock.send_multipart(protocol.encode_batch_parts(pid, seq, time.time_ns(), b"bench", payloads))
        seq += len(payloads)
        while sock.poll(0):
            sock.recv()  # acks: read as they come, as RoQ's publisher does

    while not go.is_set():
        send([STAMP.pack(0) + PAD])
        go.wait(0.005)
    paced(rate, count, send)
    sock.close(linger=1000)


def exchange_run(settings: dict[str, Any], count: int, rate: float) -> dict[str, Any]:
    from roq.config import config_from_json
    from roq.paths import Paths
    from roq.state import read_live
    from roq.zk import start_client, stop_client
    config = config_from_json(settings["config"])
    zk = start_client(config)  # with the cluster's ZooKeeper credentials, if it has any
    try:
        live = next(iter(read_live(zk, Paths(config.zk.root), settings["queue"]).values()))
    finally:
        stop_client(zk)
    latencies = pub_sub_run(raw_subscriber, raw_publisher, (live["sub"], count), (live["pub"], count, rate), 120)
    return {"total": percentiles(latencies)}


# ---------------------------------------------------------------- the whole client library


def roq_subscriber(settings: dict[str, Any], count: int, out: Any) -> None:
    from roq.client.subscriber import Subscriber
    from roq.config import config_from_json
    rows: list[tuple[int, int, int]] = []  # created, sent (monotonic), delivered
    warm: list[bool] = []

    def on_batch(batch: Any) -> None:
        now = time.monotonic_ns()
        sent = batch.sent_ns - WALL_OFFSET
        for payload in batch.payloads:
            (created,) = STAMP.unpack_from(payload)
            if created:
                rows.append((created, sent, now))
            elif not warm:
                warm.append(True)
                out.put("warm")

    sub = Subscriber(settings["queue"], config_from_json(settings["config"]), topics=["bench"],
                     batch_callback=on_batch)
    try:
        deadline = time.monotonic() + 120
        while len(rows) < count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sub.close()
    out.put({"publisher": percentiles([s - c for c, s, _ in rows]),
             "delivery": percentiles([d - s for _, s, d in rows]),
             "total": percentiles([d - c for c, _, d in rows])})


def roq_publisher(settings: dict[str, Any], count: int, rate: float, go: Any) -> None:
    from roq.client.publisher import Publisher
    from roq.config import config_from_json
    pub = Publisher(settings["queue"], config_from_json(settings["config"]))
    try:
        while not go.is_set():
            pub.publish("bench", STAMP.pack(0) + PAD)
            go.wait(0.005)
        paced(rate, count, lambda payloads: pub.publish_many("bench", payloads))
        pub.flush(30)
    finally:
        pub.close()


def roq_run(settings: dict[str, Any], count: int, rate: float) -> dict[str, Any]:
    result: dict[str, Any] = pub_sub_run(roq_subscriber, roq_publisher, (settings, count), (settings, count, rate), 180)
    return result


# ---------------------------------------------------------------- orchestration


def one_round(count: int, rate: float, workdir: Path, round_no: int) -> list[dict[str, Any]]:
    rows = []
    for system in ("zeromq", "python-hop"):
        with compare.system_settings(system, workdir) as settings:
            result = run(compare.ADAPTERS[system], settings, SIZE, count, rate=rate, timeout=120)
        rows.append({"system": system, "round": round_no, "total": {
            "p50_us": result.p50_us, "p99_us": result.p99_us, "p999_us": result.p999_us}})
    with compare.roq_cluster(workdir / f"roq-{round_no}") as settings:
        rows.append({"system": "exchange", "round": round_no, **exchange_run(settings, count, rate)})
        rows.append({"system": "roq", "round": round_no, **roq_run(settings, count, rate)})
    for row in rows:
        console.print(f"  {row['system']:>10}: " + ", ".join(
            f"{stage} p50 {v.get('p50_us', 0):,.0f} p99 {v.get('p99_us', 0):,.0f} µs"
            for stage, v in row.items() if isinstance(v, dict)))
    return rows


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per system and stage, each percentile's median over the rounds and its [min, max]."""
    out = []
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = [r for r in rows if r["system"] == system]
        stages = {stage: compare.medians([r[stage] for r in mine], ("p50_us", "p99_us", "p999_us"))
                  for stage, v in mine[0].items() if isinstance(v, dict)}
        out.append({"system": system, "rounds": len(mine), **stages})
    return out


@click.command()
@click.option("--rate", type=click.FloatRange(100), default=10_000, show_default=True)
@click.option("--messages", type=click.IntRange(500), default=30_000, show_default=True, help="per run")
@click.option("--repeat", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--smoke", is_flag=True, help="tiny counts, one round: checks that the tool works, measures nothing")
@click.option("--frames", is_flag=True, help="one-message frames/s through one exchange, and its CPU per frame")
@click.option("--window", type=click.IntRange(1), default=4, show_default=True, help="--frames: batches in flight")
@click.option("--profile", is_flag=True, help="--frames: py-spy samples of the exchange")
@click.option("--syscalls", is_flag=True, help="--frames: strace -c counts, in a run of their own")
def main(rate: float, messages: int, repeat: int, out: str, smoke: bool, frames: bool, window: int, profile: bool,
         syscalls: bool) -> None:
    if smoke:
        rate, messages, repeat = 1_000, 500, 1
    if frames:
        frames_main(messages, repeat, Path(out), window, profile, syscalls)
        return
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="roq-stages-") as tmp:
        for round_no in range(repeat):
            console.print(f"[bold]round {round_no + 1}[/] (load {os.getloadavg()[0]:.2f})")
            rows += one_round(messages, rate, Path(tmp), round_no)
    summary = medians(rows)
    table = Table(title=f"latency by stage at {rate:,.0f} msg/s, {SIZE} B (medians of {repeat} rounds)")
    for column in ("system", "stage", "p50 µs", "p99 µs", "p99.9 µs"):
        table.add_column(column, justify="left" if column in ("system", "stage") else "right")
    for row in summary:
        for stage, v in row.items():
            if isinstance(v, dict):
                table.add_row(row["system"], stage, *(f"{v.get(f) or 0:,.0f}" for f in ("p50_us", "p99_us", "p999_us")))
    console.print(table)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(["bench/stages.py"] + sys.argv[1:]),
              "settings": {"rate": rate, "messages": messages, "repeat": repeat, "size": SIZE},
              "load_before": [round(x, 2) for x in load_before],
              "load_after": [round(x, 2) for x in os.getloadavg()], "results": summary, "rounds": rows}
    (out_dir / "stages.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out_dir / 'stages.json'}")


def frames_main(messages: int, repeat: int, out_dir: Path, window: int, profile: bool, syscalls: bool) -> None:
    """`--frames`: a fresh cluster per round, one run per round (bench/frame_cost.py)."""
    from bench import frame_cost
    rows = []
    with tempfile.TemporaryDirectory(prefix="roq-frames-") as tmp:
        for round_no in range(repeat):
            with compare.roq_cluster(Path(tmp) / f"roq-{round_no}") as settings:
                load = frame_cost.load_note()
                row = {"round": round_no, "load": load,
                       **frame_cost.frames_run(settings, messages, window, profile, syscalls)}
            console.print(f"round {round_no + 1} ({load}): {row['frames_per_s']:,} frames/s, "
                          f"CPU per frame {row['cpu_per_frame']}")
            for key in ("profile", "syscalls_per_frame"):
                if key in row:
                    console.print(f"  {key}: {row[key]}")
            rows.append(row)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(["bench/stages.py"] + sys.argv[1:]),
              "settings": {"messages": messages, "window": window, "repeat": repeat}, "rounds": rows}
    (out_dir / "frames.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out_dir / 'frames.json'}")


if __name__ == "__main__":
    main()
