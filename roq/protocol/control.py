"""The control API (section 2): requests to the GCM leader and its replies. Each is a msgpack map
(not a data-path array), checked key by key."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgpack

from roq.errors import ProtocolError, RoqError
from roq.protocol.codec import MAX_CONTROL_FRAME, VERSION, pack, unpack


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
