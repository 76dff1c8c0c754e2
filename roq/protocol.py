"""Wire formats: the control API and the data path. Specified in docs/protocol.md.

Every frame is one msgpack value. Decoders validate shape and types and raise
`ProtocolError` with a reason; they never trust a peer.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from roq.errors import ProtocolError, RoqError, UserError
from roq.names import is_name

VERSION = 1
MAX_CONTROL_FRAME = 1 << 20  # control requests are small; refuse anything bigger

# ---------------------------------------------------------------- helpers


def pack(value: Any) -> bytes:
    """One frame body: msgpack with `bin` for bytes and `str` for text."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(frame: bytes | memoryview, max_size: int) -> Any:
    """Decode one frame body of at most `max_size` bytes; ProtocolError on anything else."""
    if len(frame) > max_size:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the limit of {max_size}")
    try:
        return msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=max_size,
                               max_str_len=max_size)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"frame is not valid msgpack: {type(exc).__name__}") from None


# ---------------------------------------------------------------- control API


@dataclass(frozen=True)
class Request:
    """A decoded control request (section 2)."""
    id: int
    op: str
    args: dict[str, Any]
    key: str | None = None  # the same for every retry of one logical call: writes apply once


# A request key becomes a znode name: ZooKeeper-safe characters only (a uuid4 hex fits).
_KEY = re.compile(r"[A-Za-z0-9_-]{8,64}")


def encode_request(req_id: int, op: str, args: dict[str, Any] | None = None, key: str | None = None) -> bytes:
    """A control request; `key` makes a write idempotent across retries (same key = same request)."""
    msg = {"v": VERSION, "id": req_id, "op": op, "args": args or {}}
    if key is not None:
        msg["key"] = key
    return pack(msg)


def decode_request(frame: bytes) -> Request:
    """A control request, checked: version, integer id, string op, map args, optional key."""
    msg = unpack(frame, MAX_CONTROL_FRAME)
    if not isinstance(msg, dict):
        raise ProtocolError("request must be a map")
    if msg.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {msg.get('v')!r}, this server speaks {VERSION}")
    req_id, op, args = msg.get("id"), msg.get("op"), msg.get("args", {})
    if not isinstance(req_id, int) or isinstance(req_id, bool):
        raise ProtocolError("request id must be an integer")
    if not isinstance(op, str):
        raise ProtocolError("request op must be a string")
    if not isinstance(args, dict):
        raise ProtocolError("request args must be a map")
    key = msg.get("key")
    if key is not None and not (isinstance(key, str) and _KEY.fullmatch(key)):
        raise ProtocolError("request key must be a string of 8-64 letters, digits, '_' or '-'")
    return Request(req_id, op, args, key)


def request_id_of(frame: bytes) -> int | None:
    """Best-effort id of a request that failed to decode, so the error can be matched."""
    try:
        msg = msgpack.unpackb(frame, raw=False) if len(frame) <= MAX_CONTROL_FRAME else None
    except Exception:
        return None
    rid = msg.get("id") if isinstance(msg, dict) else None
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else None


def encode_reply(req_id: int | None, result: Any) -> bytes:
    """A successful control reply echoing the request id."""
    return pack({"v": VERSION, "id": req_id, "ok": True, "result": result})


def encode_error(req_id: int | None, err: RoqError) -> bytes:
    """A control error reply: the error's code and message (and the leader, for not_leader)."""
    body = {"code": err.code, "message": str(err)}
    leader = getattr(err, "leader", None)
    if leader:
        body["leader"] = leader
    return pack({"v": VERSION, "id": req_id, "ok": False, "error": body})


@dataclass(frozen=True)
class Reply:
    """A decoded control reply: `result` when ok, else `code`, `message` and maybe `leader`."""
    id: int | None
    ok: bool
    result: Any = None
    code: str = ""
    message: str = ""
    leader: str | None = None


def decode_reply(frame: bytes) -> Reply:
    """A control reply, checked enough to route it by id and raise its error."""
    msg = unpack(frame, 64 << 20)
    if not isinstance(msg, dict) or not isinstance(msg.get("ok"), bool):
        raise ProtocolError("reply must be a map with a boolean 'ok'")
    if msg["ok"]:
        return Reply(msg.get("id"), True, msg.get("result"))
    error = msg.get("error")
    if not isinstance(error, dict):
        raise ProtocolError("error reply without an error map")
    return Reply(msg.get("id"), False, code=str(error.get("code", "internal")),
                 message=str(error.get("message", "")), leader=error.get("leader"))


# ---------------------------------------------------------------- data path
# Specified in docs/protocol.md (sections 3-5). One layout rule: every data-path body is a
# msgpack array [kind, DATA_VERSION, ...fields] (a delivery's topic travels in the ZeroMQ frame
# before its body, so that libzmq can filter by prefix). Every integer a peer sends is
# range-checked here, so nothing downstream can overflow or loop on it.

DATA_VERSION = 2
MAX_SEQ = (1 << 63) - 1  # sequence numbers, positions and request ids fit a signed 64-bit integer
MAX_U64 = (1 << 64) - 1  # sent_ns: nanoseconds since the epoch, a msgpack uint64
TOKEN_MIN, TOKEN_MAX = 16, 64  # bytes of a publisher's secret token
MAX_PREFIXES = 1024  # prefixes per fetch or position request
MAX_TOPIC = 255

HELLO, BATCH, BYE = "hello", "batch", "bye"
WELCOME, ACK, REJECT, RESEND, ERROR, MOVE = "welcome", "ack", "reject", "resend", "error", "move"
SYNC, BEAT, FETCH, FRAMES, POSITION = "sync", "beat", "fetch", "frames", "position"
PROGRESS = "progress"
MAX_CONSUMER_NAME = 63  # a durable subscriber's name (roq.names.check_subscriber_name)
DELIVERY = "delivery"
SYNC_PREFIX = b"\x00roq.sync/"  # user topics never start with NUL (roq.names.check_topic)
BEAT_TOPIC = b"\x00roq.beat"

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


def _is_int(value: Any, low: int = 0, high: int = MAX_SEQ) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _all_ints(values: list[Any], low: int = 0, high: int = MAX_SEQ) -> bool:
    """_is_int of every value, with C-level passes instead of a call per value (a delivery's
    sequence numbers: one per message)."""
    return not values or (set(map(type, values)) == {int} and low <= min(values) and max(values) <= high)


def _kind_and_version(msg: Any, what: str) -> str:
    if not isinstance(msg, list) or len(msg) < 2 or not isinstance(msg[0], str):
        raise ProtocolError(f"{what} must be an array [kind, version, ...]")
    if msg[1] != DATA_VERSION:
        raise ProtocolError(f"unsupported protocol version {msg[1]!r}, this peer speaks {DATA_VERSION}")
    return msg[0]


# ------------------------------------------------ publisher → exchange


@dataclass(frozen=True)
class Hello:
    """A publisher's claim of its id on a connection (section 3.2)."""
    publisher: str
    token: bytes
    from_seq: int  # the lowest sequence number the publisher will send on this connection


