"""What one frame costs an exchange: how many one-message frames per second it forwards, and where
its CPU goes per frame (`bench/stages.py --frames`).

A raw publisher (its own process, no RoQ client library) sends one-message two-part batches as
fast as a window of `window` unacknowledged batches allows; a raw SUB counts what is delivered.
One message per frame is the worst case for the exchange: everything it does per frame is paid
per message. Measured around the run, on the exchange's process:

* frames/s at the subscriber (first to last measured message);
* CPU per frame, split by thread: the exchange's main (Python) thread and libzmq's I/O threads,
  each in user and system time (psutil; the idle threads, such as ZooKeeper's, are in `other`);
* with `--profile`: where the main thread's samples fall (py-spy, if installed), by function;
* with `--syscalls`: system calls per frame by thread and name (`strace -f`, a run of its own: strace
  slows the exchange several times, so that run's rate is not reported).
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ONE = struct.Struct("<q")  # the payload starts with 1 (measured) or 0 (warm-up)
PAD = b"x" * 92


def window_publisher(endpoint: str, count: int, window: int, go: Any) -> None:
    """Send `count` one-message batches, at most `window` of them unacknowledged (after warm-ups)."""
    import zmq

    from bench.stages import welcomed_dealer
    from roq import protocol
    sock, pid = welcomed_dealer(endpoint)
    seq, acked = 1, 0

    def send(stamp: int) -> None:
        nonlocal seq
        head, block = protocol.encode_batch_parts(pid, seq, time.time_ns(), b"bench", [ONE.pack(stamp) + PAD])
        sock.send(head, zmq.SNDMORE)
        sock.send(block)
        seq += 1

    def read_acks(timeout_ms: int) -> None:
        nonlocal acked
        while sock.poll(timeout_ms):
            reply = protocol.decode_exchange_reply(sock.recv())
            if reply.kind == protocol.ACK:
                acked = max(acked, reply.seq)
            timeout_ms = 0

    while not go.is_set():
        send(0)
        go.wait(0.005)
    last = seq + count - 1
    while seq <= last:
        if seq - 1 - acked < window:
            send(1)
            read_acks(0)
        else:
            read_acks(1000)
    while acked < last and sock.poll(5000):
        read_acks(0)
    sock.close(linger=1000)


def counting_subscriber(endpoint: str, count: int, out: Any) -> None:
    """Count measured messages and the frames that carried them; report the time they took."""
    import zmq

    from roq import protocol
    sock = zmq.Context().socket(zmq.SUB)
    sock.rcvhwm = 0
    sock.setsockopt(zmq.SUBSCRIBE, b"bench")
    sock.connect(endpoint)
    messages = frames = 0
    first = last = 0.0
    warm = False
    while messages < count and sock.poll(5000):
        _, body = sock.recv_multipart()
        stamps = [ONE.unpack_from(p)[0] for p in protocol.decode_delivery(body).payloads]
        if any(stamps):
            last = time.monotonic()
            first = first or last
            messages += sum(stamps)
            frames += 1
        elif not warm:
            warm = True
            out.put("warm")
    out.put({"messages": messages, "frames": frames, "seconds": last - first})


class ThreadCpu:
    """CPU seconds of one process by thread, between `start()` and `stop()`."""

    def __init__(self, pid: int) -> None:
        import psutil
        self.proc = psutil.Process(pid)
        self.before: dict[int, tuple[float, float]] = {}

    def sample(self) -> dict[int, tuple[float, float]]:
        return {t.id: (t.user_time, t.system_time) for t in self.proc.threads()}

    def start(self) -> None:
        self.before = self.sample()

    def stop(self, frames: int) -> dict[str, Any]:
        """µs per frame: the main thread, libzmq's I/O threads (named ZMQbg/IO/n), the others."""
        after = self.sample()
        names = _thread_names(self.proc.pid)
        split: dict[str, list[float]] = {}
        for tid, (user, system) in after.items():
            u0, s0 = self.before.get(tid, (0.0, 0.0))
            name = "main" if tid == self.proc.pid else "zmq_io" if names.get(tid, "").startswith("ZMQbg/IO") \
                else "other"
            acc = split.setdefault(name, [0.0, 0.0])
            acc[0] += user - u0
            acc[1] += system - s0
        per = max(frames, 1)
        out = {name: {"user_us": round(u / per * 1e6, 1), "system_us": round(s / per * 1e6, 1)}
               for name, (u, s) in sorted(split.items())}
        out["total_us"] = round(sum(u + s for u, s in split.values()) / per * 1e6, 1)
        return out


def _thread_names(pid: int) -> dict[int, str]:
    names = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            pass
    return names


