"""The forwarding loop: publishers' ROUTER socket in, subscribers' XPUB socket out.

A batch is validated message by message (oversize payloads and bad topics are
rejected one by one and counted), de-duplicated against the highest sequence
already forwarded for its publisher (a publisher replaying after a move is
harmless), grouped into runs of one topic, and sent as [topic, body] so that
libzmq filters by topic prefix. Then the publisher gets a cumulative ack.

Every frame sent to subscribers gets the next position of this incarnation's
stream, names the position of the previous frame of its topic, and is kept in
the retention buffer. Slow subscribers: XPUB keeps at most `exchange.sub_hwm`
frames per subscriber and drops beyond that for that subscriber only; the
subscriber sees the broken chain of positions and fetches the missing frames
from retention through the replay socket (ROUTER), as does a subscriber that
reconnects. A subscription to a sync marker topic is answered with the next
position, so a subscriber knows from where on its subscription is live.

Nothing a peer sends can raise out of `handle_publisher` or `handle_fetch`.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import zmq

from exchange.retention import Retention
from exchange.stats import ExchangeStats
from roq import protocol
from roq.config import ExchangeConfig
from roq.errors import ProtocolError
from roq.names import MAX_TOPIC_BYTES
from roq.security import Gatekeeper

log = logging.getLogger(__name__)

POLL_MS = 100
TOPIC_TRACK_LIMIT = 100_000  # topics remembered for prev_pos; least recently used forgotten first
# Plain ints: or-ing pyzmq's enum flags costs microseconds on the per-frame path.
_MORE, _NOBLOCK, _MORE_NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK), int(zmq.SNDMORE | zmq.NOBLOCK)


class Forwarder:
    def __init__(self, context: zmq.Context, config: ExchangeConfig, exchange_id: str,
                 bind_host: str, advertise_host: str, gatekeeper: Gatekeeper | None = None) -> None:
        """`gatekeeper` (CURVE, connection limits) guards the three sockets before they bind."""
        self.config = config
        self.exchange_id = exchange_id
        # A restarted exchange keeps its id but starts a new stream of positions.
        self.incarnation = f"{exchange_id}.{secrets.token_hex(4)}"
        self.stats = ExchangeStats()
        self.retention = Retention(config.retention_seconds, config.retention_bytes)
        self.last_seq: dict[str, int] = {}
        self.routes: dict[str, bytes] = {}  # publisher id → routing id, to send control
        self.topic_pos: OrderedDict[bytes, int] = OrderedDict()  # topic → position of its last frame
        self.front = context.socket(zmq.ROUTER)
        self.front.linger = 0
        self.front.rcvhwm = config.pub_hwm
        # libzmq drops oversize frames before they cost us anything.
        self.front.setsockopt(zmq.MAXMSGSIZE, config.max_batch_bytes + 4096)
        self.back = context.socket(zmq.XPUB)
        self.back.linger = 0
        self.back.sndhwm = config.sub_hwm
        # Pass every (un)subscription up, duplicates included, so we can count subscribers.
        self.back.setsockopt(zmq.XPUB_VERBOSER, 1)
        self.replay = context.socket(zmq.ROUTER)
        self.replay.linger = 0
        self.replay.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_CONTROL_FRAME)
        if gatekeeper is not None:
            for sock, domain in ((self.front, "publishers"), (self.back, "subscribers"), (self.replay, "replay")):
                gatekeeper.guard(sock, domain)
        pub_port = self.front.bind_to_random_port(f"tcp://{bind_host}")
        sub_port = self.back.bind_to_random_port(f"tcp://{bind_host}")
        replay_port = self.replay.bind_to_random_port(f"tcp://{bind_host}")
        self.pub_endpoint = f"tcp://{advertise_host}:{pub_port}"
        self.sub_endpoint = f"tcp://{advertise_host}:{sub_port}"
        self.replay_endpoint = f"tcp://{advertise_host}:{replay_port}"

    def close(self) -> None:
        for sock in (self.front, self.back, self.replay):
            sock.close(linger=0)

    def run(self, should_stop: Callable[[], bool], on_tick: Callable[[], None]) -> None:
        poller = zmq.Poller()
        for sock in (self.front, self.back, self.replay):
            poller.register(sock, zmq.POLLIN)
        next_beat = 0.0
        while not should_stop():
            for sock, _ in poller.poll(POLL_MS):
                if sock is self.front:
                    self._drain_publishers()
                elif sock is self.back:
                    self._drain_subscriptions()
                else:
                    self._drain_fetches()
            self.retention.trim()
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.config.beat_interval
                self._beat()
            on_tick()

    def _beat(self) -> None:
        body = protocol.encode_sync(self.exchange_id, self.incarnation, self.retention.next_pos, protocol.BEAT)
        try:
            self.back.send_multipart([protocol.BEAT_TOPIC, body], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _drain_publishers(self, budget: int = 256) -> None:
        """Handle queued publisher frames, a bounded number per wake-up."""
        for _ in range(budget):
            try:
                frames = self.front.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                self.stats.totals.malformed += 1
                if frames:
                    self._reply(frames[0], [protocol.ERROR, protocol.VERSION, "malformed",
                                            "expected exactly one frame per message"])
                continue
            self.handle_publisher(frames[0], frames[1])

    def _drain_subscriptions(self) -> None:
        while True:
            try:
                event = self.back.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, topic = event[:1], event[1:]
            if topic[:1] == b"\x00":  # our own marker topics, not a user's subscription
                if kind == b"\x01" and topic.startswith(protocol.SYNC_PREFIX):
                    self._answer_sync(topic)
            elif kind == b"\x01":
                self.stats.subscriptions += 1
            elif kind == b"\x00":
                self.stats.subscriptions = max(0, self.stats.subscriptions - 1)

    def _answer_sync(self, marker: bytes) -> None:
        """The subscriber's subscriptions arrived together with its marker, so they are
        active now: every frame from the next position on reaches it live."""
        body = protocol.encode_sync(self.exchange_id, self.incarnation, self.retention.next_pos)
        try:
            self.back.send_multipart([marker, body], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the subscriber falls back to its sync timeout

    def _drain_fetches(self, budget: int = 16) -> None:
        for _ in range(budget):
            try:
                frames = self.replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 2:
                self.handle_fetch(frames[0], frames[1])
            else:
                self.stats.totals.malformed += 1

    def handle_fetch(self, ident: bytes, payload: bytes) -> None:
        try:
            req = protocol.decode_fetch(payload)
        except ProtocolError as err:
            self.stats.totals.malformed += 1
            self._send_replay(ident, [protocol.ERROR, protocol.VERSION, protocol.request_id_of(payload),
                                      err.code, str(err)])
            return
        if req.position_only:
            self._send_replay(ident, [protocol.POSITION, protocol.VERSION, req.request_id, self.incarnation,
                                      self.retention.oldest, self.retention.next_pos])
            return
        if req.incarnation and req.incarnation != self.incarnation:
            self._send_replay(ident, [protocol.ERROR, protocol.VERSION, req.request_id, "unknown_incarnation",
                                      f"this exchange is incarnation {self.incarnation}"])
            return
        limit = min(req.max_bytes or self.config.fetch_max_bytes, self.config.fetch_max_bytes)
        found, scanned_to, done = self.retention.read(req.after, req.before, req.prefixes, limit, req.known)
        self.stats.totals.fetches += 1
        self.stats.totals.fetched_frames += len(found)
        self._send_replay(ident, [protocol.FRAMES, protocol.VERSION, req.request_id, self.incarnation,
                                  self.retention.oldest, found, scanned_to, done])

    def _send_replay(self, ident: bytes, message: list[Any]) -> None:
        try:
            self.replay.send_multipart([ident, protocol.pack(message)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the subscriber is gone; it will ask again

    def handle_publisher(self, ident: bytes, payload: bytes) -> None:
        try:
            kind, detail = protocol.decode_publisher_frame(payload, self.config.max_batch_bytes)
        except ProtocolError as err:
            self.stats.totals.malformed += 1
            self._reply(ident, [protocol.ERROR, protocol.VERSION, err.code, str(err)])
            return
        if kind == protocol.BATCH:
            self._forward(ident, detail)
        elif kind == protocol.HELLO:
            self.routes[detail] = ident
            self.stats.publishers[detail] = time.monotonic()
            self._reply(ident, [protocol.WELCOME, protocol.VERSION, self.exchange_id,
                                self.last_seq.get(detail, 0), self.stats.subscriptions])
        elif kind == protocol.BYE:
            self.routes.pop(detail, None)
            self.stats.publishers.pop(detail, None)

    def _forward(self, ident: bytes, batch: protocol.Batch) -> None:
        pub = batch.publisher
        self.routes[pub] = ident
        self.stats.publishers[pub] = time.monotonic()
        flat = batch.flat
        count = len(flat) // 2
        last = self.last_seq.get(pub, 0)
        skip = min(max(0, last - batch.first_seq + 1), count)  # already forwarded: a replay
        totals = self.stats.totals
        totals.duplicates += skip
        topics, payloads = flat[2 * skip::2], flat[2 * skip + 1::2]
        size = _one_valid_topic(topics, payloads, self.config.max_message_bytes) if topics else -1
        if size >= 0:
            # The common case, checked with C-level calls instead of a loop per message.
            first = batch.first_seq + skip
            self._send(topics[0], pub, batch.sent_ns, list(range(first, first + len(payloads))), payloads, size)
        else:
            self._forward_one_by_one(ident, batch, skip)
        totals.msgs_in += count - skip
        by_publisher = self.stats.interval_by_publisher
        by_publisher[pub] = by_publisher.get(pub, 0) + count - skip
        self.stats.note_latency(time.time_ns() - batch.sent_ns)
        newest = batch.first_seq + count - 1
        if newest > last:
            self.last_seq[pub] = newest
        self._reply(ident, [protocol.ACK, protocol.VERSION, max(newest, last), self.stats.subscriptions])

    def _forward_one_by_one(self, ident: bytes, batch: protocol.Batch, skip: int) -> None:
        """Mixed topics or a bad message: check each, reject the bad ones, send runs of one topic."""
        pub, flat, totals = batch.publisher, batch.flat, self.stats.totals
        count = len(flat) // 2
        run_topic: Any = None
        seqs: list[int] = []
        payloads: list[bytes] = []
        run_size = 0
        max_size = self.config.max_message_bytes
        for i in range(skip, count):
            topic, payload = flat[2 * i], flat[2 * i + 1]
            seq = batch.first_seq + i
            problem = _check_message(topic, payload, max_size)
            if problem:
                totals.rejected += 1
                self._reply(ident, [protocol.REJECT, protocol.VERSION, seq, problem[0], problem[1]])
                continue
            if topic != run_topic and seqs:
                self._send(run_topic, pub, batch.sent_ns, seqs, payloads, run_size)
                seqs, payloads, run_size = [], [], 0
            run_topic = topic
            seqs.append(seq)
            payloads.append(payload)
            run_size += len(payload)
        if seqs:
            self._send(run_topic, pub, batch.sent_ns, seqs, payloads, run_size)

    def _send(self, topic: bytes, pub: str, sent_ns: int, seqs: list[int], payloads: list[bytes], size: int) -> None:
        """Number, retain and publish one frame of accepted messages; `size` is the payloads' total."""
        pos = self.retention.next_pos
        prev_pos = self.topic_pos.pop(topic, 0)
        self.topic_pos[topic] = pos
        if len(self.topic_pos) > TOPIC_TRACK_LIMIT:
            self.topic_pos.popitem(last=False)
        body = protocol.encode_delivery(self.exchange_id, self.incarnation, pos, prev_pos, pub, sent_ns,
                                        seqs, payloads)
        self.retention.add(topic, body)
        self.back.send(topic, _MORE)  # two sends: send_multipart costs more than the send itself
        self.back.send(body)
        totals = self.stats.totals
        totals.msgs_out += len(seqs)
        totals.bytes_in += size  # every accepted payload is sent once, here
        totals.bytes_out += size
        totals.frames_out += 1

    def _reply(self, ident: bytes, message: list[Any]) -> None:
        try:
            self.front.send(ident, _MORE_NOBLOCK)  # once the first part went, the rest goes too
            self.front.send(protocol.pack(message), _NOBLOCK)
        except zmq.ZMQError:
            pass  # the publisher is gone or not reading; acks are cumulative anyway

    def ask_publishers_to_move(self, reason: str) -> int:
        """Tell every known publisher to go to another exchange (before shutdown)."""
        for ident in set(self.routes.values()):
            self._reply(ident, [protocol.MOVE, protocol.VERSION, reason])
        return len(self.routes)


def _one_valid_topic(topics: list[Any], payloads: list[Any], max_size: int) -> int:
    """The payloads' total size if every message has the same valid topic and a bytes payload
    within the size limit, else -1."""
    topic = topics[0]
    if _check_message(topic, b"", max_size) is not None or topics.count(topic) != len(topics) \
            or set(map(type, payloads)) != {bytes}:
        return -1
    size = sum(map(len, payloads))
    # A total within the limit means every payload is: the max is only needed for big batches.
    return size if size <= max_size or max(map(len, payloads)) <= max_size else -1


def _check_message(topic: Any, payload: Any, max_size: int) -> tuple[str, str] | None:
    if not isinstance(topic, bytes) or not 0 < len(topic) <= MAX_TOPIC_BYTES or topic[:1] == b"\x00":
        return ("invalid_name", f"topic must be 1-{MAX_TOPIC_BYTES} bytes, not starting with NUL")
    if not isinstance(payload, bytes):
        return ("malformed", "payload must be bytes (msgpack bin)")
    if len(payload) > max_size:
        return ("too_large", f"payload of {len(payload)} bytes exceeds exchange.max_message_bytes={max_size}")
    return None