@dataclass(frozen=True)
class Batch:
    """Consecutive messages of one publisher (section 3.2); each message is checked by the exchange.
    One frame holds them as `flat`; a batch of one topic may come in two parts instead: `topic`,
    then its `payloads` as one msgpack array (`block`, kept as sent so that the exchange can pass it
    on to subscribers without packing each payload again)."""
    publisher: str
    first_seq: int
    sent_ns: int
    flat: list[Any]  # topic, payload, topic, payload, ... (each message checked by the exchange)
    topic: Any = None  # the two-part form: every message's topic (checked by the exchange) ...
    payloads: list[Any] | None = None  # ... the payloads, decoded from ...
    block: Any = None  # ... the second part, a msgpack array of bin (bytes or a buffer)

    @property
    def count(self) -> int:
        return len(self.payloads) if self.payloads is not None else len(self.flat) // 2

    def messages(self) -> list[Any]:
        """The messages as a flat [topic, payload, ...] list, whatever the form."""
        if self.payloads is None:
            return self.flat
        flat: list[Any] = [self.topic] * (2 * len(self.payloads))
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


def encode_hello(publisher: str, token: bytes, from_seq: int) -> bytes:
    """`hello`: the id, the token it derives from, and the lowest sequence number still to send."""
    return pack([HELLO, DATA_VERSION, publisher, token, from_seq])


def encode_batch(publisher: str, first_seq: int, sent_ns: int, flat: list[Any]) -> bytes:
    """`batch`: messages first_seq, first_seq+1, ... as [topic, payload, ...] (a topic may be an
    attributed slot: a list, or an `Attributed`)."""
    return msgpack.packb([BATCH, DATA_VERSION, publisher, first_seq, sent_ns, flat], use_bin_type=True,
                         default=_slot_of)


def encode_batch_parts(publisher: str, first_seq: int, sent_ns: int, topic: bytes,
                       payloads: list[bytes]) -> tuple[bytes, bytes]:
    """`batch` of one topic in two parts: the header, then the payloads as one msgpack array, which
    the exchange splices into its delivery as it is (section 3.2)."""
    return (pack([BATCH, DATA_VERSION, publisher, first_seq, sent_ns, topic]),
            msgpack.packb(payloads, use_bin_type=True))


def encode_bye(publisher: str) -> bytes:
    """`bye`: the publisher leaves this connection."""
    return pack([BYE, DATA_VERSION, publisher])


def decode_publisher_frame(frame: bytes, max_size: int, block: Any = None) -> Hello | Batch | Bye:
    """A publisher's frame, every field checked; ProtocolError (RefusedBatch when it is a batch
    that can be attributed) otherwise. `block`: the second part of a two-part batch (bytes or a
    buffer), None when the message had one part. A map (a message's headers, section 3.2) is
    decoded by `_header_map`: one that is not a valid map of text keys refuses that message
    alone, when the exchange checks it, not the whole batch."""
    if len(frame) > max_size:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the limit of {max_size}")
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=False, object_pairs_hook=_header_map,
                              unicode_errors="surrogateescape", max_bin_len=max_size, max_str_len=max_size)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"frame is not valid msgpack: {type(exc).__name__}") from None
    kind = _kind_and_version(msg, "publisher frame")
    publisher = msg[2] if len(msg) > 2 else None
    if not isinstance(publisher, str) or not PUBLISHER_ID.fullmatch(publisher):
        raise ProtocolError("publisher id must be \"p-\" and 24 lowercase hex digits (derived from the token)")
    if kind == BATCH:
        return _decode_batch(msg, publisher, block, max_size - len(frame))
    if block is not None:
        raise ProtocolError(f"a {kind} is one frame; only a batch of one topic has two")
    if kind == HELLO:
        if len(msg) != 5 or not isinstance(msg[3], bytes) or not TOKEN_MIN <= len(msg[3]) <= TOKEN_MAX \
                or not _is_int(msg[4], 1):
            raise ProtocolError(f"hello must be [\"hello\", {DATA_VERSION}, publisher, token "
                                f"({TOKEN_MIN}-{TOKEN_MAX} bytes), from_seq (1..2^63-1)]")
        return Hello(publisher, msg[3], msg[4])
    if kind == BYE:
        if len(msg) != 3:
            raise ProtocolError(f"bye must be [\"bye\", {DATA_VERSION}, publisher]")
        return Bye(publisher)
    raise ProtocolError(f"unknown publisher frame kind {kind!r}")


def _decode_batch(msg: list[Any], publisher: str, block: Any, block_limit: int) -> Batch:
    if len(msg) < 4 or not _is_int(msg[3], 1):
        raise ProtocolError("batch first_seq must be an integer from 1 to 2^63-1")
    first_seq: int = msg[3]
    if len(msg) != 6:
        raise RefusedBatch(f"batch must be [\"batch\", {DATA_VERSION}, publisher, first_seq, sent_ns, "
                           "[topic, payload, ...]]", publisher, first_seq)
    sent_ns, flat = msg[4], msg[5]
    if not _is_int(sent_ns, 0, MAX_U64):
        raise RefusedBatch("batch sent_ns must be an integer from 0 to 2^64-1 (a msgpack integer, "
                           "not a float)", publisher, first_seq)
    if block is not None or isinstance(flat, bytes):
        return _decode_two_part_batch(publisher, first_seq, sent_ns, flat, block, block_limit)
    if not isinstance(flat, list) or not flat or len(flat) % 2:
        raise RefusedBatch("batch messages must be a non-empty flat array [topic, payload, ...]",
                           publisher, first_seq)
    if first_seq + len(flat) // 2 - 1 > MAX_SEQ:
        raise RefusedBatch("batch sequence numbers would pass 2^63-1", publisher, first_seq)
    return Batch(publisher, first_seq, sent_ns, flat)


def _decode_two_part_batch(publisher: str, first_seq: int, sent_ns: int, topic: Any, block: Any,
                           block_limit: int) -> Batch:
    """A batch of one topic: the header names the topic, the second part holds the payloads as
    one msgpack array. The block is decoded here (C-level) so that every payload is known to be a
    bin before the exchange passes the block on."""
    if not isinstance(topic, bytes) or block is None:
        raise RefusedBatch("a two-part batch is [\"batch\", 2, publisher, first_seq, sent_ns, topic] "
                           "then [payload, ...] in a second frame", publisher, first_seq)
    if len(block) > block_limit:
        raise RefusedBatch(f"batch of {len(block)} payload bytes exceeds exchange.max_batch_bytes",
                           publisher, first_seq)
    try:
        payloads = msgpack.unpackb(block, raw=False, max_bin_len=block_limit, max_str_len=block_limit,
                                   max_array_len=block_limit, max_map_len=0, max_ext_len=0)
    except Exception as exc:
        raise RefusedBatch(f"batch payloads are not one msgpack array: {type(exc).__name__}",
                           publisher, first_seq) from None
    if not isinstance(payloads, list) or not payloads or set(map(type, payloads)) != {bytes}:
        raise RefusedBatch("batch payloads must be a non-empty array of bin", publisher, first_seq)
    if first_seq + len(payloads) - 1 > MAX_SEQ:
        raise RefusedBatch("batch sequence numbers would pass 2^63-1", publisher, first_seq)
    return Batch(publisher, first_seq, sent_ns, [], topic, payloads, block)


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
    msg = unpack(frame, MAX_CONTROL_FRAME)
    kind = _kind_and_version(msg, "exchange reply")
    n = len(msg)
    if kind == ACK and n == 4 and _is_int(msg[2]) and _is_int(msg[3]):
        return ExchangeReply(ACK, msg[2], msg[3])
    if kind == WELCOME and n == 5 and isinstance(msg[2], str) and _is_int(msg[3]) and _is_int(msg[4]):
        return ExchangeReply(WELCOME, msg[3], msg[4], exchange=msg[2])
    if kind in (REJECT, RESEND) and n == 5 and _is_int(msg[2]) and isinstance(msg[3], str) \
            and isinstance(msg[4], str):
        return ExchangeReply(kind, msg[2], code=msg[3], message=msg[4])
    if kind == ERROR and n == 4 and isinstance(msg[2], str) and isinstance(msg[3], str):
        return ExchangeReply(ERROR, code=msg[2], message=msg[3])
    if kind == MOVE and n == 3 and isinstance(msg[2], str):
        return ExchangeReply(MOVE, message=msg[2])
    raise ProtocolError(f"malformed {kind!r} reply from the exchange")


