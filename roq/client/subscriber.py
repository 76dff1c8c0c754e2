"""Subscriber: receives every message of its topics from all exchanges of a queue.

One SUB socket, owned by the I/O thread, is connected to every running
exchange; ZooKeeper watches add new exchanges and drop removed ones while it
runs. Topic filtering is by prefix, inside libzmq. Each publisher's sequence
numbers are tracked so a replayed message (after a publisher moved) reaches
the application once; `duplicates` counts what was dropped.

Iterator style: `for msg in sub` / `sub.receive(timeout)`. Callback style:
`Subscriber(..., callback=fn)`; `fn` runs on the I/O thread, keep it short.
The hand-off queue is bounded: a slow application slows the socket, and the
exchange's high-water mark (not this process's memory) absorbs the rest.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import zmq
from kazoo.client import KazooClient

from roq import protocol
from roq.client.topology import QueueTopology
from roq.config import Config
from roq.errors import ProtocolError
from roq.names import check_topic
from roq.paths import Paths
from roq.zk import start_client, stop_client

log = logging.getLogger(__name__)

HANDOFF_LIMIT = 100_000  # messages buffered between the I/O thread and the application


@dataclass(frozen=True)
class Message:
    topic: bytes
    payload: bytes
    publisher: str
    seq: int
    exchange: str
    sent_ns: int


class Subscriber:
    def __init__(self, queue: str, config: Config, topics: Iterable[str | bytes] = (),
                 zk: KazooClient | None = None, callback: Callable[[Message], None] | None = None) -> None:
        self.config = config
        self.queue = queue
        self.topics = [check_topic(t) for t in topics] or [b""]
        self.callback = callback
        self._own_zk = zk is None
        self.zk = zk or start_client(config)
        self._inbox: queue_module.Queue[Message] = queue_module.Queue(HANDOFF_LIMIT)
        self._last_seq: dict[str, int] = {}  # publisher → highest seq delivered (dedup)
        self._topic_last: dict[tuple[str, bytes], int] = {}  # (publisher, topic) → last seq seen
        self.received = 0
        self.duplicates = 0
        self.gaps = 0  # deliveries of a followed topic that never arrived (dropped for slowness)
        self.connected: set[str] = set()  # exchange ids we are connected to
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        try:
            self.topology = QueueTopology(self.zk, Paths(config.zk.root), queue, self._wake)
        except Exception:
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            if self._own_zk:
                stop_client(self.zk)
            raise
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"subscriber-{queue}", daemon=True)
        self._thread.start()
        self._ready.wait(5)

    # ------------------------------------------------------------ API

    def receive(self, timeout: float | None = None) -> Message | None:
        try:
            return self._inbox.get(timeout=timeout)
        except queue_module.Empty:
            return None

    def __iter__(self) -> Iterator[Message]:
        while not self._closed:
            msg = self.receive(timeout=0.2)
            if msg is not None:
                yield msg

    def wait_connected(self, count: int | None = None, timeout: float = 10.0) -> None:
        """Wait until connected to `count` exchanges (default: all running ones)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            want = count if count is not None else len(self.topology.snapshot())
            if want and len(self.connected) >= want:
                return
            time.sleep(0.02)
        raise TimeoutError(f"connected to {sorted(self.connected)} after {timeout:.1f}s")

    def close(self) -> None:
        self._closed = True
        self._wake()
        self._thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._own_zk:
            stop_client(self.zk)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ I/O thread

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _run(self) -> None:
        context = zmq.Context()
        sock = context.socket(zmq.SUB)
        sock.linger = 0
        sock.rcvhwm = 100_000
        for topic in self.topics:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        endpoints: dict[str, str] = {}
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        seen_version = -1
        self._ready.set()
        try:
            while not self._closed:
                if self.topology.version != seen_version:
                    seen_version = self.topology.version
                    endpoints = self._follow(sock, endpoints)
                events = dict(poller.poll(200))
                if events.get(self._wake_r):
                    os.read(self._wake_r, 4096)
                if events.get(sock):
                    self._drain(sock)
        finally:
            sock.close(linger=0)
            context.term()

    def _follow(self, sock: zmq.Socket, current: dict[str, str]) -> dict[str, str]:
        wanted = {xid: data["sub"] for xid, data in self.topology.snapshot().items() if data.get("sub")}
        for xid, endpoint in current.items():
            if wanted.get(xid) != endpoint:
                try:
                    sock.disconnect(endpoint)
                except zmq.ZMQError:
                    pass
                log.info("subscriber left %s/%s", self.queue, xid)
        for xid, endpoint in wanted.items():
            if current.get(xid) != endpoint:
                sock.connect(endpoint)
                log.info("subscriber joined %s/%s at %s", self.queue, xid, endpoint)
        self.connected = set(wanted)
        return wanted

    def _drain(self, sock: zmq.Socket, budget: int = 1000) -> None:
        for _ in range(budget):
            try:
                topic, body = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:
                continue  # not two frames: not from an exchange
            try:
                delivery = protocol.decode_delivery(body)
            except ProtocolError as exc:
                log.warning("dropping an undecodable delivery: %s", exc)
                continue
            self._deliver(topic, delivery)

    def _deliver(self, topic: bytes, d: protocol.Delivery) -> None:
        publisher = d.publisher
        last = self._last_seq.get(publisher, 0)
        topic_last = self._topic_last.get((publisher, topic))
        if d.prev_seq and topic_last is not None and topic_last < d.prev_seq:
            self.gaps += 1  # frames of this topic never reached us (slow-subscriber drop)
        for seq, payload in zip(d.seqs, d.payloads):
            if seq <= last:
                self.duplicates += 1
                continue
            last = seq
            msg = Message(topic, payload, publisher, seq, d.exchange, d.sent_ns)
            self.received += 1
            if self.callback:
                self.callback(msg)
            else:
                while not self._closed:
                    try:
                        self._inbox.put(msg, timeout=0.2)
                        break
                    except queue_module.Full:
                        continue
        self._last_seq[publisher] = last
        if d.seqs:
            self._topic_last[(publisher, topic)] = max(d.seqs[-1], topic_last or 0)
