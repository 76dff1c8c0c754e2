"""A consumer group member's I/O thread: one DEALER per running exchange, on its `work` endpoint.

The thread follows the queue's topology (QueueTopology wakes it), joins the group on every
exchange it connects to, pings each one every PING_INTERVAL, and joins again when a `pong` says
the exchange forgot this member (it timed it out during a pause, or its connection was re-made).
Joining an exchange that appeared (or restarted) after the member started asks the exchange, when
it creates the group there, to take what it still retains. Acks and nacks queued from any thread
(`settle`) leave as ranges, one frame per exchange and kind per turn. Work goes to `on_work`, on
this thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from roq import protocol
from roq.client.io_thread import QueueIoThread
from roq.client.metadata import MetadataClient
from roq.config import Config
from roq.errors import ProtocolError
from roq.security import secure_client

log = logging.getLogger(__name__)

PING_INTERVAL = 1.0  # s; the exchange forgets a member silent for exchange.group_member_timeout
MAX_WORK_FRAME = 64 << 20
DROP = "drop"  # a nack that sends the message to the dead-letter topic instead of back to the group

OnWork = Callable[[str, str, list[list[Any]]], None]  # (xid, incarnation, entries)


@dataclass(frozen=True)
class JoinTerms:
    """What every member of a group must agree on, sent with each join."""
    group: str
    topics: list[bytes]
    prefetch: int
    ack_timeout: float  # seconds
    max_deliveries: int
    dead_letter: bytes


class _Link:
    """This member's connection to one exchange incarnation."""

    def __init__(self, xid: str, endpoint: str, incarnation: str, sock: zmq.Socket, from_beginning: bool) -> None:
        self.xid, self.endpoint, self.incarnation, self.sock = xid, endpoint, incarnation, sock
        self.from_beginning = from_beginning
        self.joined = False
        self.refusal: tuple[str, str] | None = None
        self.next_ping = 0.0


class MemberLinks(QueueIoThread):
    def __init__(self, metadata: MetadataClient, config: Config, queue: str, terms: JoinTerms, on_work: OnWork) -> None:
        """Watch the queue; `start()` starts the I/O thread."""
        self.terms, self.group = terms, terms.group
        self._on_work = on_work
        self._settled: list[tuple[str, str, str, int, int]] = []  # (kind, xid, incarnation, pos, idx)
        self._settled_lock = threading.Lock()
        self._links: dict[str, _Link] = {}
        super().__init__(metadata, config, queue, f"group-{queue}-{terms.group}")
        # Exchanges running now hold no history for this member; one that appears later might.
        self._initial = {live.get("incarnation") for live in self.topology.snapshot().values()}
        self.changed = threading.Condition()  # notified when a join is answered or the exchanges change

    def start(self) -> None:
        """Start the I/O thread; when closed, it sends what is settled and leaves the group everywhere."""
        self._start_thread()

    @property
    def joined(self) -> set[str]:
        """Exchanges on which this member has joined the group."""
        return {xid for xid, link in list(self._links.items()) if link.joined}

    def refusals(self) -> list[tuple[str, str]]:
        """(code, message) of each exchange that refused this member's join."""
        return [link.refusal for link in list(self._links.values()) if link.refusal]

    def settle(self, kind: str, xid: str, incarnation: str, pos: int, idx: int) -> None:
        """Queue an ack, nack or drop (any thread); the I/O thread sends it."""
        with self._settled_lock:
            self._settled.append((kind, xid, incarnation, pos, idx))
            first = len(self._settled) == 1
        if first and not self.on_io_thread():
            self._wake.wake()  # one wake-up per batch of acks; the I/O thread flushes after callbacks

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
        with self.changed:
            self.changed.notify_all()

    def _join(self, link: _Link) -> None:
        terms = self.terms
        self._send(link, protocol.encode_join(terms.group, terms.topics, terms.prefetch,
                                              round(terms.ack_timeout * 1000), terms.max_deliveries,
                                              terms.dead_letter, link.from_beginning))
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
            self._on_work(link.xid, reply.incarnation, reply.entries)
        elif reply.kind == protocol.JOINED and reply.group == self.group:
            link.joined, link.refusal = True, None
            with self.changed:
                self.changed.notify_all()
        elif reply.kind == protocol.PONG and reply.groups is not None and self.group not in reply.groups:
            link.joined = False
            self._join(link)  # the exchange forgot us (a pause, a new connection): join again
        elif reply.kind == protocol.ERROR and reply.group in (self.group, None):
            log.warning("group %s on %s/%s: %s: %s", self.group, self.queue, link.xid, reply.code, reply.message)
            if reply.group == self.group:
                link.refusal = (reply.code, reply.message)
                with self.changed:
                    self.changed.notify_all()

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
            self._send(link, protocol.encode_settle(wire, self.group, incarnation, ranges, requeue=kind != DROP))