# ------------------------------------------------ exchange → subscriber


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


def decode_delivery(frame: bytes | memoryview) -> Delivery:
    """A delivery body, every field checked (section 4.2)."""
    try:
        msg = msgpack.unpackb(frame, raw=False)
    except Exception:
        raise ProtocolError("delivery is not valid msgpack") from None
    if not isinstance(msg, list) or len(msg) not in (10, 11) or msg[0] != DELIVERY or msg[1] != DATA_VERSION:
        raise ProtocolError("delivery must be [\"delivery\", 2, exchange, incarnation, pos, chains, publisher, "
                            "sent_ns, seqs, payloads, attrs?]")
    _, _, exchange_id, incarnation, pos, chains, publisher, sent_ns, seqs, payloads = msg[:10]
    attrs = msg[10] if len(msg) == 11 else None
    if attrs is not None and not _delivery_attrs(attrs, len(seqs) if isinstance(seqs, list) else 0):
        raise ProtocolError("delivery attrs must be [[index, priority, not_before_ms, key], ...]")
    if not _is_int(pos, 1) or not isinstance(incarnation, str) or not isinstance(exchange_id, str) \
            or not isinstance(publisher, str) or not _is_int(sent_ns, 0, MAX_U64):
        raise ProtocolError("delivery pos must be a positive integer, exchange, incarnation and publisher strings")
    if not isinstance(chains, list) or not all(
            isinstance(c, list) and len(c) == 2 and _is_int(c[0], 0, MAX_TOPIC) and _is_int(c[1], 0, pos - 1)
            for c in chains):
        raise ProtocolError("delivery chains must be [[prefix_length, prev < pos], ...]")
    if not isinstance(seqs, list) or not isinstance(payloads, list) or len(seqs) != len(payloads) \
            or not _all_ints(seqs, 1) or (payloads and set(map(type, payloads)) != {bytes}):
        raise ProtocolError("delivery seqs and payloads must be lists of equal length (integers, bin)")
    return Delivery(exchange_id, incarnation, pos, {c[0]: c[1] for c in chains}, publisher, sent_ns, seqs,
                    payloads, attrs)


def _delivery_attrs(attrs: Any, count: int) -> bool:
    return isinstance(attrs, list) and all(
        isinstance(a, list) and len(a) in (ATTRS_LEN, HEADERS_ATTRS_LEN) and _is_int(a[0], 0, max(count - 1, 0))
        and _is_int(a[1], 0, MAX_PRIORITY) and _is_int(a[2]) and isinstance(a[3], bytes) and len(a[3]) <= MAX_KEY
        and (len(a) == ATTRS_LEN or _valid_headers(a[4])) for a in attrs)


def _valid_headers(headers: Any) -> bool:
    """A headers map as an exchange sends it (RoQ's own `roq-` headers allowed)."""
    try:
        headers_size(headers, own=True)
    except ProtocolError:
        return False
    return True


def message_headers(attrs: list[list[Any]] | None, count: int) -> list[dict[str, bytes]] | None:
    """Each message's headers, by index, from a delivery's (or fetched frame's) `attrs` ({} for a
    message without); None when no message of the frame has any."""
    if not attrs:
        return None
    with_headers = [a for a in attrs if len(a) == HEADERS_ATTRS_LEN and a[4]]
    if not with_headers:
        return None
    out: list[dict[str, bytes]] = [{} for _ in range(count)]
    for a in with_headers:
        out[a[0]] = a[4]
    return out


@dataclass(frozen=True)
class Sync:
    """A decoded `sync` or `beat`: the position the exchange's next frame will take."""
    exchange: str
    incarnation: str
    next_pos: int


def sync_topic(subscriber_id: str) -> bytes:
    """The private marker topic whose subscription the exchange answers with `sync`."""
    return SYNC_PREFIX + subscriber_id.encode()


def encode_sync(exchange_id: str, incarnation: str, next_pos: int, kind: str = SYNC) -> bytes:
    """A sync answer (or, kind=BEAT, a heartbeat): the position the next frame will take."""
    return pack([kind, DATA_VERSION, exchange_id, incarnation, next_pos])


def decode_sync(frame: bytes | memoryview, kind: str = SYNC) -> Sync:
    """A sync answer, or (kind=BEAT) a heartbeat: both tell the next position."""
    msg = unpack(frame, MAX_CONTROL_FRAME)
    if not isinstance(msg, list) or len(msg) != 5 or msg[:2] != [kind, DATA_VERSION] \
            or not isinstance(msg[2], str) or not isinstance(msg[3], str) or not _is_int(msg[4], 1):
        raise ProtocolError(f"{kind} must be [\"{kind}\", {DATA_VERSION}, exchange, incarnation, next_pos]")
    return Sync(msg[2], msg[3], msg[4])


# ------------------------------------------------ subscriber ↔ exchange replay socket


@dataclass(frozen=True)
class Fetch:
    """A decoded `fetch` request (section 5.1)."""
    request_id: int
    incarnation: str  # "" = whichever runs
    after: int
    before: int  # exclusive; 0 = no upper bound
    prefixes: list[bytes]  # empty = every topic
    max_bytes: int  # 0 = the exchange's own limit


@dataclass(frozen=True)
class PositionRequest:
    """A decoded `position` request (section 5.2). With an `incarnation`, it asks about a stored
    incarnation that has ended (a replica's copy or a journal archive), and seals it (section 6)."""
    request_id: int
    prefixes: list[bytes]
    incarnation: str = ""


@dataclass(frozen=True)
class Progress:
    """A decoded `progress` report (section 5.5): durable subscriber `name` has taken every frame
    of `incarnation` up to `pos`. Never answered (unless malformed)."""
    name: str
    incarnation: str
    pos: int


def encode_progress(name: str, incarnation: str, pos: int) -> bytes:
    return pack([PROGRESS, DATA_VERSION, name, incarnation, pos])


def encode_fetch(request_id: int, incarnation: str, after: int, before: int, prefixes: list[bytes],
                 max_bytes: int) -> bytes:
    """`fetch`: frames after < pos < before (0: no bound) of the prefixes (none: all)."""
    return pack([FETCH, DATA_VERSION, request_id, incarnation, after, before, prefixes, max_bytes])


def encode_position_request(request_id: int, prefixes: Sequence[bytes] = (), incarnation: str = "") -> bytes:
    """`position`: where the stream is, and where each prefix's chain ends; with `incarnation`,
    where that ended incarnation's stored copy ends (section 6.3)."""
    if incarnation:
        return pack([POSITION, DATA_VERSION, request_id, list(prefixes), incarnation])
    return pack([POSITION, DATA_VERSION, request_id, list(prefixes)])


