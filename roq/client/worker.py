"""A consumer group member: `Subscriber(queue, config, topics, group="workers")`.

Each message of the group's topics goes to one member of the group, which acks it when done
(docs/work-queues.md). Every exchange of the queue runs the group for its own stream, so a
member joins the group on every running exchange, through one DEALER per exchange connected to
its `work` endpoint, and follows the topology as a subscriber does. Joining an exchange that
appeared (or restarted) after this member started asks the exchange, when it creates the group
there, to take what it still retains: messages published to it before any member came.

One I/O thread owns the sockets. The application acks from any thread: acks are queued, and the
I/O thread sends them as ranges, one frame per exchange per turn. Each exchange sends at most
`prefetch` unacked messages to this member. Every second the member pings each exchange; the
`pong` names the groups this connection is a member of, and a member that lost its membership
(the exchange timed it out during a pause, or its connection was re-made) joins again.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import zmq
from kazoo.client import KazooClient

from roq import protocol
from roq.client.subscriber import EMPTY_HEADERS
from roq.client.topology import QueueTopology
from roq.client.wake import WakePipe
from roq.config import Config
from roq.errors import ProtocolError, RoqError, UserError
from roq.names import check_group_name, check_topic, topic_text
from roq.paths import Paths
from roq.security import load_keys, secure_client
from roq.zk import start_client, stop_client

log = logging.getLogger(__name__)

PING_INTERVAL = 1.0  # s; the exchange forgets a member silent for exchange.group_member_timeout
JOIN_TIMEOUT = 10.0  # s the constructor waits for the running exchanges to answer the join
MAX_WORK_FRAME = 64 << 20


class GroupMismatchError(UserError):
    """The group runs with other topics or settings (every member must agree), or is refused."""
    code = "group_mismatch"


class WorkMessage:
    """One message handed to this member: ack() it when done, or nack() it. `topic` and `key` are
    text (str, as given to `publish()`; None: no key), `topic_bytes` and `key_bytes` the exact bytes;
    `headers` the publisher's (str → bytes; a dead letter's also say where it came from)."""

    __slots__ = ("topic_bytes", "payload", "publisher", "seq", "exchange", "sent_ns", "incarnation", "pos", "idx",
                 "deliveries", "priority", "key_bytes", "headers", "_member", "settled")

    def __init__(self, member: GroupSubscriber, entry: list[Any], i: int, exchange: str, incarnation: str) -> None:
        self.topic_bytes: bytes = entry[3]
        self.publisher: str = entry[4]
        self.sent_ns: int = entry[5]
        self.seq: int = entry[6][i]
        self.payload: bytes = entry[7][i]
        self.exchange, self.incarnation = exchange, incarnation
        self.pos: int = entry[0]
        self.idx: int = entry[1] + i
        self.deliveries: int = entry[2]
        self.priority: int = entry[8]
        self.key_bytes: bytes | None = entry[9] or None
        # Each message its own copy: the messages of an entry share one map on the wire.
        self.headers: Mapping[str, bytes] = dict(entry[10]) if len(entry) > 10 else EMPTY_HEADERS
        self._member = member
        self.settled = False

    @property
    def topic(self) -> str:
        return topic_text(self.topic_bytes)

    @property
    def key(self) -> str | None:
        return topic_text(self.key_bytes) if self.key_bytes is not None else None

    @property
    def id(self) -> str:
        """Unique per message, the same on every redelivery and after failover: an idempotency key."""
        return f"{self.publisher}:{self.seq}"

    @property
    def redelivered(self) -> bool:
        return self.deliveries > 1

    def ack(self) -> None:
        """Done: the group forgets the message (a second ack or nack does nothing)."""
        self._member._settle(self, protocol.ACK)

    def nack(self, requeue: bool = True) -> None:
        """Not done: back to the group now (counts as a delivery), or with `requeue=False`
        straight to the group's dead-letter topic."""
        self._member._settle(self, protocol.NACK if requeue else "drop")

    def __repr__(self) -> str:
        headers = f", headers={dict(self.headers)!r}" if self.headers else ""
        return (f"WorkMessage(id={self.id!r}, topic={self.topic!r}, deliveries={self.deliveries}, "
                f"priority={self.priority}, key={self.key!r}{headers}, {len(self.payload)} bytes)")


