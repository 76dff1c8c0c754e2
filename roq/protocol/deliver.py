"""Subscribing (section 4): deliveries, and the `sync` and `beat` markers, exchange → subscriber."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from roq.errors import ProtocolError
from roq.protocol.attributes import MAX_KEY, MAX_PRIORITY, message_headers, valid_headers
from roq.protocol.codec import (
    DATA_VERSION,
    MAX_CONTROL_FRAME,
    MAX_TOPIC,
    MAX_U64,
    all_ints,
    is_int,
    pack,
    unpack,
    version_refusal,
)
from roq.protocol.fields import Array, Bin, Conversation, Field, Int, ListOf, Nullable, Str, Test, frame
from roq.protocol.large import MAX_PARTS, LargeBody, as_bytes, as_view, resolve

DELIVERY, SYNC, BEAT = "delivery", "sync", "beat"
SYNC_PREFIX = b"\x00roq.sync/"  # user topics never start with NUL (roq.names.check_topic)
BEAT_TOPIC = b"\x00roq.beat"


@dataclass(frozen=True)
class Delivery:
    """A decoded delivery (section 4.2)."""
    exchange: str
    incarnation: str
    pos: int
    chains: dict[int, int]  # prefix length → prev: no frame of that prefix lies in (prev, pos)
    publisher: str
    sent_ns: int
    seqs: list[int]
    payloads: list[bytes]
    # [index, priority, not_before_ms, key] or [index, priority, not_before_ms, key, headers] of the messages
    # published with attributes (priority, not-before and key only matter to groups)
    attrs: list[list[Any]] | None = None
    # Each message's topic when they differ (each starts with the frame's routing topic, the
    # ZeroMQ frame before the body); None when every message has the routing topic.
    topics: list[bytes] | None = None

    def message_topics(self, routing: bytes) -> list[bytes]:
        """Each message's topic, given the frame's routing topic."""
        return self.topics if self.topics is not None else [routing] * len(self.seqs)

    def matching(self, routing: bytes, prefixes: tuple[bytes, ...]) -> Delivery | None:
        """The frame with only the messages whose topic starts with one of `prefixes` (all when
        empty), None when it holds none: what of a fetched frame is a reader's (section 5)."""
        if not prefixes or routing.startswith(prefixes):
            return self
        if self.topics is None:
            return None
        keep = [i for i, topic in enumerate(self.topics) if topic.startswith(prefixes)]
        if not keep:
            return None
        return self if len(keep) == len(self.topics) else self.only(keep)

    def only(self, keep: list[int]) -> Delivery:
        """The same frame with messages `keep` (indexes, ascending) alone: what of a fetched frame
        is a prefix's. The attrs' indexes are renumbered; topics stay per message."""
        at = {old: new for new, old in enumerate(keep)}
        attrs = [[at[a[0]], *a[1:]] for a in self.attrs if a[0] in at] if self.attrs else None
        return Delivery(self.exchange, self.incarnation, self.pos, self.chains, self.publisher, self.sent_ns,
                        [self.seqs[i] for i in keep], [self.payloads[i] for i in keep], attrs or None,
                        [self.topics[i] for i in keep] if self.topics is not None else None)

    def headers(self) -> list[dict[str, bytes]] | None:
        """Each message's headers ({} for one without), None when no message has any."""
        return message_headers(self.attrs, len(self.seqs))


ATTRS = ListOf(Array(Field("index", Int()), Field("priority", Int(0, MAX_PRIORITY)), Field("not_before_ms", Int()),
                     Field("key", Bin(0, MAX_KEY)),
                     Field("headers", Test(valid_headers, "a headers map (section 3.2.1)"), optional=True)))


def _chains_below(pos: int, chains: list[list[int]]) -> bool:
    return all(prev < pos for _, prev in chains)


def _attrs_within(count: int, attrs: list[list[Any]] | None) -> bool:
    """Each attrs entry's index names one of the `count` messages (0 when there are none)."""
    return attrs is None or all(a[0] <= max(count - 1, 0) for a in attrs)


def _build_delivery(exchange_id: str, incarnation: str, pos: int, chains: list[list[int]], publisher: str,
                    sent_ns: int, seqs: list[int], payloads: list[bytes], topics: list[bytes] | None,
                    attrs: list[list[Any]] | None = None) -> Delivery:
    return Delivery(exchange_id, incarnation, pos, {c[0]: c[1] for c in chains}, publisher, sent_ns, seqs, payloads,
                    attrs, topics)


