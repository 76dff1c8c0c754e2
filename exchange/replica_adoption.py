"""What a replica answers a restarted exchange that asks for its predecessor's consumer groups.

The newest group state held of an earlier incarnation, brought up to the copy's end (what left the
groups since is taken out, what came since is pending whole), with the frames of its pending
messages and each publisher's highest sequence number in that copy (protocol section 7.6). With a
disk storage policy a group's backlog may lie below the copy's memory tail (the primary's groups
read it from disk: exchange/group_spill.py): those frames are read from the copy's segment store
on this host (exchange/replica_disk.py). An exchange that asks for pages gets one group's frames at
a time, PAGE_BYTES of bodies at most: the adoption is worked out once (a `Plan`: what each group
still holds and where, not the bodies), in bounded steps a loop turn each (`plan_steps`), and each
page read from the copy's memory and store.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import cast

from exchange.retention import Retention
from exchange.segment_reader import ReadResult
from exchange.segment_store import SegmentStore
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

READ_PAGE_BYTES = 4 << 20  # read from the copy's store at a time
PAGE_BYTES = 4 << 20  # frame bodies in one page of a paged adoption


@dataclass
class Plan:
    """An adoption worked out once, served whole or a page at a time."""
    ended: str
    groups: list[protocol.GroupRecord]  # as `_final` makes them
    high: dict[str, int]
    wanted: list[list[int]]  # each group's positions holding its pending messages, ascending
    copy: Retention
    stores: Mapping[str, SegmentStore]  # looked up at each read: a transfer may replace the store meanwhile

    @property
    def store(self) -> SegmentStore | None:
        return self.stores.get(self.ended)


def adoption_plan(adopt: protocol.Adopt, copies: Mapping[str, Retention],
                  group_state: Mapping[str, list[protocol.GroupRecord]],
                  group_done: Mapping[str, dict[str, list[tuple[int, int, int]]]],
                  stores: Mapping[str, SegmentStore] | None = None) -> Plan | None:
    """The groups the incarnation before `adopt.incarnation` left (the newest copy with a state),
    or None: `plan_steps` all at once."""
    steps = plan_steps(adopt, copies, group_state, group_done, stores)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return cast("Plan | None", done.value)


def plan_steps(adopt: protocol.Adopt, copies: Mapping[str, Retention],
               group_state: Mapping[str, list[protocol.GroupRecord]],
               group_done: Mapping[str, dict[str, list[tuple[int, int, int]]]],
               stores: Mapping[str, SegmentStore] | None = None) -> Generator[None, None, Plan | None]:
    """`adoption_plan` in bounded steps (a replica's loop turn each, so a backlog of gigabytes does
    not stop it answering its primaries): a read of READ_PAGE_BYTES of the copy's store, the copy's
    memory tail (bounded by its retention), or one group's final state. Frames on disk are scanned
    for their topics and publishers, their bodies not kept."""
    ended = next((inc for inc in reversed(list(copies)) if inc != adopt.incarnation and inc in group_state
                  and inc.rsplit(".", 1)[0] == adopt.exchange), "")
    if not ended:
        return None
    copy, records = copies[ended], list(group_state[ended])
    lowest = min((needed_from(g) for g in records), default=copy.oldest)
    stores = stores or {}
    store = stores.get(ended)
    index: list[tuple[int, bytes, int]] = []
    high: dict[str, int] = {}
    at = lowest
    if store is not None:
        _gone_below(store, lowest)
        at = max(lowest, store.first_pos)
        # The memory tail may move up meanwhile: read to it; the store is looked up again at each step.
        while (store := stores.get(ended)) is not None and at < min(copy.oldest, store.end_pos):
            page = _read(store, at, min(copy.oldest, store.end_pos), READ_PAGE_BYTES)
            if page.damaged:
                log.warning("adoption: damaged records in the copy's store at %s; passed over", page.damaged)
            for f in page.frames:
                _index(index, high, f.pos, f.topic, f.body, f.messages)
            if page.next_pos <= at:
                break
            at = page.next_pos
            yield
    first = max(at, copy.oldest)
    for pos, (held_topic, held_body, count) in enumerate(copy.entries(first, 1 << 62), first):
        assert isinstance(held_topic, bytes) and isinstance(held_body, bytes) and isinstance(count, int)
        _index(index, high, pos, held_topic, held_body, count)
    done = group_done.get(ended, {})
    groups = []
    for record in records:
        yield
        groups.append(_final(record, done.get(record.name, []), index, copy.next_pos))
    wanted = [sorted({p[0] for p in g.pending}) for g in groups]
    return Plan(ended, groups, high, wanted, copy, stores)


def _index(index: list[tuple[int, bytes, int]], high: dict[str, int], pos: int, topic: bytes, body: bytes,
           messages: int) -> None:
    index.append((pos, topic, messages))
    try:
        delivery = protocol.decode_delivery(body)
    except ProtocolError:
        return
    if delivery.seqs:
        high[delivery.publisher] = max(high.get(delivery.publisher, 0), delivery.seqs[-1])


def adoption_reply(adopt: protocol.Adopt, copies: Mapping[str, Retention],
                   group_state: Mapping[str, list[protocol.GroupRecord]],
                   group_done: Mapping[str, dict[str, list[tuple[int, int, int]]]], applied: tuple[str, ...],
                   stores: Mapping[str, SegmentStore] | None = None, plan: Plan | None = None) -> bytes:
    """The answer to `adopt` (protocol section 7.6): the whole adoption, or the page it asks for
    (`plan`: one worked out for an earlier page of the same adoption). The admin commands
    applied (`applied`) go with it: the adopting exchange applies none of them again."""
    if plan is None:
        plan = adoption_plan(adopt, copies, group_state, group_done, stores)
    if plan is None:
        return protocol.encode_adoption(adopt.incarnation, "", [], {}, [], applied,
                                        None if adopt.page is None else (0, 0, 0, 0))
    if adopt.page is not None:
        return _page(adopt, plan, applied)
    frames, _ = frames_at(plan, sorted({pos for wanted in plan.wanted for pos in wanted}), 1 << 62)
    log.info("%s adopts the %d consumer groups of %s (%d frames)", adopt.incarnation, len(plan.groups), plan.ended,
             len(frames))
    return protocol.encode_adoption(adopt.incarnation, plan.ended, plan.groups, plan.high, frames, applied)


@dataclass
class _Planning:
    """A paged adoption being worked out, a step per loop turn, and the ask waiting for it."""
    asker: str
    steps: Generator[None, None, Plan | None]
    waiting: tuple[bytes, protocol.Adopt, tuple[str, ...]] | None  # (route, ask, applied) to answer once done


class Adoptions:
    """A replica's answers to `adopt`: a paged adoption is worked out once per asker, at its first
    paged ask (again after a restart of ours), in bounded steps (`turn`, once per loop turn: the
    loop answers copies between two), and kept until its asker sends its own state; that asker's
    whole ask (its fallback for a replica of before pages) is not answered."""

    def __init__(self) -> None:
        self._plan: tuple[str, Plan | None] | None = None  # the asker's incarnation, its plan
        self._planning: _Planning | None = None

    @property
    def planning(self) -> bool:
        """A plan is being worked out: the loop should turn at once."""
        return self._planning is not None

    def answer(self, adopt: protocol.Adopt, copies: Mapping[str, Retention],
               group_state: Mapping[str, list[protocol.GroupRecord]],
               group_done: Mapping[str, dict[str, list[tuple[int, int, int]]]], applied: tuple[str, ...],
               stores: Mapping[str, SegmentStore], route: bytes = b"") -> bytes | None:
        """The answer to `adopt` now, or None: none (a whole ask of an asker in pages), or later
        (its plan is being worked out: `turn` answers the last such ask, to `route`)."""
        planning = self._planning is not None and self._planning.asker == adopt.incarnation
        asked_in_pages = planning or (self._plan is not None and self._plan[0] == adopt.incarnation)
        if adopt.page is None:
            # An asker that asked for pages sends the whole ask only as a fallback for a replica of
            # before pages: not one, so no reply the size of the whole backlog is built.
            return None if asked_in_pages else adoption_reply(adopt, copies, group_state, group_done, applied,
                                                              stores)
        if not asked_in_pages:  # worked out once per asker: a repeated (0, 0) is a retry
            self._plan = None
            self._planning = _Planning(adopt.incarnation, plan_steps(adopt, copies, group_state, group_done, stores),
                                       None)
            planning = True
        if planning:
            assert self._planning is not None
            self._planning.waiting = (route, adopt, applied)
            return None
        assert self._plan is not None
        return self._reply(adopt, applied, self._plan[1])

    def turn(self) -> tuple[bytes, bytes] | None:
        """One step of the plan being worked out; once it is, (route, answer) of the ask waiting."""
        planning = self._planning
        if planning is None:
            return None
        try:
            next(planning.steps)
            return None
        except StopIteration as done:
            plan = cast("Plan | None", done.value)
        self._planning, self._plan = None, (planning.asker, plan)
        if planning.waiting is None:
            return None
        route, adopt, applied = planning.waiting
        return route, self._reply(adopt, applied, plan)

    @staticmethod
    def _reply(adopt: protocol.Adopt, applied: tuple[str, ...], plan: Plan | None) -> bytes:
        if plan is None:  # nothing to adopt
            return protocol.encode_adoption(adopt.incarnation, "", [], {}, [], applied, (0, 0, 0, 0))
        return _page(adopt, plan, applied)

    def over(self, incarnation: str) -> None:
        """`incarnation` sent its own group state: its adoption is over."""
        if self._plan is not None and self._plan[0] == incarnation:
            self._plan = None
        if self._planning is not None and self._planning.asker == incarnation:
            self._planning = None


def _page(adopt: protocol.Adopt, plan: Plan, applied: tuple[str, ...]) -> bytes:
    """Group `group`'s frames after position `after`, PAGE_BYTES of bodies at most (one frame at
    least), and where the next page starts; the groups, the publishers' highs and the commands
    go with the first page (0, 0) only."""
    assert adopt.page is not None
    group, after = adopt.page
    first = adopt.page == (0, 0)
    positions = [pos for pos in plan.wanted[group] if pos > after] if group < len(plan.groups) else []
    frames, taken = frames_at(plan, positions, PAGE_BYTES)
    if taken < len(positions):
        following = (group, positions[taken - 1])
    else:
        following = (next((g for g in range(group + 1, len(plan.groups)) if plan.wanted[g]), len(plan.groups)), 0)
    if first:
        log.info("%s adopts the %d consumer groups of %s, in pages", adopt.incarnation, len(plan.groups), plan.ended)
    return protocol.encode_adoption(adopt.incarnation, plan.ended, plan.groups if first else [],
                                    plan.high if first else {}, frames, applied if first else (),
                                    (group, after, *following))


def frames_at(plan: Plan, positions: list[int], max_bytes: int) -> tuple[list[tuple[int, bytes, bytes]], int]:
    """(pos, topic, body) of the frames at `positions` (ascending) from the copy's store and
    memory, about `max_bytes` of bodies (one frame at least), and how many positions that
    covered. Positions neither holds any more are passed over (logged)."""
    frames: list[tuple[int, bytes, bytes]] = []
    size, i, copy, store = 0, 0, plan.copy, plan.store
    while i < len(positions) and (not frames or size < max_bytes):
        pos = positions[i]
        if pos >= copy.oldest or store is None:
            entry = copy.entries(pos, 1) if pos >= copy.oldest else []
            if entry:
                topic, body = entry[0][0], entry[0][1]
                assert isinstance(topic, bytes) and isinstance(body, bytes)
                frames.append((pos, topic, body))
                size += len(body)
            i += 1
            continue
        page = _read(store, pos, min(positions[-1] + 1, copy.oldest), max(max_bytes - size, 1))
        if page.damaged:
            log.warning("adoption: damaged records in the copy's store at %s; passed over", page.damaged)
        wanted = set(positions[i:])
        for f in page.frames:
            if f.pos in wanted:
                frames.append((f.pos, f.topic, f.body))
                size += len(f.body)
        scanned = max(page.next_pos, pos + 1)
        while i < len(positions) and positions[i] < scanned:
            i += 1
    return frames, i


def _final(record: protocol.GroupRecord, done: list[tuple[int, int, int]],
           frames: list[tuple[int, bytes, int]], next_pos: int) -> protocol.GroupRecord:
    """A group's state as the adopting exchange reads it: every pending message listed, up to the
    copy's end. Frames from the state's `upto` on were pending whole (those of the group's topics);
    what left the group since the state (acked, dead-lettered) is taken out."""
    gone: dict[int, list[tuple[int, int]]] = {}
    for pos, idx, count in done:
        gone.setdefault(pos, []).append((idx, idx + count))
    pending = list(record.pending)
    pending += [(pos, 0, messages, 0) for pos, topic, messages in frames
                if record.is_pending_whole(pos) and messages and topic.startswith(record.prefixes)]
    kept = []
    for pos, idx, count, deliveries in pending:
        for start, end in _minus((idx, idx + count), sorted(gone.get(pos, ()))):
            kept.append((pos, start, end - start, deliveries))
    return protocol.GroupRecord(record.name, record.prefixes, record.ack_timeout_ms, record.max_deliveries,
                                record.dead_letter, max(next_pos, record.upto), kept)


def needed_from(record: protocol.GroupRecord) -> int:
    """The lowest position holding a message the group may still hand out."""
    return min([p[0] for p in record.pending], default=record.upto)


def _gone_below(store: SegmentStore, first: int) -> None:
    if store.first_pos > first:
        log.warning("adoption: the copy's store starts at %d, the groups' backlog at %d (retention deleted "
                    "the rest, or a state transfer is under way): those messages are gone", store.first_pos, first)


def _read(store: SegmentStore, first: int, end: int, max_bytes: int) -> ReadResult:
    """A read of the copy's store; one that fails (its disk, or the store replaced under a plan
    worked out over turns) passes the range over as damaged: the adoption is still answered."""
    try:
        return store.read(first, end, max_bytes)
    except OSError as err:
        log.warning("adoption: the copy's store %s cannot be read (%s): positions %d-%d passed over",
                    store.directory, err, first, end - 1)
        return ReadResult([], max(end, first), [(first, end)] if end > first else [])


def stored_pages(store: SegmentStore, first: int, end: int) -> Iterator[list[tuple[int, bytes, bytes, int]]]:
    """(pos, topic, body, messages) of the frames the store holds at first <= pos < end (a group's
    backlog below the copy's memory tail), a page at a time. Positions its retention deleted are
    passed over: the queue's policy let them go."""
    _gone_below(store, first)
    pos, end = max(first, store.first_pos), min(end, store.end_pos)
    while pos < end:
        page = _read(store, pos, end, READ_PAGE_BYTES)
        if page.damaged:
            log.warning("adoption: damaged records in the copy's store at %s; passed over", page.damaged)
        yield [(f.pos, f.topic, f.body, f.messages) for f in page.frames]
        if page.next_pos <= pos:
            break
        pos = page.next_pos


def stored_entries(store: SegmentStore, first: int, end: int) -> list[tuple[int, bytes, bytes, int]]:
    """All of `stored_pages` at once."""
    return [entry for page in stored_pages(store, first, end) for entry in page]


def _minus(span: tuple[int, int], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`span` without the (sorted) `holes`."""
    out, start = [], span[0]
    for lo, hi in holes:
        if hi <= start or lo >= span[1]:
            continue
        if lo > start:
            out.append((start, lo))
        start = max(start, hi)
    if start < span[1]:
        out.append((start, span[1]))
    return out
