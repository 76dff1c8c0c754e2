"""Publisher: thread-safe `publish()`, adaptive batching, confirms, backpressure, failover.

`publish()` only appends to the unconfirmed log and wakes the I/O thread,
which owns the ZeroMQ socket. Batching needs no timer: while batches are in
flight, new messages accumulate and leave together in the next batch; an idle
publisher's lone message leaves at once. Every message has a sequence number;
the exchange acks cumulatively and confirmed messages leave the log.

When more than `client.max_unconfirmed` messages wait, `publish()` blocks, and
raises BackpressureError after `client.publish_timeout` — nothing is dropped.
When the exchange asks us to move, disappears from ZooKeeper, or confirms
nothing for `client.confirm_timeout`, we connect to another exchange of the
queue (least loaded first) and resend every unconfirmed message, preceded by
the replay window: the messages confirmed in the last `client.replay_seconds`
(at most `client.replay_bytes`), which a dying exchange may have confirmed
without its subscribers getting them. Exchanges and subscribers drop what they
already had, by sequence number, so the application sees each message once.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections import deque
from typing import Any

import zmq
from kazoo.client import KazooClient

from roq import protocol
from roq.client.topology import QueueTopology
from roq.config import Config
from roq.errors import (BackpressureError, MessageTooLargeError, ProtocolError, RequestTimeoutError,
                        RoqError)
from roq.names import check_topic
from roq.paths import Paths
from roq.zk import start_client, stop_client

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 2  # batches sent but not yet acked; 2 overlaps one round trip
TOPIC_CACHE = 10_000


class Publisher:
    def __init__(self, queue: str, config: Config, zk: KazooClient | None = None,
                 publisher_id: str | None = None, prefer: str | None = None) -> None:
        """`prefer` names an exchange id to use while it runs (default: least loaded)."""
        self.config = config
        self.prefer = prefer
        self.queue = queue
        self.id = publisher_id or f"p-{uuid.uuid4().hex[:12]}"
        self._own_zk = zk is None
        self.zk = zk or start_client(config)
        # A plain lock (not re-entrant): publish() takes it directly, the fastest way to hold it.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._log: deque[tuple[int, bytes, bytes]] = deque()  # unconfirmed: (seq, topic, payload)
        self._replay: deque[tuple[float, int, bytes, bytes]] = deque()  # confirmed: (time, seq, topic, payload)
        self._replay_size = 0
        self._resend: list[tuple[int, bytes, bytes]] = []  # replay window, queued for the new exchange
        self._next_seq = 1
        self._topics: dict[str | bytes, bytes] = {}  # validated topics, so publish() checks each once
        self._max_message = config.exchange.max_message_bytes
        self._max_unconfirmed = config.client.max_unconfirmed
        self._sent_upto = 0  # highest seq sent to the current exchange
        self._acked = 0
        self._in_flight: deque[int] = deque()  # last seq of each batch in flight
        self._closed = False
        self._move_reason: str | None = None
        self.exchange: str | None = None  # id of the exchange we publish to
        self.subscriptions = 0  # as last reported by our exchange
        self.moves = 0
        self.replayed = 0  # confirmed messages resent after moves
        self.rejected: list[tuple[int, str, str]] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        try:
            self.topology = QueueTopology(self.zk, Paths(config.zk.root), queue, self._topology_changed)
        except Exception:
            self._close_fds()
            if self._own_zk:
                stop_client(self.zk)
            raise
        self._thread = threading.Thread(target=self._run, name=f"publisher-{self.id}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ API

    def publish(self, topic: str | bytes, payload: bytes, timeout: float | None = None) -> int:
        """Queue one message; returns its sequence number. Blocks under backpressure."""
        try:
            checked = self._topics.get(topic)
        except TypeError:  # unhashable: check_topic explains
            checked = None
        if checked is None:
            checked = self._remember_topic(topic)
        if type(payload) is not bytes:
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise TypeError("payload must be bytes")
            payload = bytes(payload)
        if len(payload) > self._max_message:
            raise MessageTooLargeError(f"payload of {len(payload)} bytes exceeds "
                                       f"exchange.max_message_bytes={self._max_message}")
        limit = self._max_unconfirmed
        topic = checked
        with self._lock:
            if self._closed:
                raise RoqError("publisher is closed")
            if len(self._log) >= limit:
                wait = self.config.client.publish_timeout if timeout is None else timeout
                if not self._cond.wait_for(lambda: len(self._log) < limit or self._closed, wait):
                    raise BackpressureError(f"{len(self._log)} messages unconfirmed for {wait:.1f}s; "
                                            "is the queue's exchange reachable?")
            seq = self._next_seq
            self._next_seq += 1
            self._log.append((seq, topic, payload))
        if not self._wake_pending:  # one wake-up per batch, not one system call per message
            self._wake_pending = True
            self._wake()
        return seq

    def _remember_topic(self, topic: str | bytes) -> bytes:
        checked = check_topic(topic)
        if len(self._topics) >= TOPIC_CACHE:
            self._topics.clear()
        self._topics[topic] = checked
        return checked

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every message published so far is confirmed."""
        with self._cond:
            target = self._next_seq - 1
            if not self._cond.wait_for(lambda: self._acked >= target, timeout):
                raise RequestTimeoutError(f"{target - self._acked} messages still unconfirmed after {timeout:.1f}s")

    def wait_for_subscribers(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until our exchange reports `count` subscriptions (the XPUB handshake)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.subscriptions < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RequestTimeoutError(f"exchange reports {self.subscriptions} subscriptions, "
                                              f"wanted {count}, after {timeout:.1f}s")
                self._want_hello = True
                self._wake()
                self._cond.wait(min(remaining, 0.05))

    @property
    def unconfirmed(self) -> int:
        with self._cond:
            return len(self._log)

    @property
    def confirmed(self) -> int:
        return self._acked

    def close(self, timeout: float = 10.0) -> None:
        """Flush (up to `timeout`), say goodbye, stop the I/O thread."""
        try:
            if not self._closed and timeout > 0:
                self.flush(timeout)
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._wake()
            self._thread.join(timeout=5)
            self._close_fds()
            if self._own_zk:
                stop_client(self.zk)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ I/O thread

    _want_hello = False
    # Set by publish() when it wakes the I/O thread; cleared by the I/O thread when it can take
    # more messages, so while batches are in flight publish() costs no system call.
    _wake_pending = False

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # already awake, or closing

    def _close_fds(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _topology_changed(self) -> None:
        live = self.topology.snapshot()
        if self.exchange is not None and self.exchange not in live:
            self._move_reason = f"exchange {self.exchange} disappeared"
        self._wake()

    def _run(self) -> None:
        context = zmq.Context()
        sock: zmq.Socket | None = None
        poller = zmq.Poller()  # one for the thread's life; the socket is swapped in and out
        poller.register(self._wake_r, zmq.POLLIN)
        last_ack_time = time.monotonic()
        try:
            while not self._closed:
                if self._move_reason and sock is not None:
                    log.info("publisher %s moving: %s", self.id, self._move_reason)
                    poller.unregister(sock)
                    sock.close(linger=0)
                    sock, self.exchange = None, None
                    self.moves += 1
                self._move_reason = None
                if sock is None:
                    sock = self._connect(context)
                    last_ack_time = time.monotonic()
                    if sock is None:
                        self._idle(poller, 100)
                        continue
                    poller.register(sock, zmq.POLLIN)
                self._send_batches(sock)
                if len(self._in_flight) < MAX_IN_FLIGHT:
                    self._wake_pending = False  # from here on publish() must wake us ...
                    self._send_batches(sock)  # ... and what came before is taken now
                if self._want_hello:
                    self._want_hello = False
                    sock.send(protocol.encode_hello(self.id))
                self._idle(poller, 100)
                while sock.poll(0):
                    self._handle_reply(sock.recv())
                    last_ack_time = time.monotonic()
                if self._in_flight and time.monotonic() - last_ack_time > self.config.client.confirm_timeout:
                    self._move_reason = f"no confirm from {self.exchange} for {self.config.client.confirm_timeout:.1f}s"
            if sock is not None:
                sock.send(protocol.encode_bye(self.id), zmq.NOBLOCK)
        finally:
            if sock is not None:
                sock.close(linger=100)
            context.term()

    def _idle(self, poller: zmq.Poller, timeout_ms: int) -> None:
        """Wait for a reply, a wake-up from publish(), or the timeout."""
        if dict(poller.poll(timeout_ms)).get(self._wake_r):
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass

    def _connect(self, context: zmq.Context) -> zmq.Socket | None:
        choice = self._choose_exchange()
        if choice is None:
            return None
        xid, endpoint = choice
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(endpoint)
        sock.send(protocol.encode_hello(self.id))
        with self._cond:
            self.exchange = xid
            self._sent_upto = self._acked  # resend everything unconfirmed
            self._in_flight.clear()
            if self.moves:
                self._trim_replay(time.monotonic())
                self._resend = [(seq, topic, payload) for _, seq, topic, payload in self._replay]
                self.replayed += len(self._resend)
        log.info("publisher %s publishing to %s/%s at %s", self.id, self.queue, xid, endpoint)
        return sock

    def _choose_exchange(self) -> tuple[str, str] | None:
        live = self.topology.snapshot()
        if not live:
            return None
        if self.prefer in live:
            return self.prefer, live[self.prefer]["pub"]

        def load(item: tuple[str, dict[str, Any]]) -> tuple[float, float]:
            stats = item[1].get("stats") or {}
            return (stats.get("publishers", 0), random.random())

        xid, data = min(live.items(), key=load)
        return xid, data["pub"]

    def _send_batches(self, sock: zmq.Socket) -> None:
        # The replay window goes first; its seqs are consecutive and end where the log starts.
        resend, self._resend = self._resend, []
        start = 0
        while start < len(resend):
            flat: list[bytes] = []
            size, end = 0, start
            while end < len(resend) and end - start < self.config.client.max_batch \
                    and size < self.config.client.max_batch_bytes:
                _, topic, payload = resend[end]
                flat += (topic, payload)
                size += len(topic) + len(payload)
                end += 1
            sock.send(protocol.encode_batch(self.id, resend[start][0], time.time_ns(), flat))
            start = end
        while len(self._in_flight) < MAX_IN_FLIGHT:
            with self._cond:
                start = self._sent_upto - self._acked  # index in the log of the first unsent
                if start >= len(self._log):
                    return
                flat: list[bytes] = []
                size = 0
                end = min(len(self._log), start + self.config.client.max_batch)
                first_seq = self._log[start][0]
                for i in range(start, end):
                    _, topic, payload = self._log[i]
                    flat.append(topic)
                    flat.append(payload)
                    size += len(payload) + len(topic)
                    if size >= self.config.client.max_batch_bytes:
                        end = i + 1
                        break
                last_seq = first_seq + (end - start) - 1
                self._sent_upto = last_seq
                self._in_flight.append(last_seq)
            sock.send(protocol.encode_batch(self.id, first_seq, time.time_ns(), flat))

    def _trim_replay(self, now: float) -> None:
        """Keep the replay window within its age and byte limits (caller holds the lock)."""
        horizon = now - self.config.client.replay_seconds
        limit = self.config.client.replay_bytes
        while self._replay and (self._replay[0][0] < horizon or self._replay_size > limit):
            _, _, topic, payload = self._replay.popleft()
            self._replay_size -= len(payload) + len(topic)

    def _handle_reply(self, frame: bytes) -> None:
        try:
            msg = protocol.decode_exchange_reply(frame)
        except ProtocolError as err:
            log.warning("publisher %s: bad reply from exchange: %s", self.id, err)
            return
        kind = msg[0]
        if kind == protocol.ACK and len(msg) >= 3:
            self._on_ack(int(msg[2]), msg[3] if len(msg) > 3 else None)
        elif kind == protocol.WELCOME and len(msg) >= 4:
            self._on_ack(int(msg[3]), msg[4] if len(msg) > 4 else None)
        elif kind == protocol.REJECT:
            self.rejected.append((msg[2], msg[3], msg[4]))
            log.error("publisher %s: message %s rejected: %s", self.id, msg[2], msg[4])
        elif kind == protocol.MOVE:
            self._move_reason = f"exchange asked: {msg[2] if len(msg) > 2 else 'move'}"
        elif kind == protocol.ERROR:
            log.error("publisher %s: exchange refused a frame: %s", self.id, msg[3:])

    def _on_ack(self, seq: int, subscriptions: Any) -> None:
        with self._cond:
            if isinstance(subscriptions, int):
                self.subscriptions = subscriptions
            if seq > self._acked:
                # A fresh exchange says 0 (or an old position): only ever move forward.
                seq = min(seq, self._next_seq - 1)
                now = time.monotonic()
                keep = self.config.client.replay_seconds > 0
                while self._log and self._log[0][0] <= seq:
                    confirmed_seq, topic, payload = self._log.popleft()
                    if keep:
                        self._replay.append((now, confirmed_seq, topic, payload))
                        self._replay_size += len(payload) + len(topic)
                self._trim_replay(now)
                self._acked = seq
                self._sent_upto = max(self._sent_upto, seq)
            while self._in_flight and self._in_flight[0] <= self._acked:
                self._in_flight.popleft()
            self._cond.notify_all()
