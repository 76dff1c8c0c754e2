"""The HTTP gateway (web/, docs/http.md) beside RoQ's native client and NATS: one invocation.

One local cluster (bench/compare.py's `roq_cluster`), one `roq-web` gateway process with auth
off on a free port, one nats-server (bench/servers.py); then, with 100-byte messages:

* HTTP publish, one message per `POST /api/queues/Q/messages`, from N concurrent keep-alive
  clients (plain HTTP/1.1 through http.client, one thread and connection each, in a process
  of their own): confirmed msg/s and request latency;
* HTTP publish of `?split=lines` bodies of L lines: msg/s;
* SSE delivery: one `GET /api/queues/Q/stream` client parsing events, reading a backlog
  published beforehand (`from=beginning&limit=K`) and keeping up with a native publisher
  (`from=now`): msg/s received;
* RoQ's native client publishing one message at a time and waiting for each confirm (what one
  HTTP client gets), and NATS publishing with a flush (a server round trip) after each message;
* pub/sub throughput, 1 publisher → 1 subscriber, through roq.tools.bench as compare.py runs it:
  RoQ `publish()` + `callback`, `publish_many()` + `batch_callback`, and NATS.

Every timed loop stops at `--seconds` or at a count, whichever comes first. Every message
published over HTTP (and by the one-at-a-time native publisher) is checked by a native
subscriber: each confirmed sequence number arrived exactly once. Each SSE client checks it got
every message once. A row reports what it lost; the run prints a warning if any row lost any.
Failures of the gateway (a non-200 answer, a stream that ends early) are counted, not retried.

    .venv/bin/python -m bench.http                              # about a minute on 2 vCPUs
    .venv/bin/python -m bench.http --seconds 5 --repeat 3 --json docs/bench/http.json   # about 2 minutes
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import psutil
from rich.console import Console
from rich.table import Table

from bench import machine, servers
from bench.compare import ADAPTERS, medians, roq_cluster
from roq.tools.bench import percentile, run

console = Console(stderr=True, width=150)
PUBLISH_QUEUE, STREAM_QUEUE = "http-publish", "http-stream"
SERVING = re.compile(r"serving the console at (http\S+)/ ")
GATEWAY_START_SECONDS = 30.0
SETTLE_SECONDS = 15.0  # how long a check waits for the last deliveries before counting losses
MAX_REQUESTS = 1_000_000  # per client and phase: the count bound beside the time bound
HELLO_INTERVAL = 0.02  # live SSE: native warm-up messages until the stream shows one
NATIVE_CHUNK = 1_000  # messages per publish_many when filling the SSE backlog


# ------------------------------------------------------------------ the gateway process

@contextlib.contextmanager
def gateway(config_json: str, workdir: Path) -> Iterator[tuple[str, int]]:
    """A `roq-web` process (auth off, a free port) on the cluster of `config_json`; yields its
    URL and pid once its log announces it."""
    from roq.config import config_from_json
    config_path = workdir / "web.toml"
    config_path.write_text(config_from_json(config_json).to_toml())
    proc = servers._spawn([sys.executable, "-m", "roq_web.daemon", "--config", str(config_path),
                           "--set", "web.port=0", "--set", "web.auth=false"], workdir)
    try:
        yield _wait_serving(proc, workdir / "server.log"), proc.pid
    finally:
        servers._stop(proc)


def _wait_serving(proc: Any, log: Path) -> str:
    deadline = time.monotonic() + GATEWAY_START_SECONDS
    while time.monotonic() < deadline:
        found = SERVING.search(log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"roq-web exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)  # a log file to poll: there is no readiness signal to wait on
    raise TimeoutError(f"roq-web did not announce its URL in {GATEWAY_START_SECONDS:.0f}s")


def uvicorn_stack() -> dict[str, str]:
    """What uvicorn's "auto" picks in the gateway's environment (the same venv)."""
    return {"http": "httptools" if importlib.util.find_spec("httptools") else "h11",
            "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"}


class CpuMeter:
    """CPU time (user + system) a process spent between start() and stop()."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self._start = 0.0

    def _now(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> float:
        return self._now() - self._start


# ------------------------------------------------------------------ work in a child process

class Child:
    """target(*args) in a spawned process: its own GIL, its own CPU accounting."""

    def __init__(self, target: Callable[..., dict[str, Any]], *args: Any) -> None:
        self.name = target.__name__
        self._results = CONTEXT.Queue()
        self._proc = CONTEXT.Process(target=_child_main, args=(target, args, self._results), daemon=True)
        self._proc.start()

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            kind, value = self._results.get(timeout=timeout)
        finally:
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
        if kind == "error":
            raise RuntimeError(f"{self.name} failed in its process: {value}")
        return value


CONTEXT = mp.get_context("spawn")


def in_child(target: Callable[..., dict[str, Any]], *args: Any, timeout: float) -> dict[str, Any]:
    return Child(target, *args).result(timeout)


def _child_main(target: Callable[..., dict[str, Any]], args: tuple[Any, ...], results: Any) -> None:
    try:
        results.put(("ok", target(*args)))
    except BaseException as exc:  # reported to the parent, which raises it there
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def _connection(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


# ------------------------------------------------------------------ HTTP publishing (clients)

def payload(client: int, n: int, size: int) -> bytes:
    """A unique printable message of `size` bytes (so SSE carries it as text)."""
    head = f"{client:03d}-{n:012d}-".encode()
    return head + b"x" * (size - len(head))


def http_publishers(url: str, queue: str, topic: str, clients: int, lines: int, size: int, seconds: float,
                    max_requests: int) -> dict[str, Any]:
    """`clients` threads, one keep-alive connection each, POSTing bodies of one message
    (lines 0) or of `lines` lines (`split=lines`) for `seconds` or `max_requests` each."""
    path = f"/api/queues/{queue}/messages?topic={topic}" + ("&split=lines" if lines else "")
    barrier = threading.Barrier(clients + 1)
    outcomes: list[dict[str, Any]] = [{} for _ in range(clients)]

    def client(i: int) -> None:
        conn = _connection(url, timeout=30)
        # The first request opens the gateway's publisher for the queue: not measured.
        _post(conn, f"/api/queues/{queue}/messages?topic=warm-up", payload(i, 0, size))
        barrier.wait()
        outcomes[i] = _publish_loop(conn, path, i, lines, size, time.monotonic() + seconds, max_requests)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait(timeout=60)
    start, cpu = time.monotonic(), time.process_time()
    for thread in threads:
        thread.join(seconds + 60)
    cpu = time.process_time() - cpu
    end = max((o.get("end", start) for o in outcomes), default=start)
    latencies = sorted(ns for o in outcomes for ns in o.get("latencies", []))
    answers = [a for o in outcomes for a in o.get("answers", [])]
    errors = [e for o in outcomes for e in o.get("errors", [])]
    return {"requests": len(latencies), "confirmed": sum(a[2] for a in answers), "seconds": end - start,
            "p50_us": percentile(latencies, 0.50), "p99_us": percentile(latencies, 0.99),
            "answers": answers, "errors": len(errors) + sum(t.is_alive() for t in threads),  # + stuck clients
            "error_samples": errors[:5], "client_cpu_s": cpu}


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/octet-stream"})
    response = conn.getresponse()
    return response.status, response.read()


def _publish_loop(conn: http.client.HTTPConnection, path: str, client: int, lines: int, size: int,
                  deadline: float, max_requests: int) -> dict[str, Any]:
    latencies: list[int] = []
    answers: list[tuple[str, int, int]] = []  # (publisher, first_seq, count) of each 200
    errors: list[str] = []
    n = 0
    while len(latencies) < max_requests and time.monotonic() < deadline:
        if lines:
            body = b"\n".join([payload(client, n + k, size) for k in range(lines)]) + b"\n"
            n += lines
        else:
            body, n = payload(client, n, size), n + 1
        began = time.perf_counter_ns()
        try:
            status, answer = _post(conn, path, body)
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            break  # the connection is gone: this client stops, the others go on
        latencies.append(time.perf_counter_ns() - began)
        if status == 200:
            confirmed = json.loads(answer)
            answers.append((confirmed["publisher"], confirmed["first_seq"], confirmed["count"]))
        else:
            errors.append(f"{status} {answer[:200]!r}")
    return {"latencies": latencies, "answers": answers, "errors": errors, "end": time.monotonic()}


# ------------------------------------------------------------------ SSE (client)

@dataclass
class StreamTally:
    """What one SSE client saw of the messages of `topic`."""
    topic: str
    seen: set[tuple[str, int]] = field(default_factory=set)
    duplicates: int = 0
    bad_payloads: int = 0
    ids: int = 0
    id_chars: int = 0
    first: float = 0.0  # when the first message arrived
    first_read: int = 0  # messages in the read that brought it (sent before it arrived: not timed)
    last: float = 0.0
    other: int = 0  # events of other topics (warm-ups)
    errors: list[str] = field(default_factory=list)

    def add(self, event: dict[str, bytes]) -> None:
        if event.get(b"event", b"message") == b"error":
            self.errors.append(event.get(b"data", b"").decode(errors="replace"))
            return
        data = event.get(b"data")
        if data is None:
            return  # `retry:` or a comment
        message = json.loads(data)
        if message["topic"] != self.topic:
            self.other += 1
            return
        now = time.monotonic()
        self.first = self.first or now
        self.last = now
        key = (message["publisher"], message["seq"])
        if key in self.seen:
            self.duplicates += 1
        self.seen.add(key)
        if message["encoding"] != "utf-8" or not message["payload"].startswith("000-"):
            self.bad_payloads += 1
        token = event.get(b"id")
        if token:
            self.ids += 1
            self.id_chars += len(token)


def sse_reader(url: str, path: str, topic: str, expect: int, seconds: float, hello: Any = None) -> dict[str, Any]:
    """Read `path` until `expect` messages of `topic` or `seconds`; `hello` (an Event) is set
    at the first event of another topic (the publisher's warm-up)."""
    tally = StreamTally(topic)
    conn = _connection(url, timeout=max(5.0, seconds))
    began, cpu = time.monotonic(), time.process_time()
    conn.request("GET", path, headers={"Accept": "text/event-stream"})
    response = conn.getresponse()
    status, received_bytes, ended = response.status, 0, "limit"
    if status != 200:
        return {"status": status, "error": response.read()[:300].decode(errors="replace"), "received": 0}
    deadline, buffer = began + seconds, b""
    try:
        while len(tally.seen) < expect:
            if time.monotonic() > deadline:
                ended = "deadline"
                break
            chunk = response.read1(1 << 16)
            if not chunk:
                ended = "server closed"
                break
            received_bytes += len(chunk)
            *blocks, buffer = (buffer + chunk).split(b"\n\n")
            timed = bool(tally.first)
            for block in blocks:
                tally.add(_fields(block))
            if not timed and tally.first:
                tally.first_read = len(tally.seen)
            if hello is not None and tally.other and not hello.is_set():
                hello.set()
    except TimeoutError:
        ended = "read timed out"
    conn.close()  # a live stream (no limit) ends here: the gateway must close its subscriber
    count = len(tally.seen)
    span, timed = tally.last - tally.first, count - tally.first_read
    return {"status": status, "received": count, "duplicates": tally.duplicates, "bad_payloads": tally.bad_payloads,
            "ids": tally.ids, "mean_id_chars": round(tally.id_chars / tally.ids) if tally.ids else 0,
            "wire_bytes_per_msg": round(received_bytes / count) if count else 0, "ended": ended,
            "first_event_s": round(tally.first - began, 3) if tally.first else None,
            "seconds": span, "msgs_per_s": round(timed / span, 1) if timed > 0 and span > 0 else 0.0,
            "msgs_per_s_with_open": round(count / (tally.last - began), 1) if count else 0.0,
            "keys": sorted(tally.seen), "error_events": tally.errors[:3], "client_cpu_s": time.process_time() - cpu}


def _fields(block: bytes) -> dict[bytes, bytes]:
    """One SSE event's fields (`name: value` lines; comments, named b"", are kept and ignored)."""
    fields: dict[bytes, bytes] = {}
    for line in block.split(b"\n"):
        name, _, value = line.partition(b":")
        fields[name] = value[1:] if value.startswith(b" ") else value
    return fields


# ------------------------------------------------------------------ checking deliveries

class Deliveries:
    """A native subscriber to a whole queue: per topic and publisher, the sequence numbers it got."""

    def __init__(self, config: Any, queue: str) -> None:
        from roq.client import Subscriber
        self._lock = threading.Lock()
        self._got: dict[tuple[str, str], list[int]] = {}
        self.subscriber = Subscriber(queue, config, batch_callback=self._on_batch)
        self.subscriber.wait_connected(timeout=30)

    def _on_batch(self, batch: Any) -> None:
        with self._lock:
            if batch.topics is None:  # one topic, the batch's
                self._got.setdefault((batch.topic, batch.publisher), []).extend(batch.seqs)
                return
            for topic, seq in zip(batch.topics, batch.seqs):  # a frame of many topics
                self._got.setdefault((topic, batch.publisher), []).append(seq)

    def received(self, topic: str) -> int:
        with self._lock:
            return sum(len(seqs) for (t, _), seqs in self._got.items() if t == topic)

    def check(self, topic: str, answers: list[tuple[str, int, int]]) -> dict[str, int]:
        """Wait (up to SETTLE_SECONDS without progress) for every confirmed message of `topic`,
        then count: received, lost, duplicates, unexpected."""
        expected = {(p, first + k) for p, first, count in answers for k in range(count)}
        _wait_for(lambda: self.received(topic), len(expected))
        with self._lock:
            got = [(p, seq) for (t, p), seqs in self._got.items() if t == topic for seq in seqs]
        unique = set(got)
        return {"received": len(got), "lost": len(expected - unique), "duplicates": len(got) - len(unique),
                "unexpected": len(unique - expected)}

    def close(self) -> None:
        self.subscriber.close()


def _wait_for(count: Callable[[], int], target: int) -> None:
    last, since = -1, time.monotonic()
    while (now := count()) < target:
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > SETTLE_SECONDS:
            return
        time.sleep(0.05)  # polling a counter the subscriber's thread advances


# ------------------------------------------------------------------ the phases

@dataclass
class Run:
    """What every phase needs: the cluster, the gateway and the limits."""
    config: Any
    url: str
    gateway_cpu: CpuMeter
    size: int
    seconds: float
    max_requests: int
    round: int = 0

    def topic(self, name: str) -> str:
        """A topic of this round's: every round's messages are checked on their own."""
        return f"{name}-r{self.round}"


def http_publish_row(run_: Run, deliveries: Deliveries, clients: int, lines: int) -> dict[str, Any]:
    kind = f"lines-{lines}" if lines else f"single-{clients}"
    topic = run_.topic(kind)
    console.print(f"HTTP publish: {clients} client(s), {lines or 1} message(s) per request")
    run_.gateway_cpu.start()
    out = in_child(http_publishers, run_.url, PUBLISH_QUEUE, topic, clients, lines, run_.size, run_.seconds,
                   run_.max_requests, timeout=run_.seconds + 120)
    gateway_cpu = run_.gateway_cpu.stop()
    confirmed = out["confirmed"]
    row = {"name": f"http-{kind}", "path": "HTTP POST" + (f" ?split=lines, {lines} per request" if lines else
                                                           ", 1 message per request"),
           "clients": clients, "per_request": lines or 1, "messages": confirmed, "requests": out["requests"],
           "seconds": round(out["seconds"], 3), "msgs_per_s": _rate(confirmed, out["seconds"]),
           "requests_per_s": _rate(out["requests"], out["seconds"]), "p50_us": out["p50_us"], "p99_us": out["p99_us"],
           "errors": out["errors"], "error_samples": out["error_samples"],
           "gateway_cpu_us_per_msg": _per(gateway_cpu, confirmed), "client_cpu_us_per_msg": _per(out["client_cpu_s"],
                                                                                                  confirmed)}
    row.update(deliveries.check(topic, out["answers"]))
    return row


def native_confirmed_row(run_: Run, deliveries: Deliveries) -> dict[str, Any]:
    """RoQ's own client, one message at a time, each waited for: one HTTP client without HTTP."""
    from roq.client import Publisher
    console.print("RoQ native: publish() then wait_confirmed(), one message at a time")
    topic = run_.topic("native-each")
    latencies: list[int] = []
    with contextlib.closing(Publisher(PUBLISH_QUEUE, run_.config)) as publisher:
        publisher.publish("warm-up", payload(0, 0, run_.size))
        publisher.flush(30)  # connected, and the exchange answered once: not measured
        first = None
        start = time.monotonic()
        deadline = start + run_.seconds
        while len(latencies) < run_.max_requests and time.monotonic() < deadline:
            began = time.perf_counter_ns()
            seq = publisher.publish(topic, payload(0, len(latencies), run_.size))
            publisher.wait_confirmed(range(seq, seq + 1), 10)
            latencies.append(time.perf_counter_ns() - began)
            first = first or seq
        elapsed = time.monotonic() - start
        answers = [(publisher.id, first, len(latencies))] if first else []
    latencies.sort()
    row = {"name": "roq-native-each", "path": "RoQ native, publish() + wait_confirmed() each", "clients": 1,
           "per_request": 1, "messages": len(latencies), "seconds": round(elapsed, 3),
           "msgs_per_s": _rate(len(latencies), elapsed), "p50_us": percentile(latencies, 0.5),
           "p99_us": percentile(latencies, 0.99), "errors": 0}
    row.update(deliveries.check(topic, answers))
    return row


def _fill_backlog(config: Any, topic: str, count: int, size: int) -> tuple[str, int]:
    """`count` messages of `topic` on the stream queue, confirmed; (publisher, first seq)."""
    from roq.client import Publisher
    with contextlib.closing(Publisher(STREAM_QUEUE, config)) as publisher:
        first = _publish_chunks(publisher, topic, count, size)
        publisher.flush(60)
        return publisher.id, first


def _publish_chunks(publisher: Any, topic: str, count: int, size: int) -> int:
    first = None
    for start in range(0, count, NATIVE_CHUNK):
        chunk = [payload(0, n, size) for n in range(start, min(count, start + NATIVE_CHUNK))]
        seqs = publisher.publish_many(topic, chunk)
        first = first or seqs.start
    assert first is not None
    return first


def sse_backlog_row(run_: Run, count: int) -> dict[str, Any]:
    console.print(f"SSE: {count:,} messages published beforehand, read from=beginning")
    topic = run_.topic("backlog")
    publisher, first = _fill_backlog(run_.config, topic, count, run_.size)
    path = f"/api/queues/{STREAM_QUEUE}/stream?topic={topic}&from=beginning&limit={count}"
    run_.gateway_cpu.start()
    out = in_child(sse_reader, run_.url, path, topic, count, run_.seconds + 60, timeout=run_.seconds + 120)
    return _sse_row(run_, out, "sse-backlog", "SSE stream, from=beginning (a backlog)", publisher, first, count)


def sse_live_row(run_: Run, count: int) -> dict[str, Any]:
    """A stream opened first (from=now); a native publisher's warm-ups until the stream shows
    one, then `count` messages as fast as it can publish them."""
    from roq.client import Publisher
    console.print(f"SSE: from=now while a native publisher sends {count:,} messages")
    hello = CONTEXT.Event()
    topic = run_.topic("live")
    path = f"/api/queues/{STREAM_QUEUE}/stream?topic={topic}&topic=hello&from=now"
    run_.gateway_cpu.start()
    reader = Child(sse_reader, run_.url, path, topic, count, run_.seconds + 60, hello)
    with contextlib.closing(Publisher(STREAM_QUEUE, run_.config)) as publisher:
        deadline = time.monotonic() + 30
        while not hello.wait(HELLO_INTERVAL):  # the stream is live once it delivered a warm-up
            if time.monotonic() > deadline:
                raise TimeoutError("the SSE stream showed no message in 30s")
            publisher.publish("hello", b"hello")
        first = _publish_chunks(publisher, topic, count, run_.size)
        publisher.flush(60)
        out = reader.result(timeout=run_.seconds + 120)
    return _sse_row(run_, out, "sse-live", "SSE stream, from=now, native publisher meanwhile", publisher.id,
                    first, count)


def _sse_row(run_: Run, out: dict[str, Any], name: str, label: str, publisher: str, first: int,
             count: int) -> dict[str, Any]:
    gateway_cpu = run_.gateway_cpu.stop()
    expected = {(publisher, first + k) for k in range(count)}
    seen = {(p, seq) for p, seq in out.get("keys", [])}
    row = {"name": name, "path": label, "clients": 1, "per_request": None, "messages": out["received"],
           "seconds": round(out.get("seconds", 0.0), 3), "msgs_per_s": out.get("msgs_per_s", 0.0),
           "p50_us": None, "p99_us": None, "errors": 0 if out["status"] == 200 and not out.get("error_events") else 1,
           "gateway_cpu_us_per_msg": _per(gateway_cpu, out["received"]),
           "client_cpu_us_per_msg": _per(out.get("client_cpu_s", 0.0), out["received"]),
           "received": out["received"], "lost": len(expected - seen), "duplicates": out.get("duplicates", 0),
           "unexpected": len(seen - expected)}
    row.update({k: out.get(k) for k in ("msgs_per_s_with_open", "first_event_s", "mean_id_chars",
                                        "wire_bytes_per_msg", "ended", "bad_payloads", "ids", "error_events",
                                        "status")})
    return row


# ------------------------------------------------------------------ NATS, one round trip per message

def nats_round_trips(url: str, size: int, seconds: float, max_messages: int) -> dict[str, Any]:
    """Publish, then flush (PING → PONG: the server has read it), one message at a time; a
    second connection subscribes and counts them."""
    import nats

    async def measure() -> dict[str, Any]:
        received = 0

        async def count(_msg: Any) -> None:
            nonlocal received
            received += 1

        listener = await nats.connect(url)
        await listener.subscribe("round-trip", cb=count)
        await listener.flush()
        client = await nats.connect(url)
        latencies: list[int] = []
        start = time.monotonic()
        while len(latencies) < max_messages and time.monotonic() < start + seconds:
            began = time.perf_counter_ns()
            await client.publish("round-trip", payload(0, len(latencies), size))
            await client.flush()
            latencies.append(time.perf_counter_ns() - began)
        elapsed = time.monotonic() - start
        last, since = -1, time.monotonic()
        while received < len(latencies) and time.monotonic() - since < SETTLE_SECONDS:
            if received != last:
                last, since = received, time.monotonic()
            await asyncio.sleep(0.05)
        await client.close()
        await listener.close()
        latencies.sort()
        return {"sent": len(latencies), "received": received, "seconds": elapsed,
                "p50_us": percentile(latencies, 0.5), "p99_us": percentile(latencies, 0.99)}

    return asyncio.run(measure())


def nats_round_trip_row(url: str, size: int, seconds: float, max_messages: int) -> dict[str, Any]:
    console.print("NATS: publish() + flush() each")
    out = nats_round_trips(url, size, seconds, max_messages)
    return {"name": "nats-each", "path": "NATS, publish() + flush() each (a server round trip)", "clients": 1,
            "per_request": 1, "messages": out["sent"], "seconds": round(out["seconds"], 3),
            "msgs_per_s": _rate(out["sent"], out["seconds"]), "p50_us": out["p50_us"], "p99_us": out["p99_us"],
            "errors": 0, "received": out["received"], "lost": max(0, out["sent"] - out["received"]),
            "duplicates": max(0, out["received"] - out["sent"])}


# ------------------------------------------------------------------ pub/sub throughput, as compare.py

THROUGHPUT = {"roq": "RoQ native, publish() + callback, 1 → 1",
              "roq-batch": "RoQ native, publish_many() + batch_callback, 1 → 1",
              "nats": "NATS, publish + subscribe, 1 → 1"}


def throughput_row(system: str, settings: dict[str, Any], size: int, messages: int) -> dict[str, Any]:
    console.print(f"{system}: {messages:,} messages, 1 publisher → 1 subscriber (roq.tools.bench)")
    result = run(ADAPTERS[system], settings, size, messages, timeout=600)
    return {"name": f"{system}-throughput", "path": THROUGHPUT[system], "clients": 1, "per_request": None,
            "messages": result.messages, "seconds": None, "msgs_per_s": result.msgs_per_s, "p50_us": None,
            "p99_us": None, "errors": 0, "received": result.received, "lost": result.lost, "duplicates": 0,
            "confirmed": result.confirmed, "saturated_p50_us": result.p50_us}


# ------------------------------------------------------------------ report

def _rate(count: float, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def _per(cpu_seconds: float, messages: int) -> float | None:
    return round(cpu_seconds * 1e6 / messages, 1) if messages else None


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="HTTP gateway beside the native client and NATS (medians; min–max over rounds)")
    for column in ("path", "clients", "msgs/s", "p50 µs", "p99 µs", "gateway CPU µs/msg", "lost", "dup", "errors"):
        out.add_column(column, justify="left" if column == "path" else "right")
    for r in rows:
        out.add_row(r["path"], str(r["clients"]), _spread(r, "msgs_per_s"), _num(r["p50_us"]), _num(r["p99_us"]),
                    _num(r.get("gateway_cpu_us_per_msg")), str(r["lost"]), str(r["duplicates"]), str(r["errors"]))
    return out


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _spread(r: dict[str, Any], key: str) -> str:
    text, span = _num(r[key]), r.get(f"{key}_range")
    if span and r["rounds"] > 1:
        text += f" ({_num(span[0])}–{_num(span[1])})"
    return text


# ------------------------------------------------------------------ one invocation

def measure(base: Path, settings: Settings) -> list[dict[str, Any]]:
    """Every phase `settings.repeat` times, round after round, on one cluster and one gateway."""
    from roq.config import config_from_json
    from roq.tools.bench_cli import ensure_queue
    console.print("starting a local cluster, roq-web and nats-server")
    with roq_cluster(servers.scratch(base, "roq")) as native, \
            gateway(native["config"], servers.scratch(base, "web")) as (url, pid), \
            servers.nats(servers.scratch(base, "nats")) as nats_settings:
        config = config_from_json(native["config"])
        for queue in (PUBLISH_QUEUE, STREAM_QUEUE):
            ensure_queue(config, queue, 1)
        console.print(f"roq-web at {url} (pid {pid})")
        run_ = Run(config, url, CpuMeter(pid), settings.size, settings.seconds, settings.max_requests)
        rows: list[dict[str, Any]] = []
        for round_no in range(settings.repeat):
            run_.round = round_no
            console.print(f"[bold]round {round_no + 1} of {settings.repeat}[/] (load {os.getloadavg()[0]:.2f})")
            rows += [dict(row, round=round_no, load1=round(os.getloadavg()[0], 2))
                     for row in one_round(run_, settings, native, nats_settings)]
    return rows


def one_round(run_: Run, settings: Settings, native: dict[str, Any],
              nats_settings: dict[str, Any]) -> list[dict[str, Any]]:
    deliveries = Deliveries(run_.config, PUBLISH_QUEUE)
    try:
        rows = [http_publish_row(run_, deliveries, n, 0) for n in settings.clients]
        rows += [http_publish_row(run_, deliveries, 1, n) for n in settings.lines]
        rows.append(native_confirmed_row(run_, deliveries))
    finally:
        deliveries.close()
    rows.append(sse_backlog_row(run_, settings.sse_messages))
    rows.append(sse_live_row(run_, settings.sse_messages))
    rows.append(nats_round_trip_row(nats_settings["url"], run_.size, run_.seconds, run_.max_requests))
    for system in ("roq", "roq-batch"):
        rows.append(throughput_row(system, native, run_.size, settings.native_messages))
    rows.append(throughput_row("nats", nats_settings, run_.size, settings.native_messages))
    return rows


@dataclass(frozen=True)
class Settings:
    seconds: float
    size: int
    clients: list[int]
    lines: list[int]
    sse_messages: int
    native_messages: int
    max_requests: int
    repeat: int


MEDIAN_FIELDS = ("msgs_per_s", "requests_per_s", "p50_us", "p99_us", "gateway_cpu_us_per_msg",
                 "client_cpu_us_per_msg", "msgs_per_s_with_open", "first_event_s", "mean_id_chars",
                 "wire_bytes_per_msg")
SUMMED_FIELDS = ("messages", "requests", "received", "lost", "duplicates", "unexpected", "errors", "ids",
                 "bad_payloads")


def summarise(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per path: medians over the rounds with their spread (min, max); counts summed,
    so one lost message in any round shows."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rounds:
        groups.setdefault(r["name"], []).append(r)
    summary = []
    for name, group in groups.items():
        out = {"name": name, "path": group[0]["path"], "clients": group[0]["clients"],
               "per_request": group[0]["per_request"], "rounds": len(group)}
        for key in SUMMED_FIELDS:
            out[key] = sum(r.get(key) or 0 for r in group)
        out.update(medians(group, MEDIAN_FIELDS))
        summary.append(out)
    return summary


@click.command()
@click.option("--seconds", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="each timed phase (HTTP publishing, one-at-a-time native and NATS)")
@click.option("--size", type=click.IntRange(32, 1 << 20), default=100, show_default=True, help="message bytes")
@click.option("--clients", default="1,8", show_default=True, help="concurrent HTTP publishers, one message each")
@click.option("--lines", default="100,1000", show_default=True, help="messages per ?split=lines request")
@click.option("--sse-messages", type=click.IntRange(10), default=20_000, show_default=True,
              help="messages each SSE stream reads")
@click.option("--native-messages", type=click.IntRange(100), default=200_000, show_default=True,
              help="messages in each 1 → 1 throughput run")
@click.option("--max-requests", type=click.IntRange(1), default=MAX_REQUESTS, show_default=True,
              help="per client and phase, beside --seconds")
@click.option("--repeat", type=click.IntRange(1, 20), default=1, show_default=True,
              help="rounds of every phase; medians and spread are reported")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write the results here")
def main(seconds: float, size: int, clients: str, lines: str, sse_messages: int, native_messages: int,
         max_requests: int, repeat: int, json_path: str | None) -> None:
    """Measure the HTTP gateway next to RoQ's native client and NATS."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds: every process started here stops
    servers.ensure_installed(["nats"])
    started = time.time()
    stalls = machine.stalls(min(2.0, seconds))  # before anything of ours runs
    load_before = os.getloadavg()
    settings = Settings(seconds, size, _ints(clients), _ints(lines), sse_messages, native_messages, max_requests,
                        repeat)
    with tempfile.TemporaryDirectory(prefix="roq-bench-http-") as tmp:
        rounds = measure(Path(tmp), settings)
    rows = summarise(rounds)
    console.print(table(rows))
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
              "run_seconds": round(time.time() - started, 1),
              "machine": {"cpus": stalls["cpus"], "python": platform.python_version(),
                          "platform": platform.platform(), "stalls": stalls, "uvicorn": uvicorn_stack(),
                          "load_before": [round(x, 2) for x in load_before],
                          "load_after": [round(x, 2) for x in os.getloadavg()]},
              "settings": asdict(settings), "results": rows, "rounds": rounds}
    console.print(f"run time {report['run_seconds']} s")
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {json_path}")
    if any(r["lost"] or r["duplicates"] or r.get("unexpected") or r["errors"] for r in rows):
        console.print("[red]some path lost, repeated or refused messages in this run[/]")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    main()
