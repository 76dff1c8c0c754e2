"""Subscribing (section 4): deliveries, and the `sync` and `beat` markers, exchange → subscriber."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from roq.errors import ProtocolError
from roq.protocol.attributes import MAX_KEY, MAX_PRIORITY, message_headers, valid_headers
from roq.protocol.codec import DATA_VERSION, MAX_CONTROL_FRAME, MAX_TOPIC, MAX_U64, all_ints, is_int, pack, unpack
from roq.protocol.fields import Array, Bin, Conversation, Field, Int, ListOf, Nullable, Str, Test, frame

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
                    sent_ns: int, seqs: list[int], payloads: list[bytes], attrs: list[list[Any]] | None) -> Delivery:
    return Delivery(exchange_id, incarnation, pos, {c[0]: c[1] for c in chains}, publisher, sent_ns, seqs, payloads,
                    attrs)


DELIVERIES = Conversation(
    "delivery",
    # The hot path: declared for the docs and the checks' wording, decoded by decode_delivery (see the package's
    # docstring for why).
    frame(DELIVERY, Field("exchange_id", Str()), Field("incarnation", Str()), Field("pos", Int(1)),
          Field("chains", ListOf(Array(Field("prefix_length", Int(0, MAX_TOPIC)), Field("prev", Int())))),
          Field("publisher_id", Str()), Field("sent_ns", Int(0, MAX_U64)),
          Field("seqs", ListOf(Int(1)), shown="[seq, ...]"), Field("payloads", ListOf(Bin()), shown="[payload, ...]"),
          Field("attrs", Nullable(ATTRS), optional=True),
          rules=[(lambda x, i, pos, chains, *_: _chains_below(pos, chains), "chains' prev must be below pos"),
                 (lambda *v: len(v[6]) == len(v[7]), "seqs and payloads must be of equal length"),
                 (lambda *v: _attrs_within(len(v[6]), v[8]), "attrs' index must be below the number of messages")],
          build=_build_delivery),
)
DELIVERY_FRAME = DELIVERIES.frames[DELIVERY]


def encode_delivery(exchange_id: str, incarnation: str, pos: int, chains: list[list[int]], publisher: str,
                    sent_ns: int, seqs: list[int], payloads: list[bytes],
                    attrs: list[list[Any]] | None = None) -> bytes:
    """A frame of messages for subscribers; `chains` as PrefixChains.links gives them. `attrs`, when
    some message has attributes, rides along as an eleventh element."""
    if attrs:
        return pack([DELIVERY, DATA_VERSION, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs,
                     payloads, attrs])
    return pack([DELIVERY, DATA_VERSION, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs, payloads])


_FIXARRAY = 0x90  # msgpack's array header for 0-15 elements: this byte + the count


def encode_delivery_spliced(exchange_id: str, incarnation: str, pos: int, chains: list[list[int]],
                            publisher: str, sent_ns: int, seqs: list[int], block: Any) -> bytes:
    """encode_delivery's bytes, exactly, with the payloads given as their msgpack array already
    encoded (a two-part batch's second part): the array is copied once, not packed again."""
    head = pack([DELIVERY, DATA_VERSION, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs])
    # The nine fields' array becomes a ten-field one whose last element is the block.
    return b"".join((bytes((_FIXARRAY | 10,)), memoryview(head)[1:], block))


def unpack_delivery(frame: bytes | memoryview) -> Any:
    try:
        return msgpack.unpackb(frame, raw=False)
    except Exception:
        raise ProtocolError("delivery is not valid msgpack") from None


def decode_delivery(frame: bytes | memoryview) -> Delivery:
    """A delivery body, every field checked (section 4.2): DELIVERY_FRAME's checks by hand, since
    every subscriber runs this once per frame."""
    msg = unpack_delivery(frame)
    if not isinstance(msg, list) or len(msg) not in (10, 11) or msg[0] != DELIVERY or msg[1] != DATA_VERSION:
        raise ProtocolError(f"delivery must be {DELIVERY_FRAME.layout}, attrs?")
    _, _, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs, payloads = msg[:10]
    attrs = msg[10] if len(msg) == 11 else None
    if attrs is not None and not _delivery_attrs(attrs, len(seqs) if isinstance(seqs, list) else 0):
        raise ProtocolError("delivery attrs must be [[index, priority, not_before_ms, key], ...]")
    if not is_int(pos, 1) or not isinstance(incarnation, str) or not isinstance(exchange_id, str) \
            or not isinstance(publisher, str) or not is_int(sent_ns, 0, MAX_U64):
        raise ProtocolError("delivery pos must be a positive integer, exchange, incarnation and publisher strings")
    if not isinstance(chains, list) or not all(
            isinstance(c, list) and len(c) == 2 and is_int(c[0], 0, MAX_TOPIC) and is_int(c[1], 0, pos - 1)
            for c in chains):
        raise ProtocolError("delivery chains must be [[prefix_length, prev < pos], ...]")
    if not isinstance(seqs, list) or not isinstance(payloads, list) or len(seqs) != len(payloads) \
            or not all_ints(seqs, 1) or (payloads and set(map(type, payloads)) != {bytes}):
        raise ProtocolError("delivery seqs and payloads must be lists of equal length (integers, bin)")
    return _build_delivery(exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs, payloads, attrs)


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
