"""The metadata conversation (docs/protocol.md section 8): a queue's topology from any GCM, and
pushes of its changes.

Requests ride the control API (section 2) as ops `metadata.get` and `metadata.watch`; this module
checks their arguments and builds and reads the push frame a GCM sends on the same connection.
A push is told from a reply by its `push` key (a reply has `ok`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roq.errors import LimitExceededError, ProtocolError, UserError
from roq.names import check_queue_name
from roq.protocol.codec import MAX_SEQ, VERSION, pack, unpack

GET, WATCH = "metadata.get", "metadata.watch"
PUSH_KIND = "metadata"
# Stats keys a client uses to choose an exchange (section 3.6); the rest stay in ZooKeeper.
CLIENT_STATS = ("publishers", "at", "storage_full", "storage_error")
# What a client needs of a live exchange's znode besides its stats (section 1).
EXCHANGE_KEYS = ("pub", "sub", "replay", "work", "incarnation", "host", "replicas", "archived", "silent",
                 "heartbeat", "stats_interval")
REPLICA_KEYS = ("replay", "incarnation", "stored")


@dataclass(frozen=True)
class WatchRequest:
    queues: tuple[str, ...]
    versions: dict[str, int]  # the versions the client holds, per queue (absent: none)


def check_get(args: dict[str, Any]) -> str:
    """The queue a `metadata.get` names (UserError on anything else)."""
    _only(args, {"queue"}, {"queue"})
    return check_queue_name(args["queue"])


def check_watch(args: dict[str, Any], max_queues: int) -> WatchRequest:
    """A `metadata.watch`'s queues (1..max_queues distinct names) and versions."""
    _only(args, {"queues", "version", "gcm"}, {"queues"})
    queues, versions = args["queues"], args.get("version", {})
    if not isinstance(queues, list) or not queues:
        raise UserError("queues must be a non-empty list of queue names")
    if len(queues) > max_queues:
        raise LimitExceededError(f"a watch names at most {max_queues} queues (gcm.metadata_max_queues), "
                                 f"got {len(queues)}")
    names = tuple(dict.fromkeys(check_queue_name(q) for q in queues))
    if not isinstance(versions, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SEQ
            for k, v in versions.items()):
        raise UserError("version must be a map of queue name to a non-negative integer")
    return WatchRequest(names, {k: v for k, v in versions.items() if k in names})


def _only(args: dict[str, Any], allowed: set[str], required: set[str]) -> None:
    unknown = sorted(map(str, set(args) - allowed))
    if unknown:
        raise UserError(f"unknown argument(s): {', '.join(unknown)}")
    missing = sorted(required - set(args))
    if missing:
        raise UserError(f"missing argument(s): {', '.join(missing)}")


def client_view(live: dict[str, Any]) -> dict[str, Any]:
    """A live exchange's znode data as clients get it: endpoints, identity and choosing figures."""
    view = {k: live[k] for k in EXCHANGE_KEYS if k in live}
    stats = live.get("stats")
    view["stats"] = {k: stats[k] for k in CLIENT_STATS if k in stats} if isinstance(stats, dict) else {}
    return view


def topology_part(body: dict[str, Any]) -> Any:
    """What a change must touch to be pushed: everything but the figures that move every report
    (`publishers`, `at`), which ride along with the next push or renewal."""
    exchanges = {x: {k: v for k, v in e.items() if k != "stats"} | {
        "storage_full": e.get("stats", {}).get("storage_full")} for x, e in body["exchanges"].items()}
    return (body["exists"], exchanges, body["replicas"], body["relocations"], body["leader"], body["gcms"])


def encode_push(body: dict[str, Any]) -> bytes:
    """One push frame: the body a get answers, marked as a push."""
    return pack({"v": VERSION, "push": PUSH_KIND, **body})


def decode_push(frame: bytes) -> dict[str, Any] | None:
    """A push's body, or None when `frame` is not a push (a reply). ProtocolError if malformed."""
    msg = unpack(frame, 64 << 20)
    if not isinstance(msg, dict) or "push" not in msg:
        return None
    if msg.get("v") != VERSION or msg.get("push") != PUSH_KIND:
        raise ProtocolError(f"unknown push {msg.get('push')!r} (version {msg.get('v')!r})")
    check_body(msg)
    return msg


def check_body(body: Any) -> dict[str, Any]:
    """A get answer or push body, checked enough to use: queue, version, gcm and the maps."""
    if not isinstance(body, dict) or not isinstance(body.get("queue"), str) \
            or not isinstance(body.get("version"), int) or not isinstance(body.get("gcm"), str) \
            or not isinstance(body.get("exists"), bool):
        raise ProtocolError("metadata body needs queue, exists, version and gcm")
    for key in ("exchanges", "replicas", "relocations"):
        if not isinstance(body.get(key), dict):
            raise ProtocolError(f"metadata body's {key} must be a map")
    if not isinstance(body.get("gcms"), list):
        raise ProtocolError("metadata body's gcms must be a list")
    return body

