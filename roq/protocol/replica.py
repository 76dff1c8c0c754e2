"""Replication (sections 6 and 7.6): an exchange's copy stream and its groups' state to its
replica on `repl`, and the replica's answers. Every frame of the primary ends with the
incarnation's copy secret (`proof`); checking it is the replica's business."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from roq.names import is_name
from roq.protocol.codec import DATA_VERSION, MAX_INCARNATION, MAX_SEQ, MAX_TOPIC, pack, unpack
from roq.protocol.fields import Array, Bin, Bool, Conversation, Field, Int, ListOf, Str, Test, frame
from roq.protocol.work import GROUP, GROUP_PREFIXES, MAX_ACK_TIMEOUT_MS, MAX_DELIVERIES, RANGES, ranges_of

FOLLOW, FOLLOWING, COPY, COPIED, SEALED = "follow", "following", "copy", "copied", "sealed"
GROUPS, DONE, ADOPT, ADOPTION, MARK, MARKED = "groups", "done", "adopt", "adoption", "mark", "marked"
APPLIED, RECORDED = "applied", "recorded"
FILL, FILLED = "fill", "filled"
BROKEN = "broken"
MAX_REASON = 1024  # characters of a `broken` reason
FILL_ENDED, FILLED_ENDED = "fill_ended", "filled_ended"  # an earlier incarnation's store (section 6.5)
MAX_STORED_AT_US = 1 << 53  # microseconds since the Unix epoch a stored frame may carry (year 285,000)
MAX_COPY_FRAME = 1 << 30  # a copy carries at most exchange.fetch_max_bytes-sized pages; generous
MIN_PROOF, MAX_PROOF = 16, 64  # bytes of an incarnation's copy secret
MAX_APPLIED = 256  # command ids an adoption names (the newest)
MAX_GROUP_STATES = 1024
_COMMAND_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


def copy_digest(proof: bytes) -> str:
    """What an exchange publishes of its copy secret (`copy_digest` in its live znode): the hex
    SHA-256, from which the secret cannot be found."""
    return hashlib.sha256(proof).hexdigest()


def is_command_id(value: Any) -> bool:
    """An admin command's id (section 2: `c-` and 16 hex digits, or `k-` and the request key)."""
    return isinstance(value, str) and _COMMAND_ID.fullmatch(value) is not None


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
class Fill:
    """`fill` (state transfer, section 6.5): consecutive frames of the primary's segment store from
    `first_pos`, all below `end_pos`, where the replica's copy of the incarnation starts."""
    incarnation: str
    first_pos: int
    end_pos: int
    frames: list[tuple[int, bytes, bytes, int]]  # (stored_at in µs since the epoch, topic, body, messages)
    jump: bool  # the primary's store holds nothing between what the replica asked for and first_pos
    proof: bytes
    ended: str = ""  # `fill_ended`: the earlier incarnation whose store the frames are (end_pos: its end)


@dataclass(frozen=True)
class Filled:
    """`filled`: the replica holds the transfer below `end_pos` from its start up to `next_pos`
    (== end_pos: the transfer is complete; 0: no transfer toward that `end_pos` is taken)."""
    incarnation: str
    next_pos: int
    end_pos: int
    kind: str = FILLED
    ended: str = ""  # `filled_ended`: the earlier incarnation transferred


@dataclass(frozen=True)
class ReplicaReply:
    """`following` / `copied` (next_pos: the replica holds every position below it that it was
    sent) or `sealed` (next_pos 0: the replica takes nothing more of this incarnation)."""
    kind: str
    incarnation: str
    next_pos: int


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
    # [from, to): frames from `upto` on that hold nothing of the group's (other groups' backlogs
    # forwarded again at an adoption or restore: exchange/group_spill.py); (0, 0): none.
    gap: tuple[int, int] = (0, 0)

    def wire(self) -> list[Any]:
        fields = [self.name, list(self.prefixes), self.ack_timeout_ms, self.max_deliveries, self.dead_letter,
                  self.upto, [list(p) for p in self.pending]]
        return fields + [list(self.gap)] if self.gap != (0, 0) else fields  # absent when empty: older peers

    def is_pending_whole(self, pos: int) -> bool:
        """Whether the group's messages in the frame at `pos` were all pending (never offered)."""
        return pos >= self.upto and not self.gap[0] <= pos < self.gap[1]


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


@dataclass(frozen=True)
class Mark:
    """`mark`: answer `marked serial` once every `groups` and `done` frame sent before this one is held."""
    incarnation: str
    serial: int
    proof: bytes


@dataclass(frozen=True)
class Broken:
    """The replica cannot store this incarnation's copy (its disk refused a write or an fsync): it
    takes no page now and answers none `copied`; `reason` says why, for the primary's log."""
    incarnation: str
    reason: str
    kind: str = BROKEN


