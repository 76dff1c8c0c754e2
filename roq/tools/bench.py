"""Benchmarks: throughput and latency, measured by real clients in their own processes.

The harness runs S subscriber processes and P publisher processes of one
*system* (RoQ here; raw ZeroMQ, NATS, Redis and RabbitMQ in `bench/peers.py`)
through a small adapter interface, so every system is measured the same way:

* Each payload starts with a kind byte and its send time (CLOCK_MONOTONIC,
  shared by every process on the machine); subscribers measure the end-to-end
  latency of every message they get.
* Publishers send warm-up messages until every subscriber has seen one and
  every publisher is connected (no slow-joiner losses, no sleeps, several
  publishers start together), then the measured messages, as fast as they
  can (`rate=0`) or paced at `rate` messages per second in total.
* Throughput is deliveries per second per subscriber, from the first measured
  send to the last delivery; latency percentiles are the worst subscriber's.

`roq bench` (roq/cli/bench.py) runs it against a running cluster; `bench/compare.py`
runs every system in one invocation.
"""

from __future__ import annotations

import importlib
import itertools
import multiprocessing as mp
import struct
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from roq.interrupts import ctrl_c_held, ignore_ctrl_c, raise_if_interrupted

HEADER = struct.Struct("<Bq")  # kind, send time in monotonic nanoseconds
WARMUP, DATA = 0, 1
WARMUP_INTERVAL = 0.005
IDLE_END = 3.0  # a subscriber gives up this long after its last message (a system that dropped some)
PROGRESS_EVERY = 1024
WORKER_STOP_WAIT = 5.0  # s the workers have to exit after SIGTERM (Ctrl-C, a failure) before SIGKILL


# ---------------------------------------------------------------- adapters


def topic_count(settings: dict[str, Any]) -> int:
    """settings["topics"] = N: publishers spread messages round-robin over N topics and subscribers
    take them all by prefix (the topics curve of bench/curves.py); 1, the default, is one topic."""
    return int(settings.get("topics", 1))


def topic_names(count: int, separator: str = "/") -> list[str]:
    """The `count` topics of a run with several: "bench/00000", "bench/00001", ...; one width, so a
    system that carries the topic in front of the payload (raw ZeroMQ) strips it by length."""
    return [f"bench{separator}{i:05d}" for i in range(count)]


def pace(count: int, rate: float, send: Callable[[int], None]) -> None:
    """Call send(n) until `count` messages went out at `rate` per second: n is what fell due
    since the last call (1 when the sender keeps up)."""
    start, sent = time.monotonic(), 0
    while sent < count:
        due = min(count, int((time.monotonic() - start) * rate) + 1)
        if due <= sent:
            time.sleep(min(0.0002, (sent + 1 - due) / rate))
            continue
        send(due - sent)
        sent = due


class Adapter:
    """How one system publishes and subscribes. Subclasses live at module level (spawned by name)."""

    name = "?"

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def subscribe(self, on_payload: Callable[[bytes], None]) -> None:
        """Start receiving; call on_payload(payload) for each message, from any thread."""
        raise NotImplementedError

    def open_publisher(self) -> None:
        raise NotImplementedError

    def publish(self, payload: bytes) -> None:
        raise NotImplementedError

    def drain(self) -> int:
        """Push out what is buffered; return the number of confirmed messages, or -1."""
        return -1

    def send_all(self, make_payload: Callable[[], bytes], count: int, rate: float) -> None:
        """Publish `count` messages, as fast as possible (rate 0) or paced. Adapters whose
        client is asynchronous or batches explicitly override this."""
        publish = self.publish

        def send(n: int) -> None:
            for _ in range(n):
                publish(make_payload())

        if rate <= 0:
            send(count)
        else:
            pace(count, rate, send)

    def close(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}


class BatchAdapter(Adapter):
    """A system used through its batch API: lists of payloads in, lists of payloads out.
    The harness then builds payloads a list at a time, as an application with a batch API would."""

    BATCH = 1000  # messages per publish_many call when unpaced

    def subscribe_batches(self, on_payloads: Callable[[list[bytes]], None]) -> None:
        """Start receiving; call on_payloads(payloads) for each batch, from any thread."""
        raise NotImplementedError

    def publish_many(self, payloads: list[bytes]) -> None:
        raise NotImplementedError

    def send_batches(self, make_batch: Callable[[int], list[bytes]], count: int, rate: float) -> None:
        """Publish `count` messages in lists: of BATCH when unpaced, of whatever is due when paced."""
        publish_many = self.publish_many
        if rate <= 0:
            for start in range(0, count, self.BATCH):
                publish_many(make_batch(min(self.BATCH, count - start)))
        else:
            pace(count, rate, lambda n: publish_many(make_batch(n)))


