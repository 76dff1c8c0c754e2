"""The consumer group engine (exchange/groups.py) with a fake clock: examples, and a model-based
search over joins, leaves, offers, dispatches, acks, nacks, timeouts and disconnections."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from exchange.groups import Group, Groups, GroupSettings, Unit

SETTINGS = GroupSettings((b"jobs",), ack_timeout=5.0, max_deliveries=3, dead_letter=b"dead")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.wall = 1_000_000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds


def engine(clock: Clock, dead: list[tuple[str, Unit]] | None = None, **kw: object) -> Groups:
    def on_dead(group: Group, unit: Unit) -> None:
        if dead is not None:
            dead.append((group.name, unit))
    return Groups(clock=lambda: clock.now, wall=lambda: clock.wall, on_dead=on_dead, **kw)  # type: ignore[arg-type]


def sent(groups: Groups, group: Group) -> dict[bytes, list[tuple[int, int, int]]]:
    out: dict[bytes, list[tuple[int, int, int]]] = {}
    for route, units in groups.dispatch(group):
        out.setdefault(route, []).extend((u.pos, u.idx, u.count) for u in units)
    return out


def payloads(n: int) -> tuple[list[int], list[bytes]]:
    return list(range(1, n + 1)), [b"m%d" % i for i in range(n)]


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


def test_an_ack_only_counts_from_the_member_holding_the_message() -> None:
    clock = Clock()
    groups = engine(clock)
    group, _ = groups.join("w", b"a", SETTINGS, prefetch=5)
    groups.join("w", b"b", SETTINGS, prefetch=5)
    assert group is not None
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

    @initialize()
    def start(self) -> None:
        self.clock = Clock()
        self.dead: list[tuple[str, Unit]] = []
        self.groups = engine(self.clock, self.dead, member_timeout=10.0)
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
            assert self.group.members[route].in_flight <= self.prefetch[route]  # filled up to its prefetch only
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
        if not hasattr(self, "group"):
            return
        places: Counter[tuple[int, int]] = Counter()
        units = [u for level in self.group.levels.values() for q in level.queues.values() for u in q]
        units += [entry[2] for entry in self.group.delayed]
        in_flight = [u for flying in self.group.in_flight.values() for u in flying]
        for unit in units + in_flight + [u for _, u in self.dead]:
            for i in range(unit.idx, unit.idx + unit.count):
                places[(unit.pos, i)] += 1
        for key in self.acked:
            places[key] += 1
        assert set(places) == self.offered
        assert all(n == 1 for n in places.values()), [k for k, n in places.items() if n > 1]
        assert self.group.ready == sum(u.count for u in units if u not in {e[2] for e in self.group.delayed})
        assert self.group.in_flight_count == sum(u.count for u in in_flight)
        for route, member in self.group.members.items():
            # At most the largest prefetch it had: a lowered prefetch does not take back what is out.
            assert member.in_flight == sum(u.count for u in member.units) <= 5
            assert all(u.member is member for u in member.units)
        held = sum(u.size for u in units + in_flight)
        assert self.groups.held_bytes == self.group.held_bytes == held


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
