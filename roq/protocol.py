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
#   topic, [v, exchange_id, publisher_id, sent_ns, prev_seq, [seq, ...], [payload, ...]]
#   prev_seq: the publisher's previous seq on this topic through this exchange (0 = unknown),
#   so a subscriber can tell that frames of a topic it follows were dropped.

HELLO, BATCH, BYE = "hello", "batch", "bye"
WELCOME, ACK, REJECT, ERROR, MOVE = "welcome", "ack", "reject", "error", "move"


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
    publisher: str
    sent_ns: int
    prev_seq: int
    seqs: list[int]
    payloads: list[bytes]


def encode_delivery(exchange_id: str, publisher: str, sent_ns: int, prev_seq: int,
                    seqs: list[int], payloads: list[bytes]) -> bytes:
    return pack([VERSION, exchange_id, publisher, sent_ns, prev_seq, seqs, payloads])


def decode_delivery(frame: bytes) -> Delivery:
    try:
        msg = msgpack.unpackb(frame, raw=False)
    except Exception:
        raise ProtocolError("delivery is not valid msgpack") from None
    if not isinstance(msg, list) or len(msg) != 7 or msg[0] != VERSION:
        raise ProtocolError("delivery must be [v, exchange, publisher, sent_ns, prev_seq, seqs, payloads]")
    _, exchange_id, publisher, sent_ns, prev_seq, seqs, payloads = msg
    if not isinstance(seqs, list) or not isinstance(payloads, list) or len(seqs) != len(payloads):
        raise ProtocolError("delivery seqs and payloads must be lists of equal length")
    return Delivery(exchange_id, publisher, sent_ns, prev_seq, seqs, payloads)


def decode_exchange_reply(frame: bytes) -> list[Any]:
    msg = unpack(frame, MAX_CONTROL_FRAME)
    if not isinstance(msg, list) or len(msg) < 2 or not isinstance(msg[0], str):
        raise ProtocolError("exchange reply must be an array [kind, version, ...]")
    return msg