def _prefixes(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_PREFIXES and all(
        isinstance(p, bytes) and len(p) <= MAX_TOPIC for p in value)


def decode_replay_request(frame: bytes) -> Fetch | PositionRequest | Progress:
    """A `fetch` or `position` request or a `progress` report, every field range-checked."""
    msg = unpack(frame, MAX_CONTROL_FRAME)
    kind = _kind_and_version(msg, "replay request")
    if kind == PROGRESS:
        if len(msg) != 5 or not is_name(msg[2]) or not _is_incarnation(msg[3]) or not _is_int(msg[4]):
            raise ProtocolError(f"progress must be [\"progress\", {DATA_VERSION}, name, incarnation, pos] "
                                f"(name 1-{MAX_CONSUMER_NAME} letters, digits, '_', '.', '-', starting with a "
                                f"letter or digit; incarnation 1-{MAX_INCARNATION} characters; pos 0..2^63-1)")
        return Progress(msg[2], msg[3], msg[4])
    if kind == POSITION:
        if len(msg) not in (4, 5) or not _is_int(msg[2]) or not _prefixes(msg[3]) \
                or (len(msg) == 5 and not _is_incarnation(msg[4])):
            raise ProtocolError(f"position must be [\"position\", {DATA_VERSION}, request_id, "
                                f"[prefix, ...], incarnation?] (at most {MAX_PREFIXES} prefixes of "
                                f"0-{MAX_TOPIC} bytes; incarnation 1-{MAX_INCARNATION} characters)")
        return PositionRequest(msg[2], msg[3], msg[4] if len(msg) == 5 else "")
    if kind != FETCH or len(msg) != 8:
        raise ProtocolError(f"replay request must be [\"fetch\", {DATA_VERSION}, request_id, incarnation, "
                            "after, before, [prefix, ...], max_bytes] or [\"position\", ...]")
    _, _, request_id, incarnation, after, before, prefixes, max_bytes = msg
    if not all(_is_int(v) for v in (request_id, after, before, max_bytes)):
        raise ProtocolError("fetch request_id, after, before and max_bytes must be integers 0..2^63-1")
    if not isinstance(incarnation, str) or len(incarnation) > 256:
        raise ProtocolError("fetch incarnation must be a string")
    if not _prefixes(prefixes):
        raise ProtocolError(f"fetch prefixes must be at most {MAX_PREFIXES} byte strings of 0-{MAX_TOPIC} bytes")
    return Fetch(request_id, incarnation, after, before, prefixes, max_bytes)


@dataclass(frozen=True)
class Frames:
    """A decoded `frames` answer: one page of a fetch."""
    request_id: int
    incarnation: str
    oldest: int  # oldest position still retained
    frames: list[tuple[bytes, bytes]]  # (topic, delivery body), in position order
    scanned_to: int  # every position <= this was looked at
    done: bool
    lost: int  # messages of the prefixes evicted in (after, oldest) before this fetch
    lost_exact: bool  # False: the eviction record does not reach back to `after`; at least `lost`


@dataclass(frozen=True)
class StreamPosition:
    """A decoded `position` answer."""
    request_id: int
    incarnation: str
    oldest: int
    next_pos: int
    last: list[int]  # per prefix asked: no frame of it lies in (last, next_pos)


def encode_frames(request_id: int, incarnation: str, oldest: int, frames: list[tuple[bytes, bytes]],
                  scanned_to: int, done: bool, lost: int, lost_exact: bool) -> bytes:
    """One page of a fetch, with what was evicted from the range before it was asked for."""
    return pack([FRAMES, DATA_VERSION, request_id, incarnation, oldest, frames, scanned_to, done,
                 [lost, lost_exact]])


def encode_position(request_id: int, incarnation: str, oldest: int, next_pos: int, last: list[int]) -> bytes:
    """The answer to a position request: `last[i]` for `prefixes[i]`."""
    return pack([POSITION, DATA_VERSION, request_id, incarnation, oldest, next_pos, last])


def encode_replay_error(request_id: int | None, code: str, message: str) -> bytes:
    """A refused replay request, echoing its id when it could be read."""
    return pack([ERROR, DATA_VERSION, request_id, code, message])


def decode_replay_reply(frame: bytes, max_size: int) -> Frames | StreamPosition:
    """A `frames` or `position` answer; an `error` answer raises ReplayRefused."""
    msg = unpack(frame, max_size)
    kind = _kind_and_version(msg, "replay reply")
    if kind == ERROR and len(msg) == 5:
        raise ReplayRefused(msg[2] if _is_int(msg[2]) else None, str(msg[3]), str(msg[4]))
    if kind == POSITION and len(msg) == 7 and _is_int(msg[2]) and isinstance(msg[3], str) \
            and _is_int(msg[4]) and _is_int(msg[5]) and isinstance(msg[6], list) \
            and all(_is_int(v) for v in msg[6]):
        return StreamPosition(msg[2], msg[3], msg[4], msg[5], msg[6])
    if kind != FRAMES or len(msg) != 9:
        raise ProtocolError("replay reply must be [\"frames\", 2, request_id, incarnation, oldest, frames, "
                            "scanned_to, done, [lost, exact]] or [\"position\", ...]")
    _, _, request_id, incarnation, oldest, frames, scanned_to, done, lost = msg
    if not all(_is_int(v) for v in (request_id, oldest, scanned_to)) or not isinstance(incarnation, str) \
            or not isinstance(done, bool) or not isinstance(lost, list) or len(lost) != 2 \
            or not _is_int(lost[0]) or not isinstance(lost[1], bool):
        raise ProtocolError("replay frames reply has ill-typed fields")
    if not isinstance(frames, list) or not all(
            isinstance(f, list) and len(f) == 2 and all(isinstance(x, bytes) for x in f) for f in frames):
        raise ProtocolError("fetch reply frames must be [topic, body] pairs")
    return Frames(request_id, incarnation, oldest, [(f[0], f[1]) for f in frames], scanned_to, done,
                  lost[0], lost[1])


# ------------------------------------------------ exchange → replica (section 6)

FOLLOW, FOLLOWING, COPY, COPIED, SEALED = "follow", "following", "copy", "copied", "sealed"
MAX_INCARNATION = 256
MAX_COPY_FRAME = 1 << 30  # a copy carries at most exchange.fetch_max_bytes-sized pages; generous


def _is_incarnation(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_INCARNATION


MIN_PROOF, MAX_PROOF = 16, 64  # bytes of an incarnation's copy secret


def copy_digest(proof: bytes) -> str:
    """What an exchange publishes of its copy secret (`copy_digest` in its live znode): the hex
    SHA-256, from which the secret cannot be found."""
    return hashlib.sha256(proof).hexdigest()


def _is_proof(value: Any) -> bool:
    return isinstance(value, bytes) and MIN_PROOF <= len(value) <= MAX_PROOF


@dataclass(frozen=True)
class Follow:
    """`follow`: the exchange (primary) asks its replica to keep a copy of `incarnation`. `proof`,
    on every frame of the primary, is the incarnation's copy secret (section 6.1)."""
    incarnation: str
    exchange: str
    proof: bytes


@dataclass(frozen=True)
class Copy:
    """`copy`: consecutive frames of the primary's stream from `first_pos`."""
    incarnation: str
    first_pos: int
    frames: list[tuple[bytes, bytes, int]]  # (topic, delivery body, messages in it)
    jump: bool  # the primary holds nothing before first_pos (evicted): start the copy there
    proof: bytes


@dataclass(frozen=True)
class ReplicaReply:
    """`following` / `copied` (next_pos: the replica holds every position below it that it was
    sent) or `sealed` (next_pos 0: the replica takes nothing more of this incarnation)."""
    kind: str
    incarnation: str
    next_pos: int


def encode_follow(incarnation: str, exchange: str, proof: bytes) -> bytes:
    return pack([FOLLOW, DATA_VERSION, incarnation, exchange, proof])


def encode_copy(incarnation: str, first_pos: int, frames: list[list[Any]], proof: bytes, jump: bool = False) -> bytes:
    """`frames` are [topic, body, messages] lists (as retention holds them)."""
    return pack([COPY, DATA_VERSION, incarnation, first_pos, frames, jump, proof])


def decode_replica_request(frame: bytes) -> Follow | Copy | GroupState | GroupsDone | Mark | Adopt | Applied:
    """What a replica receives from its primary, every field range-checked. Each frame ends with
    the incarnation's copy secret (`proof`); checking it is the replica's business."""
    msg = unpack(frame, MAX_COPY_FRAME)
    kind = _kind_and_version(msg, "replication request")
    proof = msg[-1] if len(msg) > 3 else None
    if not _is_proof(proof) or not _is_incarnation(msg[2]):
        raise ProtocolError(f"a replication request must be [kind, {DATA_VERSION}, incarnation, ..., proof] "
                            f"with a proof of {MIN_PROOF}-{MAX_PROOF} bytes (section 6.1)")
    assert isinstance(proof, bytes)
    if kind == FOLLOW and len(msg) == 5 and _is_incarnation(msg[3]):
        return Follow(msg[2], msg[3], proof)
    if kind == GROUPS:
        groups = _group_states(msg[3]) if len(msg) == 5 else None
        if groups is None:
            raise ProtocolError(f"groups must be [\"groups\", {DATA_VERSION}, incarnation, [[group, [prefix, ...], "
                                "ack_timeout_ms, max_deliveries, dead_letter, upto, [[pos, idx, count, deliveries], "
                                "...]], ...], proof]")
        return GroupState(msg[2], groups, proof)
    if kind == DONE:
        done = _done_lists(msg[3]) if len(msg) == 5 else None
        if done is None:
            raise ProtocolError(f"done must be [\"done\", {DATA_VERSION}, incarnation, [[group, [[pos, idx, count], "
                                "...]], ...], proof]")
        return GroupsDone(msg[2], done, proof)
    if kind == ADOPT:
        if len(msg) != 5 or not _is_incarnation(msg[3]):
            raise ProtocolError(f"adopt must be [\"adopt\", {DATA_VERSION}, incarnation, exchange, proof]")
        return Adopt(msg[2], msg[3], proof)
    if kind == MARK:
        if len(msg) != 5 or not _is_int(msg[3], 1):
            raise ProtocolError(f"mark must be [\"mark\", {DATA_VERSION}, incarnation, serial >= 1, proof]")
        return Mark(msg[2], msg[3], proof)
    if kind == APPLIED:
        return _decode_applied(msg, proof)
    if kind != COPY or len(msg) != 7 or not _is_int(msg[3], 1) or not isinstance(msg[4], list) \
            or not isinstance(msg[5], bool):
        raise ProtocolError(f"replication request must be [\"follow\", {DATA_VERSION}, incarnation, exchange, proof] "
                            f"or [\"copy\", {DATA_VERSION}, incarnation, first_pos >= 1, [[topic, body, "
                            "messages], ...], jump, proof]")
    frames = msg[4]
    for f in frames:
        if not (isinstance(f, list) and len(f) == 3 and isinstance(f[0], bytes) and 0 < len(f[0]) <= MAX_TOPIC
                and isinstance(f[1], bytes) and _is_int(f[2])):
            raise ProtocolError("copy frames must be [topic (1-255 bytes), body (bytes), messages (int)]")
    if msg[3] + len(frames) > MAX_SEQ:
        raise ProtocolError("copy positions overflow")
    return Copy(msg[2], msg[3], [(f[0], f[1], f[2]) for f in frames], msg[5], proof)


def encode_replica_reply(kind: str, incarnation: str, next_pos: int = 0) -> bytes:
    if kind == SEALED:
        return pack([SEALED, DATA_VERSION, incarnation])
    return pack([kind, DATA_VERSION, incarnation, next_pos])


def decode_replica_reply(frame: bytes) -> ReplicaReply | Adoption | Marked | Recorded:
    msg = unpack(frame, MAX_COPY_FRAME)
    kind = _kind_and_version(msg, "replica reply")
    if kind == ADOPTION:
        return _decode_adoption(msg)
    if kind == MARKED and len(msg) == 4 and _is_incarnation(msg[2]) and _is_int(msg[3], 1):
        return Marked(msg[2], msg[3])
    if kind == RECORDED:
        if len(msg) != 4 or not _is_incarnation(msg[2]) or not is_command_id(msg[3]):
            raise ProtocolError(f"recorded must be [\"recorded\", {DATA_VERSION}, incarnation, command_id]")
        return Recorded(msg[2], msg[3])
    if kind == SEALED and len(msg) == 3 and _is_incarnation(msg[2]):
        return ReplicaReply(SEALED, msg[2], 0)
    if kind in (FOLLOWING, COPIED) and len(msg) == 4 and _is_incarnation(msg[2]) and _is_int(msg[3]):
        return ReplicaReply(kind, msg[2], msg[3])
    raise ProtocolError(f"replica reply must be [\"following\" | \"copied\", {DATA_VERSION}, incarnation, "
                        f"next_pos], [\"sealed\", {DATA_VERSION}, incarnation] or [\"marked\", {DATA_VERSION}, "
                        "incarnation, serial]")


class ReplayRefused(ProtocolError):
    """The exchange answered a replay request with an error (`busy`, `unknown_incarnation`, ...)."""

    def __init__(self, request_id: int | None, code: str, message: str) -> None:
        super().__init__(f"exchange refused: {code}: {message}")
        self.request_id = request_id
        self.refusal = code


# ------------------------------------------------ message attributes (section 3.2) and work groups (section 7)

MAX_PRIORITY = 255
MAX_KEY = 255
ATTRS_LEN = 4  # [topic, priority, not_before_ms, key] in a batch's topic slot ...
HEADERS_ATTRS_LEN = 5  # ... or [topic, priority, not_before_ms, key, headers]

# Headers (section 3.2): a small map per message, str keys to bin values. A publisher's are held
# to these limits; RoQ's own (dead letters: `roq-` keys, which publishers may not use) may add up
# to MAX_OWN_HEADERS entries of MAX_OWN_HEADERS_BYTES more, which receivers must accept.
MAX_HEADERS = 64
MAX_HEADER_KEY = 128  # bytes of a key's UTF-8
MAX_HEADER_VALUE = 8192
MAX_HEADERS_BYTES = 65536  # keys' UTF-8 and values together, per message (and within max_message_bytes)
MAX_OWN_HEADERS = 16
MAX_OWN_HEADERS_BYTES = 4096
RESERVED_HEADER_PREFIX = "roq-"  # any case: RoQ's own headers
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


class BadMap:
    """What the publisher frame's decoder makes of a map that cannot be headers (a key that is not
    text, a repeated key), so that the message holding it is rejected with `reason`, alone."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _header_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any] | BadMap:
    """msgpack's object_pairs_hook for publisher frames: a dict, unless a key is not a str or is
    repeated (a map's count must not lie about what it holds)."""
    headers = {}
    for key, value in pairs:
        if type(key) is not str:
            return BadMap(f"header keys must be str (UTF-8 text), not {type(key).__name__}")
        if key in headers:
            return BadMap(f"header key {key[:MAX_HEADER_KEY]!r} appears twice")
        headers[key] = value
    return headers


def headers_size(headers: Any, own: bool = False) -> int:
    """The size of a valid headers map: its keys' UTF-8 bytes and its values' bytes together.
    ProtocolError saying what is wrong otherwise (section 3.2): at most MAX_HEADERS entries; keys
    str of 1-MAX_HEADER_KEY UTF-8 bytes without control characters (U+0000-U+001F, U+007F), not
    starting with `roq-` (any case); values bin of at most MAX_HEADER_VALUE bytes; MAX_HEADERS_BYTES
    in all. `own`: a map RoQ may have added its own `roq-` headers to (deliveries, work entries)."""
    if isinstance(headers, BadMap):
        raise ProtocolError(headers.reason)
    if not isinstance(headers, dict):
        raise ProtocolError("headers must be a map of str keys to bin values")
    most, most_bytes = (MAX_HEADERS + MAX_OWN_HEADERS, MAX_HEADERS_BYTES + MAX_OWN_HEADERS_BYTES) if own \
        else (MAX_HEADERS, MAX_HEADERS_BYTES)
    if len(headers) > most:
        raise ProtocolError(f"{len(headers)} headers: at most {most} per message")
    size = 0
    for key, value in headers.items():
        if not isinstance(key, str):
            raise ProtocolError("header keys must be str (UTF-8 text)")
        try:
            raw = key.encode()
        except UnicodeEncodeError:
            raise ProtocolError(f"header key {key[:MAX_HEADER_KEY]!r} is not valid UTF-8") from None
        if not 0 < len(raw) <= MAX_HEADER_KEY or _CONTROL_CHARACTER.search(key):
            raise ProtocolError(f"header key {key[:MAX_HEADER_KEY]!r}: keys are 1-{MAX_HEADER_KEY} bytes of UTF-8 "
                                "without control characters")
        if not own and key[:4].lower() == RESERVED_HEADER_PREFIX:
            raise ProtocolError(f"header key {key!r}: keys starting with {RESERVED_HEADER_PREFIX!r} are RoQ's own")
        if not isinstance(value, bytes) or len(value) > MAX_HEADER_VALUE:
            raise ProtocolError(f"header {key!r}: values are bin of at most {MAX_HEADER_VALUE} bytes")
        size += len(raw) + len(value)
    if size > most_bytes:
        raise ProtocolError(f"headers of {size} bytes: at most {most_bytes} per message (keys and values)")
    return size


def check_headers(headers: Any) -> dict[str, bytes]:
    """An application's headers as they travel: a dict of str keys to bytes (a str value is
    UTF-8 encoded); UserError saying what is wrong (section 3.2's limits, the `roq-` prefix)."""
    if headers is None:
        return {}
    try:
        items = list(headers.items())
    except AttributeError:
        raise UserError(f"headers must be a mapping of str keys to bytes or str values, not "
                        f"{type(headers).__name__}") from None
    out = {}
    for key, value in items:
        if isinstance(value, str):
            try:
                value = value.encode()
            except UnicodeEncodeError:
                raise UserError(f"header {key!r}: the value is not valid text") from None
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        out[key] = value
    try:
        headers_size(out)
    except ProtocolError as exc:
        raise UserError(str(exc)) from None
    return out


def attributed_topic(topic: bytes, priority: int, not_before_ms: int, key: bytes,
                     headers: dict[str, bytes] | None = None) -> list[Any]:
    """A batch's topic slot for a message with attributes: priority, not-before and key matter to
    consumer groups only; headers reach every subscriber."""
    if headers:
        return [topic, priority, not_before_ms, key, headers]
    return [topic, priority, not_before_ms, key]


class Attributed:
    """A publisher's topic slot for a message with attributes, as its log holds it: `len()` is
    the slot's size on the wire (topic, key and headers), so that batches are sized with the
    headers' bytes; packed as the slot itself (encode_batch)."""

    __slots__ = ("slot", "size")

    def __init__(self, slot: list[Any], size: int) -> None:
        self.slot = slot
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attributed) and other.slot == self.slot

    __hash__ = None  # type: ignore[assignment]


def _slot_of(value: Any) -> Any:
    """msgpack's `default` for batches: an Attributed slot packs as its list."""
    if isinstance(value, Attributed):
        return value.slot
    raise TypeError(f"cannot pack {type(value).__name__}")


def message_attributes(slot: list[Any]) -> tuple[bytes, int, int, bytes, dict[str, bytes] | None]:
    """(topic, priority, not_before_ms, key, headers or None) from an attributed topic slot;
    ProtocolError saying what is malformed. The topic itself is checked by the caller."""
    if len(slot) not in (ATTRS_LEN, HEADERS_ATTRS_LEN):
        raise ProtocolError("an attributed message's topic must be [topic, priority 0..255, not_before_ms "
                            "0..2^63-1, key of 0-255 bytes] or the same and a headers map")
    topic, priority, not_before_ms, key = slot[:ATTRS_LEN]
    if not isinstance(topic, bytes) or not _is_int(priority, 0, MAX_PRIORITY) or not _is_int(not_before_ms) \
            or not isinstance(key, bytes) or len(key) > MAX_KEY:
        raise ProtocolError("an attributed message's topic must be [topic, priority 0..255, not_before_ms "
                            "0..2^63-1, key of 0-255 bytes] or the same and a headers map")
    headers = slot[4] if len(slot) == HEADERS_ATTRS_LEN else None
    if headers is not None:
        headers_size(headers)
    return topic, priority, not_before_ms, key, headers or None


JOIN, JOINED, LEAVE, WORK, NACK, PING, PONG = "join", "joined", "leave", "work", "nack", "ping", "pong"
MAX_GROUP_NAME = 63
MAX_PREFETCH = 100_000
MAX_WORK_RANGES = 100_000
MAX_DELIVERIES = 1000


@dataclass(frozen=True)
class Join:
    group: str
    prefixes: tuple[bytes, ...]
    prefetch: int
    ack_timeout_ms: int
    max_deliveries: int
    dead_letter: bytes
    from_beginning: bool


@dataclass(frozen=True)
class Settle:
    """An `ack` or a `nack` of messages, as (pos, idx, count) ranges of one incarnation's frames."""
    kind: str
    group: str
    incarnation: str
    ranges: list[tuple[int, int, int]]
    requeue: bool = True


@dataclass(frozen=True)
class Leave:
    group: str


@dataclass(frozen=True)
class Ping:
    pass


def encode_join(group: str, prefixes: Sequence[bytes], prefetch: int, ack_timeout_ms: int, max_deliveries: int,
                dead_letter: bytes, from_beginning: bool) -> bytes:
    return pack([JOIN, DATA_VERSION, group, list(prefixes), prefetch, ack_timeout_ms, max_deliveries, dead_letter,
                 from_beginning])


def encode_settle(kind: str, group: str, incarnation: str, ranges: list[list[int]], requeue: bool = True) -> bytes:
    if kind == NACK:
        return pack([NACK, DATA_VERSION, group, incarnation, ranges, requeue])
    return pack([ACK, DATA_VERSION, group, incarnation, ranges])


def encode_leave(group: str) -> bytes:
    return pack([LEAVE, DATA_VERSION, group])


def encode_ping() -> bytes:
    return pack([PING, DATA_VERSION])


def _ranges(value: Any) -> list[tuple[int, int, int]] | None:
    if not isinstance(value, list) or len(value) > MAX_WORK_RANGES:
        return None
    out = []
    for r in value:
        if not isinstance(r, list) or len(r) != 3 or not _is_int(r[0], 1) or not _is_int(r[1]) or not _is_int(r[2], 1):
            return None
        out.append((r[0], r[1], r[2]))
    return out


def decode_member_frame(frame: bytes, max_size: int = MAX_CONTROL_FRAME) -> Join | Settle | Leave | Ping:
    """A group member's frame on the work socket, every field checked (section 7.2)."""
    msg = unpack(frame, max_size)
    kind = _kind_and_version(msg, "work frame")
    if kind == PING:
        if len(msg) != 2:
            raise ProtocolError(f"ping must be [\"ping\", {DATA_VERSION}]")
        return Ping()
    group = msg[2] if len(msg) > 2 else None
    if not is_name(group) or len(group) > MAX_GROUP_NAME:
        raise ProtocolError(f"group must be a name of 1-{MAX_GROUP_NAME} letters, digits, '_', '.', '-', "
                            "starting with a letter or digit")
    if kind == JOIN:
        if len(msg) != 9 or not _prefixes(msg[3]) or not msg[3] or not _is_int(msg[4], 1, MAX_PREFETCH) \
                or not _is_int(msg[5], 1, 86_400_000) or not _is_int(msg[6], 1, MAX_DELIVERIES) \
                or not isinstance(msg[7], bytes) or not 0 < len(msg[7]) <= MAX_TOPIC or msg[7][:1] == b"\x00" \
                or not isinstance(msg[8], bool):
            raise ProtocolError(f"join must be [\"join\", {DATA_VERSION}, group, [prefix, ...] (1-{MAX_PREFIXES}), "
                                f"prefetch (1..{MAX_PREFETCH}), ack_timeout_ms (1..86400000), max_deliveries "
                                f"(1..{MAX_DELIVERIES}), dead_letter (topic), from_beginning (bool)]")
        if any(p[:1] == b"\x00" for p in msg[3]):
            raise ProtocolError("group prefixes must not start with NUL")
        return Join(group, tuple(sorted(set(msg[3]))), msg[4], msg[5], msg[6], msg[7], msg[8])
    if kind == LEAVE:
        if len(msg) != 3:
            raise ProtocolError(f"leave must be [\"leave\", {DATA_VERSION}, group]")
        return Leave(group)
    if kind in (ACK, NACK):
        size = 5 if kind == ACK else 6
        ranges = _ranges(msg[4]) if len(msg) == size else None
        if ranges is None or not _is_incarnation(msg[3]) or (kind == NACK and not isinstance(msg[5], bool)):
            raise ProtocolError(f"{kind} must be [\"{kind}\", {DATA_VERSION}, group, incarnation, [[pos, idx, "
                                f"count], ...]{', requeue (bool)' if kind == NACK else ''}] (at most "
                                f"{MAX_WORK_RANGES} ranges)")
        return Settle(kind, group, msg[3], ranges, msg[5] if kind == NACK else True)
    raise ProtocolError(f"unknown work frame kind {kind!r}")


def encode_joined(group: str, exchange_id: str, incarnation: str) -> bytes:
    return pack([JOINED, DATA_VERSION, group, exchange_id, incarnation])


def encode_work(group: str, incarnation: str, entries: list[list[Any]]) -> bytes:
    return pack([WORK, DATA_VERSION, group, incarnation, entries])


def encode_pong(incarnation: str, groups: list[str]) -> bytes:
    """Answer to `ping`: the running incarnation and the groups this connection is a member of."""
    return pack([PONG, DATA_VERSION, incarnation, groups])


def encode_work_error(group: str | None, code: str, message: str) -> bytes:
    return pack([ERROR, DATA_VERSION, group, code, message])


@dataclass(frozen=True)
class WorkReply:
    kind: str
    group: str | None = None
    exchange: str = ""
    incarnation: str = ""
    entries: list[list[Any]] | None = None
    groups: list[str] | None = None  # a pong's: the groups this connection is a member of
    code: str = ""
    message: str = ""


def decode_work_reply(frame: bytes, max_size: int) -> WorkReply:
    """An exchange's frame to a group member (section 7.3)."""
    msg = unpack(frame, max_size)
    kind = _kind_and_version(msg, "work reply")
    if kind == WORK and len(msg) == 5 and isinstance(msg[2], str) and isinstance(msg[3], str) \
            and isinstance(msg[4], list) and all(_is_entry(e) for e in msg[4]):
        return WorkReply(WORK, msg[2], incarnation=msg[3], entries=msg[4])
    if kind == JOINED and len(msg) == 5 and all(isinstance(v, str) for v in msg[2:]):
        return WorkReply(JOINED, msg[2], msg[3], msg[4])
    if kind == PONG and len(msg) == 4 and isinstance(msg[2], str) and isinstance(msg[3], list) \
            and all(isinstance(g, str) for g in msg[3]):
        return WorkReply(PONG, incarnation=msg[2], groups=msg[3])
    if kind == ERROR and len(msg) == 5 and (msg[2] is None or isinstance(msg[2], str)) \
            and isinstance(msg[3], str) and isinstance(msg[4], str):
        return WorkReply(ERROR, msg[2], code=msg[3], message=msg[4])
    raise ProtocolError(f"unexpected work reply {kind!r}")


def _is_entry(e: Any) -> bool:
    """A `work` entry, down to each sequence number and payload (a member trusts nothing it is sent):
    10 fields, or 11 with the messages' headers."""
    return isinstance(e, list) and (len(e) == 10 or (len(e) == 11 and _valid_headers(e[10]))) \
        and _is_int(e[0], 1) and _is_int(e[1]) and _is_int(e[2], 1) and isinstance(e[3], bytes) \
        and 0 < len(e[3]) <= MAX_TOPIC and isinstance(e[4], str) \
        and _is_int(e[5], 0, MAX_U64) and isinstance(e[6], list) and isinstance(e[7], list) \
        and len(e[6]) == len(e[7]) > 0 and all(_is_int(seq, 1) for seq in e[6]) \
        and all(isinstance(p, bytes) for p in e[7]) and _is_int(e[8], 0, MAX_PRIORITY) \
        and isinstance(e[9], bytes) and len(e[9]) <= MAX_KEY



# ------------------------------------------------ consumer groups' state at the replica (section 7.6)

GROUPS, DONE, ADOPT, ADOPTION, MARK, MARKED = "groups", "done", "adopt", "adoption", "mark", "marked"
APPLIED, RECORDED = "applied", "recorded"
MAX_APPLIED = 256  # command ids an adoption names (the newest)
_COMMAND_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


def is_command_id(value: Any) -> bool:
    """An admin command's id (section 2: `c-` and 16 hex digits, or `k-` and the request key)."""
    return isinstance(value, str) and _COMMAND_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class GroupRecord:
    """One group's state at stream position `upto`: every message of its topics in a frame below
    `upto` is done unless listed in `pending` as (pos, idx, count, deliveries); every message of its
    topics in a frame at or above `upto` is pending (delivered 0 times)."""
    name: str
    prefixes: tuple[bytes, ...]
    ack_timeout_ms: int
    max_deliveries: int
    dead_letter: bytes
    upto: int
    pending: list[tuple[int, int, int, int]]

    def wire(self) -> list[Any]:
        return [self.name, list(self.prefixes), self.ack_timeout_ms, self.max_deliveries, self.dead_letter, self.upto,
                [list(p) for p in self.pending]]


@dataclass(frozen=True)
class GroupState:
    incarnation: str
    groups: list[GroupRecord]
    proof: bytes


@dataclass(frozen=True)
class GroupsDone:
    """Messages that left groups (acked or dead-lettered) since the last `groups` state."""
    incarnation: str
    done: dict[str, list[tuple[int, int, int]]]
    proof: bytes


def encode_done(incarnation: str, done: dict[str, list[tuple[int, int, int]]], proof: bytes) -> bytes:
    return pack([DONE, DATA_VERSION, incarnation, [[g, [list(r) for r in ranges]] for g, ranges in done.items()],
                 proof])


def _done_lists(value: Any) -> dict[str, list[tuple[int, int, int]]] | None:
    if not isinstance(value, list) or len(value) > 1024:
        return None
    done = {}
    for entry in value:
        ranges = _ranges(entry[1]) if isinstance(entry, list) and len(entry) == 2 and is_name(entry[0]) else None
        if ranges is None:
            return None
        done[entry[0]] = ranges
    return done


@dataclass(frozen=True)
class Mark:
    """`mark`: answer `marked serial` once every `groups` and `done` frame sent before this one is held."""
    incarnation: str
    serial: int
    proof: bytes


@dataclass(frozen=True)
class Marked:
    """The replica holds the group state and acks the primary sent before its `mark` `serial`."""
    incarnation: str
    serial: int
    kind: str = MARKED


def encode_mark(incarnation: str, serial: int, proof: bytes) -> bytes:
    return pack([MARK, DATA_VERSION, incarnation, serial, proof])


def encode_marked(incarnation: str, serial: int) -> bytes:
    return pack([MARKED, DATA_VERSION, incarnation, serial])


@dataclass(frozen=True)
class Adopt:
    incarnation: str  # the asking primary's (new) incarnation
    exchange: str
    proof: bytes


@dataclass(frozen=True)
class Adoption:
    """The groups of the newest earlier incarnation the replica holds state of (`ended`, "" if none),
    the frames of its copy holding their pending messages, each publisher's highest sequence
    number in that copy, and the admin commands the exchange's incarnations applied (section 2)."""
    incarnation: str
    ended: str
    groups: list[GroupRecord]
    high: dict[str, int]
    frames: list[tuple[int, bytes, bytes]]  # (pos, topic, body)
    applied: tuple[str, ...] = ()
    kind: str = ADOPTION


@dataclass(frozen=True)
class Applied:
    """`applied`: the primary applied admin command `command_id`; `groups` is its groups' state
    right after (replacing the last one, as a `groups` frame does), `purge_upto` the position
    below which a purge dropped the stream (0: not a purge). Answered `recorded`."""
    incarnation: str
    command_id: str
    groups: list[GroupRecord]
    purge_upto: int
    proof: bytes


@dataclass(frozen=True)
class Recorded:
    """`recorded`: the replica holds what `applied` said (the state and the command's id)."""
    incarnation: str
    command_id: str
    kind: str = RECORDED


def encode_applied(incarnation: str, command_id: str, groups: list[GroupRecord], purge_upto: int,
                   proof: bytes) -> bytes:
    return pack([APPLIED, DATA_VERSION, incarnation, command_id, [g.wire() for g in groups], purge_upto, proof])


def encode_recorded(incarnation: str, command_id: str) -> bytes:
    return pack([RECORDED, DATA_VERSION, incarnation, command_id])


def _decode_applied(msg: list[Any], proof: bytes) -> Applied:
    groups = _group_states(msg[4]) if len(msg) == 7 else None
    if groups is None or not is_command_id(msg[3]) or not _is_int(msg[5]):
        raise ProtocolError(f"applied must be [\"applied\", {DATA_VERSION}, incarnation, command_id, [group state, "
                            "...], purge_upto, proof]")
    return Applied(msg[2], msg[3], groups, msg[5], proof)


def encode_groups(incarnation: str, groups: list[GroupRecord], proof: bytes) -> bytes:
    return pack([GROUPS, DATA_VERSION, incarnation, [g.wire() for g in groups], proof])


def encode_adopt(incarnation: str, exchange: str, proof: bytes) -> bytes:
    return pack([ADOPT, DATA_VERSION, incarnation, exchange, proof])


def encode_adoption(incarnation: str, ended: str, groups: list[GroupRecord], high: dict[str, int],
                    frames: list[tuple[int, bytes, bytes]], applied: tuple[str, ...] = ()) -> bytes:
    return pack([ADOPTION, DATA_VERSION, incarnation, ended, [g.wire() for g in groups],
                 [[p, s] for p, s in high.items()], [list(f) for f in frames], list(applied[-MAX_APPLIED:])])


def _group_states(value: Any) -> list[GroupRecord] | None:
    if not isinstance(value, list) or len(value) > 1024:
        return None
    records = []
    for g in value:
        if not isinstance(g, list) or len(g) != 7 or not is_name(g[0]) or len(g[0]) > MAX_GROUP_NAME \
                or not _prefixes(g[1]) or not g[1] or not _is_int(g[2], 1, 86_400_000) \
                or not _is_int(g[3], 1, MAX_DELIVERIES) or not isinstance(g[4], bytes) \
                or not 0 < len(g[4]) <= MAX_TOPIC or not _is_int(g[5], 1) or not isinstance(g[6], list):
            return None
        pending = []
        for p in g[6]:
            if not isinstance(p, list) or len(p) != 4 or not _is_int(p[0], 1) or not _is_int(p[1]) \
                    or not _is_int(p[2], 1) or not _is_int(p[3], 0, MAX_DELIVERIES):
                return None
            pending.append((p[0], p[1], p[2], p[3]))
        records.append(GroupRecord(g[0], tuple(g[1]), g[2], g[3], g[4], g[5], pending))
    return records


def _decode_adoption(msg: list[Any]) -> Adoption:
    groups = _group_states(msg[4]) if len(msg) in (7, 8) else None
    applied = msg[7] if len(msg) == 8 else []  # 7 elements: a replica from before admin commands
    if groups is None or not _is_incarnation(msg[2]) or not (msg[3] == "" or _is_incarnation(msg[3])) \
            or not isinstance(msg[5], list) or not isinstance(msg[6], list) or not isinstance(applied, list) \
            or len(applied) > MAX_APPLIED or not all(map(is_command_id, applied)):
        raise ProtocolError(f"adoption must be [\"adoption\", {DATA_VERSION}, incarnation, ended, groups, "
                            "[[publisher, seq], ...], [[pos, topic, body], ...], [command_id, ...]]")
    high = {}
    for entry in msg[5]:
        if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str) or not _is_int(entry[1]):
            raise ProtocolError("adoption high must be [[publisher, seq], ...]")
        high[entry[0]] = entry[1]
    frames = []
    for f in msg[6]:
        if not isinstance(f, list) or len(f) != 3 or not _is_int(f[0], 1) or not isinstance(f[1], bytes) \
                or not isinstance(f[2], bytes):
            raise ProtocolError("adoption frames must be [[pos, topic, body], ...]")
        frames.append((f[0], f[1], f[2]))
    return Adoption(msg[2], msg[3], groups, high, frames, tuple(applied))
