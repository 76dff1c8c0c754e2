"""Replicas in placement (gcm/placement.py, gcm/view.py, roq/paths.py): an exchange and its replica
never share a host, a replica counts against its host's capacity like an exchange, primaries are
placed before replicas, and the leader's plan after host losses keeps all of that."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gcm.placement import HostLoad, Move, choose_replica_host, place_new_exchanges, plan_moves
from gcm.queues import check_replica_count
from gcm.view import assignment_data, exchanges_only, placement_data, read_placements, replicas_only
from roq.errors import UserError
from roq.paths import Paths, is_replica_slot, primary_of, replica_slot, split_assignment
from roq.state import read_queue, replica_count
from tests.profiles import examples

# ------------------------------------------------------------------ names and records


def test_replica_slots_and_their_paths() -> None:
    paths = Paths("/roq")
    assert replica_slot("x1") == "x1~r" and primary_of("x1~r") == "x1" and primary_of("x1") == "x1"
    assert is_replica_slot("x1~r") and not is_replica_slot("x1")
    assert paths.assignment("h", "q", replica_slot("x1")) == "/roq/assignments/h/q~x1~r"
    assert split_assignment("q~x1~r") == ("q", "x1~r")
    assert paths.replica_live("q", "x1") == "/roq/replicas/q/x1" == paths.replica_live("q", "x1~r")
    assert "/roq/replicas" in paths.base_paths()


def test_what_placements_and_assignments_hold() -> None:
    placed = {("q", "x1"): "a", ("q", "x1~r"): None, ("p", "x1"): "b"}
    assert placement_data(placed, "q", "x1") == {"host": "a", "replica": None}
    assert placement_data(placed, "p", "x1") == {"host": "b"}  # no replica key without replicas
    assert assignment_data("q", "x1") == {"queue": "q", "exchange": "x1"}
    assert assignment_data("q", "x1~r") == {"queue": "q", "exchange": "x1", "role": "replica"}
    assert exchanges_only(placed) == {("q", "x1"): "a", ("p", "x1"): "b"}
    assert replicas_only(placed) == {("q", "x1~r"): None}


def test_replica_counts_are_checked() -> None:
    assert check_replica_count(1) == 1 and check_replica_count(2) == 2
    for bad in (0, 3, True, "2", 1.0, None):
        with pytest.raises(UserError, match="replicas must be 1 or 2"):
            check_replica_count(bad)
    assert replica_count({}) == 1 and replica_count({"replicas": 2}) == 2  # a queue from before: 1


class FakeTree:
    """A roq.state.Tree over a dict of path → data (children derived from the paths)."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes

    def children(self, path: str) -> list[str]:
        return sorted({p[len(path) + 1:].split("/")[0] for p in self.nodes if p.startswith(path + "/")})

    def read_json(self, path: str) -> dict[str, Any] | None:
        return self.nodes.get(path)


def test_placements_read_a_replica_slot_for_every_exchange_of_a_replicated_queue() -> None:
    tree = FakeTree({
        "/roq/queues/old": {"next_exchange": 2},  # made before replicas existed
        "/roq/queues/old/exchanges/x1": {"host": "a"},
        "/roq/queues/rep": {"replicas": 2},
        "/roq/queues/rep/exchanges/x1": {"host": "a", "replica": "b"},
        "/roq/queues/rep/exchanges/x2": {"host": "b"},  # no replica key yet: read as unplaced
        "/roq/replicas/rep/x1": {"repl": "tcp://b:1", "replay": "tcp://b:2"},
    })
    assert read_placements(tree, Paths("/roq")) == {
        ("old", "x1"): "a", ("rep", "x1"): "a", ("rep", "x1~r"): "b", ("rep", "x2"): "b", ("rep", "x2~r"): None}
    info = read_queue(tree, Paths("/roq"), "rep")
    assert info is not None and info.replicas == 2
    assert [(x.id, x.replica, bool(x.replica_live)) for x in info.exchanges] == [("x1", "b", True), ("x2", None, False)]


# ------------------------------------------------------------------ new exchanges


def test_a_replica_never_goes_to_its_primarys_host() -> None:
    assert choose_replica_host([HostLoad("a", 4, 0), HostLoad("b", 4, 3)], "a") == "b"
    assert choose_replica_host([HostLoad("a", 4, 0)], "a") is None
    assert choose_replica_host([HostLoad("a", 4, 0)], None) == "a"


