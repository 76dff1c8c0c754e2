"""One consumer group: its messages as units, queued by priority and key, and its members.

A group holds its messages as *units*: consecutive messages of one frame with the same
priority, key, not-before time and headers. Units are split only where credit, fairness or a partial ack
ask for it, so a frame of a thousand messages costs one object until a member takes part of it.
Units reference the frame's own lists (seqs, payloads) by offset: no copy until they are sent.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from roq import protocol
from roq.records import GroupStats

DEFAULT_PRIORITY = 0
NO_KEY = b""
# Why a message was dead-lettered (its `roq-reason` header)
NACKED, MAX_DELIVERIES = "nack", "max_deliveries"
# Turns over the members in one dispatch when a message waits for a member it has not come back
# from (each turn must hand something out); what is left goes at the next dispatch.
DISPATCH_PASSES = 3


@dataclass(frozen=True)
class GroupSettings:
    """What every member of a group must agree on."""
    prefixes: tuple[bytes, ...]
    ack_timeout: float
    max_deliveries: int
    dead_letter: bytes

    def describe(self) -> dict[str, Any]:
        """The settings as a joining member sends them (protocol 7.2: `ack_timeout_ms` in ms), in the
        group_mismatch message: a member that was refused can see what to send. Topics that are not
        UTF-8 are shown in hex, so that nothing is lost in the showing."""
        return {"prefixes": sorted(_shown(p) for p in self.prefixes), "ack_timeout_ms": round(self.ack_timeout * 1000),
                "max_deliveries": self.max_deliveries, "dead_letter": _shown(self.dead_letter)}


class Unit:
    """Messages idx..idx+count-1 of the frame at `pos`, with one priority, key, not-before time and
    headers (None: none)."""

    __slots__ = ("pos", "idx", "count", "topic", "publisher", "sent_ns", "seqs", "payloads", "priority", "key",
                 "not_before", "headers", "deliveries", "counted", "counting", "returned", "member", "deadline",
                 "arrived", "size")

    def __init__(self, pos: int, idx: int, count: int, topic: bytes, publisher: str, sent_ns: int,
                 seqs: list[int], payloads: list[bytes], priority: int = DEFAULT_PRIORITY, key: bytes = NO_KEY,
                 not_before: float = 0.0, arrived: float = 0.0, size: int | None = None,
                 headers: dict[str, bytes] | None = None) -> None:
        self.pos, self.idx, self.count = pos, idx, count
        self.topic, self.publisher, self.sent_ns = topic, publisher, sent_ns
        self.seqs, self.payloads = seqs, payloads  # the frame's lists: ours are [idx, idx + count)
        self.priority, self.key, self.not_before = priority, key, not_before
        self.headers = headers
        self.deliveries = 0  # sent to a member this often (what members are told)
        self.counted = 0  # ... of which count toward max_deliveries
        self.counting = False  # the delivery in flight is one of those
        self.returned: tuple[bytes, ...] = ()  # the members (routes) it came back from
        self.member: Member | None = None  # in flight at this member
        self.deadline = 0.0
        self.arrived = arrived
        self.size = sum(map(len, payloads[idx:idx + count])) if size is None else size

    def cut(self, count: int) -> Unit:
        """Split off and return the first `count` messages (same attributes, same state)."""
        head = Unit(self.pos, self.idx, count, self.topic, self.publisher, self.sent_ns, self.seqs, self.payloads,
                    self.priority, self.key, self.not_before, self.arrived, headers=self.headers)
        head.deliveries, head.counted, head.counting = self.deliveries, self.counted, self.counting
        head.returned, head.member, head.deadline = self.returned, self.member, self.deadline
        self.idx += count
        self.count -= count
        self.size -= head.size
        return head

    def entry(self) -> list[Any]:
        """The unit as one entry of a `work` frame (docs/protocol.md section 7)."""
        end = self.idx + self.count
        entry = [self.pos, self.idx, self.deliveries, self.topic, self.publisher, self.sent_ns,
                 self.seqs[self.idx:end], self.payloads[self.idx:end], self.priority, self.key]
        if self.headers:
            entry.append(self.headers)
        return entry


class Level:
    """One priority's ready units: a queue per key, served round-robin."""

    __slots__ = ("queues", "turn")

    def __init__(self) -> None:
        self.queues: dict[bytes, deque[Unit]] = {}
        self.turn: deque[bytes] = deque()  # keys with ready units, the next to serve first

    def add(self, unit: Unit, front: bool = False) -> None:
        queue = self.queues.get(unit.key)
        if queue is None:
            queue = self.queues[unit.key] = deque()
            self.turn.append(unit.key)
        if front:
            queue.appendleft(unit)
        else:
            queue.append(unit)

    def head(self) -> Unit:
        return self.queues[self.turn[0]][0]

    def take(self, limit: int) -> Unit:
        """The next unit of at most `limit` messages (one while several keys wait: fairness)."""
        key = self.turn[0]
        queue = self.queues[key]
        unit = queue[0]
        if len(self.turn) > 1:
            limit = 1
        if unit.count <= limit:
            queue.popleft()
        else:
            unit = unit.cut(limit)
        if not queue:
            del self.queues[key]
            self.turn.popleft()
        elif len(self.turn) > 1:
            self.turn.rotate(-1)
        return unit


