"""The work socket: consumer group members join, take work and ack it (docs/protocol.md section 7).

A ROUTER socket. Members' frames go to the groups (exchange/groups.py); what the groups hand
out leaves as `work` frames, per member per dispatch, each of at most WORK_FRAME_MESSAGES messages
and about WORK_FRAME_BYTES of payloads. A member holds at most `exchange.group_max_prefetch`
unacked messages whatever its join asked (the groups clamp it).
A member whose process died gives its unacked messages back at once: the socket's monitor
reports the dropped connection's file descriptor, and each member's join and pings tell which
descriptor its connection has (ZMQ_SRCFD). A frozen member keeps its connection, and gives them
back after `exchange.group_member_timeout` without a frame (members ping every second).
A send that would block (the member does not read) puts the units back, uncounted.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from exchange.groups import Group, Groups, GroupSettings, Unit
from exchange.retention import Retention
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

WORK_HWM = 1000  # frames queued per member; credit (prefetch) bounds them first
WORK_FRAME_BYTES = 1 << 20  # a work frame holds about this much payload at most
WORK_FRAME_MESSAGES = 1000  # ... and at most this many messages
MAX_MEMBER_FRAME = 8 << 20  # an ack of 100,000 ranges fits
SEND_RETRY = 0.1  # s before work is encoded again for a member whose socket was full


def work_socket(context: zmq.Context) -> zmq.Socket:
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    sock.sndhwm = WORK_HWM
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MEMBER_FRAME)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone member fails instead of vanishing
    return sock


class WorkServer:
    def __init__(self, sock: zmq.Socket, groups: Groups, xid: str, incarnation: str,
                 retention: Retention, count: Callable[[str, int], None], offer: Callable[..., None]) -> None:
        """`offer(pos, topic, publisher, sent_ns, seqs, payloads, attrs, only=group)` gives a retained
        frame to a group (the forwarder's, which leaves out what an adopted group had)."""
        self.sock = sock
        self.groups = groups
        self.xid = xid
        self.incarnation = incarnation
        self.retention = retention
        self._count = count
        self._offer = offer
        self.gone: deque[int] = deque()  # fds of dropped connections (appended by any thread)
        self._routes_by_fd: dict[int, set[bytes]] = {}
        self.monitor: zmq.Socket | None = None  # our own, when no gatekeeper watches the socket

    def watch_connections(self) -> None:
        """Follow dropped connections with a monitor of our own (when the gatekeeper does not)."""
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def close(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
        self.sock.close(linger=0)

    def drain_monitor(self) -> None:
        assert self.monitor is not None
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.gone.append(int(event["value"]))

    def forget_gone(self) -> None:
        """The members of connections that dropped leave their groups."""
        while self.gone:
            for route in self._routes_by_fd.pop(self.gone.popleft(), ()):
                self.groups.disconnected(route)

    def drain(self, budget: int = 256) -> None:
        for _ in range(budget):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            route = frames[0].bytes
            if len(frames) != 2:
                self._count("malformed", 1)
                self._send(route, protocol.encode_work_error(None, protocol.MALFORMED,
                                                             "expected exactly one frame per message"))
                continue
            try:
                self.handle(route, frames[1].bytes, frames[1])
            except ProtocolError as err:
                self._count("malformed", 1)
                self._send(route, protocol.encode_work_error(None, protocol.MALFORMED, str(err)))

    def handle(self, route: bytes, payload: bytes, message: zmq.Frame | None = None) -> None:
        frame = protocol.decode_member_frame(payload, MAX_MEMBER_FRAME)
        self.groups.seen(route)
        if message is not None and isinstance(frame, (protocol.Ping, protocol.Join)):
            self._note_fd(route, message)
        if isinstance(frame, protocol.Ping):
            self._send(route, protocol.encode_pong(self.incarnation, self.groups.member_of(route)))
        elif isinstance(frame, protocol.Join):
            self._join(route, frame)
        elif isinstance(frame, protocol.Leave):
            self.groups.leave(frame.group, route)
        elif frame.incarnation != self.incarnation:
            pass  # about a stream that ended: those messages are redelivered by whoever holds them now
        elif frame.kind == protocol.ACK:
            self.groups.ack(frame.group, route, frame.ranges)
        else:
            self.groups.nack(frame.group, route, frame.ranges, frame.requeue)

    def _note_fd(self, route: bytes, message: zmq.Frame) -> None:
        try:
            fd = int(message.get(zmq.SRCFD))
        except (zmq.ZMQError, TypeError, ValueError):
            return  # then only the member timeout finds a dead member
        routes = self._routes_by_fd.setdefault(fd, set())
        if route not in routes:
            for other in self._routes_by_fd.values():  # a route lives on one connection
                other.discard(route)
            routes.add(route)
            for stale in [f for f, r in self._routes_by_fd.items() if not r]:
                del self._routes_by_fd[stale]

    def _join(self, route: bytes, join: protocol.Join) -> None:
        settings = GroupSettings(join.prefixes, join.ack_timeout_ms / 1000.0, join.max_deliveries, join.dead_letter)
        if any(join.dead_letter.startswith(p) for p in join.prefixes):
            self._send(route, protocol.encode_work_error(join.group, "bad_request", "the dead-letter topic must not "
                                                         "match the group's own topics (dead letters would loop)"))
            return
        new = join.group not in self.groups.groups
        group, refusal = self.groups.join(join.group, route, settings, join.prefetch)
        if group is None:
            code = "group_mismatch" if join.group in self.groups.groups else "limit_exceeded"
            self._send(route, protocol.encode_work_error(join.group, code, refusal))
            return
        if new and join.from_beginning:
            self._take_retained(group)
        self._send(route, protocol.encode_joined(join.group, self.xid, self.incarnation))

    def _take_retained(self, group: Group) -> None:
        """A group created on an exchange its members did not know yet (it appeared, or restarted)
        takes what the exchange still retains: messages published before the first member came."""
        frames, _, _ = self.retention.read(0, self.retention.next_pos, list(group.settings.prefixes), 1 << 62)
        for topic, body in frames:
            try:
                d = protocol.decode_delivery(body)
            except ProtocolError:
                continue
            attrs = [tuple(a) for a in d.attrs] if d.attrs else None
            self._offer(d.pos, topic, d.publisher, d.sent_ns, d.seqs, d.payloads, attrs, only=group, topics=d.topics)

    def pump(self) -> None:
        """Hand ready messages to members with credit."""
        for group in list(self.groups.groups.values()):
            if not group.ready or not group.members:
                continue
            for route, units in self.groups.dispatch(group, WORK_FRAME_MESSAGES):
                self._send_units(group, route, units)

    def _send_units(self, group: Group, route: bytes, units: list[Unit]) -> None:
        entries, size, count = [], 0, 0
        for i, unit in enumerate(units):
            entries.append(unit.entry())
            size += unit.size
            count += unit.count
            last = i == len(units) - 1
            if last or size >= WORK_FRAME_BYTES or count + units[i + 1].count > WORK_FRAME_MESSAGES:
                if not self._send(route, protocol.encode_work(group.name, self.incarnation, entries)):
                    self.groups.unsend(group, units[i + 1 - len(entries):])  # this frame's and the rest
                    member = group.members.get(route)
                    if member is not None:
                        member.paused_until = self.groups.clock() + SEND_RETRY
                    return
                entries, size, count = [], 0, 0

    def _send(self, route: bytes, frame: bytes) -> bool:
        try:
            self.sock.send_multipart([route, frame], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # full (not reading) or gone: it will ask again, or its units come back
            return False
