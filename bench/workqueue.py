"""Work queues side by side: one producer, four worker processes, every message acked.

Each system is used as its Python client normally runs a work queue:
* roq-workqueue: a consumer group (`Subscriber(group=...)`, callback style), `msg.ack()` per
  message, prefetch P; the producer calls `publish()` per message, like the others;
  roq-workqueue-batch: the same workers, the producer `publish_many()`s lists of 1,000;
* rabbitmq-workqueue: pika, one queue, `basic_qos(prefetch_count=P)`, manual `basic_ack` per
  message; the producer `basic_publish`es (no publisher confirms, as bench/peers.py);
* nats-queue-group: nats-py, a queue group; core NATS has no acks (at most once): it is the
  speed of plain distribution, not of acked work.

Throughput is N / (last message processed - first message published). Every worker reports the
ids it processed, so loss and duplicates are counted, not assumed. `measure()` is what
bench/compare.py's --workqueue runs; `python bench/workqueue.py` runs it alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import queue as queue_module
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

WORKERS = 4
SIZE = 100
PREFETCH = 500
IDLE = 1.0  # s without a message after the first: a worker is done
SYSTEMS = ("roq-workqueue", "roq-workqueue-batch", "rabbitmq-workqueue", "nats-queue-group")
QUEUE = "work"


def payload(i: int) -> bytes:
    return struct.pack(">Q", i) + b"x" * (SIZE - 8)


def message_id(body: bytes) -> int:
    return int(struct.unpack(">Q", body[:8])[0])


class Tally:
    """What one worker processed, and when its first and last message came."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.first = self.last = 0.0

    def take(self, body: bytes) -> None:
        now = time.time()
        self.first = self.first or now
        self.last = now
        self.ids.append(message_id(body))

    def idle(self) -> bool:
        return bool(self.last) and time.time() - self.last > IDLE

    def report(self) -> tuple[list[int], float, float]:
        return self.ids, self.first, self.last


# ------------------------------------------------------------------ workers (child processes)

def roq_worker(settings: dict[str, Any], ready: Any, results: Any) -> None:
    from roq.client.subscriber import Subscriber
    from roq.config import config_from_json
    tally = Tally()

    def on_message(msg: Any) -> None:
        tally.take(msg.payload)
        msg.ack()
    sub = Subscriber(QUEUE, config_from_json(settings["config"]), ["jobs"], group="workers", callback=on_message,
                     prefetch=PREFETCH, auto_ack=False)
    ready.put(1)
    while not tally.idle():
        time.sleep(0.05)
    sub.close()
    results.put(tally.report())


def rabbit_worker(settings: dict[str, Any], ready: Any, results: Any) -> None:
    import pika
    connection = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=settings["port"],
                                                                   heartbeat=0))
    channel = connection.channel()
    channel.queue_declare(QUEUE)
    channel.basic_qos(prefetch_count=PREFETCH)
    tally = Tally()

    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        tally.take(body)
        ch.basic_ack(method.delivery_tag)
    channel.basic_consume(QUEUE, on_message, auto_ack=False)
    ready.put(1)
    while not tally.idle():
        connection.process_data_events(time_limit=0.05)
    connection.close()
    results.put(tally.report())


def nats_worker(settings: dict[str, Any], ready: Any, results: Any) -> None:
    import nats
    tally = Tally()

    async def run() -> None:
        nc = await nats.connect(settings["url"], pending_size=1 << 30)

        async def on_message(msg: Any) -> None:
            tally.take(msg.data)
        await nc.subscribe("jobs", queue="workers", cb=on_message, pending_msgs_limit=10_000_000,
                           pending_bytes_limit=1 << 30)
        await nc.flush()
        ready.put(1)
        while not tally.idle():
            await asyncio.sleep(0.05)
        await nc.close()
    asyncio.run(run())
    results.put(tally.report())


WORKER = {"roq-workqueue": roq_worker, "roq-workqueue-batch": roq_worker, "rabbitmq-workqueue": rabbit_worker,
          "nats-queue-group": nats_worker}


# ------------------------------------------------------------------ producers (this process)

def roq_produce(settings: dict[str, Any], count: int) -> None:
    from roq.client.publisher import Publisher
    from roq.config import config_from_json
    with Publisher(QUEUE, config_from_json(settings["config"])) as pub:
        for i in range(count):
            pub.publish("jobs", payload(i))
        pub.flush(timeout=300)


