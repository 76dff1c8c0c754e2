"""Publishing (section 3): a publisher's hello, batch and bye, and the exchange's replies to it."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from roq.errors import ProtocolError
from roq.protocol.attributes import header_map, slot_of
from roq.protocol.codec import (
    ACK,
    DATA_VERSION,
    ERROR,
    MAX_CONTROL_FRAME,
    MAX_SEQ,
    MAX_U64,
    is_int,
    kind_and_version,
    pack,
    unpack,
)
from roq.protocol.fields import Bin, Conversation, Field, Int, Pattern, Str, Test, frame
from roq.protocol.large import MAX_PARTS, resolve

HELLO, BATCH, BYE = "hello", "batch", "bye"
WELCOME, REJECT, RESEND, MOVE = "welcome", "reject", "resend", "move"
TOKEN_MIN, TOKEN_MAX = 16, 64  # bytes of a publisher's secret token

# resend codes: why the exchange holds nothing of a publisher from `next_seq` on
OUT_OF_ORDER = "out_of_order"  # the batch started after next_seq: something before it never arrived
HELLO_REQUIRED = "hello_required"  # this connection has not proved it owns the publisher id
MALFORMED = "malformed"

# A publisher id as publisher_id_for makes it: the only shape an exchange takes in a hello, batch or bye.
PUBLISHER_ID = re.compile(r"p-[0-9a-f]{24}")


def publisher_id_for(token: bytes) -> str:
    """A publisher's id is derived from its secret token: anyone can read the id (it is in every
    delivery), only the token's holder can claim it in a `hello`."""
    return "p-" + hashlib.blake2b(token, digest_size=12).hexdigest()


@dataclass(frozen=True)
class Hello:
    """A publisher's claim of its id on a connection (section 3.2)."""
    publisher: str
    token: bytes
    from_seq: int  # the lowest sequence number the publisher will send on this connection


@dataclass(frozen=True)
class Batch:
    """Consecutive messages of one publisher (section 3.2); each message is checked by the exchange.
    One frame holds them as `flat`; a batch without attributes may come in two parts instead: the
    topics (`topic`: one for every message, or a list of one per message), then the `payloads` as
    one msgpack array (`block`, kept as sent so that the exchange can pass it on to subscribers
    without packing each payload again)."""
    publisher: str
    first_seq: int
    sent_ns: int
    flat: list[Any]  # topic, payload, topic, payload, ... (each message checked by the exchange)
    topic: Any = None  # the two-part form: every message's topic, or a list of one per message ...
    payloads: list[Any] | None = None  # ... the payloads, decoded from ...
    block: Any = None  # ... the second part, a msgpack array of bin (bytes or a buffer)
    # The parts after the block, one per large payload (section 3.2.2): `payloads` holds them in
    # the block's integer slots' places, as received (pyzmq Frames on the exchange).
    parts: tuple[Any, ...] = field(default=(), repr=False)  # not shown: tests/unit/test_protocol_wire.py pins reprs

    @property
    def count(self) -> int:
        return len(self.payloads) if self.payloads is not None else len(self.flat) // 2

    def topics(self) -> list[Any]:
        """A two-part batch's topics, one per message."""
        assert self.payloads is not None
        return self.topic if isinstance(self.topic, list) else [self.topic] * len(self.payloads)

    def messages(self) -> list[Any]:
        """The messages as a flat [topic, payload, ...] list, whatever the form."""
        if self.payloads is None:
            return self.flat
        flat: list[Any] = [None] * (2 * len(self.payloads))
        flat[0::2] = self.topics()
        flat[1::2] = self.payloads
        return flat


@dataclass(frozen=True)
class Bye:
    """A publisher leaving a connection."""
    publisher: str


class RefusedBatch(ProtocolError):
    """A batch whose publisher and first sequence number could be read, refused as a whole:
    the exchange answers `resend` so the publisher knows nothing of it was taken."""

    def __init__(self, message: str, publisher: str, first_seq: int) -> None:
        super().__init__(message)
        self.publisher = publisher
        self.first_seq = first_seq


# ------------------------------------------------ declarations, publisher → exchange

PUBLISHER = Field("publisher_id", Pattern(PUBLISHER_ID, '"p-" and 24 lowercase hex digits (derived from the token)'))
SEQ = Int(1)


