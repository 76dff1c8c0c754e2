"""Rebalancing and zones (gcm/placement.py): `plan_rebalance` evens the spread without ever making it
worse, never oscillates, honours capacity and the exchange/replica rule; zones spread a queue and
keep an exchange and its replica apart when they can."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gcm.placement import (
    HostLoad,
    Move,
    choose_hosts,
    place_new_exchanges,
    plan_moves,
    plan_rebalance,
    spread_cost,
)
from roq.paths import is_replica_slot, primary_of, replica_slot
from tests.profiles import examples

Slots = dict[tuple[str, str], str | None]


def apply(placements: Slots, moves: list[Move]) -> Slots:
    result = dict(placements)
    for move in moves:
        assert result[(move.queue, move.slot)] == move.old
        result[(move.queue, move.slot)] = move.new
    return result


def check_rules(capacities: dict[str, int], placements: Slots) -> None:
    load = Counter(h for h in placements.values() if h is not None)
    for host, n in load.items():
        assert n <= capacities[host], (host, n)
    for (queue, slot), host in placements.items():
        if is_replica_slot(slot):
            assert host is None or host != placements.get((queue, primary_of(slot))), (queue, slot)


# ---------------------------------------------------------------- examples


def test_a_host_back_gets_a_share_of_a_replicated_queue() -> None:
    """The reported case: 2 exchanges with replicas on 3 hosts; host h2 was lost and its slot went to
    h3, so h2 came back empty while h1 and h3 hold two slots of the queue each."""
    caps = {"h1": 8, "h2": 8, "h3": 8}
    placed = {("q", "x1"): "h1", ("q", "x1~r"): "h3", ("q", "x2"): "h3", ("q", "x2~r"): "h1"}
    moves = plan_rebalance(caps, placed)
    assert len(moves) == 1 and moves[0].new == "h2"
    after = apply(placed, moves)
    assert sorted(Counter(after.values()).values()) == [1, 1, 2]
    assert plan_rebalance(caps, after) == []  # as even as 4 slots on 3 hosts get


def test_a_queue_left_on_one_host_is_spread_again() -> None:
    caps = {"h1": 8, "h2": 8, "h3": 8}
    placed = {("q", "x1"): "h1", ("q", "x2"): "h1"}
    moves = plan_rebalance(caps, placed)
    assert moves == [Move("q", "x1", "h1", "h2")]
    assert plan_rebalance(caps, apply(placed, moves)) == []


def test_hysteresis_leaves_a_host_within_its_margin_alone() -> None:
    """Different queues (nothing to gain per queue): only the overall load could move them, and only
    from a host loaded beyond its fair share by more than the margin."""
    caps = {"h1": 8, "h2": 8}
    three_one = {("a", "x1"): "h1", ("b", "x1"): "h1", ("c", "x1"): "h1", ("d", "x1"): "h2"}
    assert plan_rebalance(caps, three_one, margin=1.0) == []  # h1: 3 slots, fair share 2 (+1 margin)
    assert len(plan_rebalance(caps, three_one, margin=0.5)) == 1
    five_one = {**three_one, ("e", "x1"): "h1", ("f", "x1"): "h1"}
    moves = plan_rebalance(caps, five_one, margin=1.0, max_moves=8)
    assert [m.new for m in moves] == ["h2"]  # 5:1 → 4:2, where h1 is within its margin again
    assert plan_rebalance(caps, apply(five_one, moves), margin=1.0) == []


def test_only_the_named_queues_move_and_pinned_slots_stay() -> None:
    caps = {"h1": 8, "h2": 8}
    placed = {("a", "x1"): "h1", ("a", "x2"): "h1", ("b", "x1"): "h1", ("b", "x2"): "h1"}
    moves = plan_rebalance(caps, placed, queues={"b"}, max_moves=8)
    assert [(m.queue, m.new) for m in moves] == [("b", "h2")]
    assert plan_rebalance(caps, placed, pinned={("a", "x1"), ("a", "x2")}, queues={"a"}) == []


def test_a_plan_moves_one_slot_per_exchange_and_never_onto_its_partner() -> None:
    caps = {"h1": 8, "h2": 8, "h3": 1}
    placed = {("q", "x1"): "h1", ("q", "x1~r"): "h2", ("q", "x2"): "h1", ("q", "x2~r"): "h2"}
    moves = plan_rebalance(caps, placed, max_moves=8)
    assert len({primary_of(m.slot) for m in moves}) == len(moves)
    check_rules(caps, apply(placed, moves))


def test_an_exchange_never_goes_to_a_full_disk() -> None:
    caps = {"h1": 8, "h2": 8}
    placed = {("q", "x1"): "h1", ("q", "x2"): "h1"}
    assert plan_rebalance(caps, placed, full={"h2"}) == []


def test_zones_first_for_a_replica_and_for_a_queue() -> None:
    zones = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    hosts = [HostLoad(name, 8, 0, zone) for name, zone in zones.items()]
    placed = place_new_exchanges(2, hosts, 2)
    for primary, replica in placed:
        assert primary and replica and zones[primary] != zones[replica]
    assert {zones[primary] for primary, _ in placed if primary} == {"a", "b"}
    # A zone's hosts busier than the other zone's still get the queue's second exchange.
    busy = [HostLoad("a1", 8, 0, "a"), HostLoad("b1", 8, 6, "b")]
    assert choose_hosts(2, busy) == ["a1", "b1"]
    # With room only in the primary's zone, the replica still goes to another host.
    one_zone = [HostLoad("a1", 8, 0, "a"), HostLoad("a2", 8, 0, "a"), HostLoad("b1", 1, 1, "b")]
    assert place_new_exchanges(1, one_zone, 2) == [("a1", "a2")]


def test_a_lost_zone_moves_replicas_to_the_other_zone() -> None:
    zones = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    placed = {("q", "x1"): "a1", ("q", "x1~r"): "b1", ("q", "x2"): "b2", ("q", "x2~r"): "a2"}
    moves = plan_moves({"a1": 8, "a2": 8}, placed, evacuate={"b1", "b2"}, zones={"a1": "a", "a2": "a"})
    after = apply(placed, moves)
    check_rules({h: 8 for h in zones}, after)
    assert after[("q", "x2")] in ("a1", "a2") and after[("q", "x1~r")] in ("a1", "a2")
    # Once zone b is back, rebalancing puts a copy of each exchange there again.
    caps = {h: 8 for h in zones}
    for _ in range(4):
        after = apply(after, plan_rebalance(caps, after, zones))
    assert spread_cost(caps, after, zones)[0] == 0  # no exchange shares its replica's zone
    assert {zones[after[("q", x)]] for x in ("x1", "x2")} == {"a", "b"}


def test_rebalancing_separates_an_exchange_from_its_replicas_zone() -> None:
    zones = {"a1": "a", "a2": "a", "b1": "b"}
    caps = {h: 8 for h in zones}
    placed = {("q", "x1"): "a1", ("q", "x1~r"): "a2"}
    moves = plan_rebalance(caps, placed, zones)
    assert len(moves) == 1 and moves[0].new == "b1"


# ---------------------------------------------------------------- properties


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, str], Slots]:
    """Live hosts (capacity, zone) and valid placements of a few queues on them."""
    count = draw(st.integers(1, 6))
    capacities = {f"h{i}": draw(st.integers(1, 5)) for i in range(count)}
    zones = {h: draw(st.sampled_from(["", "a", "b", "c"])) for h in capacities}
    load: Counter[str] = Counter()
    placed: Slots = {}
    for q in range(draw(st.integers(1, 4))):
        replicated = draw(st.booleans())
        for x in range(1, draw(st.integers(1, 4)) + 1):
            room = [h for h in capacities if load[h] < capacities[h]]
            if not room:
                break
            primary = draw(st.sampled_from(room))
            load[primary] += 1
            placed[(f"q{q}", f"x{x}")] = primary
            if replicated:
                others = [h for h in room if h != primary and load[h] < capacities[h]]
                replica = draw(st.sampled_from(others)) if others else None
                if replica:
                    load[replica] += 1
                placed[(f"q{q}", replica_slot(f"x{x}"))] = replica
    return capacities, zones, placed


@settings(max_examples=examples(300), deadline=None)
@given(clusters(), st.integers(1, 4), st.sampled_from([0.0, 0.5, 1.0, 2.0]))
def test_plans_only_improve_and_always_come_to_rest(cluster, max_moves, margin) -> None:
    """Every move lowers the measure strictly, keeps every rule, and plans run again and again end
    with nothing to do, never visiting a state twice: rebalancing cannot oscillate."""
    capacities, zones, placed = cluster
    seen = {frozenset(placed.items())}
    cost = spread_cost(capacities, placed, zones)
    for _ in range(200):
        moves = plan_rebalance(capacities, placed, zones, max_moves=max_moves, margin=margin)
        if not moves:
            break
        assert len(moves) <= max_moves
        assert len({(m.queue, primary_of(m.slot)) for m in moves}) == len(moves)  # one slot per exchange
        for move in moves:
            assert move.old in capacities and move.new in capacities and move.old != move.new
            placed = apply(placed, [move])
            check_rules(capacities, placed)
            lower = spread_cost(capacities, placed, zones)
            assert lower < cost, (move, lower, cost)
            assert lower[0] <= cost[0]  # an exchange never joins its replica's zone
            cost = lower
        state = frozenset(placed.items())
        assert state not in seen
        seen.add(state)
    else:
        raise AssertionError("rebalancing did not come to rest in 200 plans")


@settings(max_examples=examples(200), deadline=None)
@given(clusters())
def test_at_rest_no_queue_has_two_slots_on_a_host_while_an_allowed_host_has_none(cluster) -> None:
    """Per queue: at rest, a host holds two of a queue's slots only if no host without any of them
    could take one (full, or the slot's partner is there)."""
    capacities, _, placed = cluster
    for _ in range(200):
        moves = plan_rebalance(capacities, placed, max_moves=4)
        if not moves:
            break
        placed = apply(placed, moves)
    load = Counter(h for h in placed.values() if h is not None)
    for (queue, slot), host in placed.items():
        if host is None:
            continue
        mine = Counter(h for (q, _), h in placed.items() if q == queue and h is not None)
        if mine[host] < 2:
            continue
        partner = placed.get((queue, primary_of(slot) if is_replica_slot(slot) else replica_slot(slot)))
        for other in capacities:
            if mine[other] == 0 and load[other] < capacities[other] and other != partner:
                raise AssertionError(f"{queue}/{slot} on {host} with {mine[host]} of its queue; {other} has none")