@dataclass(frozen=True)
class Marked:
    """The replica holds the group state and acks the primary sent before its `mark` `serial`."""
    incarnation: str
    serial: int
    kind: str = MARKED


@dataclass(frozen=True)
class Adopt:
    incarnation: str  # the asking primary's (new) incarnation
    exchange: str
    proof: bytes
    page: tuple[int, int] | None = None  # (group, after): the adoption page asked for; None: unpaged


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
    # (group, after, next_group, next_after) of a paged reply: its frames are group `group`'s after
    # position `after`; next_group == len(groups) of the first page: the last page. None: unpaged.
    page: tuple[int, int, int, int] | None = None
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


# ------------------------------------------------ declarations

INCARNATION = Field("incarnation", Str(1, MAX_INCARNATION))
PROOF = Field("proof", Bin(MIN_PROOF, MAX_PROOF))
COMMAND_ID = Test(is_command_id, "a command id (1-80 letters, digits, '_' or '-')")
GROUP_STATE = Array(
    Field("group", GROUP), Field("prefixes", GROUP_PREFIXES, shown="[prefix, ...]"),
    Field("ack_timeout_ms", Int(1, MAX_ACK_TIMEOUT_MS)), Field("max_deliveries", Int(1, MAX_DELIVERIES)),
    Field("dead_letter", Bin(1, MAX_TOPIC)), Field("upto", Int(1)),
    Field("pending", ListOf(Array(Field("pos", Int(1)), Field("idx", Int()), Field("count", Int(1)),
                                  Field("deliveries", Int(0, MAX_DELIVERIES)))),
          shown="[[pos, idx, count, deliveries], ...]"),
    # absent from a primary of before groups on disk with a replica, and when the group has no gap
    Field("gap", Array(Field("from", Int(1)), Field("to", Int(1)),
                       rules=[(lambda start, end: start < end, "gap from < to")]),
          shown="[from, to]", optional=True, default=None),
    rules=[(lambda *g: g[7] is None or g[7][0] >= g[5], "gap from >= upto")])
_GROUP_STATES = ListOf(GROUP_STATE, max_len=MAX_GROUP_STATES)
GROUP_STATES = Field("groups", _GROUP_STATES, shown="[[group, [prefix, ...], ack_timeout_ms, max_deliveries, "
                                                    "dead_letter, upto, [[pos, idx, count, deliveries], ...], "
                                                    "[from, to]?], ...]")
GROUP_STATE_LIST = Field("groups", _GROUP_STATES, shown="[group state, ...]")


def records_of(groups: list[list[Any]]) -> list[GroupRecord]:
    return [GroupRecord(g[0], tuple(g[1]), g[2], g[3], g[4], g[5], [(p[0], p[1], p[2], p[3]) for p in g[6]],
                        (g[7][0], g[7][1]) if len(g) > 7 else (0, 0))
            for g in groups]


def _copy(incarnation: str, first_pos: int, frames: list[list[Any]], jump: bool, proof: bytes) -> Copy:
    return Copy(incarnation, first_pos, [(f[0], f[1], f[2]) for f in frames], jump, proof)


def _fill(incarnation: str, first_pos: int, end_pos: int, frames: list[list[Any]], jump: bool, proof: bytes) -> Fill:
    return Fill(incarnation, first_pos, end_pos, [(f[0], f[1], f[2], f[3]) for f in frames], jump, proof)


def _fill_ended(incarnation: str, ended: str, first_pos: int, end_pos: int, frames: list[list[Any]], jump: bool,
                proof: bytes) -> Fill:
    return Fill(incarnation, first_pos, end_pos, [(f[0], f[1], f[2], f[3]) for f in frames], jump, proof, ended)


FILL_FRAMES = Field("frames", ListOf(Array(Field("stored_at_us", Int(0, MAX_STORED_AT_US)),
                                           Field("topic", Bin(0, MAX_TOPIC)), Field("body", Bin()),
                                           Field("messages", Int()))),
                    shown="[[stored_at_us, topic, body, messages], ...]")
ENDED = Field("ended", Str(1, MAX_INCARNATION))