class _Link:
    """This member's connection to one exchange incarnation."""

    def __init__(self, xid: str, endpoint: str, incarnation: str, sock: zmq.Socket, from_beginning: bool) -> None:
        self.xid, self.endpoint, self.incarnation, self.sock = xid, endpoint, incarnation, sock
        self.from_beginning = from_beginning
        self.joined = False
        self.refusal: tuple[str, str] | None = None
        self.next_ping = 0.0


class GroupSubscriber:
    def __init__(self, queue: str, config: Config, topics: Iterable[str | bytes] = (), zk: KazooClient | None = None,
                 callback: Callable[[WorkMessage], None] | None = None, *, group: str, prefetch: int | None = None,
                 auto_ack: bool = True, ack_timeout: float | None = None, max_deliveries: int | None = None,
                 dead_letter: str | bytes | None = None, inbox_limit: int = 100_000) -> None:
        check_group_name(group)
        client = config.client
        prefetch = client.prefetch if prefetch is None else prefetch
        ack_timeout = client.ack_timeout if ack_timeout is None else ack_timeout
        max_deliveries = client.max_deliveries if max_deliveries is None else max_deliveries
        if not isinstance(prefetch, int) or not 1 <= prefetch <= protocol.MAX_PREFETCH:
            raise UserError(f"prefetch must be an integer from 1 to {protocol.MAX_PREFETCH}, got {prefetch!r}")
        if not 0.001 <= ack_timeout <= 86_400:
            raise UserError(f"ack_timeout must be from 0.001 to 86400 seconds, got {ack_timeout!r}")
        if not isinstance(max_deliveries, int) or not 1 <= max_deliveries <= protocol.MAX_DELIVERIES:
            raise UserError(f"max_deliveries must be an integer from 1 to {protocol.MAX_DELIVERIES}")
        load_keys(config.security)
        self.config, self.queue, self.group = config, queue, group
        self.topics = sorted({check_topic(t) for t in topics}) or [b""]
        self.dead_letter = check_topic(dead_letter if dead_letter is not None else f"roq.dead/{group}")
        if any(self.dead_letter.startswith(p) for p in self.topics):
            raise UserError(f"dead-letter topic {self.dead_letter!r} matches the group's own topics: dead letters "
                            "would come back to the group; choose another (dead_letter=...)")
        self.prefetch, self.auto_ack = prefetch, auto_ack
        self.ack_timeout, self.max_deliveries = ack_timeout, max_deliveries
        self.callback = callback
        self.received = self.acked = self.nacked = self.redelivered = self.callback_errors = 0
        self._inbox: queue_module.Queue[WorkMessage] = queue_module.Queue(inbox_limit)
        self._last: WorkMessage | None = None  # iterator style with auto_ack: acked at the next receive()
        self._settled: list[tuple[str, str, str, int, int]] = []  # (kind, xid, incarnation, pos, idx)
        self._settled_lock = threading.Lock()
        self._links: dict[str, _Link] = {}
        self._closed = False
        self._own_zk = zk is None
        self.zk = zk or start_client(config)
        self._wake = WakePipe()
        try:
            self.topology = QueueTopology(self.zk, Paths(config.zk.root), queue, self._wake.wake)
        except Exception:
            self._wake.close()
            if self._own_zk:
                stop_client(self.zk)
            raise
        # Exchanges running now hold no history for this member; one that appears later might.
        self._initial = {live.get("incarnation") for live in self.topology.snapshot().values()}
        self._joined = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"group-{queue}-{group}", daemon=True)
        self._thread.start()
        try:
            self._wait_joined()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ API

    def receive(self, timeout: float | None = None) -> WorkMessage | None:
        """The next message, or None after `timeout`. With auto_ack, the message returned before
        this call is acked now (the application is done with it)."""
        if self._last is not None:
            last, self._last = self._last, None
            last.ack()
        try:
            msg = self._inbox.get(timeout=timeout)
        except queue_module.Empty:
            self.topology.check_exists()
            return None
        if self.auto_ack:
            self._last = msg
        return msg

    def __iter__(self) -> Iterator[WorkMessage]:
        while not self._closed:
            msg = self.receive(timeout=0.2)
            if msg is not None:
                yield msg

    @property
    def connected(self) -> set[str]:
        return {xid for xid, link in list(self._links.items()) if link.joined}

    def wait_connected(self, count: int | None = None, timeout: float = 10.0) -> None:
        """Wait until this member has joined the group on `count` exchanges (default: all running)."""
        deadline = time.monotonic() + timeout
        while True:
            want = len(self.topology.snapshot()) if count is None else count
            if len(self.connected) >= want:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"joined group {self.group!r} on {len(self.connected)} of {want} exchanges")
            time.sleep(0.02)

    def stats(self) -> dict[str, int]:
        return {"received": self.received, "acked": self.acked, "nacked": self.nacked,
                "redelivered": self.redelivered, "callback_errors": self.callback_errors,
                "joined": len(self.connected)}

    def close(self) -> None:
        """Leave the group: what this member has not acked goes to the other members at once."""
        if self._closed:
            return
        if self._last is not None:
            last, self._last = self._last, None
            last.ack()
        self._closed = True
        self._wake.wake()
        self._thread.join(timeout=5)
        self.topology.close()
        self._wake.close()
        if self._own_zk:
            stop_client(self.zk)

    def __enter__(self) -> GroupSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ acks from any thread

    def _settle(self, msg: WorkMessage, kind: str) -> None:
        if msg.settled:
            return
        msg.settled = True
        with self._settled_lock:
            self._settled.append((kind, msg.exchange, msg.incarnation, msg.pos, msg.idx))
            first = len(self._settled) == 1
        if kind == protocol.ACK:
            self.acked += 1
        else:
            self.nacked += 1
        if first and threading.current_thread() is not self._thread:
            self._wake.wake()  # one wake-up per batch of acks; the I/O thread flushes after callbacks

    def _wait_joined(self) -> None:
        """Every exchange running now answered the join; a refusal raises GroupMismatchError."""
        deadline = time.monotonic() + JOIN_TIMEOUT
        with self._joined:
            while True:
                refused = [link.refusal for link in list(self._links.values()) if link.refusal]
                if refused:
                    code, message = refused[0]
                    raise GroupMismatchError(f"group {self.group!r} refused this member: {code}: {message}")
                running = set(self.topology.snapshot())
                if running <= self.connected:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RoqError(f"group {self.group!r}: no answer to the join from exchanges "
                                   f"{sorted(running - self.connected)} in {JOIN_TIMEOUT:.0f}s (an exchange "
                                   "refuses the handshake of a key without the consume right on the queue: "
                                   "roq keys show NAME)")
                self._joined.wait(min(left, 0.1))

    # ------------------------------------------------------------ I/O thread

    def _run(self) -> None:
        context = zmq.Context()
        poller = zmq.Poller()
        poller.register(self._wake.fd, zmq.POLLIN)
        seen_version = -1
        try:
            while not self._closed:
                if self.topology.version != seen_version:
                    seen_version = self.topology.version
                    self._follow(context, poller)
                for sock, _ in poller.poll(200):
                    if sock == self._wake.fd:
                        self._wake.drain()
                    else:
                        self._drain(sock)
                self._flush_settled()
                self._ping()
            self._flush_settled()
            for link in self._links.values():
                self._send(link, protocol.encode_leave(self.group))
        finally:
            for link in self._links.values():
                link.sock.close(linger=500)  # the leave should reach the exchange
            context.term()

    def _follow(self, context: zmq.Context, poller: zmq.Poller) -> None:
        live = self.topology.snapshot()
        for xid, link in list(self._links.items()):
            data = live.get(xid) or {}
            if data.get("work") != link.endpoint or data.get("incarnation") != link.incarnation:
                poller.unregister(link.sock)
                link.sock.close(linger=0)
                del self._links[xid]
        for xid, data in live.items():
            endpoint, incarnation = data.get("work"), data.get("incarnation")
            if xid in self._links or not isinstance(endpoint, str) or not isinstance(incarnation, str):
                continue
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_WORK_FRAME)
            secure_client(sock, self.config)
            sock.connect(endpoint)
            poller.register(sock, zmq.POLLIN)
            link = self._links[xid] = _Link(xid, endpoint, incarnation, sock, incarnation not in self._initial)
            self._join(link)
        with self._joined:
            self._joined.notify_all()

    def _join(self, link: _Link) -> None:
        self._send(link, protocol.encode_join(self.group, self.topics, self.prefetch, round(self.ack_timeout * 1000),
                                              self.max_deliveries, self.dead_letter, link.from_beginning))
        link.next_ping = time.monotonic() + PING_INTERVAL

    def _ping(self) -> None:
        now = time.monotonic()
        for link in self._links.values():
            if now >= link.next_ping:
                link.next_ping = now + PING_INTERVAL
                self._send(link, protocol.encode_ping())

    def _send(self, link: _Link, frame: bytes) -> None:
        try:
            link.sock.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # not connected yet, or its queue is full: pings and acks are repeated or redelivered

    def _drain(self, sock: zmq.Socket, budget: int = 256) -> None:
        link = next((lk for lk in self._links.values() if lk.sock is sock), None)
        for _ in range(budget):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if link is None:
                continue
            try:
                reply = protocol.decode_work_reply(frame, MAX_WORK_FRAME)
            except ProtocolError as exc:
                log.warning("dropping an undecodable frame from %s/%s: %s", self.queue, link.xid, exc)
                continue
            self._on_reply(link, reply)

    def _on_reply(self, link: _Link, reply: protocol.WorkReply) -> None:
        if reply.kind == protocol.WORK and reply.group == self.group and reply.entries is not None:
            self._take(link, reply.incarnation, reply.entries)
        elif reply.kind == protocol.JOINED and reply.group == self.group:
            link.joined, link.refusal = True, None
            with self._joined:
                self._joined.notify_all()
        elif reply.kind == protocol.PONG and reply.groups is not None and self.group not in reply.groups:
            link.joined = False
            self._join(link)  # the exchange forgot us (a pause, a new connection): join again
        elif reply.kind == protocol.ERROR and reply.group in (self.group, None):
            log.warning("group %s on %s/%s: %s: %s", self.group, self.queue, link.xid, reply.code, reply.message)
            if reply.group == self.group:
                link.refusal = (reply.code, reply.message)
                with self._joined:
                    self._joined.notify_all()

    def _take(self, link: _Link, incarnation: str, entries: list[list[Any]]) -> None:
        callback = self.callback
        for entry in entries:
            for i in range(len(entry[6])):
                msg = WorkMessage(self, entry, i, link.xid, incarnation)
                self.received += 1
                if msg.deliveries > 1:
                    self.redelivered += 1
                if callback is None:
                    self._inbox.put(msg)
                    continue
                try:
                    callback(msg)
                except Exception:
                    self.callback_errors += 1
                    log.exception("group %s callback failed; the message goes back to the group", self.group)
                    if self.auto_ack:
                        msg.nack()
                    continue
                if self.auto_ack:
                    msg.ack()

    def _flush_settled(self) -> None:
        """Send the queued acks and nacks as ranges: one frame per exchange and kind."""
        with self._settled_lock:
            settled, self._settled = self._settled, []
        if not settled:
            return
        by_target: dict[tuple[str, str, str], list[list[int]]] = {}
        for kind, xid, incarnation, pos, idx in settled:
            ranges = by_target.setdefault((kind, xid, incarnation), [])
            last = ranges[-1] if ranges else None
            if last is not None and last[0] == pos and last[1] + last[2] == idx:
                last[2] += 1
            else:
                ranges.append([pos, idx, 1])
        for (kind, xid, incarnation), ranges in by_target.items():
            link = self._links.get(xid)
            if link is None or link.incarnation != incarnation:
                continue  # that exchange is gone: its messages come again from wherever they are now
            wire = protocol.NACK if kind != protocol.ACK else protocol.ACK
            self._send(link, protocol.encode_settle(wire, self.group, incarnation, ranges, requeue=kind != "drop"))