def test_new_exchanges_get_replicas_on_other_hosts() -> None:
    hosts = [HostLoad("a", 4, 0), HostLoad("b", 4, 0), HostLoad("c", 4, 0)]
    assert place_new_exchanges(2, hosts, 1) == [("a", None), ("b", None)]
    assert place_new_exchanges(2, hosts, 2) == [("a", "c"), ("b", "a")]  # primaries spread first


def test_replicas_beyond_the_hosts_stay_unplaced_and_primaries_come_first() -> None:
    assert place_new_exchanges(2, [HostLoad("a", 4, 0)], 2) == [("a", None), ("a", None)]
    # One free slot in all: the primary takes it.
    assert place_new_exchanges(1, [HostLoad("a", 1, 0), HostLoad("b", 1, 1)], 2) == [("a", None)]
    assert place_new_exchanges(1, [], 2) == [(None, None)]


# ------------------------------------------------------------------ the leader's plan


def test_a_lost_replica_is_placed_again_on_a_third_host() -> None:
    placed = {("q", "x1"): "a", ("q", "x1~r"): "b"}
    assert plan_moves({"a": 4, "c": 4}, placed, evacuate={"b"}) == [Move("q", "x1~r", "b", "c")]


def test_a_lost_primary_never_moves_onto_its_replica() -> None:
    placed = {("q", "x1"): "a", ("q", "x1~r"): "b"}
    assert plan_moves({"b": 4, "c": 4}, placed, evacuate={"a"}) == [Move("q", "x1", "a", "c")]
    assert plan_moves({"b": 4}, placed, evacuate={"a"}) == []  # unplaced until another host appears


def test_a_replica_that_stopped_answering_moves_to_a_host_other_than_its_own_and_its_primarys() -> None:
    placed = {("q", "x1"): "a", ("q", "x1~r"): "b"}
    stuck = {("q", "x1~r")}
    assert plan_moves({"a": 4, "b": 4, "c": 4}, placed, set(), stuck) == [Move("q", "x1~r", "b", "c")]
    assert plan_moves({"a": 4, "b": 4}, placed, set(), stuck) == []  # nowhere else: its HCM's restart is all


def test_hosts_within_their_grace_are_left_alone() -> None:
    placed = {("q", "x1"): "a", ("q", "x1~r"): "b"}
    assert plan_moves({"a": 4, "c": 4}, placed, evacuate=set()) == []


def test_an_unplaced_replica_is_placed_once_a_host_appears() -> None:
    placed = {("q", "x1"): "a", ("q", "x1~r"): None}
    assert plan_moves({"a": 4}, placed, set()) == []
    assert plan_moves({"a": 4, "b": 1}, placed, set()) == [Move("q", "x1~r", None, "b")]


def test_a_replica_on_its_primarys_host_moves_or_is_unplaced() -> None:
    placed = {("q", "x1"): "a", ("q", "x1~r"): "a"}
    assert plan_moves({"a": 4, "b": 4}, placed, set()) == [Move("q", "x1~r", "a", "b")]
    assert plan_moves({"a": 4}, placed, set()) == [Move("q", "x1~r", "a", None)]


def test_an_exchange_whose_disk_refuses_moves_to_a_host_with_room_or_stays() -> None:
    placed = {("q", "x1"): "a", ("q", "x2"): "b"}
    moves = plan_moves({"a": 4, "b": 4, "c": 4}, placed, set(), relocate={("q", "x1")}, full={"a"})
    assert moves == [Move("q", "x1", "a", "c")]  # not its own host, and b has one of the queue already
    assert plan_moves({"a": 4, "b": 4}, placed, set(), relocate={("q", "x1")}, full={"a", "b"}) == []  # stays
    assert plan_moves({"a": 4}, placed, set(), relocate={("q", "x1")}) == []  # nowhere else: stays


def test_no_exchange_goes_to_a_full_host_but_a_replica_may() -> None:
    placed = {("q", "x1"): None, ("q", "x1~r"): None}
    assert plan_moves({"a": 4, "b": 4}, placed, set(), full={"a"}) == [Move("q", "x1", None, "b"),
                                                                       Move("q", "x1~r", None, "a")]
    assert plan_moves({"a": 4}, {("q", "x1"): "gone"}, {"gone"}, full={"a"}) == []  # waits for room
    assert place_new_exchanges(2, [HostLoad("a", 4, 0), HostLoad("b", 4, 0)], 2, full={"a"}) == [("b", "a"),
                                                                                                ("b", "a")]


