"""Consumer groups: every message of a group's topics goes to one member, which acks it.

Pure logic, no sockets (exchange/work.py talks to the members). An exchange runs the groups of
its own stream: every frame it forwards whose topic starts with one of a group's prefixes is
offered to that group, from the group's first join on (or, for a group created with
`from_beginning`, from the oldest frame still retained).

A group holds its messages as *units*: consecutive messages of one frame with the same
priority, key, not-before time and headers. Units are split only where credit, fairness or a partial ack
ask for it, so a frame of a thousand messages costs one object until a member takes part of it.
Units reference the frame's own lists (seqs, payloads) by offset: no copy until they are sent.

What is ready is served lowest priority number first, and within one priority round-robin over
the keys that have work (one message per key per turn while several keys wait), so one key's
thousand jobs do not starve the others. A message with a not-before time waits in a heap until
the exchange's clock reaches it. A member holds at most `prefetch` unacked messages, and never
more than `max_prefetch` whatever its join asked (a larger join is clamped). A message not acked
within the group's ack timeout, nacked, or held by a member that went away goes back to the front
of its queue with its delivery count, remembering the member it came back from; after
`max_deliveries` counted deliveries it is dead-lettered: handed to `on_dead` with the reason
(`max_deliveries`, or `nack` for a nack without requeue; the forwarder publishes it on the group's
dead-letter topic, saying where it came from in its headers).

A message that came back goes to a member it has not come back from whenever one has credit; only
when none has may it go back to one it came back from, and that repeat does not count toward
`max_deliveries` while the group has a member it has not come back from: one member's nack loop
(or a member that lets everything time out) cannot dead-letter work that others could do.

With `hold_acks` (a replicated exchange) an acked message keeps its room in its member's prefetch
until the replica holds the ack (`settled`): what a failover can hand out again of what a member
processed is at most its prefetch.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
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


_tiebreak = itertools.count()


class Groups:
    """The consumer groups of one exchange incarnation."""

    def __init__(self, max_groups: int = 64, max_members: int = 1000, member_timeout: float = 10.0,
                 group_ttl: float = 86400.0, on_dead: Callable[[Group, Unit, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 max_prefetch: int = 1000) -> None:
        self.max_groups = max_groups
        self.max_prefetch = max_prefetch
        self.max_members = max_members
        self.member_timeout = member_timeout
        self.group_ttl = group_ttl
        self.on_dead = on_dead or (lambda group, unit, reason: None)
        self.clock, self.wall = clock, wall
        self.groups: dict[str, Group] = {}
        self.held_bytes = 0
        self.expired_groups = 0
        # With a replica: an ack frees its member's credit only once the replica holds it (settled()),
        # so that what a member processed and a failover can hand out again is at most its prefetch.
        self.hold_acks = False
        self._settling: list[tuple[Member, int]] = []  # acks held since the last take_settling()

    def __bool__(self) -> bool:
        return bool(self.groups)

    # ------------------------------------------------------------ membership

    def join(self, name: str, route: bytes, settings: GroupSettings, prefetch: int) -> tuple[Group | None, str]:
        """Add `route` as a member (creating the group), holding at most min(prefetch, max_prefetch)
        unacked messages; (group, "") or (None, refusal)."""
        prefetch = min(prefetch, self.max_prefetch)
        now = self.clock()
        group = self.groups.get(name)
        if group is None:
            if len(self.groups) >= self.max_groups:
                return None, f"this exchange already runs {self.max_groups} groups (exchange.max_groups)"
            group = self.groups[name] = Group(name, settings, now)
        elif group.settings != settings:
            return None, (f"group {name!r} runs with {group.settings.describe()}; every member must join with "
                          "the same topics and settings")
        member = group.members.get(route)
        if member is None:
            if len(group.members) >= self.max_members:
                return None, f"group {name!r} already has {self.max_members} members"
            member = group.members[route] = Member(route, prefetch, now)
            group.rotation.append(route)
        member.prefetch, member.last_seen = prefetch, now
        group.idle_since = 0.0
        return group, ""

    def leave(self, name: str, route: bytes) -> None:
        group = self.groups.get(name)
        if group is not None and route in group.members:
            self._remove_member(group, route)

    def disconnected(self, route: bytes) -> None:
        """The connection went away: it leaves every group it was in."""
        for group in list(self.groups.values()):
            if route in group.members:
                self._remove_member(group, route)

    def seen(self, route: bytes) -> None:
        now = self.clock()
        for group in self.groups.values():
            member = group.members.get(route)
            if member is not None:
                member.last_seen = now

    def member_of(self, route: bytes) -> list[str]:
        return [name for name, group in self.groups.items() if route in group.members]

    def _remove_member(self, group: Group, route: bytes) -> None:
        member = group.members.pop(route)
        group.rotation.remove(route)
        self._requeue(group, group.recall(member), member)
        if not group.members:
            group.idle_since = self.clock()

    # ------------------------------------------------------------ messages in

    def offer(self, pos: int, topic: bytes, publisher: str, sent_ns: int, seqs: list[int], payloads: list[bytes],
              attrs: list[tuple[Any, ...]] | None = None, only: Group | None = None, start: int = 0,
              deliveries: int = 0) -> None:
        """A frame the exchange forwarded: every group whose prefixes match it takes it (or only
        `only`), from message `start` on. `attrs`: (index, priority, not_before_ms, key) or (index,
        priority, not_before_ms, key, headers) of the messages published with some; `deliveries`:
        how often they were delivered already (adopted)."""
        groups = [g for g in ((only,) if only is not None else self.groups.values()) if g.matches(topic)]
        if not groups or start >= len(seqs):
            return
        now, wall = self.clock(), self.wall()
        units = list(_units(pos, topic, publisher, sent_ns, seqs, payloads, attrs, now, start))
        for group in groups:
            for unit in units:
                if len(groups) > 1:  # each group needs its own unit objects (their state differs)
                    unit = Unit(unit.pos, unit.idx, unit.count, topic, publisher, sent_ns, seqs, payloads,
                                unit.priority, unit.key, unit.not_before, now, unit.size, unit.headers)
                unit.deliveries = unit.counted = deliveries
                group.add(unit, wall)
                group.held_bytes += unit.size
                self.held_bytes += unit.size
                group.counters.offered += unit.count

    # ------------------------------------------------------------ messages out

    def dispatch(self, group: Group, unit_limit: int = 1 << 62) -> list[tuple[bytes, list[Unit]]]:
        """Fill the members' credit from the ready queues, in turn, in units of at most `unit_limit`
        messages: (route, units) per member served. A message that came back waits for a member it
        has not come back from while one has credit; that member's turn comes in the same call."""
        if not group.ready or not group.members:
            return []
        now = self.clock()
        rotation = group.rotation
        served: dict[bytes, list[Unit]] = {}
        for _ in range(DISPATCH_PASSES):
            deferred = progress = False
            for _ in range(len(rotation)):
                if not group.ready:
                    break
                route = rotation[0]
                rotation.rotate(-1)  # the next dispatch starts with the next member
                member = group.members[route]
                if member.paused_until > now:
                    continue
                while member.credit > 0 and group.ready:
                    unit = group.take(min(member.credit, unit_limit),
                                      lambda head: self._elsewhere(group, head, member, now))
                    if unit is None:
                        deferred = True
                        break
                    group.send(member, unit, now)
                    served.setdefault(route, []).append(unit)
                    progress = True
            # A member passed over for a message that waits for another may take what came after it.
            if not (deferred and progress and group.ready):
                break
        return list(served.items())

    @staticmethod
    def _elsewhere(group: Group, unit: Unit, member: Member, now: float) -> bool:
        """`unit` came back from `member`, and another member it has not come back from has credit."""
        if member.route not in unit.returned:
            return False
        return any(other.credit > 0 and other.paused_until <= now and other.route not in unit.returned
                   for other in group.members.values())

    def ack(self, name: str, route: bytes, ranges: list[tuple[int, int, int]]) -> int:
        """Messages done: they leave the group for good. Only the member holding a message may
        ack it (a late ack of a message given to another member since is ignored). Returns how
        many were acked."""
        group = self.groups.get(name)
        member = group.members.get(route) if group is not None else None
        if group is None or member is None:
            return 0
        done = 0
        for pos, idx, count in ranges:
            for piece in group.settle(pos, idx, count, member):
                done += piece.count
                self._drop(group, piece)
                group.done.append((piece.pos, piece.idx, piece.count))
        group.counters.acked += done
        if done and self.hold_acks:
            member.settling += done
            self._settling.append((member, done))
        return done

    def nack(self, name: str, route: bytes, ranges: list[tuple[int, int, int]], requeue: bool) -> int:
        group = self.groups.get(name)
        member = group.members.get(route) if group is not None else None
        if group is None or member is None:
            return 0
        pieces = [piece for pos, idx, count in ranges for piece in group.settle(pos, idx, count, member)]
        count = sum(piece.count for piece in pieces)
        group.counters.nacked += count
        if requeue:
            self._requeue(group, pieces, member)
        else:
            for piece in pieces:
                self._dead(group, piece, NACKED)
        return count

    def unsend(self, group: Group, units: list[Unit]) -> None:
        """Units that could not be sent (the member's socket is full, or it is gone): back to
        the front of their queues, as if never delivered."""
        wall = self.wall()
        for unit in reversed(units):
            for piece in group.settle(unit.pos, unit.idx, unit.count):
                piece.deliveries -= 1
                piece.counted -= piece.counting
                group.counters.delivered -= piece.count
                if piece.deliveries:
                    group.counters.redelivered -= piece.count
                group.add(piece, wall, front=True)

    def _requeue(self, group: Group, units: list[Unit], returner: Member) -> None:
        """Back from `returner` to the front of their queues (oldest first), or to the dead letters
        once delivered `max_deliveries` times that counted."""
        wall = self.wall()
        for unit in reversed(units):
            if unit.counted >= group.settings.max_deliveries:
                self._dead(group, unit, MAX_DELIVERIES)
                continue
            if returner.route not in unit.returned:
                unit.returned += (returner.route,)
            group.add(unit, wall, front=True)

    def _dead(self, group: Group, unit: Unit, reason: str) -> None:
        group.counters.dead_lettered += unit.count
        self._drop(group, unit)
        group.done.append((unit.pos, unit.idx, unit.count))
        self.on_dead(group, unit, reason)

    def _drop(self, group: Group, unit: Unit) -> None:
        group.held_bytes -= unit.size
        self.held_bytes -= unit.size

    # ------------------------------------------------------------ time

    def tick(self) -> None:
        """Release delayed messages, take back what timed out or silent members hold, forget
        groups without members for `group_ttl`."""
        now, wall = self.clock(), self.wall()
        for name, group in list(self.groups.items()):
            group.release_due(wall)
            for route, member in list(group.members.items()):
                if now - member.last_seen > self.member_timeout:
                    group.counters.expired_members += 1
                    self._remove_member(group, route)
                    continue
                if now >= member.next_deadline:
                    self._take_back_late(group, member, now)
            if not group.members and group.idle_since and now - group.idle_since > self.group_ttl:
                self._drop_group(name)

    def _take_back_late(self, group: Group, member: Member, now: float) -> None:
        late = sorted((u for u in member.units if u.deadline <= now), key=lambda u: (u.pos, u.idx))
        for unit in late:
            for _ in group.settle(unit.pos, unit.idx, unit.count):
                pass
        self._requeue(group, late, member)
        member.next_deadline = min((u.deadline for u in member.units), default=math.inf)

    def shed_idle(self, max_bytes: int) -> list[str]:
        """Over `max_bytes` held: drop groups without members, longest idle first, until under it
        (an abandoned group must not stop the exchange; groups with members get flow control)."""
        dropped = []
        idle = sorted((g for g in self.groups.values() if not g.members), key=lambda g: g.idle_since)
        for group in idle:
            if self.held_bytes <= max_bytes:
                break
            self._drop_group(group.name)
            dropped.append(group.name)
        return dropped

    def _drop_group(self, name: str) -> None:
        group = self.groups.pop(name)
        self.held_bytes -= group.held_bytes
        self.expired_groups += 1

    # ------------------------------------------------------------ admin commands (exchange/commands.py)

    def reset(self, name: str) -> int | None:
        """Drop the group's ready and delayed messages; those in flight stay with their members, who
        ack or give them back as usual. Returns how many went (None: no such group here)."""
        group = self.groups.get(name)
        if group is None:
            return None
        waiting = [u for level in group.levels.values() for q in level.queues.values() for u in q]
        waiting += [entry[2] for entry in group.delayed]
        for unit in waiting:
            self._drop(group, unit)
        group.levels.clear()
        group.delayed.clear()
        group.ready = group.delayed_count = 0
        return sum(unit.count for unit in waiting)

    def delete(self, name: str) -> int:
        """Forget a group without members, with its messages; returns how many it held. A group with
        members is not deleted (they would join again at once and make it anew): ValueError."""
        group = self.groups[name]
        if group.members:
            raise ValueError(f"group {name!r} has {len(group.members)} members connected")
        held = group.ready + group.delayed_count + group.in_flight_count
        del self.groups[name]
        self.held_bytes -= group.held_bytes
        return held

    def next_due(self) -> float | None:
        """Wall-clock time of the earliest delayed message, if any."""
        times = [group.delayed[0][0] for group in self.groups.values() if group.delayed]
        return min(times) if times else None

    # ------------------------------------------------------------ replication (protocol section 7.6)

    def signature(self) -> tuple[int, ...]:
        """Changes whenever a group's state does (for copying it only when it changed)."""
        total = [len(self.groups)]
        for group in self.groups.values():
            c = group.counters
            total += (c.offered, c.acked, c.nacked, c.delivered, c.dead_lettered, group.ready, group.delayed_count)
        return tuple(total)

    def take_done(self) -> dict[str, list[tuple[int, int, int]]]:
        """What left each group (acked, dead-lettered) since the last call."""
        done = {}
        for name, group in self.groups.items():
            if group.done:
                done[name], group.done = group.done, []
        return done

    def take_settling(self) -> list[tuple[Member, int]]:
        """The acks that hold their members' credit (hold_acks) since the last call: hand them to
        settled() once the replica holds them (the `done` taken with them, or a later state)."""
        settling, self._settling = self._settling, []
        return settling

    def settled(self, acks: list[tuple[Member, int]]) -> None:
        """The replica holds these acks: their members' credit is free again."""
        for member, count in acks:
            member.settling = max(0, member.settling - count)

    def records(self, upto: int) -> list[protocol.GroupRecord]:
        """Every group's state at stream position `upto` (every frame below it was offered): its
        messages not yet acked or dead-lettered, as (pos, idx, count, deliveries that counted)."""
        records = []
        for name, group in self.groups.items():
            units: list[Unit] = [u for level in group.levels.values() for q in level.queues.values() for u in q]
            units += [entry[2] for entry in group.delayed]
            units += [u for flying in group.in_flight.values() for u in flying]
            s = group.settings
            records.append(protocol.GroupRecord(name, s.prefixes, round(s.ack_timeout * 1000), s.max_deliveries,
                                                s.dead_letter, upto,
                                                [(u.pos, u.idx, u.count, u.counted) for u in units]))
        return records

    def adopt(self, record: protocol.GroupRecord) -> Group:
        """A group of an ended incarnation, without members until they join again."""
        settings = GroupSettings(tuple(sorted(set(record.prefixes))), record.ack_timeout_ms / 1000.0,
                                 record.max_deliveries, record.dead_letter)
        group = self.groups.get(record.name)
        if group is None:
            group = self.groups[record.name] = Group(record.name, settings, self.clock())
            group.idle_since = self.clock()
        return group

    # ------------------------------------------------------------ statistics

    def stats(self) -> dict[str, GroupStats]:
        """Each group's figures now: members and messages as they stand, counters since its creation."""
        now = self.clock()
        out = {}
        for name, group in self.groups.items():
            oldest = group.oldest_ready()
            c = group.counters
            out[name] = GroupStats(members=len(group.members), ready=group.ready, delayed=group.delayed_count,
                                   in_flight=group.in_flight_count, acked=c.acked, delivered=c.delivered,
                                   redelivered=c.redelivered, nacked=c.nacked, dead_lettered=c.dead_lettered,
                                   held_bytes=group.held_bytes,
                                   oldest_ready_s=round(now - oldest, 3) if oldest is not None else 0.0,
                                   topics=tuple(group.settings.describe()["prefixes"]))
        return out


