"""Wire formats: the control API and the data path. Specified in docs/protocol.md.

Every frame is one msgpack value. Decoders validate shape and types and raise
`ProtocolError` with a reason; they never trust a peer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from roq.errors import ProtocolError, RoqError

VERSION = 1
MAX_CONTROL_FRAME = 1 << 20  # control requests are small; refuse anything bigger

# ---------------------------------------------------------------- helpers


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(frame: bytes, max_size: int) -> Any:
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
    id: int
    op: str
    args: dict[str, Any]


def encode_request(req_id: int, op: str, args: dict[str, Any] | None = None) -> bytes:
    return pack({"v": VERSION, "id": req_id, "op": op, "args": args or {}})


def decode_request(frame: bytes) -> Request:
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
    return Request(req_id, op, args)


def request_id_of(frame: bytes) -> int | None:
    """Best-effort id of a request that failed to decode, so the error can be matched."""
    try:
        msg = msgpack.unpackb(frame, raw=False) if len(frame) <= MAX_CONTROL_FRAME else None
    except Exception:
        return None
    rid = msg.get("id") if isinstance(msg, dict) else None
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else None


def encode_reply(req_id: int | None, result: Any) -> bytes:
    return pack({"v": VERSION, "id": req_id, "ok": True, "result": result})


def encode_error(req_id: int | None, err: RoqError) -> bytes:
    body = {"code": err.code, "message": str(err)}
    leader = getattr(err, "leader", None)
    if leader:
        body["leader"] = leader
    return pack({"v": VERSION, "id": req_id, "ok": False, "error": body})


@dataclass(frozen=True)
class Reply:
    id: int | None
    ok: bool
    result: Any = None
    code: str = ""
    message: str = ""
    leader: str | None = None


def decode_reply(frame: bytes) -> Reply:
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
# Publisher → exchange (DEALER → ROUTER):
#   ["hello", v, publisher_id]
#   ["batch", v, publisher_id, first_seq, sent_ns, [topic, payload, topic, payload, ...]]
#   ["bye",   v, publisher_id]
# Exchange → publisher:
#   ["welcome", v, exchange_id, last_seq_seen, subscriptions]
#   ["ack",  v, seq, subscriptions]     cumulative: every seq <= seq is handled
#   ["reject", v, seq, code, message]   this one message was refused (and is covered by acks)
#   ["error", v, code, message]         the frame was refused as a whole
#   ["move", v, reason]                 please publish to another exchange of the queue
# Exchange → subscriber (XPUB → SUB), two frames:
#   topic, [v, exchange_id, incarnation, pos, prev_pos, publisher_id, sent_ns, [seq, ...], [payload, ...]]
#   pos: this frame's position in the exchange incarnation's stream (1, 2, ...);
#   prev_pos: position of the previous frame of the same topic (0 = unknown), so a
#   subscriber can tell that frames of a topic it follows never reached it.
#   SYNC_PREFIX + subscriber id, [v, "sync", exchange_id, incarnation, next_pos]
#   answers a subscription to that marker topic: every frame from next_pos on is live.
#   BEAT_TOPIC, [v, "beat", exchange_id, incarnation, next_pos]   every exchange.beat_interval,
#   so a subscriber whose last frames were dropped learns that it missed something.
# Subscriber → exchange replay socket (DEALER → ROUTER):
#   ["fetch", v, request_id, incarnation, after, before, [topic prefix, ...], max_bytes, [[topic, pos], ...]]
#   the last list names topics the subscriber already has up to pos: older frames of them are skipped.
#   ["frames", v, request_id, incarnation, oldest, [[topic, body], ...], scanned_to, done]
#   ["error", v, request_id, code, message]
#   ["position", v, request_id] → ["position", v, request_id, incarnation, oldest, next_pos]

HELLO, BATCH, BYE = "hello", "batch", "bye"
WELCOME, ACK, REJECT, ERROR, MOVE = "welcome", "ack", "reject", "error", "move"
SYNC, FETCH, FRAMES, POSITION = "sync", "fetch", "frames", "position"
SYNC_PREFIX = b"\x00roq.sync/"  # user topics never start with NUL (roq.names.check_topic)
BEAT_TOPIC = b"\x00roq.beat"
BEAT = "beat"
MAX_FETCH_PREFIXES = 1024


@dataclass(frozen=True)
class Batch:
    publisher: str
    first_seq: int
    sent_ns: int
    flat: list[Any]  # topic, payload, topic, payload, ...


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decode_publisher_frame(frame: bytes, max_size: int) -> tuple[str, Any]:
    """(kind, detail) for a publisher's frame: detail is a Batch, or the publisher id."""
    msg = unpack(frame, max_size)
    if not isinstance(msg, list) or len(msg) < 3 or not isinstance(msg[0], str):
        raise ProtocolError("publisher frame must be an array [kind, version, publisher, ...]")
    kind, version, publisher = msg[0], msg[1], msg[2]
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version!r}, this exchange speaks {VERSION}")
    if not isinstance(publisher, str) or not 0 < len(publisher) <= 128:
        raise ProtocolError("publisher id must be a string of 1-128 characters")
    if kind in (HELLO, BYE):
        return kind, publisher
    if kind != BATCH:
        raise ProtocolError(f"unknown publisher frame kind {kind!r}")
    if len(msg) != 6 or not _is_int(msg[3]) or msg[3] < 1 or not _is_int(msg[4]) \
            or not isinstance(msg[5], list) or len(msg[5]) % 2:
        raise ProtocolError("batch must be [\"batch\", v, publisher, first_seq>=1, sent_ns, [topic, payload, ...]]")
    return kind, Batch(publisher, msg[3], msg[4], msg[5])