class RoqAdapter(Adapter):
    """RoQ through `roq.client`: settings = {"config": <config json>, "queue": name}, optionally
    "topics": N (topic_count)."""

    name = "roq"

    def _config(self) -> Any:
        from roq.config import config_from_json
        return config_from_json(self.settings["config"])

    def _subscribed(self) -> list[str]:
        """One topic, "bench", or the prefix of the many: "bench/"."""
        return ["bench/"] if topic_count(self.settings) > 1 else ["bench"]

    def subscribe(self, on_payload: Callable[[bytes], None]) -> None:
        from roq.client.subscriber import Subscriber
        self.sub = Subscriber(self.settings["queue"], self._config(), topics=self._subscribed(),
                              callback=lambda msg: on_payload(msg.payload))
        self.sub.wait_connected(timeout=30)

    def open_publisher(self) -> None:
        from roq.client.publisher import Publisher
        self.pub = Publisher(self.settings["queue"], self._config())
        self._publish = self.pub.publish
        if topic_count(self.settings) > 1:
            self._spread_over_topics(topic_names(topic_count(self.settings)))

    def _spread_over_topics(self, topics: list[str]) -> None:
        """Replace publish() (an instance attribute wins over the method) by one that takes the
        topics in turn; the one-topic path above keeps its method untouched."""
        publish, turn = self.pub.publish, itertools.cycle(topics)
        self.publish = lambda payload: publish(next(turn), payload)

    def publish(self, payload: bytes) -> None:
        self._publish("bench", payload)

    def drain(self) -> int:
        self.pub.flush(60)
        return self.pub.confirmed

    def close(self) -> None:
        for client in (getattr(self, "sub", None), getattr(self, "pub", None)):
            if client is not None:
                client.close()

    def stats(self) -> dict[str, Any]:
        sub = getattr(self, "sub", None)
        return sub.stats().as_dict() if sub is not None else {}


class RoqBatchAdapter(RoqAdapter, BatchAdapter):
    """RoQ through its batch API: `Publisher.publish_many` and `Subscriber(batch_callback=...)`."""

    name = "roq-batch"

    def subscribe_batches(self, on_payloads: Callable[[list[bytes]], None]) -> None:
        from roq.client.subscriber import Subscriber
        self.sub = Subscriber(self.settings["queue"], self._config(), topics=self._subscribed(),
                              batch_callback=lambda batch: on_payloads(batch.payloads))
        self.sub.wait_connected(timeout=30)

    def _spread_over_topics(self, topics: list[str]) -> None:
        """Over N topics, message j of the run goes to topic j mod N, as with publish(): each list
        goes in one publish_many() call with each payload's own topic, and a frame of many topics
        reaches the batch callback as one MessageBatch (its `topics` say whose each message is)."""
        super()._spread_over_topics(topics)
        publish_many, count, state = self.pub.publish_many, len(topics), {"next": 0}

        def spread(payloads: list[bytes]) -> None:
            start = state["next"]
            publish_many([topics[(start + i) % count] for i in range(len(payloads))], payloads)
            state["next"] = (start + len(payloads)) % count

        self.publish_many = spread

    def publish_many(self, payloads: list[bytes]) -> None:
        self.pub.publish_many("bench", payloads)


# ---------------------------------------------------------------- results


@dataclass
class SubscriberResult:
    received: int = 0
    first_ns: int = 0  # send time of the first measured message received
    last_ns: int = 0  # arrival time of the last one
    p50_us: float = 0.0
    p99_us: float = 0.0
    p999_us: float = 0.0
    max_us: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunResult:
    system: str
    size: int
    messages: int  # per publisher × publishers
    publishers: int
    subscribers: int
    rate: float  # requested total rate; 0 = as fast as possible
    sent: int
    confirmed: int  # -1 when the system has no confirms
    received: int  # summed over subscribers
    msgs_per_s: float  # deliveries per second per subscriber (mean)
    mb_per_s: float
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    lost: int  # expected deliveries that never came

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(ordered: list[int] | array, fraction: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] / 1000.0


# ---------------------------------------------------------------- workers


def _adapter_class(adapter_path: str) -> type[Adapter]:
    module, _, name = adapter_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _load(adapter_path: str, settings: dict[str, Any]) -> Adapter:
    return _adapter_class(adapter_path)(settings)