def test_both_slots_lost_at_once_end_on_two_distinct_hosts() -> None:
    placed = {("q", "x1"): "a", ("q", "x1~r"): "b"}
    moves = plan_moves({"c": 4, "d": 4}, placed, evacuate={"a", "b"})
    assert [m.slot for m in moves] == ["x1", "x1~r"]  # the primary first
    assert {m.new for m in moves} == {"c", "d"}


# ------------------------------------------------------------------ properties

host_names = st.sampled_from([f"h{i}" for i in range(6)])


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, int], dict[tuple[str, str], str | None]]:
    """Hosts with capacities, and queues placed on them the way queue.create places them."""
    capacities = draw(st.dictionaries(host_names, st.integers(1, 4), max_size=6))
    placed: dict[tuple[str, str], str | None] = {}
    for q in range(draw(st.integers(0, 4))):
        replicas = draw(st.sampled_from([1, 2]))
        count = draw(st.integers(1, 4))
        load = Counter(h for h in placed.values() if h)
        hosts = [HostLoad(n, c, load[n]) for n, c in sorted(capacities.items())]
        for i, (host, replica) in enumerate(place_new_exchanges(count, hosts, replicas), 1):
            placed[(f"q{q}", f"x{i}")] = host
            if replicas == 2:
                placed[(f"q{q}", f"x{i}~r")] = replica
    return capacities, placed


def check_placement(capacities: dict[str, int], placed: dict[tuple[str, str], str | None]) -> None:
    for (queue, slot), host in placed.items():
        if is_replica_slot(slot) and host is not None:
            assert host != placed[(queue, primary_of(slot))], f"{queue}/{slot} shares its primary's host"
    load = Counter(h for h in placed.values() if h in capacities)
    for host, used in load.items():
        assert used <= capacities[host], f"{host} holds {used} slots, capacity {capacities[host]}"


def apply(placed: dict[tuple[str, str], str | None], moves: list[Move]) -> dict[tuple[str, str], str | None]:
    after = dict(placed)
    for m in moves:
        assert after[(m.queue, m.slot)] == m.old
        after[(m.queue, m.slot)] = m.new
    return after


@given(clusters())
def test_created_queues_keep_the_rules(cluster) -> None:
    check_placement(*cluster)


@settings(max_examples=examples(300))
@given(clusters(), st.sets(host_names), st.dictionaries(st.sampled_from(["n1", "n2"]), st.integers(1, 4)),
       st.booleans())
def test_after_any_host_losses_and_arrivals_the_plan_keeps_the_rules(cluster, lost, arrived, past_grace) -> None:
    capacities, placed = cluster
    survivors = {h: c for h, c in capacities.items() if h not in lost} | arrived
    evacuate = set(lost) if past_grace else set()
    moves = plan_moves(survivors, placed, evacuate)
    after = apply(placed, moves)
    check_placement(survivors, after)
    for m in moves:  # only what needed a host moved, and never within a lost host's grace
        assert m.old is None or m.old in evacuate
        assert m.new is not None
    # Nothing that needs a host is left without one while a host could take it.
    load = Counter(h for h in after.values() if h in survivors)
    for (queue, slot), host in after.items():
        if host is None or host in evacuate:
            partner = after.get((queue, replica_slot(slot) if not is_replica_slot(slot) else primary_of(slot)))
            assert all(load[h] >= c or h == partner for h, c in survivors.items()), f"{queue}/{slot} left out"
    assert plan_moves(survivors, after, evacuate) == []  # the plan is complete: a second tick does nothing


@given(st.dictionaries(host_names, st.integers(1, 3), max_size=4),
       st.dictionaries(st.tuples(st.sampled_from(["q", "p"]), st.sampled_from(["x1", "x1~r", "x2", "x2~r"])),
                       st.one_of(st.none(), host_names), max_size=8))
def test_from_any_state_the_plan_separates_replicas_and_never_overfills(capacities, raw) -> None:
    # Any state at all, even one the leader never writes (a replica on its primary's host, hosts
    # over capacity): the plan moves nothing onto a full host and leaves no replica on its primary's.
    placed = dict(raw)
    for queue, slot in list(placed):
        placed.setdefault((queue, primary_of(slot)), None)
    moves = plan_moves(capacities, placed, evacuate=set())
    after = apply(placed, moves)
    for (queue, slot), host in after.items():
        if is_replica_slot(slot) and host is not None:
            assert host != after[(queue, primary_of(slot))]
    before, load = Counter(placed.values()), Counter(after.values())
    for m in moves:
        if m.new is not None:
            assert load[m.new] <= max(capacities[m.new], before[m.new])