def encode_hello(publisher: str) -> bytes:
    return pack([HELLO, VERSION, publisher])


def encode_batch(publisher: str, first_seq: int, sent_ns: int, flat: list[bytes]) -> bytes:
    return pack([BATCH, VERSION, publisher, first_seq, sent_ns, flat])


def encode_bye(publisher: str) -> bytes:
    return pack([BYE, VERSION, publisher])


@dataclass(frozen=True)
class Delivery:
    exchange: str
    incarnation: str
    pos: int
    prev_pos: int
    publisher: str
    sent_ns: int
    seqs: list[int]
    payloads: list[bytes]


def encode_delivery(exchange_id: str, incarnation: str, pos: int, prev_pos: int, publisher: str,
                    sent_ns: int, seqs: list[int], payloads: list[bytes]) -> bytes:
    return pack([VERSION, exchange_id, incarnation, pos, prev_pos, publisher, sent_ns, seqs, payloads])


def decode_delivery(frame: bytes) -> Delivery:
    try:
        msg = msgpack.unpackb(frame, raw=False)
    except Exception:
        raise ProtocolError("delivery is not valid msgpack") from None
    if not isinstance(msg, list) or len(msg) != 9 or msg[0] != VERSION:
        raise ProtocolError("delivery must be [v, exchange, incarnation, pos, prev_pos, publisher, "
                            "sent_ns, seqs, payloads]")
    _, exchange_id, incarnation, pos, prev_pos, publisher, sent_ns, seqs, payloads = msg
    if not _is_int(pos) or not _is_int(prev_pos) or not isinstance(incarnation, str):
        raise ProtocolError("delivery pos and prev_pos must be integers, incarnation a string")
    if not isinstance(seqs, list) or not isinstance(payloads, list) or len(seqs) != len(payloads):
        raise ProtocolError("delivery seqs and payloads must be lists of equal length")
    return Delivery(exchange_id, incarnation, pos, prev_pos, publisher, sent_ns, seqs, payloads)


@dataclass(frozen=True)
class Sync:
    exchange: str
    incarnation: str
    next_pos: int


def sync_topic(subscriber_id: str) -> bytes:
    return SYNC_PREFIX + subscriber_id.encode()


def encode_sync(exchange_id: str, incarnation: str, next_pos: int, kind: str = SYNC) -> bytes:
    return pack([VERSION, kind, exchange_id, incarnation, next_pos])


def decode_sync(frame: bytes, kind: str = SYNC) -> Sync:
    """A sync answer, or (kind=BEAT) a heartbeat: both tell the next position."""
    msg = unpack(frame, MAX_CONTROL_FRAME)
    if not isinstance(msg, list) or len(msg) != 5 or msg[:2] != [VERSION, kind] \
            or not isinstance(msg[2], str) or not isinstance(msg[3], str) or not _is_int(msg[4]):
        raise ProtocolError(f"{kind} must be [v, \"{kind}\", exchange, incarnation, next_pos]")
    return Sync(msg[2], msg[3], msg[4])


@dataclass(frozen=True)
class Fetch:
    request_id: int
    incarnation: str
    after: int
    before: int
    prefixes: list[bytes]
    max_bytes: int
    known: dict[bytes, int]
    position_only: bool = False  # a "position" request: where the stream is, no frames


def encode_fetch(request_id: int, incarnation: str, after: int, before: int,
                 prefixes: list[bytes], max_bytes: int, known: list[list[Any]] | None = None) -> bytes:
    return pack([FETCH, VERSION, request_id, incarnation, after, before, prefixes, max_bytes, known or []])