def subscriber_worker(adapter_path: str, settings: dict[str, Any], expected: int, ready: Any,
                      progress: Any, results: Any) -> None:
    ignore_ctrl_c()  # run() started it with SIGINT blocked: the parent stops it on Ctrl-C
    adapter = _load(adapter_path, settings)
    latencies = array("q")
    state = {"received": 0, "first": 0, "last": 0, "warm": False}  # written by the receiving thread only
    done = threading.Event()
    now = time.monotonic_ns
    unpack = HEADER.unpack_from

    def on_payload(payload: bytes) -> None:
        kind, sent = unpack(payload)
        if kind != DATA:
            if not state["warm"]:
                state["warm"] = True
                ready.set()
            return
        arrived = now()
        latencies.append(arrived - sent)
        if not state["first"]:
            state["first"] = sent
        state["last"] = arrived
        count = state["received"] = state["received"] + 1
        if count % PROGRESS_EVERY == 0 or count == expected:
            progress.value = count
            if count >= expected:
                done.set()

    def on_payloads(payloads: list[bytes]) -> None:
        """The same as on_payload for a list, in comprehensions rather than a call per message;
        one arrival time per list (its messages arrived together)."""
        arrived = now()
        stamps = list(map(unpack, payloads))
        sent = [stamp for kind, stamp in stamps if kind == DATA]
        if len(sent) != len(stamps) and not state["warm"]:
            state["warm"] = True
            ready.set()
        if not sent:
            return
        latencies.extend([arrived - stamp for stamp in sent])
        if not state["first"]:
            state["first"] = sent[0]
        state["last"] = arrived
        before = state["received"]
        count = state["received"] = before + len(sent)
        if count // PROGRESS_EVERY != before // PROGRESS_EVERY or count >= expected:
            progress.value = count
            if count >= expected:
                done.set()

    extra: dict[str, Any] = {}
    try:
        if isinstance(adapter, BatchAdapter):
            adapter.subscribe_batches(on_payloads)
        else:
            adapter.subscribe(on_payload)
        last_seen, last_count = time.monotonic(), -1
        while not done.wait(0.1):
            if state["received"] != last_count:
                last_seen, last_count = time.monotonic(), state["received"]
            elif state["warm"] and last_count > 0 and time.monotonic() - last_seen > IDLE_END:
                break
        extra = adapter.stats()
    finally:
        adapter.close()  # no more callbacks after this
        ordered = sorted(latencies)
        result = SubscriberResult(state["received"], state["first"], state["last"],
                                  percentile(ordered, 0.50), percentile(ordered, 0.99),
                                  percentile(ordered, 0.999), percentile(ordered, 1.0), extra)
        progress.value = state["received"]
        results.put(("sub", asdict(result)))


def publisher_worker(adapter_path: str, settings: dict[str, Any], size: int, count: int, rate: float,
                     go: Any, results: Any, opened: Any) -> None:
    ignore_ctrl_c()  # as subscriber_worker
    adapter = _load(adapter_path, settings)
    pad = b"x" * max(0, size - HEADER.size)
    pack = HEADER.pack
    now = time.monotonic_ns
    publish = None
    sent, confirmed, warmups = 0, -1, 0
    try:
        adapter.open_publisher()
        opened.set()  # run() starts the clock once every publisher is connected
        publish = adapter.publish
        while not go.is_set():
            publish(pack(WARMUP, now()) + pad)
            warmups += 1
            adapter.drain()
            go.wait(WARMUP_INTERVAL)
        if isinstance(adapter, BatchAdapter):
            adapter.send_batches(lambda n: [pack(DATA, now()) + pad for _ in range(n)], count, rate)
        else:
            adapter.send_all(lambda: pack(DATA, now()) + pad, count, rate)
        sent = count
        confirmed = adapter.drain()
        confirmed = confirmed - warmups if confirmed >= 0 else -1
    finally:
        adapter.close()
        results.put(("pub", {"sent": sent, "confirmed": confirmed}))


# ---------------------------------------------------------------- orchestration


