"""Consumer groups: every message of a group's topics goes to one member, which acks it.

Pure logic, no sockets (exchange/work.py talks to the members; one group's queues and members are
exchange/group.py's). An exchange runs the groups of its own stream: every frame it forwards whose
topic starts with one of a group's prefixes is offered to that group, from the group's first join on
(or, with `from_beginning`, from the oldest frame still retained). Ready work is served by priority,
then round-robin over keys; a member holds at most its prefetch unacked; what times out, is nacked or
was held by a member that went away comes back, to another member when one has credit, and is
dead-lettered after `max_deliveries` (`on_dead`). With `hold_acks` (a replicated exchange) an ack
keeps its room until the replica holds it. The rules and why: docs/work-queues.md "What the exchange
does"; on the wire: docs/protocol.md section 7.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from exchange.group import (
    DEFAULT_PRIORITY,
    MAX_DELIVERIES,
    NACKED,
    NO_KEY,
    Group,
    GroupCounters,
    GroupSettings,
    Level,
    Member,
    Unit,
    frame_units,
)
from roq import protocol
from roq.records import GroupStats

__all__ = ["DEFAULT_PRIORITY", "MAX_DELIVERIES", "NACKED", "NO_KEY", "Group", "GroupCounters", "GroupSettings",
           "Groups", "Level", "Member", "Unit"]


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
        self.keep_done = True  # keep what left each group for take_done() (a replica copies it)
        # Told of every message range that leaves a group (a disk-retained queue's cursor files)
        self.on_done: Callable[[Group, int, int, int], None] | None = None

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
              deliveries: int = 0, topics: list[bytes] | None = None, end: int | None = None) -> None:
        """A frame the exchange forwarded: every group whose prefixes match a message takes it (or
        only `only`), from message `start` on. `topics`: each message's topic in a frame of many
        (None: all have `topic`). `attrs`: (index, priority, not_before_ms, key) or (index,
        priority, not_before_ms, key, headers) of the messages published with some; `deliveries`:
        how often they were delivered already (adopted); `end`: up to message `end` - 1 only."""
        stop = len(seqs) if end is None else end
        if topics is None:
            self._offer_run(pos, topic, publisher, sent_ns, seqs, payloads, attrs, only, start, stop, deliveries)
            return
        for run_topic, begin, run_end in _topic_runs(topics):
            if min(run_end, stop) > max(begin, start):
                self._offer_run(pos, run_topic, publisher, sent_ns, seqs, payloads, attrs, only, max(begin, start),
                                min(run_end, stop), deliveries)

    def _offer_run(self, pos: int, topic: bytes, publisher: str, sent_ns: int, seqs: list[int],
                   payloads: list[bytes], attrs: list[tuple[Any, ...]] | None, only: Group | None, start: int,
                   end: int, deliveries: int) -> None:
        """Messages start..end-1 of a frame, all of `topic`, to the groups that match it."""
        # A spilled group (exchange/group_spill.py) takes frames from the store, not live.
        groups = [g for g in ((only,) if only is not None else self.groups.values())
                  if g.matches(topic) and (only is not None or not g.spilled_from)]
        if not groups or start >= end:
            return
        now, wall = self.clock(), self.wall()
        units = list(frame_units(pos, topic, publisher, sent_ns, seqs, payloads, attrs, now, start, end))
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
        """Fill the members' credit from the ready queues (Group.dispatch)."""
        return group.dispatch(self.clock(), unit_limit)

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
                self._left(group, piece)
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
        """Units that could not be sent: back to the front of their queues (Group.unsend)."""
        group.unsend(units, self.wall())

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
        self._left(group, unit)
        self.on_dead(group, unit, reason)

    def _left(self, group: Group, unit: Unit) -> None:
        if self.keep_done:
            group.done.append((unit.pos, unit.idx, unit.count))
        if self.on_done is not None:
            self.on_done(group, unit.pos, unit.idx, unit.count)

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
        waiting = group.waiting()
        for unit in waiting:
            self._drop(group, unit)
        group.levels.clear()
        group.delayed.clear()
        group.ready = group.delayed_count = 0
        group.spilled_from = 0  # what waits on disk for it goes too
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
        """Every group's state at stream position `upto` (Group.record)."""
        return [group.record(upto) for group in self.groups.values()]

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
        """Each group's figures now (Group.stats)."""
        now = self.clock()
        return {name: group.stats(now) for name, group in self.groups.items()}


def _topic_runs(topics: list[bytes]) -> list[tuple[bytes, int, int]]:
    """(topic, first index, end index) of each run of equal topics in a frame of many."""
    runs: list[tuple[bytes, int, int]] = []
    begin = 0
    for i in range(1, len(topics) + 1):
        if i == len(topics) or topics[i] != topics[begin]:
            runs.append((topics[begin], begin, i))
            begin = i
    return runs
