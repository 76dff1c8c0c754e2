#!/usr/bin/env python3
"""Messages on disk (issue 35): a subscriber far behind catches up from disk, beside JetStream;
an exchange holding many GB restarts and serves.

Two measurements, each in this one invocation, on a fresh local cluster (`roq cluster up`'s:
2 GCMs, 2 HCMs) with one queue of one exchange and a disk storage policy:

* catch-up: `--messages` messages of `--size` bytes are published (batch API, confirmed) while no
  subscriber is there, so all but the memory tail are only on disk; then a subscriber starting
  at the beginning reads them all. Reported: its rate and gaps (must be 0). The same with NATS
  JetStream (file storage): the stream is filled, then an ordered consumer replays it from the
  start. An hour behind at 5,000 msg/s is `--messages 18000000`.
* group backlog (`--group-messages`): a consumer group with no member while that many are
  published; the exchange's peak resident memory meanwhile; then two members take them all
  (counted per message: delivered, twice).
* group restore (`--restore-gb G`, 0 to skip): a consumer group with no member while G GB of
  `--restore-size` byte messages are published to a third queue; the exchange SIGKILLed; from the
  new process's start a publisher publishes (a batch of 100, confirmed, in a loop) while two
  members take the backlog. Reported: the time from the new process's start to the first
  confirm, the longest a later batch waited for its confirm while the backlog was read (publishers
  held by the restore show here), the restore's duration (from the new process's start until every
  backlog message was taken) and every backlog message once.
* big store (`--store-gb G`, 0 to skip): G GB of 64 KiB messages are published to a second
  queue; then the exchange's resident memory, and after a SIGKILL, the time from the new
  process's start until a subscriber from the beginning has its first message (the restart
  reads segment indexes, not the data).

    .venv/bin/python bench/disk_catchup.py --messages 18000000 --group-messages 10000000 \
        --store-gb 10 --json out.json
    .venv/bin/python bench/disk_catchup.py --restore-gb 4 --group-messages 0 --skip-jetstream \
        --store-gb 0 --messages 1000        # a 4 GB group restore alone
    .venv/bin/python bench/disk_catchup.py                  # smoke: 100,000 messages, 0.2 GB

Run it alone on the machine: other load changes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from bench import servers  # noqa: E402
from bench.compare import local_cluster  # noqa: E402

BATCH = 1000  # messages per publish_many call while filling
RETENTION = 7 * 24 * 3600.0  # a week: nothing ages out during the run


def fill_roq(config: Any, queue: str, messages: int, size: int) -> float:
    """Publish `messages` confirmed messages; returns msg/s of the fill."""
    from roq.client import Publisher
    payload = b"x" * size
    start = time.perf_counter()
    with Publisher(queue, config) as pub:
        for first in range(0, messages, BATCH):
            pub.publish_many("t", [payload] * min(BATCH, messages - first), timeout=120)
        pub.flush(600)
    return messages / (time.perf_counter() - start)


def catch_up_roq(config: Any, queue: str, messages: int, timeout: float) -> dict[str, Any]:
    """A subscriber from the beginning: seconds until it has every message, its gaps."""
    from roq.client import Subscriber
    got = [0]
    done = threading.Event()

    def on_batch(batch: Any) -> None:
        got[0] += len(batch.payloads)
        if got[0] >= messages:
            done.set()

    start = time.perf_counter()
    sub = Subscriber(queue, config, start="beginning", batch_callback=on_batch)
    try:
        done.wait(timeout)
        seconds = time.perf_counter() - start
        return {"received": got[0], "seconds": round(seconds, 2), "msg_per_s": round(got[0] / seconds),
                "gaps": sub.gaps, "duplicates": sub.duplicates}
    finally:
        sub.close()


def exchange_process(queue: str) -> psutil.Process:
    """The live exchange process of `queue` among this process's cluster (its HCMs' children)."""
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            if "exchange.main" in cmd and queue in cmd and "primary" in cmd:
                return proc
    raise LookupError(f"no exchange process of {queue}")


def big_store(config: Any, admin: Any, gigabytes: float, timeout: float) -> dict[str, Any]:
    """Fill a queue with `gigabytes` of 64 KiB messages while a durable subscriber is away; the
    exchange's RSS; SIGKILL; the time from the new process's start until the durable subscriber,
    back, has its first message (read from the ended incarnation's segments)."""
    from roq.client import Subscriber
    queue = "bigstore"
    admin.create_queue(queue, retention=RETENTION, retention_bytes=int(gigabytes * 2e9))
    admin.wait_running(queue, 1, timeout=60)
    away = Subscriber(queue, config, durable="bench-away", batch_callback=lambda batch: None)
    away.wait_connected(timeout=60)
    away.close()  # its position (the start of this incarnation) is saved
    messages = int(gigabytes * 1e9 / 65536)
    fill_rate = fill_roq(config, queue, messages, 65536)
    proc = exchange_process(queue)
    rss_mb = proc.memory_info().rss / 1e6
    proc.send_signal(signal.SIGKILL)
    fresh = restarted(queue, proc, timeout)  # time the new process, not the HCM's backoff
    first = threading.Event()
    got = [0]

    def on_batch(batch: Any) -> None:
        got[0] += len(batch.payloads)
        first.set()

    back = Subscriber(queue, config, durable="bench-away", batch_callback=on_batch)
    try:
        first.wait(timeout)
        serving = time.time() - fresh.create_time()
        fresh_rss = fresh.memory_info().rss / 1e6
    finally:
        back.close()
    return {"gigabytes": gigabytes, "messages": messages, "fill_mb_per_s": round(fill_rate * 65536 / 1e6),
            "exchange_rss_mb": round(rss_mb, 1), "restarted_rss_mb": round(fresh_rss, 1),
            "restart_to_first_message_s": round(serving, 2), "served": first.is_set()}


def group_backlog(config: Any, admin: Any, messages: int, size: int, timeout: float) -> dict[str, Any]:
    """A consumer group with no member while `messages` are published: the exchange's peak RSS
    meanwhile; then two members take them all (each counted: once, never twice)."""
    from roq.client import GroupMember, Publisher
    queue = "groupdisk"
    admin.create_queue(queue, retention=RETENTION, retention_bytes=int(messages * (size + 200) * 2))
    admin.wait_running(queue, 1, timeout=60)
    with GroupMember(queue, config, ["t"], group="w", prefetch=100) as founder:
        founder.wait_connected(1, timeout=60)  # the group exists from here on; then it has no member
    proc = exchange_process(queue)
    peak = [proc.memory_info().rss]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.2):
            with contextlib.suppress(psutil.Error):
                peak[0] = max(peak[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    pad = b"x" * max(0, size - 8)
    start = time.perf_counter()
    with Publisher(queue, config) as pub:
        for first in range(0, messages, BATCH):
            pub.publish_many("t", [n.to_bytes(8, "big") + pad for n in range(first, min(messages, first + BATCH))],
                             timeout=120)
        pub.flush(600)
    fill = messages / (time.perf_counter() - start)
    counts = bytearray(messages)  # deliveries per message number (saturating)
    lock, done = threading.Lock(), threading.Event()
    taken = [0]

    def on_work(msg: Any) -> None:
        n = int.from_bytes(msg.payload[:8], "big")
        with lock:
            if counts[n] == 0:
                taken[0] += 1
            counts[n] = min(255, counts[n] + 1)
            if taken[0] >= messages:
                done.set()

    start = time.perf_counter()
    members = [GroupMember(queue, config, ["t"], group="w", prefetch=1000, callback=on_work) for _ in range(2)]
    try:
        done.wait(timeout)
        seconds = time.perf_counter() - start
    finally:
        for member in members:
            member.close()
        sampling.set()
    return {"messages": messages, "fill_msg_per_s": round(fill), "exchange_peak_rss_mb": round(peak[0] / 1e6, 1),
            "delivered": taken[0], "twice": sum(1 for c in counts if c > 1), "seconds": round(seconds, 2),
            "msg_per_s": round(taken[0] / seconds)}


def restarted(queue: str, proc: psutil.Process, timeout: float) -> psutil.Process:
    """`queue`'s exchange process after `proc` was killed (the HCM restarts it after its backoff)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(LookupError):
            fresh = exchange_process(queue)
            if fresh.pid != proc.pid:
                return fresh
        if time.monotonic() > deadline:
            raise TimeoutError("the exchange was not restarted")
        time.sleep(0.01)


NEW = 1 << 40  # numbers of the messages published after the restart (the backlog's are below)


def group_restore(config: Any, admin: Any, gigabytes: float, size: int, timeout: float) -> dict[str, Any]:
    """A group's backlog of `gigabytes` on disk, the exchange SIGKILLed: how long the restarted
    exchange held publishers, and how long the group took to read its backlog back."""
    from roq.client import GroupMember, Publisher
    queue, messages = "grouprestore", int(gigabytes * 1e9 / size)
    admin.create_queue(queue, retention=RETENTION, retention_bytes=int(messages * (size + 200) * 2))
    admin.wait_running(queue, 1, timeout=60)
    with GroupMember(queue, config, ["t"], group="w", prefetch=100) as founder:
        founder.wait_connected(1, timeout=60)  # the group exists from here on; then it has no member
    pad = b"x" * max(0, size - 8)
    with Publisher(queue, config) as pub:
        for first in range(0, messages, BATCH):
            pub.publish_many("t", [n.to_bytes(8, "big") + pad for n in range(first, min(messages, first + BATCH))],
                             timeout=120)
        pub.flush(600)
    time.sleep(2)  # a few loop turns: the store wrote what was confirmed (a SIGKILL keeps the page cache)
    proc = exchange_process(queue)
    proc.send_signal(signal.SIGKILL)
    fresh = restarted(queue, proc, timeout)
    counts, order = bytearray(messages), []  # deliveries per backlog message; new ones by arrival
    lock, backlog_done, stop = threading.Lock(), threading.Event(), threading.Event()
    taken, last_backlog_at = [0], [0.0]

    def on_work(msg: Any) -> None:
        n = int.from_bytes(msg.payload[:8], "big")
        with lock:
            if n >= NEW:
                order.append(n)
                return
            if counts[n] == 0:
                taken[0] += 1
                last_backlog_at[0] = time.time()
            counts[n] = min(255, counts[n] + 1)
            if taken[0] >= messages:
                backlog_done.set()

    waits: list[float] = []
    confirmed_at = [0.0]

    def publish() -> None:
        with Publisher(queue, config) as pub:
            n = NEW
            while not stop.is_set():
                began = time.time()
                pub.publish_many("t", [(n + i).to_bytes(8, "big") + pad for i in range(100)], timeout=timeout)
                pub.flush(timeout)
                confirmed_at[0] = confirmed_at[0] or time.time()
                waits.append(time.time() - began)
                n += 100

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    members = [GroupMember(queue, config, ["t"], group="w", prefetch=1000, callback=on_work) for _ in range(2)]
    try:
        backlog_done.wait(timeout)
    finally:
        stop.set()
        publisher.join(60)
        for member in members:
            member.close()
    born = fresh.create_time()
    return {"gigabytes": gigabytes, "messages": messages, "size": size,
            "restart_to_first_confirm_s": round(confirmed_at[0] - born, 2) if confirmed_at[0] else None,
            # After the first (which waits for the new process to be found and ready).
            "longest_confirm_wait_s": round(max(waits[1:]), 3) if len(waits) > 1 else None,
            "confirmed_batches": len(waits),
            "restore_s": round(last_backlog_at[0] - born, 2), "backlog_delivered": taken[0],
            "twice": sum(1 for c in counts if c > 1), "new_messages_taken": len(order)}


def jetstream(messages: int, size: int, workdir: Path, timeout: float) -> dict[str, Any]:
    """Fill a file-storage stream, then an ordered consumer replays it from the start."""
    import nats
    from nats.js.api import DeliverPolicy, StorageType, StreamConfig

    async def run(url: str) -> dict[str, Any]:
        nc = await nats.connect(url, pending_size=1 << 30)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="CATCHUP", subjects=["catchup"], storage=StorageType.FILE))
        payload = b"x" * size
        start = time.perf_counter()
        for first in range(0, messages, BATCH):  # plain publishes (the stream stores them), then its count
            for _ in range(min(BATCH, messages - first)):
                await nc.publish("catchup", payload)
            await nc.flush()
        while (await js.stream_info("CATCHUP")).state.messages < messages:
            await asyncio.sleep(0.05)
        fill = messages / (time.perf_counter() - start)
        done, got = asyncio.Event(), [0]

        async def handler(msg: Any) -> None:
            got[0] += 1
            if got[0] >= messages:
                done.set()

        start = time.perf_counter()
        sub = await js.subscribe("catchup", cb=handler, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL,
                                 pending_msgs_limit=10_000_000, pending_bytes_limit=1 << 30)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), timeout)
        seconds = time.perf_counter() - start
        await sub.unsubscribe()
        await nc.close()
        return {"fill_msg_per_s": round(fill), "received": got[0], "seconds": round(seconds, 2),
                "msg_per_s": round(got[0] / seconds)}

    with servers.nats_jetstream(servers.scratch(workdir, "jetstream")) as settings:
        return asyncio.run(run(settings["url"]))


@contextlib.contextmanager
def disk_cluster(workdir: Path) -> Iterator[Any]:
    with local_cluster(servers.scratch(workdir, "roq")) as config:
        yield config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--store-gb", type=float, default=0.2)
    parser.add_argument("--timeout", type=float, default=3600.0, help="for each catch-up and restart")
    parser.add_argument("--skip-jetstream", action="store_true")
    parser.add_argument("--jetstream-messages", type=int, default=0,
                        help="messages for JetStream's replay (default --messages; its Python client replays "
                             "about 30k msg/s, so 18 M take 10 minutes)")
    parser.add_argument("--group-messages", type=int, default=100_000,
                        help="a member-less group's backlog (0 to skip); the issue's case is 10000000")
    parser.add_argument("--restore-gb", type=float, default=0.0,
                        help="a group's backlog of this many GB, the exchange SIGKILLed: publishers held, restore time")
    parser.add_argument("--restore-size", type=int, default=1000, help="message size of --restore-gb")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import tempfile

    from roq.client import Admin
    workdir = Path(tempfile.mkdtemp(prefix="roq-disk-bench-"))
    result: dict[str, Any] = {"messages": args.messages, "size": args.size, "load_before": os.getloadavg()}
    with disk_cluster(workdir) as config:
        # Durable positions of this run only (not an earlier run's, in the working directory).
        config = config.replace(client={"state_dir": str(workdir / "positions")})
        with Admin(config) as admin:
            stored = int(args.messages * (args.size + 200) * 2)  # room for every message and its framing
            admin.create_queue("catchup", retention=RETENTION, retention_bytes=stored)
            admin.wait_running("catchup", 1, timeout=60)
            result["roq_fill_msg_per_s"] = round(fill_roq(config, "catchup", args.messages, args.size))
            result["roq"] = catch_up_roq(config, "catchup", args.messages, args.timeout)
            print("roq catch-up", result["roq"], flush=True)
            if args.group_messages > 0:
                result["group"] = group_backlog(config, admin, args.group_messages, args.size, args.timeout)
                print("group backlog", result["group"], flush=True)
            if args.restore_gb > 0:
                result["group_restore"] = group_restore(config, admin, args.restore_gb, args.restore_size,
                                                        args.timeout)
                print("group restore", result["group_restore"], flush=True)
            if args.store_gb > 0:
                result["big_store"] = big_store(config, admin, args.store_gb, args.timeout)
                print("big store", result["big_store"], flush=True)
    if not args.skip_jetstream:
        result["jetstream"] = jetstream(args.jetstream_messages or args.messages, args.size, workdir, args.timeout)
        print("jetstream replay", result["jetstream"], flush=True)
        result["roq_over_jetstream"] = round(result["roq"]["msg_per_s"] / result["jetstream"]["msg_per_s"], 2)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
