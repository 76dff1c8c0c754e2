"""SubscriberReceiver: a subscriber's I/O thread and its one SUB socket.

The socket is connected to every running exchange of the queue; ZooKeeper watches (the queue's
QueueTopology, which the receiver owns) wake the thread, and it connects to new exchanges and
disconnects from removed ones while it runs. Topic filtering is by prefix, inside libzmq: the
receiver subscribes to the topics, the beat topic and, last, the subscriber's private sync
marker. Every frame goes to the stream rules (roq.client.subscriber.streams), which fetch what was dropped
and hand the rest over to the Subscriber (roq.client.subscriber); a dropped connection makes
the stream catch up at its next sync. A durable subscriber's position is saved from this thread
every `client.position_save_interval`. A handshake an exchange refuses (no subscribe right on the
queue, an unknown key, too many connections) is logged once and remembered per endpoint until one
succeeds there (`refusal()`); libzmq keeps retrying underneath.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from roq import protocol
from roq.client.io_thread import QueueIoThread
from roq.client.metadata import MetadataClient
from roq.client.subscriber.replay import ReplayClient
from roq.client.subscriber.streams import StreamSet
from roq.config import Config
from roq.errors import ProtocolError
from roq.security import HANDSHAKE_FAILED, refusal_text, secure_client

log = logging.getLogger(__name__)
_NOBLOCK, _RCVMORE = int(zmq.NOBLOCK), int(zmq.RCVMORE)


class SubscriberReceiver(QueueIoThread):
    def __init__(self, queue: str, config: Config, metadata: MetadataClient, topics: list[bytes], sync_topic: bytes,
                 streams: StreamSet, replay: ReplayClient, save_position: Callable[[], None] | None) -> None:
        """Watch the queue; `start()` starts the I/O thread. `save_position` (durable subscribers
        only) is called from the I/O thread every `client.position_save_interval`."""
        self._topics = topics
        self._sync_topic = sync_topic
        self._streams = streams
        self._replay = replay
        self._save_position = save_position
        self.connected: set[str] = set()  # exchange ids we are connected to
        self._refused: dict[str, bool] = {}  # endpoint → whether its last handshake was refused
        self._ready = threading.Event()
        self._endpoints: dict[str, str] = {}  # exchange id → the endpoint followed, as the I/O thread last saw
        super().__init__(metadata, config, queue, f"subscriber-{queue}")

    def start(self) -> None:
        """Start the I/O thread; returns once its socket is subscribed (at most 5 s)."""
        self._start_thread()
        self._ready.wait(5)

    # ------------------------------------------------------------ I/O thread

    def _run(self) -> None:
        context = zmq.Context()
        sock = context.socket(zmq.SUB)
        sock.linger = 0
        secure_client(sock, self.config)
        sock.rcvhwm = self.config.client.receive_hwm
        if self.config.client.socket_buffer_bytes:
            sock.rcvbuf = self.config.client.socket_buffer_bytes
        for topic in self._topics:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.setsockopt(zmq.SUBSCRIBE, protocol.BEAT_TOPIC)
        # Last, so the exchange sees it together with (after) the topics.
        sock.setsockopt(zmq.SUBSCRIBE, self._sync_topic)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILED)
        self._replay.bind(context)
        endpoints: dict[str, str] = {}
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        poller.register(self._wake.fd, zmq.POLLIN)
        seen_version = -1
        next_save = time.monotonic() + self.config.client.position_save_interval
        self._ready.set()
        try:
            while not self._closed:
                if self.topology.version != seen_version:
                    seen_version = self.topology.version
                    endpoints = self._endpoints = self._follow(sock, endpoints)
                events = dict(poller.poll(200))
                if events.get(self._wake.fd):
                    self._wake.drain()
                if events.get(monitor):
                    self._on_monitor(monitor, endpoints)
                if events.get(sock):
                    self._drain(sock)
                self._streams.expire_syncs(time.monotonic())
                self._streams.drain_ended(time.monotonic())
                if self._save_position and time.monotonic() >= next_save:
                    next_save = time.monotonic() + self.config.client.position_save_interval
                    self._save_position()
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            self._replay.close()
            sock.close(linger=0)
            context.term()

    def _follow(self, sock: zmq.Socket, current: dict[str, str]) -> dict[str, str]:
        live = self.topology.snapshot()
        wanted = {xid: data["sub"] for xid, data in live.items() if data.get("sub")}
        for xid, endpoint in current.items():
            if wanted.get(xid) != endpoint:
                try:
                    sock.disconnect(endpoint)
                except zmq.ZMQError:
                    pass
                self._replay.drop(xid)
                log.info("subscriber left %s/%s", self.queue, xid)
        for xid, endpoint in wanted.items():
            if current.get(xid) != endpoint:
                sock.connect(endpoint)
                log.info("subscriber joined %s/%s at %s", self.queue, xid, endpoint)
        self.connected = set(wanted)
        running = {str(data.get("incarnation")) for data in live.values()}
        for stream in list(self._streams.streams.values()):
            # `known`: followed before, so an incarnation missing from `running` has ended (a new
            # one is only ever met through an endpoint the topology already showed).
            if stream.xid not in live or (stream.incarnation not in running and stream.known):
                # That process is gone: read what it left from a stored copy, then forget it.
                self._streams.end(stream.incarnation)
        return wanted

    def refusal(self) -> str | None:
        """Why every exchange we follow refuses our handshake; None while any accepts us (or none
        answered yet)."""
        refused = self._refused.copy()  # the I/O thread changes it: one atomic copy (CPython)
        wanted = set(refused) & set(self._endpoints.values())
        if not wanted or not all(refused[e] for e in wanted):
            return None
        return refusal_text(self.config, ", ".join(sorted(wanted)), "subscribe")

    def _on_monitor(self, monitor: zmq.Socket, endpoints: dict[str, str]) -> None:
        """A dropped connection loses whatever was in flight: catch up at the next sync. A refused
        handshake is logged the first time at its endpoint."""
        by_endpoint = {endpoint: xid for xid, endpoint in endpoints.items()}
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            endpoint = event.get("endpoint", b"").decode(errors="replace")
            if event["event"] & HANDSHAKE_FAILED:
                if not self._refused.get(endpoint):
                    log.error("subscriber of %s: %s", self.queue, refusal_text(self.config, endpoint, "subscribe"))
                self._refused[endpoint] = True
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._refused[endpoint] = False
            elif (xid := by_endpoint.get(endpoint)) is not None:
                self._streams.on_disconnect(xid)

    def _drain(self, sock: zmq.Socket, budget: int = 1000) -> None:
        streams = self._streams
        more = sock.getsockopt
        views = self.config.client.payload_views
        for _ in range(budget):
            try:
                topic = sock.recv(_NOBLOCK)
            except zmq.Again:
                return
            if not more(_RCVMORE):
                continue  # not two frames: not from an exchange
            body = sock.recv(copy=False).buffer  # decoded in place: a delivery's bytes are not copied out
            parts = _large_parts(sock) if more(_RCVMORE) else ()
            try:
                if topic[:1] == b"\x00":
                    if parts:
                        continue  # a marker is two parts: not from an exchange
                    if topic == protocol.BEAT_TOPIC:
                        streams.on_beat(protocol.decode_sync(body, protocol.BEAT))
                    elif topic == self._sync_topic:
                        streams.on_sync(protocol.decode_sync(body))
                    continue  # another subscriber's marker (we follow every topic)
                delivery = protocol.decode_delivery(body, parts, views)
            except ProtocolError as exc:
                log.warning("dropping an undecodable frame: %s", exc)
                continue
            streams.on_live(topic, delivery)


def _large_parts(sock: zmq.Socket) -> list[zmq.Frame]:
    """A delivery's parts after its body, one per large payload (protocol section 4.2): kept as
    libzmq's messages, their bytes taken once when decoded. Beyond MAX_PARTS the message is not
    an exchange's: read to its end and refused by the decoder."""
    parts: list[zmq.Frame] = []
    while sock.getsockopt(_RCVMORE):
        part = sock.recv(copy=False)
        if len(parts) <= protocol.MAX_PARTS:
            parts.append(part)
    return parts
