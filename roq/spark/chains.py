"""Reading an exchange across its incarnations: the ended ones still served, then the running one.

When an exchange restarts (a new incarnation), its earlier incarnations may still be served: by
the running incarnation from its segment store or journal (`archived`), or by the exchange's
replica (`stored`, a host lost with its disk), as the Subscriber reads them
(roq.client.subscriber.from_time, docs/protocol.md 4.4 rule 2 and 7). An offset names one
incarnation per exchange ({inc, pos, msgs}); a stream whose offset is in an ended incarnation
reads it to the end of its copy, and only then moves on to the running incarnation from its first
frame. The end offset that reaches a copy's end says so (`"ended": true`), so that the next
trigger moves on even if the copy has been dropped meanwhile. Pure planning: what the cluster
says comes in a `Copies`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roq.spark.exchanges import StreamEnd

log = logging.getLogger(__name__)


def offset(inc: str, pos: int, msgs: int, replay: str, ended: bool = False) -> dict[str, Any]:
    """One exchange's offset entry; `ended`: `pos` is where that ended incarnation's copy ends."""
    entry: dict[str, Any] = {"inc": inc, "pos": pos, "replay": replay}
    if msgs:
        entry["msgs"] = msgs
    if ended:
        entry["ended"] = True
    return entry


def copy_end(copy: StreamEnd) -> dict[str, Any]:
    return offset(copy.inc, copy.pos, 0, copy.replay, ended=True)


@dataclass(frozen=True)
class Copies:
    """What the cluster serves of the queue's ended incarnations, asked once per trigger.
    `ended`: per exchange id, the copies whose end is known, oldest first (`pos` the copy's last
    position, `oldest` its oldest retained, `replay` the endpoint serving it); `waiting`: exchanges
    with a copy that may come back (a replicated exchange whose replica is not running now, a
    listed copy that did not answer: sealing, busy): ask again at the next trigger."""
    ended: dict[str, tuple[StreamEnd, ...]] = field(default_factory=dict)
    waiting: frozenset[str] = frozenset()

    def of(self, xid: str) -> tuple[StreamEnd, ...]:
        return self.ended.get(xid, ())


class IncarnationLost(RuntimeError):
    """failOnDataLoss: an ended incarnation the query had not read to its end is served nowhere."""


def lost(xid: str, entry: dict[str, Any], fail_on_loss: bool) -> None:
    why = (f"exchange {xid}: incarnation {entry['inc']} has ended and no copy of it is served any more "
           f"(no replica stores it, the running incarnation does not archive it): what it held after "
           f"position {entry['pos']} cannot be read")
    if fail_on_loss:
        raise IncarnationLost(why + " (failOnDataLoss; set it to false to go on with the running incarnation)")
    log.warning("%s; going on with the running incarnation (failOnDataLoss false)", why)


def holds_frames(copy: StreamEnd) -> bool:
    return copy.pos >= copy.oldest


def step(xid: str, start: dict[str, Any] | None, running: dict[str, Any], copies: Copies,
         fail_on_loss: bool) -> dict[str, Any] | None:
    """The next end offset of an exchange whose start offset is in an ended incarnation: the end
    of that incarnation's copy until the start reaches it, then the next ended incarnation served
    that holds frames (from its first), then the running incarnation `running` (from its first
    frame). A start that does not name the exchange (it did not answer when the query started)
    reads it from the beginning, as the running incarnation is read then: from the oldest copy.
    A copy that may come back keeps the start where it is (None: none yet), nothing read this
    trigger; one served nowhere is a loss unless the start had reached its end (`ended`)."""
    chain = copies.of(xid)
    names = [copy.inc for copy in chain]
    if start is None:
        later = chain
    elif start["inc"] in names:
        at = names.index(start["inc"])
        if (start["pos"], start.get("msgs", 0)) < (chain[at].pos, 0):
            return copy_end(chain[at])
        later = chain[at + 1:]
    elif xid in copies.waiting:
        return dict(start)
    else:
        if not start.get("ended"):  # not read to its end, and served nowhere
            lost(xid, start, fail_on_loss)
        # Retention drops the oldest copies first: those still listed came after it.
        later = chain
    for copy in later:
        if holds_frames(copy):
            return copy_end(copy)
    if xid in copies.waiting:  # not past a copy that may come back: it would be skipped
        return None if start is None else dict(start)
    return dict(running)


def earliest(xid: str, running: StreamEnd, copies: Copies) -> dict[str, Any]:
    """startingOffsets earliest: before the oldest frame of the oldest incarnation still served."""
    for copy in copies.of(xid):
        if holds_frames(copy):
            return offset(copy.inc, copy.oldest - 1, 0, copy.replay)
    return offset(running.inc, running.oldest - 1, 0, running.replay)


def at_time(xid: str, running: StreamEnd, copies: Copies, before: dict[str, int]) -> dict[str, Any]:
    """startingTimestamp in a stream: in the oldest incarnation still served that holds a frame
    stored at or after the time, just before it; `before`: per incarnation, the last position
    stored before the time (one not there: read from its oldest frame)."""
    for copy in copies.of(xid):
        pos = before.get(copy.inc, copy.oldest - 1)
        if pos < copy.pos:
            return offset(copy.inc, pos, 0, copy.replay)
    return offset(running.inc, before.get(running.inc, running.oldest - 1), 0, running.replay)


@dataclass(frozen=True)
class Segment:
    """One incarnation's part of a batch read: after (after, skip), up to (upto, take)."""
    inc: str
    replay: str
    after: int
    skip: int
    upto: int
    take: int


def segments(xid: str, start: dict[str, Any], end: dict[str, Any], copies: Copies, fail_on_loss: bool,
             before: dict[str, int] | None = None) -> list[Segment]:
    """A batch read of one exchange from `start` to `end` (in its running incarnation): the rest of
    the start's incarnation when it has ended and is still served, the later ended ones served
    (from their first frame, or from `before`, startingTimestamp's per incarnation), then the
    running incarnation. Ranges that hold nothing are left out."""
    whole: list[Segment] = []
    inc = start["inc"]
    first = (start["pos"], start.get("msgs", 0))
    if inc == end["inc"]:
        return _nonempty([Segment(inc, end["replay"], *first, end["pos"], end.get("msgs", 0))])
    chain = copies.of(xid)
    names = [copy.inc for copy in chain]
    if inc in names:
        at = names.index(inc)
        whole.append(Segment(inc, chain[at].replay, *first, chain[at].pos, 0))
        later = chain[at + 1:]
    else:
        if not start.get("ended"):
            lost(xid, start, fail_on_loss)  # a batch does not wait for a copy to come back
        later = chain  # the oldest copies are dropped first: those still listed came after it
    points = before or {}
    whole += [Segment(copy.inc, copy.replay, points.get(copy.inc, copy.oldest - 1), 0, copy.pos, 0)
              for copy in later if holds_frames(copy)]
    whole.append(Segment(end["inc"], end["replay"], points.get(end["inc"], 0), 0, end["pos"], end.get("msgs", 0)))
    return _nonempty(whole)


def _nonempty(parts: list[Segment]) -> list[Segment]:
    return [p for p in parts if (p.upto, p.take) > (p.after, p.skip)]