REPLICA_REQUESTS = Conversation(
    "replication request",
    frame(FOLLOW, INCARNATION, Field("exchange", Str(1, MAX_INCARNATION)), PROOF, build=Follow),
    frame(COPY, INCARNATION, Field("first_pos", Int(1)),
          Field("frames", ListOf(Array(Field("topic", Bin(0, MAX_TOPIC)), Field("body", Bin()),
                                       Field("messages", Int()))), shown="[[topic, body, messages], ...]"),
          Field("jump", Bool()), PROOF,
          rules=[(lambda inc, first_pos, frames, *_: first_pos + len(frames) <= MAX_SEQ, "copy positions overflow")],
          build=_copy),
    frame(GROUPS, INCARNATION, GROUP_STATES, PROOF,
          build=lambda incarnation, groups, proof: GroupState(incarnation, records_of(groups), proof)),
    frame(DONE, INCARNATION,
          Field("done", ListOf(Array(Field("group", Test(is_name, "a group name")), Field("ranges", RANGES)),
                               max_len=MAX_GROUP_STATES), shown="[[group, [[pos, idx, count], ...]], ...]"), PROOF,
          build=lambda incarnation, done, proof: GroupsDone(incarnation, {g: ranges_of(r) for g, r in done}, proof)),
    frame(MARK, INCARNATION, Field("serial", Int(1)), PROOF, build=Mark),
    frame(ADOPT, INCARNATION, Field("exchange", Str(1, MAX_INCARNATION)), PROOF,
          # absent from an exchange of before paged adoptions: the whole adoption in one reply
          Field("page", Array(Field("group", Int()), Field("after", Int())), shown="[group, after]",
                optional=True, default=None),
          build=lambda incarnation, exchange, proof, page: Adopt(
              incarnation, exchange, proof, (page[0], page[1]) if page is not None else None)),
    frame(APPLIED, INCARNATION, Field("command_id", COMMAND_ID), GROUP_STATE_LIST, Field("purge_upto", Int()), PROOF,
          build=lambda incarnation, command_id, groups, purge_upto, proof: Applied(
              incarnation, command_id, records_of(groups), purge_upto, proof)),
    frame(FILL, INCARNATION, Field("first_pos", Int(1)), Field("end_pos", Int(2)), FILL_FRAMES,
          Field("jump", Bool()), PROOF,
          rules=[(lambda inc, first_pos, end_pos, frames, *_: first_pos + len(frames) <= end_pos,
                  "fill frames reach end_pos")],
          build=_fill),
    frame(FILL_ENDED, INCARNATION, ENDED, Field("first_pos", Int(1)), Field("end_pos", Int(2)), FILL_FRAMES,
          Field("jump", Bool()), PROOF,
          rules=[(lambda inc, ended, first_pos, end_pos, frames, *_: first_pos + len(frames) <= end_pos,
                  "fill frames reach end_pos"), (lambda inc, ended, *_: ended != inc, "ended is the running one")],
          build=_fill_ended),
)


def _adoption(incarnation: str, ended: str, groups: list[list[Any]], high: list[list[Any]],
              frames: list[list[Any]], applied: list[str], page: list[int] | None = None) -> Adoption:
    return Adoption(incarnation, ended, records_of(groups), {p: s for p, s in high},
                    [(f[0], f[1], f[2]) for f in frames], tuple(applied),
                    (page[0], page[1], page[2], page[3]) if page is not None else None)


REPLICA_REPLIES = Conversation(
    "replica reply",
    frame(FOLLOWING, INCARNATION, Field("next_pos", Int()),
          build=lambda incarnation, next_pos: ReplicaReply(FOLLOWING, incarnation, next_pos)),
    frame(COPIED, INCARNATION, Field("next_pos", Int()),
          build=lambda incarnation, next_pos: ReplicaReply(COPIED, incarnation, next_pos)),
    frame(SEALED, INCARNATION, build=lambda incarnation: ReplicaReply(SEALED, incarnation, 0)),
    frame(BROKEN, INCARNATION, Field("reason", Str(0, MAX_REASON)), build=Broken),
    frame(MARKED, INCARNATION, Field("serial", Int(1)), build=Marked),
    frame(FILLED, INCARNATION, Field("next_pos", Int()), Field("end_pos", Int()), build=Filled),
    frame(FILLED_ENDED, INCARNATION, ENDED, Field("next_pos", Int()), Field("end_pos", Int()),
          build=lambda incarnation, ended, next_pos, end_pos: Filled(incarnation, next_pos, end_pos, FILLED, ended)),
    frame(RECORDED, INCARNATION, Field("command_id", COMMAND_ID), build=Recorded),
    frame(ADOPTION, INCARNATION, Field("ended", Str(0, MAX_INCARNATION)), GROUP_STATE_LIST,
          Field("high", ListOf(Array(Field("publisher_id", Str()), Field("seq", Int()))),
                shown="[[publisher_id, seq], ...]"),
          Field("frames", ListOf(Array(Field("pos", Int(1)), Field("topic", Bin()), Field("body", Bin()))),
                shown="[[pos, topic, body], ...]"),
          # absent from a replica of before admin commands
          Field("applied", ListOf(COMMAND_ID, max_len=MAX_APPLIED), shown="[command_id, ...]", optional=True,
                default=[]),
          # present only in answer to a paged `adopt`
          Field("page", Array(Field("group", Int()), Field("after", Int()), Field("next_group", Int()),
                              Field("next_after", Int())),
                shown="[group, after, next_group, next_after]", optional=True, default=None),
          build=_adoption),
)