def roq_produce_batch(settings: dict[str, Any], count: int) -> None:
    from roq.client.publisher import Publisher
    from roq.config import config_from_json
    with Publisher(QUEUE, config_from_json(settings["config"])) as pub:
        for start in range(0, count, 1000):
            pub.publish_many("jobs", [payload(i) for i in range(start, min(count, start + 1000))])
        pub.flush(timeout=300)


def rabbit_produce(settings: dict[str, Any], count: int) -> None:
    import pika
    connection = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=settings["port"],
                                                                   heartbeat=0))
    channel = connection.channel()
    channel.queue_declare(QUEUE)
    for i in range(count):
        channel.basic_publish("", QUEUE, payload(i))
    connection.close()


def nats_produce(settings: dict[str, Any], count: int) -> None:
    import nats

    async def run() -> None:
        nc = await nats.connect(settings["url"], pending_size=1 << 30)
        for i in range(count):
            await nc.publish("jobs", payload(i))
        await nc.flush(timeout=300)
        await nc.close()
    asyncio.run(run())


PRODUCE = {"roq-workqueue": roq_produce, "roq-workqueue-batch": roq_produce_batch,
           "rabbitmq-workqueue": rabbit_produce, "nats-queue-group": nats_produce}


# ------------------------------------------------------------------ one run

@contextlib.contextmanager
def system(name: str, workdir: Path) -> Iterator[dict[str, Any]]:
    """Start what `name` needs (a RoQ cluster with one single-exchange queue, or a server)."""
    from bench import servers
    scratch = servers.scratch(workdir, name)
    if name.startswith("roq-"):
        from bench.compare import roq_cluster
        with roq_cluster(scratch, queue=QUEUE) as settings:
            yield settings
    else:
        with getattr(servers, name.split("-")[0])(scratch) as settings:
            yield settings


def run_once(name: str, settings: dict[str, Any], count: int) -> dict[str, Any]:
    context = mp.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    workers = [context.Process(target=WORKER[name], args=(settings, ready, results), daemon=True)
               for _ in range(WORKERS)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            ready.get(timeout=60)
        started = time.time()
        PRODUCE[name](settings, count)
        reports = [results.get(timeout=300 + count / 1000) for _ in workers]
    except queue_module.Empty:
        raise RuntimeError(f"{name}: a worker did not report") from None
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
    ids = [i for got, _, _ in reports for i in got]
    unique = set(ids)
    last = max(end for _, _, end in reports)
    seconds = max(last - started, 1e-9)
    return {"system": name, "messages": count, "workers": WORKERS, "prefetch": PREFETCH, "size": SIZE,
            "msgs_per_s": round(len(unique) / seconds), "seconds": round(seconds, 3),
            "lost": count - len(unique & set(range(count))), "duplicates": len(ids) - len(unique),
            "per_worker": [len(got) for got, _, _ in reports],
            "acks": name != "nats-queue-group"}


def measure(systems: list[str], count: int, repeat: int = 1, log: Any = print) -> list[dict[str, Any]]:
    """Every system `repeat` times, interleaved; one row per run with its round."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="roq-workqueue-") as tmp:
        for round_no in range(repeat):
            for name in systems:
                with system(name, Path(tmp)) as settings:
                    row = run_once(name, settings, count)
                row["round"] = round_no
                log(f"{name} (round {round_no + 1}): {row['msgs_per_s']:,} msg/s, lost {row['lost']}, "
                    f"duplicates {row['duplicates']}, per worker {row['per_worker']}")
                rows.append(row)
    return rows


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """RoQ over each peer, within each round, then the median over the rounds."""
    from statistics import median
    out = {}
    for peer in ("rabbitmq-workqueue", "nats-queue-group"):
        within = []
        for round_no in {r["round"] for r in rows}:
            by = {r["system"]: r for r in rows if r["round"] == round_no}
            if "roq-workqueue" in by and peer in by and by[peer]["msgs_per_s"]:
                within.append(by["roq-workqueue"]["msgs_per_s"] / by[peer]["msgs_per_s"])
        if within:
            out[f"roq_vs_{peer.split('-')[0]}"] = round(median(within), 2)
    return out


if __name__ == "__main__":
    import json
    messages = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    found = measure(list(SYSTEMS), messages)
    print(json.dumps({"rows": found, "ratios": ratios(found)}, indent=2))
