"""The consumer group engine (exchange/groups.py) with a fake clock: examples, and a model-based
search over joins, leaves, offers, dispatches, acks, nacks, timeouts and disconnections."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from exchange.groups import Group, Groups, GroupSettings, Member, Unit
from tests.profiles import examples

SETTINGS = GroupSettings((b"jobs",), ack_timeout=5.0, max_deliveries=3, dead_letter=b"dead")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.wall = 1_000_000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds


def engine(clock: Clock, dead: list[tuple[str, Unit]] | None = None, reasons: list[str] | None = None,
           **kw: object) -> Groups:
    def on_dead(group: Group, unit: Unit, reason: str) -> None:
        if dead is not None:
            dead.append((group.name, unit))
        if reasons is not None:
            reasons.append(reason)
    return Groups(clock=lambda: clock.now, wall=lambda: clock.wall, on_dead=on_dead, **kw)  # type: ignore[arg-type]


def sent(groups: Groups, group: Group) -> dict[bytes, list[tuple[int, int, int]]]:
    out: dict[bytes, list[tuple[int, int, int]]] = {}
    for route, units in groups.dispatch(group):
        out.setdefault(route, []).extend((u.pos, u.idx, u.count) for u in units)
    return out


def payloads(n: int) -> tuple[list[int], list[bytes]]:
    return list(range(1, n + 1)), [b"m%d" % i for i in range(n)]


def members(*routes: bytes, prefetch: int, dead: list[tuple[str, Unit]] | None = None) -> tuple[Groups, Group]:
    """An engine with group "w" of these members (joined in this order), all with `prefetch`."""
    groups = engine(Clock(), dead)
    for route in routes:
        group, _ = groups.join("w", route, SETTINGS, prefetch)
    assert group is not None
    return groups, group


def test_prefetch_bounds_what_a_member_holds_and_acks_free_room() -> None:
    clock = Clock()
    groups = engine(clock)
    group, _ = groups.join("w", b"a", SETTINGS, prefetch=3)
    assert group is not None
    groups.offer(1, b"jobs", "p", 0, *payloads(10))
    assert sent(groups, group) == {b"a": [(1, 0, 3)]}
    assert sent(groups, group) == {}
    assert groups.ack("w", b"a", [(1, 0, 2)]) == 2
    assert sent(groups, group) == {b"a": [(1, 3, 2)]}
    assert group.in_flight_count == 3 and group.ready == 5


def test_with_hold_acks_an_ack_frees_room_only_once_settled() -> None:
    """A replicated exchange's engine: an acked message counts against its member's prefetch until
    the replica holds the ack (settled), so a member never has more than its prefetch of messages a
    failover could hand out again."""
    groups, group = members(b"a", prefetch=3)
    groups.hold_acks = True
    groups.offer(1, b"jobs", "p", 0, *payloads(10))
    assert sent(groups, group) == {b"a": [(1, 0, 3)]}
    assert groups.ack("w", b"a", [(1, 0, 2)]) == 2
    assert sent(groups, group) == {}  # acked, but not yet held by the replica
    held = groups.take_settling()
    assert [(m.route, n) for m, n in held] == [(b"a", 2)] and groups.take_settling() == []
    groups.settled(held)
    assert sent(groups, group) == {b"a": [(1, 3, 2)]}
    assert groups.take_done() == {"w": [(1, 0, 2)]}


def test_an_ack_only_counts_from_the_member_holding_the_message() -> None:
    groups, group = members(b"a", b"b", prefetch=5)
    groups.offer(1, b"jobs", "p", 0, *payloads(5))
    assert sent(groups, group) == {b"a": [(1, 0, 5)]}
    assert groups.ack("w", b"b", [(1, 0, 5)]) == 0  # b does not hold them
    assert groups.ack("w", b"a", [(1, 1, 3)]) == 3  # a partial ack splits the unit
    assert sorted((u.idx, u.count) for u in group.members[b"a"].units) == [(0, 1), (4, 1)]


def test_timeouts_nacks_and_lost_members_redeliver_then_dead_letter() -> None:
    clock = Clock()
    dead: list[tuple[str, Unit]] = []
    groups = engine(clock, dead)
    group, _ = groups.join("w", b"a", SETTINGS, prefetch=10)
    assert group is not None
    groups.offer(1, b"jobs", "p", 0, *payloads(1))
    sent(groups, group)
    clock.advance(6)  # past the ack timeout
    groups.join("w", b"a", SETTINGS, prefetch=10)  # it is alive; only the message is late
    groups.tick()
    (unit,) = [u for _, units in groups.dispatch(group) for u in units]
    assert unit.deliveries == 2
    groups.nack("w", b"a", [(1, 0, 1)], requeue=True)
    (unit,) = [u for _, units in groups.dispatch(group) for u in units]
    assert unit.deliveries == 3
    groups.disconnected(b"a")  # the third delivery failed: max_deliveries reached
    assert [(name, u.count) for name, u in dead] == [("w", 1)] and group.ready == 0
    assert group.counters.dead_lettered == 1 and groups.held_bytes == 0


def test_a_silent_member_is_dropped_and_its_work_goes_to_another() -> None:
    clock = Clock()
    groups = engine(clock, member_timeout=10.0)
    group, _ = groups.join("w", b"a", SETTINGS, prefetch=10)
    assert group is not None
    groups.offer(1, b"jobs", "p", 0, *payloads(4))
    sent(groups, group)
    groups.join("w", b"b", SETTINGS, prefetch=10)
    clock.advance(4)
    groups.seen(b"b")
    clock.advance(7)  # a: 11 s silent; b: 7 s
    groups.tick()
    assert set(group.members) == {b"b"}
    assert sent(groups, group) == {b"b": [(1, 0, 4)]}


def test_a_join_asking_more_than_the_cap_holds_the_cap() -> None:
    clock = Clock()
    groups = engine(clock, max_prefetch=5)
    group, _ = groups.join("w", b"greedy", SETTINGS, prefetch=100_000)
    assert group is not None and group.members[b"greedy"].prefetch == 5
    groups.offer(1, b"jobs", "p", 0, *payloads(20))
    assert sent(groups, group) == {b"greedy": [(1, 0, 5)]}
    assert sent(groups, group) == {}


def test_dispatch_cuts_units_to_the_frame_limit() -> None:
    groups, group = members(b"a", prefetch=10)
    groups.offer(1, b"jobs", "p", 0, *payloads(8))
    assert [(u.idx, u.count) for _, units in groups.dispatch(group, unit_limit=3) for u in units] == \
        [(0, 3), (3, 3), (6, 2)]


def test_a_nacked_message_goes_to_another_member_with_credit() -> None:
    groups, group = members(b"a", b"b", prefetch=5)
    groups.offer(1, b"jobs", "p", 0, *payloads(1))
    assert sent(groups, group) == {b"a": [(1, 0, 1)]}
    groups.offer(2, b"jobs", "p", 0, *payloads(1))
    assert sent(groups, group) == {b"b": [(2, 0, 1)]}  # the next dispatch starts with a again
    groups.ack("w", b"b", [(2, 0, 1)])
    groups.nack("w", b"a", [(1, 0, 1)], requeue=True)
    assert sent(groups, group) == {b"b": [(1, 0, 1)]}  # a has credit too, but it gave it back


def test_a_member_gets_back_what_it_returned_only_when_no_other_has_credit() -> None:
    groups, group = members(b"a", b"b", prefetch=1)
    groups.offer(1, b"jobs", "p", 0, *payloads(3))
    assert sent(groups, group) == {b"a": [(1, 0, 1)], b"b": [(1, 1, 1)]}
    groups.nack("w", b"a", [(1, 0, 1)], requeue=True)
    # b is full: message 0 goes back to a rather than wait, before message 2 (a redelivery goes first).
    assert sent(groups, group) == {b"a": [(1, 0, 1)]}


def test_a_nack_loop_by_one_member_never_dead_letters_while_another_member_is_there() -> None:
    dead: list[tuple[str, Unit]] = []
    groups, group = members(b"loop", b"busy", prefetch=1, dead=dead)
    groups.offer(1, b"jobs", "p", 0, *payloads(2))
    assert sent(groups, group) == {b"loop": [(1, 0, 1)], b"busy": [(1, 1, 1)]}
    for _ in range(10 * SETTINGS.max_deliveries):  # busy has no credit: it comes back to loop each time
        groups.nack("w", b"loop", [(1, 0, 1)], requeue=True)
        assert sent(groups, group) == {b"loop": [(1, 0, 1)]}
    assert dead == [] and group.counters.dead_lettered == 0
    (unit,) = group.members[b"loop"].units
    assert unit.deliveries == 10 * SETTINGS.max_deliveries + 1 and unit.counted == 1
    assert [r.pending for r in groups.records(2)] == [[(1, 1, 1, 1), (1, 0, 1, 1)]]  # the replica counts alike
    groups.ack("w", b"busy", [(1, 1, 1)])
    groups.nack("w", b"loop", [(1, 0, 1)], requeue=True)
    assert sent(groups, group) == {b"busy": [(1, 0, 1)]}
    assert groups.ack("w", b"busy", [(1, 0, 1)]) == 1 and dead == []


def test_a_message_every_member_returned_counts_every_delivery() -> None:
    dead: list[tuple[str, Unit]] = []
    groups, group = members(b"a", b"b", prefetch=1, dead=dead)
    groups.offer(1, b"jobs", "p", 0, *payloads(1))
    for _ in range(SETTINGS.max_deliveries):  # a poison message: it fails at every member
        (route, units), = groups.dispatch(group)
        groups.nack("w", route, [(1, 0, 1)], requeue=True)
    assert [(name, u.count, u.deliveries) for name, u in dead] == [("w", 1, SETTINGS.max_deliveries)]


def test_lower_priority_numbers_first_and_keys_in_turn() -> None:
    clock = Clock()
    groups = engine(clock)
    group, _ = groups.join("w", b"a", SETTINGS, prefetch=100)
    assert group is not None
    seqs, data = payloads(6)
    # messages 0-2: key x, priority 5; 3-4: key y, priority 5; 5: priority 1
    groups.offer(1, b"jobs", "p", 0, seqs, data, [(0, 5, 0, b"x"), (1, 5, 0, b"x"), (2, 5, 0, b"x"),
                                                  (3, 5, 0, b"y"), (4, 5, 0, b"y"), (5, 1, 0, b"")])
    order = [u.idx for _, units in groups.dispatch(group) for u in units for _ in range(u.count)]
    assert order[0] == 5  # the most urgent first
    assert order[1:] == [0, 3, 1, 4, 2]  # then x and y in turn


def test_not_before_holds_a_message_until_its_time() -> None:
    clock = Clock()
    groups = engine(clock)
    group, _ = groups.join("w", b"a", SETTINGS, prefetch=10)
    assert group is not None
    groups.offer(1, b"jobs", "p", 0, *payloads(1), [(0, 0, int((clock.wall + 2) * 1000), b"")])
    groups.tick()
    assert sent(groups, group) == {} and group.delayed_count == 1
    clock.advance(2.5)
    groups.tick()
    assert sent(groups, group) == {b"a": [(1, 0, 1)]}


def test_an_abandoned_group_is_dropped_before_publishers_are_held() -> None:
    clock = Clock()
    groups = engine(clock)
    groups.join("old", b"a", SETTINGS, prefetch=1)
    groups.leave("old", b"a")
    busy, _ = groups.join("busy", b"b", SETTINGS, prefetch=1)
    groups.offer(1, b"jobs", "p", 0, [1], [b"x" * 1000])
    assert groups.held_bytes == 2000
    assert groups.shed_idle(1500) == ["old"] and groups.held_bytes == 1000 and set(groups.groups) == {"busy"}
    assert groups.shed_idle(500) == []  # a group with members is never dropped: publishers wait


MEMBERS = [b"m1", b"m2", b"m3"]


class GroupMachine(RuleBasedStateMachine):
    """Every message offered is in exactly one place: ready, delayed, in flight at one member, acked
    or dead-lettered; a member never holds more than its prefetch; an acked message never returns."""

    @initialize(hold=st.booleans())
    def start(self, hold: bool) -> None:
        self.clock = Clock()
        self.dead: list[tuple[str, Unit]] = []
        self.groups = engine(self.clock, self.dead, member_timeout=10.0)
        self.groups.hold_acks = hold  # a replicated exchange's: acks free room once the replica holds them
        self.unheld: list[tuple[Member, int]] = []  # acks handed to the replica, not yet held
        self.next_pos = 1
        self.offered: set[tuple[int, int]] = set()
        self.acked: set[tuple[int, int]] = set()
        self.prefetch: dict[bytes, int] = {}
        group, _ = self.groups.join("w", MEMBERS[0], SETTINGS, prefetch=2)
        assert group is not None
        self.group = group
        self.prefetch[MEMBERS[0]] = 2

    @rule(member=st.sampled_from(MEMBERS), prefetch=st.integers(1, 5))
    def join(self, member: bytes, prefetch: int) -> None:
        group, refusal = self.groups.join("w", member, SETTINGS, prefetch)
        assert group is self.group and not refusal
        self.prefetch[member] = prefetch

    @rule(member=st.sampled_from(MEMBERS), gone=st.booleans())
    def leave(self, member: bytes, gone: bool) -> None:
        if gone:
            self.groups.disconnected(member)
        else:
            self.groups.leave("w", member)
        self.prefetch.pop(member, None)

    @rule(count=st.integers(1, 6), keyed=st.booleans(), later=st.booleans())
    def offer(self, count: int, keyed: bool, later: bool) -> None:
        pos = self.next_pos
        self.next_pos += 1
        attrs = [(i, i % 3, int((self.clock.wall + 1) * 1000) if later and i == 0 else 0,
                  b"k%d" % (i % 2) if keyed else b"") for i in range(count)]
        self.groups.offer(pos, b"jobs.a", "p", 0, *payloads(count), attrs)
        self.offered |= {(pos, i) for i in range(count)}

    @rule()
    def dispatch(self) -> None:
        for route, units in self.groups.dispatch(self.group):
            assert route in self.group.members
            member = self.group.members[route]
            assert member.in_flight + member.settling <= self.prefetch[route]  # filled up to its prefetch only
            for unit in units:
                assert all((unit.pos, i) not in self.acked for i in range(unit.idx, unit.idx + unit.count))

    @rule(data=st.data())
    def ack_some(self, data: st.DataObject) -> None:
        held = [(route, u) for route, m in self.group.members.items() for u in m.units]
        if not held:
            return
        route, unit = data.draw(st.sampled_from(sorted(held, key=lambda h: (h[0], h[1].pos, h[1].idx))))
        idx = data.draw(st.integers(unit.idx, unit.idx + unit.count - 1))
        count = data.draw(st.integers(1, unit.idx + unit.count - idx))
        pos = unit.pos
        if data.draw(st.booleans()):
            assert self.groups.ack("w", route, [(pos, idx, count)]) == count
            self.acked |= {(pos, i) for i in range(idx, idx + count)}
        else:
            assert self.groups.nack("w", route, [(pos, idx, count)], requeue=data.draw(st.booleans())) == count

    @rule(data=st.data())
    def the_replica_holds_acks(self, data: st.DataObject) -> None:
        self.unheld += self.groups.take_settling()
        held = data.draw(st.integers(0, len(self.unheld)))
        self.groups.settled(self.unheld[:held])
        del self.unheld[:held]

    @rule(seconds=st.sampled_from([0.5, 3.0, 6.0, 11.0]), ping=st.booleans())
    def time_passes(self, seconds: float, ping: bool) -> None:
        self.clock.advance(seconds)
        if ping:
            for member in list(self.group.members):
                self.groups.seen(member)
        self.groups.tick()
        for member in set(self.prefetch) - set(self.group.members):
            del self.prefetch[member]  # dropped as silent

    @invariant()
    def every_message_is_in_one_place(self) -> None:
        if hasattr(self, "group"):
            check_places(self.groups, self.group, self.dead, self.acked, self.offered)
            for member in self.group.members.values():
                # At most the largest prefetch it had (a lowered one takes nothing back), its acks the
                # replica does not hold yet included.
                assert member.in_flight + member.settling <= 5
                assert member.settling == 0 or self.groups.hold_acks


def check_places(groups: Groups, group: Group, dead: list[tuple[str, Unit]], acked: Iterable[tuple[int, int]],
                 offered: set[tuple[int, int]]) -> None:
    """Every message offered is in exactly one place, and the counts and byte totals agree."""
    places: Counter[tuple[int, int]] = Counter()
    units = [u for level in group.levels.values() for q in level.queues.values() for u in q]
    units += [entry[2] for entry in group.delayed]
    in_flight = [u for flying in group.in_flight.values() for u in flying]
    for unit in units + in_flight + [u for _, u in dead]:
        for i in range(unit.idx, unit.idx + unit.count):
            places[(unit.pos, i)] += 1
    for key in acked:
        places[key] += 1
    assert set(places) == offered
    assert all(n == 1 for n in places.values()), [k for k, n in places.items() if n > 1]
    assert group.ready == sum(u.count for u in units if u not in {e[2] for e in group.delayed})
    assert group.in_flight_count == sum(u.count for u in in_flight)
    for member in group.members.values():
        assert member.in_flight == sum(u.count for u in member.units)
        assert all(u.member is member for u in member.units)
    held = sum(u.size for u in units + in_flight)
    assert groups.held_bytes == group.held_bytes == held


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=examples(150), stateful_step_count=40, deadline=None)


CAP = 4  # exchange.group_max_prefetch of the hostile model
HOSTILE = b"h"
STALL_ROUNDS = 3  # teardown rounds in a row that may settle nothing (HostileGroupMachine.teardown)
Msg = tuple[int, int]


class HostileGroupMachine(RuleBasedStateMachine):
    """Honest members (m1 stays; m2 comes and goes) ack or fail what they hold; a hostile member
    joins with a huge prefetch, nacks with requeue in loops, acks and nacks what it does not hold,
    lets its work time out, leaves and rejoins. It never acks or rejects what it holds (a member
    holding a message may: that is trust, not a rule the exchange can enforce).

    Invariants: no member holds more than the cap; a message that came back from a member goes back
    to it only when every member it has not come back from is full; a dead letter was delivered to an
    honest member first; in the end every message is acked by an honest member or dead-lettered."""

    @initialize(prefetch=st.integers(1, 3))
    def start(self, prefetch: int) -> None:
        self.clock = Clock()
        self.dead: list[tuple[str, Unit]] = []
        self.groups = engine(self.clock, self.dead, member_timeout=10.0, max_prefetch=CAP)
        group, _ = self.groups.join("w", b"m1", SETTINGS, prefetch)
        assert group is not None
        self.group = group
        self.next_pos = 1
        self.offered: set[Msg] = set()
        self.acked_by: dict[Msg, bytes] = {}
        self.delivered_to: dict[Msg, list[bytes]] = {}
        self.returned_by: dict[Msg, set[bytes]] = {}

    # ------------------------------------------------------------ the model's bookkeeping

    def held(self) -> dict[bytes, set[Msg]]:
        return {route: {(u.pos, i) for u in m.units for i in range(u.idx, u.idx + u.count)}
                for route, m in self.group.members.items()}

    def note_returns(self, before: dict[bytes, set[Msg]]) -> None:
        """What left a member other than by an ack came back from it (timeout, leave, nack)."""
        after = self.held()
        for route, msgs in before.items():
            for msg in msgs - after.get(route, set()):
                if msg not in self.acked_by:
                    self.returned_by.setdefault(msg, set()).add(route)

    def dispatch_and_check(self) -> None:
        for route, units in self.groups.dispatch(self.group):
            for unit in units:
                for i in range(unit.idx, unit.idx + unit.count):
                    msg = (unit.pos, i)
                    self.delivered_to.setdefault(msg, []).append(route)
                    returned = self.returned_by.get(msg, set())
                    if route in returned:  # back to a member it came back from: nobody else had room
                        for other, member in self.group.members.items():
                            assert other in returned or member.credit <= 0, (msg, route, other)

    def settle(self, route: bytes, ranges: list[tuple[int, int, int]], ack: bool) -> None:
        before = self.held()
        if ack:
            self.groups.ack("w", route, ranges)
        else:
            self.groups.nack("w", route, ranges, requeue=True)
        for msg in before.get(route, set()) - self.held().get(route, set()):
            if ack:
                self.acked_by[msg] = route
            else:
                self.returned_by.setdefault(msg, set()).add(route)

    # ------------------------------------------------------------ rules

    @rule(count=st.integers(1, 6), keyed=st.booleans())
    def offer(self, count: int, keyed: bool) -> None:
        pos = self.next_pos
        self.next_pos += 1
        attrs = [(i, i % 2, 0, b"k%d" % (i % 2) if keyed else b"") for i in range(count)]
        self.groups.offer(pos, b"jobs.a", "p", 0, *payloads(count), attrs)
        self.offered |= {(pos, i) for i in range(count)}

    @rule()
    def dispatch(self) -> None:
        self.dispatch_and_check()

    @rule(prefetch=st.sampled_from([1, CAP, 1000, 100_000]))
    def hostile_joins(self, prefetch: int) -> None:
        group, _ = self.groups.join("w", HOSTILE, SETTINGS, prefetch)
        assert group is self.group

    @rule(gone=st.booleans())
    def hostile_leaves(self, gone: bool) -> None:
        before = self.held()
        if gone:
            self.groups.disconnected(HOSTILE)
        else:
            self.groups.leave("w", HOSTILE)
        self.note_returns(before)

    @rule(rounds=st.integers(1, 8))
    def hostile_nack_loop(self, rounds: int) -> None:
        for _ in range(rounds):
            held = sorted(self.held().get(HOSTILE, set()))
            if not held:
                return
            self.settle(HOSTILE, [(pos, idx, 1) for pos, idx in held], ack=False)
            self.dispatch_and_check()

    @rule(pos=st.integers(1, 8), idx=st.integers(0, 7), count=st.integers(1, 9), ack=st.booleans())
    def hostile_settles_what_it_does_not_hold(self, pos: int, idx: int, count: int, ack: bool) -> None:
        mine = self.held().get(HOSTILE, set())
        if any((pos, i) in mine for i in range(idx, idx + count)):
            return
        before = self.held()
        method = self.groups.ack if ack else self.groups.nack
        args = () if ack else (True,)
        assert method("w", HOSTILE, [(pos, idx, count)], *args) == 0  # type: ignore[operator]
        assert self.held() == before

    @rule(prefetch=st.integers(1, 3))
    def m2_joins(self, prefetch: int) -> None:
        self.groups.join("w", b"m2", SETTINGS, prefetch)

    @rule(gone=st.booleans())
    def m2_leaves(self, gone: bool) -> None:
        before = self.held()
        if gone:
            self.groups.disconnected(b"m2")
        else:
            self.groups.leave("w", b"m2")
        self.note_returns(before)

    @rule(data=st.data(), ack=st.booleans())
    def honest_work(self, data: st.DataObject, ack: bool) -> None:
        """An honest member finishes one message: done (ack), or it failed (nack: counted)."""
        held = sorted((route, msg) for route, msgs in self.held().items() if route != HOSTILE for msg in msgs)
        if held:
            route, (pos, idx) = data.draw(st.sampled_from(held))
            self.settle(route, [(pos, idx, 1)], ack)

    @rule(seconds=st.sampled_from([0.5, 3.0, 6.0, 11.0]), hostile_pings=st.booleans())
    def time_passes(self, seconds: float, hostile_pings: bool) -> None:
        before = self.held()
        self.clock.advance(seconds)
        for route in list(self.group.members):
            if route != HOSTILE or hostile_pings:
                self.groups.seen(route)
        self.groups.tick()
        self.note_returns(before)

    # ------------------------------------------------------------ invariants

    @invariant()
    def nobody_holds_more_than_the_cap(self) -> None:
        if hasattr(self, "group"):
            assert all(m.in_flight <= CAP and m.prefetch <= CAP for m in self.group.members.values())
            check_places(self.groups, self.group, self.dead, self.acked_by, self.offered)

    @invariant()
    def dead_letters_had_an_honest_delivery(self) -> None:
        for _, unit in getattr(self, "dead", []):
            for i in range(unit.idx, unit.idx + unit.count):
                to = self.delivered_to[(unit.pos, i)]
                assert set(to) - {HOSTILE}, (unit.pos, i, to)

    def settled_count(self) -> int:
        return len(self.acked_by) + sum(u.count for _, u in self.dead)

    def teardown_round(self) -> None:
        """A second passes; every member pings; the honest ones ack all they hold, the hostile one
        nacks all it holds."""
        self.clock.advance(1.0)
        for route in list(self.group.members):
            self.groups.seen(route)
        before = self.held()
        self.groups.tick()
        self.note_returns(before)
        self.dispatch_and_check()
        for route, msgs in self.held().items():
            if msgs:
                self.settle(route, [(pos, idx, 1) for pos, idx in sorted(msgs)], ack=route != HOSTILE)

    def teardown(self) -> None:
        """The hostile member keeps nacking; the honest ones work until everything is settled.

        No fixed number of rounds: m1 (never leaving) may have a prefetch of 1 and so ack one
        message a round, however many were offered. Every STALL_ROUNDS rounds must settle something:
        m1 has its whole prefetch free at each dispatch, and a message it is passed over for (it
        came back from m1) goes to a member it has not come back from, which acks it or, hostile,
        returns it, after which m1 may have it."""
        if not hasattr(self, "group"):
            return
        stalled = 0
        while self.settled_count() < len(self.offered):
            settled = self.settled_count()
            self.teardown_round()
            stalled = 0 if self.settled_count() > settled else stalled + 1
            group = self.group
            assert stalled < STALL_ROUNDS, (f"nothing settled in {stalled} rounds: ready {group.ready}, in flight "
                                            f"{group.in_flight_count}, members {list(group.members)}")
        check_places(self.groups, self.group, self.dead, self.acked_by, self.offered)
        assert all(route != HOSTILE for route in self.acked_by.values())
        assert self.settled_count() == len(self.offered)
        self.dead_letters_had_an_honest_delivery()


TestHostileGroupMachine = HostileGroupMachine.TestCase
TestHostileGroupMachine.settings = settings(max_examples=examples(200), stateful_step_count=50, deadline=None)


def test_hostile_model_teardown_outlasts_a_backlog_larger_than_any_fixed_round_count() -> None:
    """The shrunk failing example of HostileGroupMachine: m1 alone with prefetch 1, 201 messages
    offered, nothing else. Teardown acks one message a round, so the 201st needs round 201: the
    model once gave up after 200 and reported the message still ready as neither acked nor dead."""
    machine = HostileGroupMachine()
    machine.start(prefetch=1)
    for count in [6] * 33 + [3]:
        machine.offer(count=count, keyed=False)
    assert len(machine.offered) == machine.group.ready == 201  # every message waits in the group
    machine.teardown()
    assert len(machine.acked_by) == 201 and machine.dead == []
    assert set(machine.acked_by.values()) == {b"m1"}