def _topics_ok(topics: Any, count: int) -> bool:
    """nil, or one bin topic (1-255 bytes) per message."""
    if topics is None:
        return True
    return isinstance(topics, list) and len(topics) == count and (not topics or set(map(type, topics)) == {bytes}) \
        and 0 < min(map(len, topics), default=1) and max(map(len, topics), default=0) <= MAX_TOPIC


DELIVERIES = Conversation(
    "delivery",
    # The hot path: declared for the docs and the checks' wording, decoded by decode_delivery (see the package's
    # docstring for why).
    frame(DELIVERY, Field("exchange_id", Str()), Field("incarnation", Str()), Field("pos", Int(1)),
          Field("chains", ListOf(Array(Field("prefix_length", Int(0, MAX_TOPIC)), Field("prev", Int())))),
          Field("publisher_id", Str()), Field("sent_ns", Int(0, MAX_U64)),
          Field("seqs", ListOf(Int(1)), shown="[seq, ...]"), Field("payloads", ListOf(Bin()), shown="[payload, ...]"),
          Field("topics", Nullable(ListOf(Bin(1, MAX_TOPIC))), shown="nil | [topic, ...]"),
          Field("attrs", Nullable(ATTRS), optional=True),
          rules=[(lambda x, i, pos, chains, *_: _chains_below(pos, chains), "chains' prev must be below pos"),
                 (lambda *v: len(v[6]) == len(v[7]), "seqs and payloads must be of equal length"),
                 (lambda *v: v[8] is None or len(v[8]) == len(v[6]), "topics must be nil or one per message"),
                 (lambda *v: _attrs_within(len(v[6]), v[9]), "attrs' index must be below the number of messages")],
          build=_build_delivery),
)
DELIVERY_FRAME = DELIVERIES.frames[DELIVERY]


def encode_delivery(exchange_id: str, incarnation: str, pos: int, chains: list[list[int]], publisher: str,
                    sent_ns: int, seqs: list[int], payloads: list[bytes],
                    attrs: list[list[Any]] | None = None, topics: list[bytes] | None = None) -> bytes:
    """A frame of messages for subscribers; `chains` as PrefixChains.links gives them. `topics`: one
    per message when they differ from the routing topic (None: all have it). `attrs`, when some
    message has attributes, rides along as a twelfth element."""
    if attrs:
        return pack([DELIVERY, DATA_VERSION, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs,
                     payloads, topics, attrs])
    return pack([DELIVERY, DATA_VERSION, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs, payloads,
                 topics])


_PAYLOAD_TYPES = {bytes, memoryview}  # memoryview: a large payload's part, read-only (decode_delivery's views)
_FIXARRAY = 0x90  # msgpack's array header for 0-15 elements: this byte + the count
_NIL = b"\xc0"


def encode_delivery_spliced(exchange_id: str, incarnation: str, pos: int, chains: list[list[int]],
                            publisher: str, sent_ns: int, seqs: list[int], block: Any,
                            topics: list[bytes] | None = None) -> bytes:
    """encode_delivery's bytes, exactly, with the payloads given as their msgpack array already
    encoded (a two-part batch's second part): the array is copied once, not packed again. Its
    integer slots (large payloads, section 3.2.2) stay as they are: the batch's parts follow the
    delivery in the same order."""
    head = pack([DELIVERY, DATA_VERSION, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs])
    # The nine fields' array becomes an eleven-field one: the block, then the topics.
    return b"".join((bytes((_FIXARRAY | 11,)), memoryview(head)[1:], block, _NIL if topics is None else pack(topics)))


def unpack_delivery(frame: bytes | memoryview) -> Any:
    try:
        return msgpack.unpackb(frame, raw=False)
    except Exception:
        raise ProtocolError("delivery is not valid msgpack") from None