def encode_follow(incarnation: str, exchange: str, proof: bytes) -> bytes:
    return pack([FOLLOW, DATA_VERSION, incarnation, exchange, proof])


def encode_copy(incarnation: str, first_pos: int, frames: list[list[Any]], proof: bytes, jump: bool = False) -> bytes:
    """`frames` are [topic, body, messages] lists (as retention holds them)."""
    return pack([COPY, DATA_VERSION, incarnation, first_pos, frames, jump, proof])


def encode_groups(incarnation: str, groups: list[GroupRecord], proof: bytes) -> bytes:
    return pack([GROUPS, DATA_VERSION, incarnation, [g.wire() for g in groups], proof])


def encode_done(incarnation: str, done: dict[str, list[tuple[int, int, int]]], proof: bytes) -> bytes:
    return pack([DONE, DATA_VERSION, incarnation, [[g, [list(r) for r in ranges]] for g, ranges in done.items()],
                 proof])


def encode_mark(incarnation: str, serial: int, proof: bytes) -> bytes:
    return pack([MARK, DATA_VERSION, incarnation, serial, proof])


def encode_adopt(incarnation: str, exchange: str, proof: bytes, page: tuple[int, int] | None = None) -> bytes:
    """`page`: (group, after) of a paged adoption ((0, 0) first); None: the whole adoption at once."""
    return pack([ADOPT, DATA_VERSION, incarnation, exchange, proof] + ([list(page)] if page is not None else []))


def encode_applied(incarnation: str, command_id: str, groups: list[GroupRecord], purge_upto: int,
                   proof: bytes) -> bytes:
    return pack([APPLIED, DATA_VERSION, incarnation, command_id, [g.wire() for g in groups], purge_upto, proof])


def encode_fill(incarnation: str, first_pos: int, end_pos: int, frames: list[list[Any]], proof: bytes,
                jump: bool = False, ended: str = "") -> bytes:
    """`frames` are [stored_at_us, topic, body, messages] lists, from `first_pos` on, below `end_pos`;
    `ended`: they are that earlier incarnation's (`fill_ended`), not the running one's."""
    if ended:
        return pack([FILL_ENDED, DATA_VERSION, incarnation, ended, first_pos, end_pos, frames, jump, proof])
    return pack([FILL, DATA_VERSION, incarnation, first_pos, end_pos, frames, jump, proof])


def encode_filled(incarnation: str, next_pos: int, end_pos: int, ended: str = "") -> bytes:
    if ended:
        return pack([FILLED_ENDED, DATA_VERSION, incarnation, ended, next_pos, end_pos])
    return pack([FILLED, DATA_VERSION, incarnation, next_pos, end_pos])


ReplicaRequest = Follow | Copy | GroupState | GroupsDone | Mark | Adopt | Applied | Fill


def decode_replica_request(frame: bytes) -> ReplicaRequest:
    """What a replica receives from its primary, every field range-checked."""
    request: ReplicaRequest = REPLICA_REQUESTS.decode(unpack(frame, MAX_COPY_FRAME))
    return request


def encode_replica_reply(kind: str, incarnation: str, next_pos: int = 0) -> bytes:
    if kind == SEALED:
        return pack([SEALED, DATA_VERSION, incarnation])
    return pack([kind, DATA_VERSION, incarnation, next_pos])


def encode_marked(incarnation: str, serial: int) -> bytes:
    return pack([MARKED, DATA_VERSION, incarnation, serial])


def encode_broken(incarnation: str, reason: str) -> bytes:
    return pack([BROKEN, DATA_VERSION, incarnation, reason[:MAX_REASON]])


def encode_recorded(incarnation: str, command_id: str) -> bytes:
    return pack([RECORDED, DATA_VERSION, incarnation, command_id])


def encode_adoption(incarnation: str, ended: str, groups: list[GroupRecord], high: dict[str, int],
                    frames: list[tuple[int, bytes, bytes]], applied: tuple[str, ...] = (),
                    page: tuple[int, int, int, int] | None = None) -> bytes:
    return pack([ADOPTION, DATA_VERSION, incarnation, ended, [g.wire() for g in groups],
                 [[p, s] for p, s in high.items()], [list(f) for f in frames], list(applied[-MAX_APPLIED:])]
                + ([list(page)] if page is not None else []))


ReplicaAnswer = ReplicaReply | Adoption | Marked | Recorded | Filled | Broken


def decode_replica_reply(frame: bytes) -> ReplicaAnswer:
    reply: ReplicaAnswer = REPLICA_REPLIES.decode(unpack(frame, MAX_COPY_FRAME))
    return reply
