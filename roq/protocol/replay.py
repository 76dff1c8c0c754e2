"""Retention fetches, position checks and progress reports (section 5): subscriber ↔ exchange `replay`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from roq.errors import ProtocolError
from roq.names import is_name
from roq.protocol.codec import (
    DATA_VERSION,
    ERROR,
    MAX_CONTROL_FRAME,
    MAX_INCARNATION,
    MAX_PREFIXES,
    MAX_TOPIC,
    is_int,
    pack,
    unpack,
)
from roq.protocol.fields import Anything, Array, Bin, Bool, Conversation, Field, Int, ListOf, Str, Test, frame
from roq.protocol.large import MAX_PARTS, LargeBody

FETCH, FRAMES, POSITION, PROGRESS = "fetch", "frames", "position", "progress"
POSITION_AT = "position_at"  # a time mapped to a position (section 5.6)
MAX_TIME = float(1 << 40)  # Unix seconds: far beyond any clock, well within a double's exact integers
MAX_CONSUMER_NAME = 63  # a durable subscriber's name (roq.names.check_subscriber_name)

PREFIXES = ListOf(Bin(0, MAX_TOPIC), max_len=MAX_PREFIXES)
INCARNATION = Str(1, MAX_INCARNATION)
NAME = Test(is_name, "a name of 1-63 letters, digits, '_', '.', '-', starting with a letter or digit")
UNIX_TIME = Test(lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
                 and math.isfinite(value) and 0 <= value <= MAX_TIME, "int or float 0..2^40 (Unix seconds)")


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
class PositionAtRequest:
    """A decoded `position_at` request (section 5.6): the first position stored at or after `at`."""
    request_id: int
    incarnation: str  # "" = the running one
    at: float  # Unix seconds


@dataclass(frozen=True)
class Progress:
    """A decoded `progress` report (section 5.5): durable subscriber `name` has taken every frame
    of `incarnation` up to `pos`. Never answered (unless malformed)."""
    name: str
    incarnation: str
    pos: int


REPLAY_REQUESTS = Conversation(
    "replay request",
    frame(FETCH, Field("request_id", Int()), Field("incarnation", Str(0, MAX_INCARNATION)), Field("after", Int()),
          Field("before", Int()), Field("prefixes", PREFIXES, shown="[prefix, ...]"), Field("max_bytes", Int()),
          build=Fetch),
    frame(POSITION, Field("request_id", Int()), Field("prefixes", PREFIXES, shown="[prefix, ...]"),
          Field("incarnation", INCARNATION, optional=True, default=""), build=PositionRequest),
    frame(PROGRESS, Field("name", NAME), Field("incarnation", INCARNATION), Field("pos", Int()), build=Progress),
    frame(POSITION_AT, Field("request_id", Int()), Field("incarnation", Str(0, MAX_INCARNATION)),
          Field("at", UNIX_TIME), build=PositionAtRequest),
)


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


def encode_position_at_request(request_id: int, at: float, incarnation: str = "") -> bytes:
    """`position_at`: the first position of the stream stored at or after Unix time `at`."""
    return pack([POSITION_AT, DATA_VERSION, request_id, incarnation, float(at)])


def decode_replay_request(frame: bytes) -> Fetch | PositionRequest | PositionAtRequest | Progress:
    """A `fetch`, `position` or `position_at` request or a `progress` report, every field range-checked."""
    request: Fetch | PositionRequest | PositionAtRequest | Progress = REPLAY_REQUESTS.decode(
        unpack(frame, MAX_CONTROL_FRAME))
    return request


@dataclass(frozen=True)
class Frames:
    """A decoded `frames` answer: one page of a fetch."""
    request_id: int
    incarnation: str
    oldest: int  # oldest position still retained
    frames: list[tuple[bytes, Any]]  # (topic, delivery body: bytes, or a LargeBody with its parts), in order
    scanned_to: int  # every position <= this was looked at
    done: bool
    lost: int  # messages of the prefixes evicted in (after, oldest) before this fetch
    lost_exact: bool  # False: the eviction record does not reach back to `after`; at least `lost`


@dataclass(frozen=True)
class TimePosition:
    """A decoded `position_at` answer."""
    request_id: int
    incarnation: str
    oldest: int
    next_pos: int
    pos: int  # the first position stored at or after the time asked (oldest <= pos <= next_pos)


@dataclass(frozen=True)
class StreamPosition:
    """A decoded `position` answer."""
    request_id: int
    incarnation: str
    oldest: int
    next_pos: int
    last: list[int]  # per prefix asked: no frame of it lies in (last, next_pos)


class ReplayRefused(ProtocolError):
    """The exchange answered a replay request with an error (`busy`, `unknown_incarnation`, ...)."""

    def __init__(self, request_id: int | None, code: str, message: str) -> None:
        super().__init__(f"exchange refused: {code}: {message}")
        self.request_id = request_id
        self.refusal = code


def _refused(request_id: Any, code: Any, message: Any) -> ReplayRefused:
    """An `error` answer, taken whatever its fields' types: it is raised, never used."""
    return ReplayRefused(request_id if is_int(request_id) else None, str(code), str(message))