class Member:
    __slots__ = ("route", "prefetch", "in_flight", "settling", "units", "last_seen", "next_deadline",
                 "paused_until")

    def __init__(self, route: bytes, prefetch: int, now: float) -> None:
        self.route = route
        self.prefetch = prefetch
        self.in_flight = 0  # messages
        self.settling = 0  # messages it acked that the replica does not hold the ack of yet (Groups.hold_acks)
        self.units: set[Unit] = set()
        self.last_seen = now
        # No unit of ours is late before this: units are sent with ever later deadlines, so only
        # the tick that passes it needs to look at them.
        self.next_deadline = math.inf
        self.paused_until = 0.0  # its socket was full: do not encode work for it again before this

    @property
    def credit(self) -> int:
        return self.prefetch - self.in_flight - self.settling


@dataclass
class GroupCounters:
    delivered: int = 0  # messages sent to members, redeliveries included
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    expired_members: int = 0
    offered: int = 0


@dataclass
class Group:
    name: str
    settings: GroupSettings
    created: float
    members: dict[bytes, Member] = field(default_factory=dict)
    levels: dict[int, Level] = field(default_factory=dict)
    ready: int = 0  # messages
    delayed: list[tuple[float, int, Unit]] = field(default_factory=list)  # heap by not-before
    delayed_count: int = 0
    in_flight: dict[int, list[Unit]] = field(default_factory=dict)  # pos → units out at members
    in_flight_count: int = 0
    held_bytes: int = 0
    idle_since: float = 0.0  # when the last member left (0: has members)
    counters: GroupCounters = field(default_factory=GroupCounters)
    done: list[tuple[int, int, int]] = field(default_factory=list)  # left the group since last taken (replica)
    rotation: deque[bytes] = field(default_factory=deque)  # members, the next to fill first
    # A disk-retained queue's group takes frames from here on from the store, not live (0: live;
    # exchange/group_spill.py)
    spilled_from: int = 0
    spill_gap: tuple[int, int] = (0, 0)  # [from, to): frames read back skip them (exchange/group_sync.py)

    def matches(self, topic: bytes) -> bool:
        return topic.startswith(self.settings.prefixes)

    # ------------------------------------------------------------ ready and delayed

    def add(self, unit: Unit, now_wall: float, front: bool = False) -> None:
        if unit.not_before > now_wall:
            heapq.heappush(self.delayed, (unit.not_before, next(_tiebreak), unit))
            self.delayed_count += unit.count
            return
        level = self.levels.get(unit.priority)
        if level is None:
            level = self.levels[unit.priority] = Level()
        level.add(unit, front)
        self.ready += unit.count

    def release_due(self, now_wall: float) -> None:
        """Move the delayed units whose time came to the ready queues."""
        while self.delayed and self.delayed[0][0] <= now_wall:
            unit = heapq.heappop(self.delayed)[2]
            self.delayed_count -= unit.count
            self.add(unit, now_wall)

    def take(self, limit: int, refuse: Callable[[Unit], bool] | None = None) -> Unit | None:
        """The next ready unit of at most `limit` messages; None when there is none, or when
        `refuse` says no to the one that comes next (it stays first)."""
        if not self.levels:
            return None
        priority = min(self.levels)
        level = self.levels[priority]
        if refuse is not None and refuse(level.head()):
            return None
        unit = level.take(limit)
        if not level.turn:
            del self.levels[priority]
        self.ready -= unit.count
        return unit

    def oldest_ready(self) -> float | None:
        """When the oldest ready unit arrived (monotonic), or None."""
        heads = [queue[0].arrived for level in self.levels.values() for queue in level.queues.values()]
        return min(heads) if heads else None

    # ------------------------------------------------------------ in flight

    def send(self, member: Member, unit: Unit, now: float) -> None:
        unit.member = member
        unit.deliveries += 1
        # Back to a member it came back from, while another could have it: not counted (a member
        # that nacks in a loop must not make it a dead letter).
        unit.counting = not (member.route in unit.returned and self.has_member_besides(unit.returned))
        unit.counted += unit.counting
        unit.deadline = now + self.settings.ack_timeout
        member.next_deadline = min(member.next_deadline, unit.deadline)
        member.units.add(unit)
        member.in_flight += unit.count
        self.in_flight.setdefault(unit.pos, []).append(unit)
        self.in_flight_count += unit.count
        self.counters.delivered += unit.count
        if unit.deliveries > 1:
            self.counters.redelivered += unit.count

    def settle(self, pos: int, idx: int, count: int, holder: Member | None = None) -> Iterator[Unit]:
        """Take messages idx..idx+count-1 of frame `pos` out of flight (only those `holder` holds,
        if given); yields the pieces that were in flight (splitting units where the range ends inside)."""
        units = self.in_flight.get(pos)
        if not units:
            return
        end = idx + count
        for unit in list(units):
            lo, hi = max(unit.idx, idx), min(unit.idx + unit.count, end)
            if lo >= hi or (holder is not None and unit.member is not holder):
                continue
            member = unit.member
            assert member is not None
            if lo > unit.idx:  # keep the part before the range in flight
                head = unit.cut(lo - unit.idx)
                units.append(head)
                member.units.add(head)
            if hi < unit.idx + unit.count:  # ... and the part after it
                piece = unit.cut(hi - unit.idx)
            else:
                piece = unit
                units.remove(unit)
                member.units.discard(unit)
            member.in_flight -= piece.count
            self.in_flight_count -= piece.count
            piece.member = None
            yield piece
        if not units:
            del self.in_flight[pos]

    def has_member_besides(self, routes: tuple[bytes, ...]) -> bool:
        return any(route not in routes for route in self.members)

    def recall(self, member: Member) -> list[Unit]:
        """Everything `member` holds, out of flight (it left, or went silent)."""
        units = sorted(member.units, key=lambda u: (u.pos, u.idx))
        for unit in units:
            for _ in self.settle(unit.pos, unit.idx, unit.count):
                pass
        return units

    def dispatch(self, now: float, unit_limit: int = 1 << 62) -> list[tuple[bytes, list[Unit]]]:
        """Fill the members' credit from the ready queues, in turn, in units of at most `unit_limit`
        messages: (route, units) per member served. A message that came back waits for a member it
        has not come back from while one has credit; that member's turn comes in the same call."""
        if not self.ready or not self.members:
            return []
        rotation = self.rotation
        served: dict[bytes, list[Unit]] = {}
        for _ in range(DISPATCH_PASSES):
            deferred = progress = False
            for _ in range(len(rotation)):
                if not self.ready:
                    break
                route = rotation[0]
                rotation.rotate(-1)  # the next dispatch starts with the next member
                member = self.members[route]
                if member.paused_until > now:
                    continue
                while member.credit > 0 and self.ready:
                    unit = self.take(min(member.credit, unit_limit),
                                     lambda head: self._elsewhere(head, member, now))
                    if unit is None:
                        deferred = True
                        break
                    self.send(member, unit, now)
                    served.setdefault(route, []).append(unit)
                    progress = True
            # A member passed over for a message that waits for another may take what came after it.
            if not (deferred and progress and self.ready):
                break
        return list(served.items())

    def _elsewhere(self, unit: Unit, member: Member, now: float) -> bool:
        """`unit` came back from `member`, and another member it has not come back from has credit."""
        if member.route not in unit.returned:
            return False
        return any(other.credit > 0 and other.paused_until <= now and other.route not in unit.returned
                   for other in self.members.values())

    def unsend(self, units: list[Unit], wall: float) -> None:
        """Units that could not be sent (the member's socket is full, or it is gone): back to
        the front of their queues, as if never delivered."""
        for unit in reversed(units):
            for piece in self.settle(unit.pos, unit.idx, unit.count):
                piece.deliveries -= 1
                piece.counted -= piece.counting
                self.counters.delivered -= piece.count
                if piece.deliveries:
                    self.counters.redelivered -= piece.count
                self.add(piece, wall, front=True)

    def waiting(self) -> list[Unit]:
        """Its ready and delayed units."""
        units = [u for level in self.levels.values() for q in level.queues.values() for u in q]
        return units + [entry[2] for entry in self.delayed]

    def record(self, upto: int) -> protocol.GroupRecord:
        """Its state at stream position `upto` (every frame below it was offered), for the replica:
        its messages not yet acked or dead-lettered, as (pos, idx, count, deliveries that counted)."""
        units = self.waiting() + [u for flying in self.in_flight.values() for u in flying]
        upto = self.spilled_from or upto  # what it was not offered yet is all its own ...
        gap = self.spill_gap if self.spilled_from and self.spill_gap[1] > max(upto, self.spill_gap[0]) else (0, 0)
        s = self.settings  # ... but for the frames it skips (other groups' backlogs forwarded again)
        return protocol.GroupRecord(self.name, s.prefixes, round(s.ack_timeout * 1000), s.max_deliveries,
                                    s.dead_letter, upto, [(u.pos, u.idx, u.count, u.counted) for u in units],
                                    (max(upto, gap[0]), gap[1]) if gap != (0, 0) else gap)

    def stats(self, now: float) -> GroupStats:
        """Members and messages as they stand, counters since its creation."""
        oldest = self.oldest_ready()
        c = self.counters
        return GroupStats(members=len(self.members), ready=self.ready, delayed=self.delayed_count,
                          in_flight=self.in_flight_count, acked=c.acked, delivered=c.delivered,
                          redelivered=c.redelivered, nacked=c.nacked, dead_lettered=c.dead_lettered,
                          held_bytes=self.held_bytes,
                          oldest_ready_s=round(now - oldest, 3) if oldest is not None else 0.0,
                          topics=tuple(self.settings.describe()["prefixes"]))