def _shown(topic: bytes) -> str:
    """A topic as text, or as `0x` and its hex when it is not UTF-8."""
    try:
        return topic.decode()
    except UnicodeDecodeError:
        return "0x" + topic.hex()


def _units(pos: int, topic: bytes, publisher: str, sent_ns: int, seqs: list[int], payloads: list[bytes],
           attrs: list[tuple[Any, ...]] | None, now: float, start: int = 0) -> Iterator[Unit]:
    """Messages start.. of a frame as units: one when no message has attributes, else runs of equal ones."""
    if not attrs:
        yield Unit(pos, start, len(seqs) - start, topic, publisher, sent_ns, seqs, payloads, arrived=now)
        return
    # (priority, not_before_ms, key, headers or None) by index; headers' bytes count in a unit's size
    by_index = {a[0]: (a[1], a[2], a[3], a[4] if len(a) > 4 and a[4] else None) for a in attrs}
    plain = (DEFAULT_PRIORITY, 0, NO_KEY, None)
    current = by_index.get(start, plain)
    for i in range(start + 1, len(seqs) + 1):
        here = by_index.get(i, plain) if i < len(seqs) else None
        if here != current:
            priority, not_before_ms, key, headers = current
            size = None
            if headers:
                size = sum(map(len, payloads[start:i])) + (i - start) * protocol.headers_size(headers, own=True)
            yield Unit(pos, start, i - start, topic, publisher, sent_ns, seqs, payloads, priority, key,
                       not_before_ms / 1000.0, now, size, headers)
            if here is not None:
                start, current = i, here