def _flat_messages(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0 and len(value) % 2 == 0


PUBLISHER_FRAMES = Conversation(
    "publisher frame",
    frame(HELLO, PUBLISHER, Field("token", Bin(TOKEN_MIN, TOKEN_MAX)), Field("from_seq", SEQ), build=Hello),
    # The hot path: declared for the docs and the checks' wording, decoded by _decode_batch (see the package's
    # docstring for why). `messages` is the flat [topic, payload, ...] array, or a two-part batch's topic.
    frame(BATCH, PUBLISHER, Field("first_seq", SEQ), Field("sent_ns", Int(0, MAX_U64)),
          Field("messages", Test(lambda v: _flat_messages(v) or isinstance(v, bytes),
                                 "a non-empty flat array [topic, payload, ...], or, when the payloads follow in a "
                                 "second part, their topics: one bin for all, or an array of bin, one per payload")),
          rules=[(lambda pid, first, ns, flat: first + (len(flat) // 2 if isinstance(flat, list) else 1) - 1 <= MAX_SEQ,
                  "sequence numbers would pass 2^63-1")],
          build=lambda pid, first, ns, flat: Batch(pid, first, ns, flat)),
    frame(BYE, PUBLISHER, build=Bye),
)
BATCH_FRAME = PUBLISHER_FRAMES.frames[BATCH]


def encode_hello(publisher: str, token: bytes, from_seq: int) -> bytes:
    """`hello`: the id, the token it derives from, and the lowest sequence number still to send."""
    return pack([HELLO, DATA_VERSION, publisher, token, from_seq])


def encode_batch(publisher: str, first_seq: int, sent_ns: int, flat: list[Any]) -> bytes:
    """`batch`: messages first_seq, first_seq+1, ... as [topic, payload, ...] (a topic may be an
    attributed slot: a list, or an `Attributed`)."""
    return msgpack.packb([BATCH, DATA_VERSION, publisher, first_seq, sent_ns, flat], use_bin_type=True,
                         default=slot_of)


def encode_batch_parts(publisher: str, first_seq: int, sent_ns: int, topics: bytes | list[bytes],
                       payloads: list[Any]) -> tuple[bytes, bytes]:
    """`batch` without attributes in two parts: the header with the topics (one bin when every
    message has it, else one per payload), then the payloads as one msgpack array, which the
    exchange splices into its deliveries as it is (section 3.2). A payload slot may be an integer
    when its payload follows as a part of its own (encode_batch_message)."""
    if isinstance(topics, list) and topics.count(topics[0]) == len(topics):
        topics = topics[0]  # one topic: named once
    return (pack([BATCH, DATA_VERSION, publisher, first_seq, sent_ns, topics]),
            msgpack.packb(payloads, use_bin_type=True))


def encode_batch_message(publisher: str, first_seq: int, sent_ns: int, topics: bytes | list[bytes],
                         payloads: list[bytes], large_bytes: int = 0) -> list[bytes]:
    """A batch without attributes as the parts of one ZeroMQ message: encode_batch_parts' two,
    then, when `large_bytes` > 0, each payload of at least that many bytes as a part of its own,
    its slot in the block the part's index (section 3.2.2): never packed, never copied."""
    parts: list[bytes] = []
    if large_bytes > 0 and payloads and max(map(len, payloads)) >= large_bytes:
        payloads, parts = split_large(payloads, large_bytes)
    return [*encode_batch_parts(publisher, first_seq, sent_ns, topics, payloads), *parts]


def split_large(payloads: list[bytes], large_bytes: int) -> tuple[list[Any], list[bytes]]:
    """The payload slots with each payload of at least `large_bytes` replaced by the next integer,
    and those payloads in order."""
    slots: list[Any] = []
    parts: list[bytes] = []
    for payload in payloads:
        if len(payload) >= large_bytes and len(parts) < MAX_PARTS:
            slots.append(len(parts))
            parts.append(payload)
        else:
            slots.append(payload)
    return slots, parts


def encode_bye(publisher: str) -> bytes:
    """`bye`: the publisher leaves this connection."""
    return pack([BYE, DATA_VERSION, publisher])


def unpack_publisher_frame(frame: bytes, max_size: int) -> Any:
    """A publisher frame's msgpack value. A map (a message's headers, section 3.2) is decoded by
    `header_map`: one that is not a valid map of text keys refuses that message alone, when the
    exchange checks it, not the whole batch."""
    if len(frame) > max_size:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the limit of {max_size}")
    try:
        return msgpack.unpackb(frame, raw=False, strict_map_key=False, object_pairs_hook=header_map,
                               unicode_errors="surrogateescape", max_bin_len=max_size, max_str_len=max_size)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"frame is not valid msgpack: {type(exc).__name__}") from None


def decode_publisher_frame(frame: bytes, max_size: int, block: Any = None,
                           parts: Sequence[Any] = ()) -> Hello | Batch | Bye:
    """A publisher's frame, every field checked; ProtocolError (RefusedBatch when it is a batch
    that can be attributed) otherwise. `block`: the second part of a two-part batch (bytes or a
    buffer), None when the message had one part; `parts`: the parts after it (3.2.2)."""
    msg = unpack_publisher_frame(frame, max_size)
    kind = kind_and_version(msg, "publisher frame")
    # One rule for every kind, checked first: a frame naming no valid id cannot be attributed.
    if len(msg) < 3 or not PUBLISHER.type.ok(msg[2]):
        raise ProtocolError(f"publisher id must be {PUBLISHER.type.doc}")
    if kind == BATCH:
        return _decode_batch(msg, msg[2], block, max_size - len(frame), parts)
    if block is not None:
        raise ProtocolError(f"a {kind} is one frame; only a batch has two")
    decoded: Hello | Bye = PUBLISHER_FRAMES.decode(msg)
    return decoded


def _decode_batch(msg: list[Any], publisher: str, block: Any, block_limit: int, parts: Sequence[Any] = ()) -> Batch:
    """BATCH_FRAME's checks, by hand: this is the exchange's hot path."""
    if len(msg) < 4 or not is_int(msg[3], 1):
        raise ProtocolError(f"batch first_seq must be {SEQ.doc}")
    first_seq: int = msg[3]
    if len(msg) != 6:
        raise RefusedBatch(f"batch must be {BATCH_FRAME.layout}", publisher, first_seq)
    sent_ns, flat = msg[4], msg[5]
    if not is_int(sent_ns, 0, MAX_U64):
        raise RefusedBatch("batch sent_ns must be an integer from 0 to 2^64-1 (a msgpack integer, "
                           "not a float)", publisher, first_seq)
    if block is not None or isinstance(flat, bytes):  # the two-part form (a list then names the topics)
        return _decode_two_part_batch(publisher, first_seq, sent_ns, flat, block, block_limit, parts)
    if not _flat_messages(flat):
        raise RefusedBatch("batch messages must be a non-empty flat array [topic, payload, ...]",
                           publisher, first_seq)
    if first_seq + len(flat) // 2 - 1 > MAX_SEQ:
        raise RefusedBatch("batch sequence numbers would pass 2^63-1", publisher, first_seq)
    return Batch(publisher, first_seq, sent_ns, flat)


def _decode_two_part_batch(publisher: str, first_seq: int, sent_ns: int, topics: Any, block: Any,
                           block_limit: int, parts: Sequence[Any] = ()) -> Batch:
    """A batch in two parts: the header names the topics (one bin for all, or one per payload),
    the second part holds the payloads as one msgpack array. The block is decoded here (C-level)
    so that every payload is known to be a bin before the exchange passes the block on."""
    one_topic = isinstance(topics, bytes)
    if block is None or not (one_topic or (isinstance(topics, list) and topics
                                           and set(map(type, topics)) == {bytes})):
        raise RefusedBatch(f"a two-part batch is [\"batch\", {DATA_VERSION}, publisher, first_seq, sent_ns, topics] "
                           "(topics: one bin, or an array of bin, one per payload) then [payload, ...] in a "
                           "second frame", publisher, first_seq)
    if len(parts) > MAX_PARTS:
        raise RefusedBatch(f"batch has {len(parts)} parts after its block; at most {MAX_PARTS}", publisher, first_seq)
    size = len(block) + sum(map(len, parts))
    if size > block_limit:
        raise RefusedBatch(f"batch of {size} payload bytes exceeds exchange.max_batch_bytes",
                           publisher, first_seq)
    try:
        payloads = msgpack.unpackb(block, raw=False, max_bin_len=block_limit, max_str_len=block_limit,
                                   max_array_len=block_limit, max_map_len=0, max_ext_len=0)
    except Exception as exc:
        raise RefusedBatch(f"batch payloads are not one msgpack array: {type(exc).__name__}",
                           publisher, first_seq) from None
    types = set(map(type, payloads)) if isinstance(payloads, list) else set()
    if not payloads or not (types == {bytes} or (parts and types <= {bytes, int})):
        raise RefusedBatch("batch payloads must be a non-empty array of bin (or, for the parts after it, "
                           "integer slots)", publisher, first_seq)
    if parts or int in types:
        try:
            payloads = resolve(payloads, parts, "batch")
        except ProtocolError as exc:
            raise RefusedBatch(str(exc), publisher, first_seq) from None
    if not one_topic and len(topics) != len(payloads):
        raise RefusedBatch(f"batch names {len(topics)} topics for {len(payloads)} payloads: one bin for all, "
                           "or one per payload", publisher, first_seq)
    if first_seq + len(payloads) - 1 > MAX_SEQ:
        raise RefusedBatch("batch sequence numbers would pass 2^63-1", publisher, first_seq)
    if not one_topic and topics.count(topics[0]) == len(topics):
        topics = topics[0]  # one topic after all: the single-topic fast path
    return Batch(publisher, first_seq, sent_ns, [], topics, payloads, block, tuple(parts))


def decode_batch_declared(msg: list[Any], publisher: str) -> Batch:
    """The one-part batch by its declaration alone, with the hand-written decoder's attribution:
    bench/codecs.py measures it against _decode_batch."""
    first_seq = msg[3] if len(msg) > 3 else None
    try:
        batch: Batch = BATCH_FRAME.decode(msg)
    except ProtocolError as exc:
        if isinstance(first_seq, int) and SEQ.ok(first_seq):
            raise RefusedBatch(str(exc), publisher, first_seq) from None
        raise
    return batch


# ------------------------------------------------ exchange → publisher


@dataclass(frozen=True)
class ExchangeReply:
    """One reply to a publisher. `seq` is the welcome's last_seq, the ack's seq, the rejected
    message's seq or the resend's next_seq; `subscribers` comes with welcome and ack."""
    kind: str
    seq: int = 0
    subscribers: int | None = None
    code: str = ""
    message: str = ""
    exchange: str = ""


_COUNT, _TEXT = Int(), Str()
EXCHANGE_REPLIES = Conversation(
    "exchange reply",
    frame(WELCOME, Field("exchange_id", _TEXT), Field("last_seq", _COUNT), Field("subscribers", _COUNT),
          build=lambda xid, last, subscribers: ExchangeReply(WELCOME, last, subscribers, exchange=xid)),
    frame(ACK, Field("seq", _COUNT), Field("subscribers", _COUNT),
          build=lambda seq, subscribers: ExchangeReply(ACK, seq, subscribers)),
    frame(REJECT, Field("seq", _COUNT), Field("code", _TEXT), Field("message", _TEXT),
          build=lambda seq, code, message: ExchangeReply(REJECT, seq, code=code, message=message)),
    frame(RESEND, Field("next_seq", _COUNT), Field("code", _TEXT), Field("message", _TEXT),
          build=lambda seq, code, message: ExchangeReply(RESEND, seq, code=code, message=message)),
    frame(ERROR, Field("code", _TEXT), Field("message", _TEXT),
          build=lambda code, message: ExchangeReply(ERROR, code=code, message=message)),
    frame(MOVE, Field("reason", _TEXT), build=lambda reason: ExchangeReply(MOVE, message=reason)),
)



def encode_welcome(exchange_id: str, last_seq: int, subscribers: int) -> bytes:
    """Answer to `hello`: everything of the publisher up to `last_seq` is held here."""
    return pack([WELCOME, DATA_VERSION, exchange_id, last_seq, subscribers])


def encode_ack(seq: int, subscribers: int) -> bytes:
    """Cumulative confirm: every message up to `seq` was forwarded or rejected one by one."""
    return pack([ACK, DATA_VERSION, seq, subscribers])


def encode_reject(seq: int, code: str, message: str) -> bytes:
    """One message refused (too large, bad topic); it still counts as handled."""
    return pack([REJECT, DATA_VERSION, seq, code, message])


def encode_resend(next_seq: int, code: str, message: str) -> bytes:
    """Nothing from `next_seq` on is held: say hello again if `code` asks, then send from there."""
    return pack([RESEND, DATA_VERSION, next_seq, code, message])


def encode_publisher_error(code: str, message: str) -> bytes:
    """A frame refused that names no sequence numbers (undecodable, a refused hello)."""
    return pack([ERROR, DATA_VERSION, code, message])


def encode_move(reason: str) -> bytes:
    """Please publish to another exchange of the queue (this one is shutting down)."""
    return pack([MOVE, DATA_VERSION, reason])


def decode_exchange_reply(frame: bytes) -> ExchangeReply:
    """Any reply to a publisher, each kind checked field by field."""
    reply: ExchangeReply = EXCHANGE_REPLIES.decode(unpack(frame, MAX_CONTROL_FRAME))
    return reply