def encode_position_request(request_id: int) -> bytes:
    return pack([POSITION, VERSION, request_id])


def decode_position(frame: bytes) -> tuple[int, str, int, int]:
    """(request_id, incarnation, oldest, next_pos) from an exchange's answer."""
    msg = unpack(frame, MAX_CONTROL_FRAME)
    if isinstance(msg, list) and len(msg) == 5 and msg[0] == ERROR:
        raise ProtocolError(f"exchange refused: {msg[3]}: {msg[4]}")
    if not isinstance(msg, list) or len(msg) != 6 or msg[0] != POSITION or not isinstance(msg[3], str) \
            or not all(_is_int(v) for v in (msg[2], msg[4], msg[5])):
        raise ProtocolError("position reply must be [\"position\", v, request_id, incarnation, oldest, next_pos]")
    return msg[2], msg[3], msg[4], msg[5]


def decode_fetch(frame: bytes) -> Fetch:
    msg = unpack(frame, MAX_CONTROL_FRAME)
    if isinstance(msg, list) and len(msg) == 3 and msg[0] == POSITION and msg[1] == VERSION and _is_int(msg[2]):
        return Fetch(msg[2], "", 0, 0, [], 0, {}, position_only=True)
    if not isinstance(msg, list) or len(msg) != 9 or msg[0] != FETCH:
        raise ProtocolError("fetch must be [\"fetch\", v, request_id, incarnation, after, before, "
                            "[prefix, ...], max_bytes, [[topic, pos], ...]]")
    _, version, request_id, incarnation, after, before, prefixes, max_bytes, known = msg
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version!r}, this exchange speaks {VERSION}")
    if not all(_is_int(v) and v >= 0 for v in (request_id, after, before, max_bytes)):
        raise ProtocolError("fetch request_id, after, before and max_bytes must be integers >= 0")
    if not isinstance(incarnation, str):
        raise ProtocolError("fetch incarnation must be a string")
    if not isinstance(prefixes, list) or len(prefixes) > MAX_FETCH_PREFIXES \
            or not all(isinstance(p, bytes) for p in prefixes):
        raise ProtocolError(f"fetch prefixes must be a list of at most {MAX_FETCH_PREFIXES} byte strings")
    if not isinstance(known, list) or len(known) > MAX_FETCH_PREFIXES or not all(
            isinstance(k, list) and len(k) == 2 and isinstance(k[0], bytes) and _is_int(k[1]) for k in known):
        raise ProtocolError(f"fetch known topics must be at most {MAX_FETCH_PREFIXES} [topic, pos] pairs")
    return Fetch(request_id, incarnation, after, before, prefixes, max_bytes, {k[0]: k[1] for k in known})


@dataclass(frozen=True)
class Frames:
    request_id: int
    incarnation: str
    oldest: int  # oldest position still retained
    frames: list[tuple[bytes, bytes]]  # (topic, delivery body), in position order
    scanned_to: int  # every position <= this was looked at
    done: bool


def encode_frames(request_id: int, incarnation: str, oldest: int, frames: list[tuple[bytes, bytes]],
                  scanned_to: int, done: bool) -> bytes:
    return pack([FRAMES, VERSION, request_id, incarnation, oldest, frames, scanned_to, done])


def decode_fetch_reply(frame: bytes, max_size: int) -> Frames:
    msg = unpack(frame, max_size)
    if isinstance(msg, list) and len(msg) == 5 and msg[0] == ERROR:
        raise ProtocolError(f"exchange refused the fetch: {msg[3]}: {msg[4]}")
    if not isinstance(msg, list) or len(msg) != 8 or msg[0] != FRAMES or msg[1] != VERSION:
        raise ProtocolError("fetch reply must be [\"frames\", v, request_id, incarnation, oldest, "
                            "frames, scanned_to, done]")
    _, _, request_id, incarnation, oldest, frames, scanned_to, done = msg
    if not isinstance(frames, list) or not all(
            isinstance(f, list) and len(f) == 2 and all(isinstance(x, bytes) for x in f) for f in frames):
        raise ProtocolError("fetch reply frames must be [topic, body] pairs")
    return Frames(request_id, incarnation, oldest, [(f[0], f[1]) for f in frames], scanned_to, bool(done))


def decode_exchange_reply(frame: bytes) -> list[Any]:
    msg = unpack(frame, MAX_CONTROL_FRAME)
    if not isinstance(msg, list) or len(msg) < 2 or not isinstance(msg[0], str):
        raise ProtocolError("exchange reply must be an array [kind, version, ...]")
    return msg
