"""The HTTP gateway's data path: a normal RoQ client speaking for HTTP callers.

Publishing: one `Publisher` per queue, shared by every caller, opened on first use and closed
when unused for `web.idle_publisher_seconds` (or, beyond `web.max_publishers` queues, least
recently used first). A request's messages are queued all or none, and it is answered only once
the cluster confirmed them, so a 200 means what a confirm means to a native client. An
`Idempotency-Key` makes a retry safe: a request with a key seen in the last IDEMPOTENCY_SECONDS
(per caller and queue) queues nothing; it waits for the confirm of what the first one queued and
answers the same. A first attempt that timed out waiting (503) is thus finished by its retry.

Streaming: one `Subscriber` per SSE connection. Each event's id is a resume token: what
`Subscriber.position()` holds after that message (per exchange incarnation the stream position,
per publisher the sequence numbers seen), as a full position every DELTA_EVERY events and that
position plus the messages delivered since in between (TokenWriter). A client that reconnects with
it (`Last-Event-ID`) gets the next message and nothing it already had, from any gateway, even one
started since. A token is bounded by what it names, not by its size: at most MAX_TOKEN_PUBLISHERS
publishers (the most recently seen), MAX_TOKEN_RUNS runs and MAX_TOKEN_STREAMS incarnations, counted
while it is decoded; one naming more, or a publisher id no exchange accepts, is refused (400
bad_position) before the stream takes a slot, so a forged token costs a stream no more than an
honest one may.

Peek: the latest retained messages of a topic, read from each exchange's retention.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import msgpack
import zmq

from roq import protocol
from roq.client import Publisher, Subscriber
from roq.client.envelope import message_json, rfc3339
from roq.client.metadata import MetadataClient
from roq.client.subscriber import Message
from roq.client.subscriber.checkpoint import SAVED_RUNS, Checkpoint
from roq.client.subscriber.replay import ReplayClient
from roq.client.subscriber.streams import FetchFailed
from roq.client.topology import QueueTopology
from roq.config import Config
from roq.errors import ConfigError, RoqError, UnavailableError, UserError
from roq.names import check_queue_name, check_topic
from roq_web.limits import Slots

TOKEN_VERSION = "r1."
MAX_TOKEN_CHARS = 256 << 10  # a resume token longer than this is refused before decoding
# What a token may inflate to: the most it may name (below) packs into less than 800 KB.
MAX_POSITION_BYTES = 1 << 20
# What a token may name, counted as it is decoded: its cost as objects, in every stream resumed
# with it, whatever its size in bytes. TokenWriter writes no more (the most recently seen
# publishers, runs shared among them), so a token of ours is never refused for it.
MAX_TOKEN_STREAMS = 1_000  # exchange incarnations (a subscriber's own bound)
MAX_TOKEN_PUBLISHERS = 1_000
MAX_TOKEN_RUNS = 10_000  # runs of sequence numbers, all publishers together
MAX_TOKEN_TEXT = 256  # characters of one name (an incarnation is at most protocol.MAX_INCARNATION)
PUBLISHER_ID = re.compile(r"p-[0-9a-f]{24}")  # every id an exchange accepts (protocol.publisher_id_for)
DELTA_EVERY = 32  # events between two full encodings of a stream's position in its events' ids
DELTA_MARK = "~"
IDEMPOTENCY_SECONDS = 600.0
IDEMPOTENCY_KEYS = 100_000
MAX_IDEMPOTENCY_KEY = 200  # characters
# What one stream may buffer for a slow HTTP client: beyond it the exchange holds, then drops, its
# frames for this subscriber, which fetches them back from retention when the client reads again.
STREAM_INBOX = 2_000  # messages
STREAM_RECEIVE_HWM = 200  # frames in the subscriber's socket
PEEK_WINDOW = 5_000  # frames looked back per exchange
PEEK_MAX = 200  # messages a peek returns at most
# Characters of events sent to a stream in one write: each id holds a position that grows with the
# publishers seen, so a count of events alone would let a large position make each write large.
STREAM_WRITE_CHARS = 256 << 10


class ResumeTokenError(UserError):
    code = "bad_position"


# ------------------------------------------------------------------ resume tokens

def encode_token(position: dict[str, Any]) -> str:
    packed = zlib.compress(msgpack.packb(position, use_bin_type=True), 6)
    return TOKEN_VERSION + _b64(packed)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def decode_token(token: str) -> dict[str, Any]:
    """A position from a resume token (a base position, and the messages delivered since it);
    ResumeTokenError for anything that is not one of ours, or that names more than a token may."""
    if not token.startswith(TOKEN_VERSION) or len(token) > MAX_TOKEN_CHARS:
        raise ResumeTokenError("not a resume token of this gateway (expected the id of an event it sent)")
    base, _, delta = token[len(TOKEN_VERSION):].partition(DELTA_MARK)
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(_unb64(base), MAX_POSITION_BYTES)
        if inflater.unconsumed_tail:
            raise _too_much(f"it inflates to more than {MAX_POSITION_BYTES} bytes")
        if not inflater.eof:
            raise ValueError("truncated")
        position = Checkpoint.from_json(_unpack_bounded(raw))  # validates every field
        _check_named(position)
        if delta:
            _apply_delta(position, msgpack.unpackb(_unb64(delta), raw=False, max_array_len=DELTA_EVERY,
                                                   max_map_len=0, max_str_len=MAX_TOKEN_TEXT, max_bin_len=0,
                                                   max_ext_len=0))
    except TokenTooLargeError as exc:
        raise ResumeTokenError(str(exc)) from None
    except (binascii.Error, ValueError, zlib.error, msgpack.UnpackException, ConfigError, TypeError) as exc:
        raise ResumeTokenError(f"resume token is damaged: {exc}") from None
    return position.to_json()


class TokenTooLargeError(ValueError):
    pass


def _too_much(what: str) -> TokenTooLargeError:
    return TokenTooLargeError(f"resume token refused: {what}; a token may name at most "
                              f"{MAX_TOKEN_PUBLISHERS} publishers, {MAX_TOKEN_RUNS} runs of sequence numbers and "
                              f"{MAX_TOKEN_STREAMS} exchange incarnations (this gateway never writes more)")


def _unpack_bounded(raw: bytes) -> Any:
    """A token's position as plain data, refused as soon as it would hold more than a token may:
    each container's length is checked at its header, before its items are made, and the arrays
    (the runs above all) are counted as they are made."""
    arrays = 0
    most = MAX_TOKEN_RUNS + MAX_TOKEN_PUBLISHERS + 1  # the runs, one list of them per publisher, start_at_sync

    def count(items: list[Any]) -> list[Any]:
        nonlocal arrays
        arrays += 1
        if arrays > most:
            raise _too_much(f"it names more than {MAX_TOKEN_RUNS} runs")
        return items

    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True, list_hook=count,
                               max_map_len=max(MAX_TOKEN_PUBLISHERS, MAX_TOKEN_STREAMS),
                               max_array_len=max(SAVED_RUNS, MAX_TOKEN_STREAMS), max_str_len=MAX_TOKEN_TEXT,
                               max_bin_len=0, max_ext_len=0)
    except ValueError as exc:
        if "exceeds max_" in str(exc):  # msgpack's refusal of a container or string at its header
            raise _too_much(f"it names too much at once ({exc})") from None
        raise


def _check_named(position: Checkpoint) -> None:
    """Only what a stream of this cluster could have seen, and no more of it than a token holds."""
    if len(position.publishers) > MAX_TOKEN_PUBLISHERS:
        raise _too_much(f"it names {len(position.publishers)} publishers")
    if len(position.streams) > MAX_TOKEN_STREAMS:
        raise _too_much(f"it names {len(position.streams)} exchange incarnations")
    for publisher, seen in position.publishers.items():
        _check_publisher(publisher)
        if seen.floor < 0 or any(s < 0 or e > protocol.MAX_SEQ for s, e in zip(seen.starts, seen.ends)):
            raise ValueError(f"sequence numbers of {publisher} out of range")


def _check_publisher(publisher: str) -> None:
    if not PUBLISHER_ID.fullmatch(publisher):
        raise ValueError(f"{publisher[:40]!r} is no publisher id of this cluster")


def _apply_delta(position: Checkpoint, delta: Any) -> None:
    """Mark as seen the messages a delta lists: [[publisher, first_seq, last_seq], ...]."""
    if not isinstance(delta, list) or len(delta) > DELTA_EVERY:
        raise ValueError("bad delta")
    for item in delta:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                and all(isinstance(x, int) and not isinstance(x, bool) for x in item[1:])
                and 1 <= item[1] <= item[2] < item[1] + DELTA_EVERY):
            raise ValueError("bad delta run")
        _check_publisher(item[0])
        seen = position.seen(item[0])
        for seq in range(item[1], item[2] + 1):
            seen.add(seq)


class TokenWriter:
    """The id of each event: the subscriber's full position, encoded at most every DELTA_EVERY
    events, and in between that position plus the (publisher, seq) runs delivered since, so an
    event's id costs little however large the position grows (a stream of a few topics of busy
    publishers keeps many runs of sequence numbers)."""

    def __init__(self, subscriber: Subscriber) -> None:
        self.subscriber = subscriber
        self.base = ""
        self.delta: list[list[Any]] = []
        self.count = DELTA_EVERY

    def after(self, msg: Message) -> str:
        if self.count >= DELTA_EVERY:
            position = self.subscriber.position(max_publishers=MAX_TOKEN_PUBLISHERS, max_runs=MAX_TOKEN_RUNS)
            streams = position["streams"]
            if len(streams) > MAX_TOKEN_STREAMS:  # oldest first: the latest incarnations are kept
                position["streams"] = dict(list(streams.items())[-MAX_TOKEN_STREAMS:])
            self.base, self.delta, self.count = encode_token(position), [], 0
            return self.base  # the position already holds msg
        self.count += 1
        last = self.delta[-1] if self.delta else None
        if last is not None and last[0] == msg.publisher and last[2] + 1 == msg.seq:
            last[2] = msg.seq
        else:
            self.delta.append([msg.publisher, msg.seq, msg.seq])
        return self.base + DELTA_MARK + _b64(msgpack.packb(self.delta))


# ------------------------------------------------------------------ message encoding

def sse_event(msg: Message, token: str) -> str:
    data = json.dumps(message_json(msg.topic_bytes, msg.payload, msg.headers, publisher=msg.publisher, seq=msg.seq,
                                   exchange=msg.exchange, time=rfc3339(msg.sent_ns)), separators=(",", ":"))
    return f"id: {token}\nevent: message\ndata: {data}\n\n"


# ------------------------------------------------------------------ publishing

class Publishers:
    """The gateway's publishers, one per queue."""

    def __init__(self, config: Config, metadata: MetadataClient) -> None:
        self.config = config
        self.metadata = metadata
        self._lock = threading.Lock()
        self._open: OrderedDict[str, tuple[Publisher, float]] = OrderedDict()  # least recently used first
        self._keys = IdempotencyKeys()

    def publish(self, queue: str, topic: str, payloads: list[bytes], caller: str,
                idempotency_key: str | None, headers: list[dict[str, bytes]] | None = None) -> dict[str, Any]:
        """Publish and wait for the confirm; the answer for HTTP. With a key, a retry waits for the
        confirm of what the first attempt queued instead of queuing it again. `headers[i]`: message
        i's headers."""
        check_queue_name(queue)
        check_topic(topic)
        if idempotency_key is None:
            return self._confirmed(*self._queue(queue, topic, payloads, headers), queue, topic)
        if not idempotency_key or len(idempotency_key) > MAX_IDEMPOTENCY_KEY or not idempotency_key.isprintable():
            raise UserError(f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} printable characters")
        entry, first = self._keys.claim((caller, queue, idempotency_key))
        try:
            if first:
                entry.queued = (*self._queue(queue, topic, payloads, headers), topic)
            else:
                entry.wait_queued()  # the first attempt's: nothing is queued twice
            assert entry.queued is not None
            publisher, seqs, first_topic = entry.queued
            answer = self._confirmed(publisher, seqs, queue, first_topic)
        finally:
            entry.settled()
        return answer if first else dict(answer, replayed=True)

    def _queue(self, queue: str, topic: str, payloads: list[bytes],
               headers: list[dict[str, bytes]] | None = None) -> tuple[Publisher, range]:
        publisher = self._publisher(queue)
        return publisher, publisher.publish_all(topic, payloads, timeout=self.config.web.publish_timeout,
                                                headers=headers)  # type: ignore[arg-type]

    def _confirmed(self, publisher: Publisher, seqs: range, queue: str, topic: str) -> dict[str, Any]:
        publisher.wait_confirmed(seqs, self.config.web.publish_timeout)
        return {"queue": queue, "topic": topic, "publisher": publisher.id,
                "first_seq": seqs.start if seqs else None, "last_seq": seqs[-1] if seqs else None,
                "count": len(seqs)}

    def _publisher(self, queue: str) -> Publisher:
        now = time.monotonic()
        with self._lock:
            entry = self._open.pop(queue, None)
            if entry is not None and entry[0].queue_deleted:
                self._close_later(entry[0])
                entry = None
            if entry is None:
                entry = (Publisher(queue, self.config, metadata=self.metadata), now)  # QueueNotFoundError when absent
            self._open[queue] = (entry[0], now)
            while len(self._open) > self.config.web.max_publishers:
                _, (oldest, _) = self._open.popitem(last=False)
                self._close_later(oldest)
            return entry[0]

    def close_idle(self) -> None:
        limit = time.monotonic() - self.config.web.idle_publisher_seconds
        with self._lock:
            idle = [q for q, (_, used) in self._open.items() if used < limit]
            for queue in idle:
                self._close_later(self._open.pop(queue)[0])

    def _close_later(self, publisher: Publisher) -> None:
        """Close off the caller's thread: the flush may wait for confirms. A closed publisher still
        answers wait_confirmed() for what it had confirmed, so a retry by key finds it."""
        threading.Thread(target=publisher.close, kwargs={"timeout": self.config.web.publish_timeout},
                         name="close-publisher", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            open_now = [p for p, _ in self._open.values()]
            self._open.clear()
        for publisher in open_now:
            try:
                publisher.close(timeout=self.config.web.publish_timeout)
            except RoqError:
                pass  # their callers were answered 503 already, or are waiting and will be


class KeyEntry:
    """What the first request with an idempotency key queued; later ones wait for it."""

    def __init__(self, expires: float) -> None:
        self.expires = expires
        self.queued: tuple[Publisher, range, str] | None = None  # and the topic it was published to
        self._first_done = threading.Event()

    def wait_queued(self) -> None:
        self._first_done.wait()
        if self.queued is None:  # the first attempt queued nothing (it was refused): ours fails the same way
            raise UnavailableError("the first request with this Idempotency-Key failed before publishing: "
                                   "retry with a new key, or the same one after a moment")

    def settled(self) -> None:
        self._first_done.set()

    @property
    def refused(self) -> bool:
        """The first attempt ended having queued nothing."""
        return self._first_done.is_set() and self.queued is None


class IdempotencyKeys:
    """Keys seen in the last IDEMPOTENCY_SECONDS (at most IDEMPOTENCY_KEYS), oldest forgotten first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str, str], KeyEntry] = OrderedDict()

    def claim(self, key: tuple[str, str, str]) -> tuple[KeyEntry, bool]:
        """The key's entry, and whether this caller is its first (and must publish)."""
        now = time.monotonic()
        with self._lock:
            entries = self._entries
            while entries and (len(entries) >= IDEMPOTENCY_KEYS or next(iter(entries.values())).expires < now):
                entries.popitem(last=False)
            entry = entries.get(key)
            if entry is not None and entry.refused:
                entry = None  # the first attempt published nothing: this one may
            if entry is not None:
                return entry, False
            entry = entries[key] = KeyEntry(now + IDEMPOTENCY_SECONDS)
            return entry, True


# ------------------------------------------------------------------ streaming

class StreamLimitError(UnavailableError):
    code = "too_many_streams"


class Streams:
    """The open SSE subscriptions: at most web.max_streams, web.max_streams_per_client per caller.
    A resume token is decoded (and refused) before a slot is taken."""

    def __init__(self, config: Config, metadata: MetadataClient) -> None:
        self.config = config
        self._subscriber_config = config.replace(client={
            "receive_hwm": min(config.client.receive_hwm, STREAM_RECEIVE_HWM)})
        self.metadata = metadata
        self.slots = Slots("streams", config.web.max_streams, config.web.max_streams_per_client,
                           ("web.max_streams", "web.max_streams_per_client"), busy=StreamLimitError)

    def open(self, queue: str, topics: list[str], start: str | datetime, token: str | None,
             caller: str) -> Subscriber:
        check_queue_name(queue)
        position = decode_token(token) if token else None
        self.slots.take(caller)
        try:
            return Subscriber(queue, self._subscriber_config, topics=topics, metadata=self.metadata, position=position,
                              start=start, inbox_limit=STREAM_INBOX)
        except BaseException:
            self.slots.give_back(caller)
            raise

    def close(self, subscriber: Subscriber, caller: str) -> None:
        try:
            subscriber.close()
        finally:
            self.slots.give_back(caller)


def next_events(subscriber: Subscriber, tokens: TokenWriter, wait: float, max_events: int = 500) -> list[str]:
    """SSE events for the messages ready now (waiting up to `wait` for the first), each with the
    resume token of the position just after it, at most `max_events` and STREAM_WRITE_CHARS; a
    `gap` event first when messages of the stream's topics were evicted from retention before it
    could fetch them."""
    events: list[str] = []
    gaps = subscriber.gaps
    size = 0
    msg = subscriber.receive(timeout=wait)
    while msg is not None:
        events.append(sse_event(msg, tokens.after(msg)))
        size += len(events[-1])
        if len(events) >= max_events or size >= STREAM_WRITE_CHARS:
            break
        msg = subscriber.receive(timeout=0)
    lost = subscriber.gaps - gaps
    if lost > 0:
        events.insert(0, f"event: gap\ndata: {json.dumps({'lost': lost})}\n\n")
    return events


# ------------------------------------------------------------------ peek

def peek(config: Config, metadata: MetadataClient, queue: str, topic: str, limit: int) -> list[dict[str, Any]]:
    """The latest `limit` retained messages whose topic starts with `topic`, oldest first, taken from
    the tail of each running exchange's retention (PEEK_WINDOW frames back at most)."""
    check_queue_name(queue)
    prefix = check_topic(topic) if topic else b""  # no topic: every topic
    limit = max(1, min(limit, PEEK_MAX))
    live = QueueTopology(metadata, queue).snapshot()  # QueueNotFoundError when absent
    context = zmq.Context()
    replay = ReplayClient(config, lambda: live, lambda: False)
    replay.bind(context)
    found: list[tuple[int, dict[str, Any]]] = []
    try:
        for xid in sorted(live):
            found += _peek_exchange(replay, xid, prefix, limit)
    finally:
        replay.close()
        context.destroy(linger=0)
    found.sort(key=lambda item: item[0])  # by the time the publisher sent them
    return [message for _, message in found[-limit:]]


def _peek_exchange(replay: ReplayClient, xid: str, prefix: bytes, limit: int) -> list[tuple[int, dict[str, Any]]]:
    try:
        where = replay.position(xid, [prefix])
        after = max(where.oldest - 1, where.last[0] - PEEK_WINDOW, 0)
        messages: list[tuple[int, dict[str, Any]]] = []
        for page in replay.fetch(xid, where.incarnation, after, where.next_pos, prefix):
            for topic, body in page.frames:
                messages += _frame_messages(topic, body, prefix)
            messages = messages[-limit:]
        return messages
    except (FetchFailed, RoqError):
        return []  # an exchange that does not answer now shows nothing: a peek is a glance


def _frame_messages(routing: bytes, body: bytes, prefix: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """The messages of `prefix` in a fetched frame (one of many topics may hold others too)."""
    d = protocol.decode_delivery(body).matching(routing, (prefix,))
    if d is None:
        return
    headers = d.headers() or [{}] * len(d.seqs)
    for topic, seq, payload, own in zip(d.message_topics(routing), d.seqs, d.payloads, headers):
        yield d.sent_ns, message_json(topic, payload, own, publisher=d.publisher, seq=seq, exchange=d.exchange,
                                      pos=d.pos, time=rfc3339(d.sent_ns))