def run(adapter_path: str, settings: dict[str, Any], size: int, messages: int, publishers: int = 1,
        subscribers: int = 1, rate: float = 0.0, on_progress: Callable[[int, int], None] | None = None,
        timeout: float = 300.0, publisher_settings: list[dict[str, Any]] | None = None) -> RunResult:
    """One measured run. `messages` per publisher; every subscriber expects all of them."""
    if size < HEADER.size:
        raise ValueError(f"messages must be at least {HEADER.size} bytes (the timestamp header)")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    go = ctx.Event()
    expected = messages * publishers
    readies = [ctx.Event() for _ in range(subscribers)]
    # Each publisher says when it is connected: the measured messages start once all are, so a
    # publisher process that starts late does not stretch a run of several (fan-in).
    opened = [ctx.Event() for _ in range(publishers)]
    counters = [ctx.Value("q", 0, lock=False) for _ in range(subscribers)]
    name = getattr(_adapter_class(adapter_path), "name", adapter_path)
    procs = [ctx.Process(target=subscriber_worker, args=(adapter_path, settings, expected, readies[i],
                                                         counters[i], results), daemon=True)
             for i in range(subscribers)]
    per_pub_rate = rate / publishers if rate else 0.0
    pub_settings = publisher_settings or [settings] * publishers
    procs += [ctx.Process(target=publisher_worker, args=(adapter_path, pub_settings[i], size, messages,
                                                         per_pub_rate, go, results, opened[i]), daemon=True)
              for i in range(publishers)]
    deadline = time.monotonic() + timeout
    finished = False
    try:
        _start_workers(procs)
        while not all(event.is_set() for event in readies + opened):
            raise_if_interrupted()
            if any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError(f"{name}: a worker process failed before the start")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: a subscriber saw no warm-up message, or a publisher did not connect")
            readies[0].wait(0.05)
        go.set()
        pubs: list[dict[str, Any]] = []
        subs: list[dict[str, Any]] = []
        while len(pubs) + len(subs) < len(procs):
            raise_if_interrupted()
            if on_progress:
                on_progress(sum(c.value for c in counters), expected * subscribers)
            try:
                kind, value = results.get(timeout=0.1)
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: no result after {timeout:.0f}s") from None
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"{name}: a worker process failed") from None
                continue
            (pubs if kind == "pub" else subs).append(value)
        finished = True
    finally:
        _stop_workers(procs, terminate=not finished)  # Ctrl-C or a failure: nothing left to wait for
    return _summarise(name, size, messages, publishers, subscribers, rate, pubs, subs)


def _start_workers(procs: list[Any]) -> None:
    """Start the workers so that only this process acts on a Ctrl-C (a terminal's reaches the whole
    process group): they are born with SIGINT blocked and ignore it (ignore_ctrl_c), and one that comes
    meanwhile is raised here once all have started, so every one of them is stopped."""
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()  # not from within the block: starting it unblocks SIGINT
    with ctrl_c_held(block_in_children=True):
        for proc in procs:
            proc.start()


def _stop_workers(procs: list[Any], terminate: bool) -> None:
    """Wait for the workers that were started; with `terminate`, SIGTERM them first and give them
    WORKER_STOP_WAIT in all (else 10 s, to exit once they sent their results), then SIGKILL the rest."""
    started = [proc for proc in procs if proc.pid is not None]
    if terminate:
        for proc in started:
            proc.terminate()
    deadline = time.monotonic() + (WORKER_STOP_WAIT if terminate else 10.0)
    for proc in started:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in started:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=1.0)


def _summarise(name: str, size: int, messages: int, publishers: int, subscribers: int, rate: float,
               pubs: list[dict[str, Any]], subs: list[dict[str, Any]]) -> RunResult:
    expected = messages * publishers
    rates = []
    for sub in subs:
        elapsed = (sub["last_ns"] - sub["first_ns"]) / 1e9
        rates.append(sub["received"] / elapsed if elapsed > 0 else 0.0)
    mean_rate = sum(rates) / len(rates) if rates else 0.0
    confirmed = [p["confirmed"] for p in pubs]
    return RunResult(
        system=name, size=size, messages=expected, publishers=publishers, subscribers=subscribers, rate=rate,
        sent=sum(p["sent"] for p in pubs),
        confirmed=-1 if any(c < 0 for c in confirmed) else sum(confirmed),
        received=sum(s["received"] for s in subs),
        msgs_per_s=round(mean_rate, 1), mb_per_s=round(mean_rate * size / 1e6, 2),
        p50_us=max((s["p50_us"] for s in subs), default=0.0),
        p99_us=max((s["p99_us"] for s in subs), default=0.0),
        p999_us=max((s["p999_us"] for s in subs), default=0.0),
        max_us=max((s["max_us"] for s in subs), default=0.0),
        lost=max(0, expected * subscribers - sum(s["received"] for s in subs)),
    )