def decode_delivery(frame: bytes | memoryview | LargeBody, parts: Sequence[Any] = (), views: bool = False) -> Delivery:
    """A delivery body, every field checked (section 4.2): DELIVERY_FRAME's checks by hand, since
    every subscriber runs this once per frame. `parts`: the ZeroMQ parts after the body, one per
    integer payload slot (a large payload's, section 4.2); each payload is then their bytes, taken
    once (a LargeBody brings its own parts), or with `views` a read-only view of the part (no
    copy; the view keeps the part alive)."""
    if isinstance(frame, LargeBody):
        msg, parts = unpack_delivery(frame.body), frame.parts
    else:
        msg = unpack_delivery(frame)
    if not isinstance(msg, list) or len(msg) not in (11, 12) or msg[0] != DELIVERY or msg[1] != DATA_VERSION:
        if isinstance(msg, list) and len(msg) > 1 and msg[0] == DELIVERY and msg[1] != DATA_VERSION:
            raise ProtocolError(version_refusal(msg[1]))
        raise ProtocolError(f"delivery must be {DELIVERY_FRAME.layout}")
    _, _, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs, payloads, topics = msg[:11]
    attrs = msg[11] if len(msg) == 12 else None
    if attrs is not None and not _delivery_attrs(attrs, len(seqs) if isinstance(seqs, list) else 0):
        raise ProtocolError("delivery attrs must be [[index, priority, not_before_ms, key], ...]")
    if not is_int(pos, 1) or not isinstance(incarnation, str) or not isinstance(exchange_id, str) \
            or not isinstance(publisher, str) or not is_int(sent_ns, 0, MAX_U64):
        raise ProtocolError("delivery pos must be a positive integer, exchange, incarnation and publisher strings")
    if not isinstance(chains, list) or not all(
            isinstance(c, list) and len(c) == 2 and is_int(c[0], 0, MAX_TOPIC) and is_int(c[1], 0, pos - 1)
            for c in chains):
        raise ProtocolError("delivery chains must be [[prefix_length, prev < pos], ...]")
    if len(parts) > MAX_PARTS:
        raise ProtocolError(f"delivery has {len(parts)} parts after its body; at most {MAX_PARTS}")
    if isinstance(payloads, list) and (parts or int in set(map(type, payloads))):
        taken = as_view if views else as_bytes
        payloads = [taken(p) if type(p) is not bytes else p for p in resolve(payloads, parts, "delivery")]
    if not isinstance(seqs, list) or not isinstance(payloads, list) or len(seqs) != len(payloads) \
            or not all_ints(seqs, 1) or (payloads and not set(map(type, payloads)) <= _PAYLOAD_TYPES):
        raise ProtocolError("delivery seqs and payloads must be lists of equal length (integers, bin)")
    if not _topics_ok(topics, len(seqs)):
        raise ProtocolError(f"delivery topics must be nil or one bin (1-{MAX_TOPIC} bytes) per message")
    return _build_delivery(exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs, payloads, topics, attrs)


def topic_counts(topics: list[bytes]) -> tuple[tuple[bytes, int], ...] | None:
    """A frame's distinct topics with their message counts, None for a frame of one topic: what
    retention and tombstones keep so that a fetch finds a prefix's messages without decoding."""
    counts = Counter(topics)
    return tuple(counts.items()) if len(counts) > 1 else None


def body_topics(body: bytes | memoryview | LargeBody) -> tuple[tuple[bytes, int], ...] | None:
    """topic_counts of a retained delivery body (a replica's copy, a journal's record); None when
    it holds one topic or cannot be read."""
    if isinstance(body, LargeBody):
        body = body.body
    try:
        msg = msgpack.unpackb(body, raw=False)
    except Exception:
        return None
    if isinstance(msg, list) and len(msg) > 10 and isinstance(msg[10], list) and msg[10]:
        return topic_counts([t for t in msg[10] if isinstance(t, bytes)])
    return None


def _delivery_attrs(attrs: Any, count: int) -> bool:
    return ATTRS.ok(attrs) and _attrs_within(count, attrs)


def decode_delivery_declared(frame: bytes | memoryview) -> Delivery:
    """decode_delivery by DELIVERY_FRAME alone: bench/codecs.py measures one against the other."""
    delivery: Delivery = DELIVERIES.decode(unpack_delivery(frame))
    return delivery


@dataclass(frozen=True)
class Sync:
    """A decoded `sync` or `beat`: the position the exchange's next frame will take."""
    exchange: str
    incarnation: str
    next_pos: int


_MARKER_FIELDS = (Field("exchange_id", Str()), Field("incarnation", Str()), Field("next_pos", Int(1)))
MARKERS = {kind: Conversation(kind, frame(kind, *_MARKER_FIELDS, build=Sync)) for kind in (SYNC, BEAT)}


def sync_topic(subscriber_id: str) -> bytes:
    """The private marker topic whose subscription the exchange answers with `sync`."""
    return SYNC_PREFIX + subscriber_id.encode()


def encode_sync(exchange_id: str, incarnation: str, next_pos: int, kind: str = SYNC) -> bytes:
    """A sync answer (or, kind=BEAT, a heartbeat): the position the next frame will take."""
    return pack([kind, DATA_VERSION, exchange_id, incarnation, next_pos])


def decode_sync(frame: bytes | memoryview, kind: str = SYNC) -> Sync:
    """A sync answer, or (kind=BEAT) a heartbeat: both tell the next position."""
    sync: Sync = MARKERS[kind].decode(unpack(frame, MAX_CONTROL_FRAME))
    return sync