def _frames(request_id: int, incarnation: str, oldest: int, frames: list[list[bytes]], scanned_to: int, done: bool,
            lost: list[Any]) -> Frames:
    return Frames(request_id, incarnation, oldest, [(f[0], f[1]) for f in frames], scanned_to, done, lost[0], lost[1])


REPLAY_REPLIES = Conversation(
    "replay reply",
    frame(FRAMES, Field("request_id", Int()), Field("incarnation", Str()), Field("oldest", Int()),
          Field("frames", ListOf(Array(Field("topic", Bin()), Field("body", Bin()),
                                       Field("parts", Int(1, MAX_PARTS), optional=True))),
                shown="[[topic, body] or [topic, body, parts], ...]"),
          Field("scanned_to", Int()), Field("done", Bool()),
          Field("lost", Array(Field("lost", Int()), Field("exact", Bool())), shown="[lost, exact]"), build=_frames),
    frame(POSITION, Field("request_id", Int()), Field("incarnation", Str()), Field("oldest", Int()),
          Field("next_pos", Int()), Field("last", ListOf(Int()), shown="[last, ...]"), build=StreamPosition),
    frame(POSITION_AT, Field("request_id", Int()), Field("incarnation", Str()), Field("oldest", Int()),
          Field("next_pos", Int()), Field("pos", Int()), build=TimePosition),
    frame(ERROR, Field("request_id", Anything, shown="request_id or nil"), Field("code", Anything),
          Field("message", Anything), build=_refused),
)


def encode_frames(request_id: int, incarnation: str, oldest: int, frames: list[tuple[bytes, Any]],
                  scanned_to: int, done: bool, lost: int, lost_exact: bool) -> bytes:
    """One page of a fetch, with what was evicted from the range before it was asked for (every
    body bytes: encode_frames_message takes frames with large payloads' parts too)."""
    return pack([FRAMES, DATA_VERSION, request_id, incarnation, oldest, frames, scanned_to, done,
                 [lost, lost_exact]])


def encode_frames_message(request_id: int, incarnation: str, oldest: int, frames: list[tuple[bytes, Any]],
                          scanned_to: int, done: bool, lost: int, lost_exact: bool) -> list[Any]:
    """encode_frames as the parts of one ZeroMQ message: the reply, then the large payloads'
    parts of its frames in frame order (a LargeBody's entry is [topic, body, parts])."""
    entries: list[Any] = []
    parts: list[Any] = []
    for topic, body in frames:
        if isinstance(body, LargeBody):
            entries.append([topic, body.body, len(body.parts)])
            parts += body.parts
        else:
            entries.append((topic, body))
    return [encode_frames(request_id, incarnation, oldest, entries, scanned_to, done, lost, lost_exact), *parts]


def encode_position(request_id: int, incarnation: str, oldest: int, next_pos: int, last: list[int]) -> bytes:
    """The answer to a position request: `last[i]` for `prefixes[i]`."""
    return pack([POSITION, DATA_VERSION, request_id, incarnation, oldest, next_pos, last])


def encode_position_at(request_id: int, incarnation: str, oldest: int, next_pos: int, pos: int) -> bytes:
    """The answer to a position_at request."""
    return pack([POSITION_AT, DATA_VERSION, request_id, incarnation, oldest, next_pos, pos])


def encode_replay_error(request_id: int | None, code: str, message: str) -> bytes:
    """A refused replay request, echoing its id when it could be read."""
    return pack([ERROR, DATA_VERSION, request_id, code, message])


def decode_replay_reply(frame: bytes, max_size: int,
                        parts: Sequence[Any] = ()) -> Frames | StreamPosition | TimePosition:
    """A `frames`, `position` or `position_at` answer; an `error` answer raises ReplayRefused. `parts`: the ZeroMQ
    parts after the reply, which a `frames` answer's [topic, body, parts] entries take in order."""
    msg = unpack(frame, max_size)
    reply = REPLAY_REPLIES.decode(msg)
    if isinstance(reply, ReplayRefused):
        raise reply
    if isinstance(reply, Frames):
        return _with_parts(reply, msg[5], parts) if parts or any(len(f) == 3 for f in msg[5]) else reply
    if parts:
        raise ProtocolError(f"a {msg[0]} answer is one part, not {1 + len(parts)}")
    decoded: StreamPosition | TimePosition = reply
    return decoded


def _with_parts(reply: Frames, entries: list[list[Any]], parts: Sequence[Any]) -> Frames:
    """The page with each [topic, body, n] entry's body a LargeBody holding the next n parts."""
    frames: list[tuple[bytes, Any]] = []
    taken = 0
    for entry in entries:
        if len(entry) == 2:
            frames.append((entry[0], entry[1]))
            continue
        mine = parts[taken:taken + entry[2]]
        if len(mine) != entry[2]:
            raise ProtocolError(f"frames answer names more parts than the {len(parts)} after it")
        frames.append((entry[0], LargeBody(entry[1], mine)))
        taken += entry[2]
    if taken != len(parts):
        raise ProtocolError(f"frames answer names {taken} parts but {len(parts)} follow it")
    return Frames(reply.request_id, reply.incarnation, reply.oldest, frames, reply.scanned_to, reply.done,
                  reply.lost, reply.lost_exact)