class PySpy:
    """py-spy samples of the exchange's threads while it runs, summarised by function."""

    def __init__(self, pid: int, seconds: float) -> None:
        self.out = Path(tempfile.mkstemp(prefix="roq-pyspy-", suffix=".txt")[1])
        self.proc = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
                                      "--rate", "500", "--format", "raw", "--output", str(self.out), "--nonblocking"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, Any]:
        """Shares of the samples: by the innermost function, and by the exchange's own function
        nearest the leaf (where the time of pyzmq and msgpack calls is charged)."""
        self.proc.wait(60)
        leaf: Counter[str] = Counter()
        ours: Counter[str] = Counter()
        total = 0
        for line in self.out.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not stack or not n.isdigit():
                continue
            frames = stack.split(";")
            total += int(n)
            leaf[_short(frames[-1])] += int(n)
            mine = [f for f in frames if "exchange/" in f or "roq/" in f]
            ours[_short(mine[-1]) if mine else "(other)"] += int(n)
        self.out.unlink()
        return {"samples": total,
                "by_leaf": {k: round(v / max(total, 1), 3) for k, v in leaf.most_common(15)},
                "by_exchange_function": {k: round(v / max(total, 1), 3) for k, v in ours.most_common(15)}}


def _short(frame: str) -> str:
    """`poll (zmq/sugar/poll.py:106)` → `poll (poll.py)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.split(':')[0]).name})"


class Strace:
    """`strace -f` attached to the exchange: its system calls per frame by thread kind and name,
    counted until `stop()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.out = Path(tempfile.mkstemp(prefix="roq-strace-", suffix=".txt")[1])
        self.proc = subprocess.Popen(["strace", "-f", "-qq", "-o", str(self.out), "-p", str(pid)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # strace attaches to every thread before it counts; no event tells us when

    def stop(self, frames: int) -> dict[str, dict[str, float]]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        names = _thread_names(self.pid)
        counts: Counter[tuple[str, str]] = Counter()
        with self.out.open() as lines:
            for line in lines:
                tid, _, call = line.partition(" ")
                name = call.lstrip().partition("(")[0]
                if not tid.isdigit() or not name.isidentifier():
                    continue  # "<... resumed>", signals, exits
                kind = "main" if int(tid) == self.pid else "zmq_io" if names.get(int(tid), "").startswith(
                    "ZMQbg/IO") else "other"
                counts[(kind, name)] += 1
        self.out.unlink()
        per = max(frames, 1)
        result: dict[str, dict[str, float]] = {}
        for (kind, name), n in counts.most_common():
            if n / per >= 0.05:
                result.setdefault(kind, {})[name] = round(n / per, 2)
        for kind in result:
            result[kind]["total"] = round(sum(n for (k, _), n in counts.items() if k == kind) / per, 2)
        return result


def frames_run(settings: dict[str, Any], count: int, window: int, profile: bool, syscalls: bool) -> dict[str, Any]:
    """One measured run against the queue's one exchange (bench/stages.py starts the cluster)."""
    from bench.stages import pub_sub_run
    live = _live_exchange(settings)
    pid = int(live["pid"])
    cpu = ThreadCpu(pid)
    spy = None

    def on_go() -> None:
        nonlocal spy
        cpu.start()
        if profile and shutil.which("py-spy"):
            spy = PySpy(pid, 3)

    result = pub_sub_run(counting_subscriber, window_publisher, (live["sub"], count),
                         (live["pub"], count, window), 300, on_go=on_go)
    frames = result["frames"]
    row: dict[str, Any] = {"frames": frames, "messages": result["messages"],
                           "frames_per_s": round(frames / max(result["seconds"], 1e-9)),
                           "cpu_per_frame": cpu.stop(frames)}
    if spy is not None:
        row["profile"] = spy.stop()
    if syscalls and shutil.which("strace"):
        tracer: list[Strace] = []
        traced = pub_sub_run(counting_subscriber, window_publisher, (live["sub"], count // 4),
                             (live["pub"], count // 4, window), 300, on_go=lambda: tracer.append(Strace(pid)))
        row["syscalls_per_frame"] = tracer[0].stop(traced["frames"])
    return row


def _live_exchange(settings: dict[str, Any]) -> dict[str, Any]:
    from roq.config import config_from_json
    from roq.paths import Paths
    from roq.state import read_live
    from roq.zk import start_client, stop_client
    config = config_from_json(settings["config"])
    zk = start_client(config)
    try:
        live: dict[str, Any] = next(iter(read_live(zk, Paths(config.zk.root), settings["queue"]).values()))
        return live
    finally:
        stop_client(zk)


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} / {five:.2f}"
