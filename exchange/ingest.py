"""The publishers' side: their ROUTER socket read, batches checked and forwarded, acks sent.

A publisher first says `hello` (proving it owns its id) on its connection; its batches are then
checked against what this exchange holds of it (exchange/sessions.py): a batch must continue
where the last one ended, or it is refused with `resend` and changes nothing, so an ack never
covers a message that was not forwarded. Messages are validated (oversize payloads and bad topics
are rejected one by one and counted), cut into one frame per run of messages with the same
matching subscriptions (exchange/grouping.py) and handed to the fan-out (exchange/fanout.py). Then the publisher gets a
cumulative ack: at once, one per connection per drain, or, when acks wait for durability (a
replica, an fsync'ed journal), from the confirm gate once what the stream held when it was earned
is durable (exchange/durability.py).
Nothing a publisher sends ends the loop: an unexpected error on one frame is logged and counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import zmq

from exchange.fanout import Fanout
from exchange.grouping import frames_of
from exchange.parts import Parts
from roq import protocol
from roq.errors import ProtocolError
from roq.names import MAX_TOPIC_BYTES

log = logging.getLogger(__name__)

# Plain ints: or-ing pyzmq's enum flags costs microseconds on the per-frame path.
_NOBLOCK, _MORE_NOBLOCK = int(zmq.NOBLOCK), int(zmq.SNDMORE | zmq.NOBLOCK)
DRAIN_BUDGET = 256  # publisher frames handled per wake-up
_PAYLOAD_TYPES = {bytes, zmq.Frame}  # a large payload stays the Frame it came in (protocol section 3.2.2)


class PublisherIngest:
    def __init__(self, parts: Parts, fanout: Fanout, gated: bool) -> None:
        """`gated`: acks wait in the confirm gate until what they cover is durable."""
        self.config = parts.config
        self.xid = parts.stream.xid
        self.front = parts.front
        self.sessions = parts.sessions
        self.stats = parts.stats
        self.commands = parts.commands
        self.retention = parts.retention
        self.gate = parts.gate
        self.gated = gated
        self._send = fanout.send
        self._fanout = fanout
        # 0: each delivery leaves at once; n: a drain sends every n frames' deliveries, then their
        # acks, together (exchange.send_held_frames, a prototype of one I/O-thread wake-up per turn).
        self._held_frames = parts.config.send_held_frames
        self.chains = parts.chains
        self._subscribers = fanout.subscribers  # its length is the count every ack carries
        self._acks: dict[bytes, tuple[int, float]] = {}  # connection → (ack due, batch received) this drain

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def drain(self, budget: int = DRAIN_BUDGET) -> None:
        """Handle queued publisher frames, a bounded number per wake-up."""
        if self._held_frames:
            self._drain_held(budget, self._held_frames)
            return
        try:
            self._drain_frames(self.front, budget)
        finally:
            if self._acks:
                self._send_acks()

    def _drain_held(self, budget: int, step: int) -> None:
        """`drain` with exchange.send_held_frames: every `step` frames (and at the end) their
        deliveries go out back to back, then their acks."""
        fanout = self._fanout
        try:
            while budget > 0:
                fanout.hold()
                more = self._drain_frames(self.front, min(step, budget))
                budget -= step
                fanout.release()
                if self._acks:
                    self._send_acks()
                if not more:
                    return
        finally:
            fanout.release()
            if self._acks:
                self._send_acks()

    def _drain_frames(self, front: zmq.Socket, budget: int) -> bool:
        """Handle up to `budget` frames; False once none is left to read."""
        recv = front.recv
        for _ in range(budget):
            try:
                first = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                return False
            frame, block, parts = _rest_of_message(front, first)
            ident = first.bytes
            if frame is None or len(parts) > protocol.MAX_PARTS:
                self.stats.totals.malformed += 1
                self.reply(ident, protocol.encode_publisher_error(
                    protocol.MALFORMED, "expected one frame per message, two for a batch in two parts, and at "
                    f"most {protocol.MAX_PARTS} large payloads' parts after those two"))
                continue
            try:
                self._handle(ident, frame, block, parts)
            except Exception:  # never end the exchange on one frame
                self.stats.totals.internal_errors += 1
                log.exception("unexpected error while handling a publisher frame; going on")
        return True

    def handle(self, ident: bytes, payload: bytes, block: Any = None, parts: Sequence[Any] = ()) -> None:
        """One publisher message, answered (the drain holds acks back to send one per connection)."""
        self._handle(ident, payload, block, parts)
        self._send_acks()

    def _handle(self, ident: bytes, payload: bytes, block: Any = None, parts: Sequence[Any] = ()) -> None:
        """`parts`: the large payloads' parts after a batch's block (pyzmq Frames, passed on as they are)."""
        try:
            frame = protocol.decode_publisher_frame(payload, self.config.max_batch_bytes, block, parts)
        except protocol.RefusedBatch as err:
            self.stats.totals.malformed += 1
            self.reply(ident, protocol.encode_resend(self.sessions.refusal_point(ident, err.publisher),
                                                     protocol.MALFORMED, f"{err} (sequence numbers from "
                                                     f"{err.first_seq} refused)"))
            return
        except ProtocolError as err:
            self.stats.totals.malformed += 1
            self.reply(ident, protocol.encode_publisher_error(err.code, str(err)))
            return
        if isinstance(frame, protocol.Batch):
            self._forward(ident, frame)
        elif isinstance(frame, protocol.Hello):
            self._hello(ident, frame)
        elif self.sessions.bye(ident, frame.publisher):  # only the owner's bye counts
            self.stats.publishers.pop(frame.publisher, None)

    def _hello(self, ident: bytes, hello: protocol.Hello) -> None:
        last, refusal = self.sessions.hello(ident, hello)
        if refusal:
            self.stats.totals.refused_hellos += 1
            self.reply(ident, protocol.encode_publisher_error("refused", refusal))
            return
        self.stats.publishers[hello.publisher] = time.monotonic()
        if self.gated:  # a welcome counts as an ack: name only what is durable
            last = self.gate.welcome_seq(hello.publisher, hello.from_seq - 1)
        self.reply(ident, protocol.encode_welcome(self.xid, last, len(self._subscribers)))

    def _forward(self, ident: bytes, batch: protocol.Batch) -> None:
        pub = batch.publisher
        now = time.monotonic()
        verdict = self.sessions.batch(ident, batch, now)
        if verdict.refused:
            self.stats.totals.refused_batches += 1
            self.reply(ident, protocol.encode_resend(verdict.resend, verdict.code, verdict.message))
            return
        self.stats.publishers[pub] = now
        count = batch.count
        skip = verdict.skip
        purged = self.commands.purged_through(pub)
        if purged >= batch.first_seq + skip:  # resent after a purge dropped them: never again
            skip = min(count, purged - batch.first_seq + 1)
        totals = self.stats.totals
        totals.duplicates += skip
        if skip < count:
            block = None
            if batch.payloads is not None:  # the two-part form: the payloads as one block
                topics = batch.topics()
                payloads = batch.payloads
                if skip:  # resent duplicates: pack the rest again
                    topics, payloads = topics[skip:], payloads[skip:]
                else:
                    block = batch.block
                # A batch that names one topic has it checked once, not once per message (the
                # passes over every message cost the exchange ~30 ns each: docs/benchmarks.md).
                distinct = _valid_topics(topics if isinstance(batch.topic, list) else [batch.topic])
            else:
                topics, payloads = batch.flat[2 * skip::2], batch.flat[2 * skip + 1::2]
                distinct = _valid_topics(topics)
            size = _valid_payloads(payloads, self.config.max_message_bytes) if distinct else -1
            if distinct and size >= 0:
                # The common case, checked with C-level calls instead of a loop per message.
                first = batch.first_seq + skip
                self._send_grouped(pub, batch.sent_ns, list(range(first, first + len(payloads))), topics, distinct,
                                   payloads, size, block, large=bool(batch.parts))
            else:
                self._forward_one_by_one(ident, batch, skip)
            totals.msgs_in += count - skip
            by_publisher = self.stats.interval_by_publisher
            by_publisher[pub] = by_publisher.get(pub, 0) + count - skip
            if batch.sent_ns:  # 0: the publisher does not say when it sent
                self.stats.note_latency(time.time_ns() - batch.sent_ns)
        last = self.sessions.advance(pub, batch.first_seq + count - 1)
        if self.gated:
            self.gate.hold(self.retention.next_pos, ident, pub, last, now)
        else:
            # Acks are cumulative: one per connection per drain, sent once the drain's deliveries went.
            self._acks[ident] = (last, now)

    def _send_grouped(self, pub: str, sent_ns: int, seqs: list[int], topics: list[bytes], distinct: set[bytes],
                      payloads: list[bytes], size: int, block: Any = None,
                      attrs: list[list[Any]] | None = None, large: bool = False) -> None:
        """Accepted messages as one frame per run of the same matching subscriptions (exchange/grouping.py).
        `block`: the payloads as the publisher encoded them, spliced when the batch is one frame.
        `attrs`: [index, priority, not_before_ms, key(, headers)] of messages with attributes.
        `large`: some payloads are parts of their own (Frames), sent on as such."""
        for frame in frames_of(self.chains, seqs, topics, payloads, attrs, distinct):
            if frame.whole:  # the fast path: one frame, the block spliced as it came
                self._send(frame.topic, pub, sent_ns, seqs, payloads, size, frame.attrs, block=block,
                           topics=frame.topics, large=large)
            else:
                self._send(frame.topic, pub, sent_ns, frame.seqs, frame.payloads, sum(map(len, frame.payloads)),
                           frame.attrs, topics=frame.topics, large=large)

    def _forward_one_by_one(self, ident: bytes, batch: protocol.Batch, skip: int) -> None:
        """Attributes or a bad message: check each, reject the bad ones, send the rest grouped."""
        pub, flat, totals = batch.publisher, batch.messages(), self.stats.totals
        count = len(flat) // 2
        seqs: list[int] = []
        topics: list[bytes] = []
        payloads: list[bytes] = []
        attrs: list[list[Any]] = []  # [index among the accepted, priority, not_before_ms, key(, headers)]
        max_size = self.config.max_message_bytes
        for i in range(skip, count):
            topic, payload = flat[2 * i], flat[2 * i + 1]
            seq = batch.first_seq + i
            attributes = None
            headers_size = 0
            if isinstance(topic, list):  # [topic, priority, not_before_ms, key(, headers)]
                try:
                    attributes = protocol.message_attributes(topic)
                    if attributes[4]:
                        headers_size = protocol.headers_size(attributes[4])
                except ProtocolError as err:
                    totals.rejected += 1
                    self.reply(ident, protocol.encode_reject(seq, protocol.MALFORMED, str(err)))
                    continue
                topic = attributes[0]
            problem = _check_message(topic, payload, max_size, headers_size)
            if problem:
                totals.rejected += 1
                self.reply(ident, protocol.encode_reject(seq, problem[0], problem[1]))
                continue
            if attributes is not None and attributes[1:] != (0, 0, b"", None):
                attrs.append([len(seqs), *attributes[1:4]] if attributes[4] is None
                             else [len(seqs), *attributes[1:]])
            seqs.append(seq)
            topics.append(topic)
            payloads.append(payload)
        if seqs:
            self._send_grouped(pub, batch.sent_ns, seqs, topics, set(topics), payloads, sum(map(len, payloads)),
                               attrs=attrs or None, large=bool(batch.parts))

    def _send_acks(self) -> None:
        acks, self._acks = self._acks, {}
        now = time.monotonic()
        for ident, (seq, received) in acks.items():
            self.send_ack(ident, seq, received, now)

    def send_ack(self, ident: bytes, seq: int, received: float, now: float) -> None:
        self._send_reply(ident, protocol.encode_ack(seq, len(self._subscribers)))
        self.stats.note_confirm(now - received)

    def reply(self, ident: bytes, frame: bytes) -> None:
        """Replies leave in the order of the frames they answer: an ack still held for this
        connection goes first."""
        if ident in self._acks:
            self._fanout.flush()  # an ack follows the deliveries it covers
            self.send_ack(ident, *self._acks.pop(ident), time.monotonic())
        self._send_reply(ident, frame)

    def _send_reply(self, ident: bytes, frame: bytes) -> None:
        try:
            self.front.send(ident, _MORE_NOBLOCK)  # once the first part went, the rest goes too
            self.front.send(frame, _NOBLOCK)
        except zmq.ZMQError:
            pass  # the publisher is gone or not reading; acks are cumulative anyway

    def ask_to_move(self, reason: str) -> int:
        """Tell every connected publisher to go to another exchange (before shutdown)."""
        routes = self.sessions.routes()
        for ident in routes:
            self.reply(ident, protocol.encode_move(reason))
        return len(routes)


def _rest_of_message(sock: zmq.Socket, first: zmq.Frame) -> tuple[bytes | None, Any, list[zmq.Frame]]:
    """The parts after the routing id `first`: the frame, a two-part batch's payload block (not
    copied out of libzmq's message: it is spliced into the delivery as it is) and the parts after
    the block. Parts are received as zmq.Frame for their `more` flag: asking the socket (RCVMORE)
    costs a getsockopt per part, twice the time of the whole receive."""
    if not first.more:
        return None, None, []
    part = sock.recv(copy=False)
    frame = part.bytes
    if not part.more:
        return frame, None, []
    part = sock.recv(copy=False)
    return frame, part.buffer, _large_parts(sock) if part.more else []


def _large_parts(sock: zmq.Socket) -> list[zmq.Frame]:
    """The parts after a batch's block (at least one follows), one per large payload (protocol
    section 3.2.2), as libzmq's messages: the fan-out sends the same Frames on, so their bytes are
    never copied. Beyond MAX_PARTS the rest is read and dropped (the caller refuses the message)."""
    parts: list[zmq.Frame] = []
    while True:
        part = sock.recv(copy=False)
        if len(parts) <= protocol.MAX_PARTS:
            parts.append(part)
        if not part.more:
            return parts


def _valid_topics(topics: list[Any]) -> set[bytes] | None:
    """The distinct topics if every message has a valid plain topic (no attributes), else None."""
    if set(map(type, topics)) != {bytes}:
        return None
    distinct = set(topics)
    lowest = min(distinct)  # an empty topic or one starting with NUL sorts first
    return distinct if lowest and lowest[0] != 0 and max(map(len, distinct)) <= MAX_TOPIC_BYTES else None


def _valid_payloads(payloads: list[Any], max_size: int) -> int:
    """The payloads' total size if each is a bytes (or a part of its own) within the size limit, else -1."""
    if not set(map(type, payloads)) <= _PAYLOAD_TYPES:
        return -1
    size = sum(map(len, payloads))
    # A total within the limit means every payload is: the max is only needed for big batches.
    return size if size <= max_size or max(map(len, payloads)) <= max_size else -1


def _check_message(topic: Any, payload: Any, max_size: int, headers_size: int = 0) -> tuple[str, str] | None:
    """Why one message is refused (code, text), None if it is not; its headers count against the
    size limit with its payload."""
    if not isinstance(topic, bytes) or not 0 < len(topic) <= MAX_TOPIC_BYTES or topic[:1] == b"\x00":
        return ("invalid_name", f"topic must be 1-{MAX_TOPIC_BYTES} bytes, not starting with NUL")
    if type(payload) not in _PAYLOAD_TYPES:
        return ("malformed", "payload must be bytes (msgpack bin)")
    if len(payload) + headers_size > max_size:
        with_headers = f" and {headers_size} bytes of headers" if headers_size else ""
        return ("too_large", f"payload of {len(payload)} bytes{with_headers} exceeds "
                             f"exchange.max_message_bytes={max_size}")
    return None