_tiebreak = itertools.count()


def _shown(topic: bytes) -> str:
    """A topic as text, or as `0x` and its hex when it is not UTF-8."""
    try:
        return topic.decode()
    except UnicodeDecodeError:
        return "0x" + topic.hex()


def frame_units(pos: int, topic: bytes, publisher: str, sent_ns: int, seqs: list[int], payloads: list[bytes],
           attrs: list[tuple[Any, ...]] | None, now: float, start: int = 0, end: int | None = None) -> Iterator[Unit]:
    """Messages start..end-1 (default: to the last) of a frame as units: one when no message has
    attributes, else runs of equal ones."""
    end = len(seqs) if end is None else end
    if not attrs:
        yield Unit(pos, start, end - start, topic, publisher, sent_ns, seqs, payloads, arrived=now)
        return
    # (priority, not_before_ms, key, headers or None) by index; headers' bytes count in a unit's size
    by_index = {a[0]: (a[1], a[2], a[3], a[4] if len(a) > 4 and a[4] else None) for a in attrs}
    plain = (DEFAULT_PRIORITY, 0, NO_KEY, None)
    current = by_index.get(start, plain)
    for i in range(start + 1, end + 1):
        here = by_index.get(i, plain) if i < end else None
        if here != current:
            priority, not_before_ms, key, headers = current
            size = None
            if headers:
                size = sum(map(len, payloads[start:i])) + (i - start) * protocol.headers_size(headers, own=True)
            yield Unit(pos, start, i - start, topic, publisher, sent_ns, seqs, payloads, priority, key,
                       not_before_ms / 1000.0, now, size, headers)
            if here is not None:
                start, current = i, here
