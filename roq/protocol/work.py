"""Work groups (section 7): a member's join, ack, nack, leave and ping on the exchange's `work`
socket, and the exchange's joined, work, pong and error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from roq.names import is_name
from roq.protocol.attributes import MAX_KEY, MAX_PRIORITY, valid_headers
from roq.protocol.codec import (
    ACK,
    DATA_VERSION,
    ERROR,
    MAX_CONTROL_FRAME,
    MAX_INCARNATION,
    MAX_PREFIXES,
    MAX_TOPIC,
    MAX_U64,
    pack,
    unpack,
)
from roq.protocol.fields import Array, Bin, Bool, Conversation, Field, Int, ListOf, Nullable, Str, Test, frame

JOIN, JOINED, LEAVE, WORK, NACK, PING, PONG = "join", "joined", "leave", "work", "nack", "ping", "pong"
MAX_GROUP_NAME = 63
MAX_PREFETCH = 100_000
MAX_WORK_RANGES = 100_000
MAX_DELIVERIES = 1000
MAX_ACK_TIMEOUT_MS = 86_400_000

GROUP = Test(lambda v: is_name(v) and len(v) <= MAX_GROUP_NAME,
             f"a name of 1-{MAX_GROUP_NAME} letters, digits, '_', '.', '-', starting with a letter or digit")
GROUP_PREFIXES = ListOf(Bin(0, MAX_TOPIC), 1, MAX_PREFIXES)
RANGE = Array(Field("pos", Int(1)), Field("idx", Int()), Field("count", Int(1)))
RANGES = ListOf(RANGE, max_len=MAX_WORK_RANGES)
INCARNATION = Str(1, MAX_INCARNATION)


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


def ranges_of(ranges: list[list[int]]) -> list[tuple[int, int, int]]:
    return [(r[0], r[1], r[2]) for r in ranges]


def _join(group: str, prefixes: list[bytes], prefetch: int, ack_timeout_ms: int, max_deliveries: int,
          dead_letter: bytes, from_beginning: bool) -> Join:
    return Join(group, tuple(sorted(set(prefixes))), prefetch, ack_timeout_ms, max_deliveries, dead_letter,
                from_beginning)


_RANGES = Field("ranges", RANGES, shown="[[pos, idx, count], ...]")
MEMBER_FRAMES = Conversation(
    "work frame",
    frame(JOIN, Field("group", GROUP), Field("prefixes", GROUP_PREFIXES, shown="[prefix, ...]"),
          Field("prefetch", Int(1, MAX_PREFETCH)), Field("ack_timeout_ms", Int(1, MAX_ACK_TIMEOUT_MS)),
          Field("max_deliveries", Int(1, MAX_DELIVERIES)),
          Field("dead_letter", Test(lambda v: isinstance(v, bytes) and 0 < len(v) <= MAX_TOPIC and v[:1] != b"\x00",
                                    f"bin of 1-{MAX_TOPIC} bytes, not starting with NUL")),
          Field("from_beginning", Bool()),
          rules=[(lambda group, prefixes, *_: all(p[:1] != b"\x00" for p in prefixes),
                  "group prefixes must not start with NUL")],
          build=_join),
    frame(ACK, Field("group", GROUP), Field("incarnation", INCARNATION), _RANGES,
          build=lambda group, incarnation, ranges: Settle(ACK, group, incarnation, ranges_of(ranges))),
    frame(NACK, Field("group", GROUP), Field("incarnation", INCARNATION), _RANGES, Field("requeue", Bool()),
          build=lambda group, incarnation, ranges, requeue: Settle(NACK, group, incarnation, ranges_of(ranges),
                                                                   requeue)),
    frame(LEAVE, Field("group", GROUP), build=Leave),
    frame(PING, build=Ping),
)


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


def decode_member_frame(frame: bytes, max_size: int = MAX_CONTROL_FRAME) -> Join | Settle | Leave | Ping:
    """A group member's frame on the work socket, every field checked (section 7.2)."""
    decoded: Join | Settle | Leave | Ping = MEMBER_FRAMES.decode(unpack(frame, max_size))
    return decoded


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


# A `work` entry, down to each sequence number and payload (a member trusts nothing it is sent).
ENTRY = Array(Field("pos", Int(1)), Field("idx", Int()), Field("deliveries", Int(1)), Field("topic", Bin(1, MAX_TOPIC)),
              Field("publisher_id", Str()), Field("sent_ns", Int(0, MAX_U64)), Field("seqs", ListOf(Int(1), 1)),
              Field("payloads", ListOf(Bin())), Field("priority", Int(0, MAX_PRIORITY)), Field("key", Bin(0, MAX_KEY)),
              Field("headers", Test(valid_headers, "a headers map (section 3.2.1)"), optional=True),
              rules=[(lambda *e: len(e[6]) == len(e[7]), "as many payloads as seqs")])

_TEXT = Str()
WORK_REPLIES = Conversation(
    "work reply",
    frame(WORK, Field("group", _TEXT), Field("incarnation", _TEXT),
          Field("entries", ListOf(ENTRY), shown="[entry, ...]"),
          build=lambda group, incarnation, entries: WorkReply(WORK, group, incarnation=incarnation, entries=entries)),
    frame(JOINED, Field("group", _TEXT), Field("exchange_id", _TEXT), Field("incarnation", _TEXT),
          build=lambda group, xid, incarnation: WorkReply(JOINED, group, xid, incarnation)),
    frame(PONG, Field("incarnation", _TEXT), Field("groups", ListOf(_TEXT), shown="[group, ...]"),
          build=lambda incarnation, groups: WorkReply(PONG, incarnation=incarnation, groups=groups)),
    frame(ERROR, Field("group", Nullable(_TEXT), shown="group or nil"), Field("code", _TEXT), Field("message", _TEXT),
          build=lambda group, code, message: WorkReply(ERROR, group, code=code, message=message)),
)


def encode_joined(group: str, exchange_id: str, incarnation: str) -> bytes:
    return pack([JOINED, DATA_VERSION, group, exchange_id, incarnation])


def encode_work(group: str, incarnation: str, entries: list[list[Any]]) -> bytes:
    return pack([WORK, DATA_VERSION, group, incarnation, entries])


def encode_pong(incarnation: str, groups: list[str]) -> bytes:
    """Answer to `ping`: the running incarnation and the groups this connection is a member of."""
    return pack([PONG, DATA_VERSION, incarnation, groups])


def encode_work_error(group: str | None, code: str, message: str) -> bytes:
    return pack([ERROR, DATA_VERSION, group, code, message])


def decode_work_reply(frame: bytes, max_size: int) -> WorkReply:
    """An exchange's frame to a group member (section 7.3)."""
    reply: WorkReply = WORK_REPLIES.decode(unpack(frame, max_size))
    return reply
