"""What a restarted exchange adopts of its groups (protocol section 7.6): the replica's arithmetic
on a group's state, and the engine's records of it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.groups import Groups, GroupSettings
from exchange.replica import _final, _minus
from roq import protocol
from roq.errors import ProtocolError

SETTINGS = GroupSettings((b"jobs",), 30.0, 5, b"dead")


def record(upto: int, pending: list[tuple[int, int, int, int]]) -> protocol.GroupRecord:
    return protocol.GroupRecord("workers", (b"jobs",), 30_000, 5, b"dead", upto, pending)


@given(st.tuples(st.integers(0, 50), st.integers(0, 50)),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=6))
def test_minus_keeps_exactly_the_points_outside_the_holes(span, holes) -> None:
    span = (min(span), max(span))
    holes = sorted((min(h), max(h)) for h in holes)
    kept = _minus(span, holes)
    points = {p for lo, hi in kept for p in range(lo, hi)}
    expected = {p for p in range(*span) if not any(lo <= p < hi for lo, hi in holes)}
    assert points == expected
    assert all(lo < hi for lo, hi in kept)


def test_the_adopted_state_lists_every_pending_message_and_nothing_done() -> None:
    # Frames 1-4 of 3 messages each; the state was taken at position 3 with frame 1 partly pending.
    frames = [(1, b"jobs", 3), (2, b"jobs", 3), (3, b"jobs", 3), (4, b"other", 3), (5, b"jobs.x", 3)]
    state = record(3, [(1, 1, 2, 1)])
    done = [(1, 2, 1), (3, 0, 1), (5, 0, 3)]  # acked since: one of frame 1, the first of 3, all of 5
    final = _final(state, done, frames, next_pos=6)
    assert final.upto == 6
    assert sorted(final.pending) == [(1, 1, 1, 1), (3, 1, 2, 0)]  # frame 2 was done, 4 is not ours


def test_records_list_ready_delayed_and_in_flight_units_with_their_deliveries() -> None:
    now = [100.0]
    groups = Groups(clock=lambda: now[0], wall=lambda: 1_000.0)
    group, _ = groups.join("workers", b"m1", SETTINGS, prefetch=2)
    assert group is not None
    groups.offer(1, b"jobs", "p-a", 0, [1, 2, 3], [b"a", b"b", b"c"])
    groups.offer(2, b"jobs", "p-a", 0, [4], [b"d"], [(0, 0, 2_000_000, b"")])  # not before 2,000 s
    sent = [u for _, units in groups.dispatch(group) for u in units]
    assert [(u.pos, u.idx, u.count) for u in sent] == [(1, 0, 2)]
    groups.ack("workers", b"m1", [(1, 0, 1)])
    (state,) = groups.records(upto=3)
    assert sorted(state.pending) == [(1, 1, 1, 1), (1, 2, 1, 0), (2, 0, 1, 0)]
    assert groups.take_done() == {"workers": [(1, 0, 1)]} and groups.take_done() == {}


@settings(max_examples=50)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 9), st.integers(1, 9), st.integers(0, 5)), max_size=8))
def test_group_records_survive_the_wire(pending) -> None:
    rec = record(10, pending)
    decoded = protocol.decode_replica_request(protocol.encode_groups("x1.ab", [rec], b"s" * 32))
    assert isinstance(decoded, protocol.GroupState) and decoded.groups == [rec]
    adoption = protocol.decode_replica_reply(protocol.encode_adoption("x1.cd", "x1.ab", [rec], {"p-a": 7},
                                                                      [(3, b"jobs", b"body")]))
    assert isinstance(adoption, protocol.Adoption)
    assert (adoption.ended, adoption.groups, adoption.high, adoption.frames) == \
        ("x1.ab", [rec], {"p-a": 7}, [(3, b"jobs", b"body")])


def test_a_work_entry_whose_items_lie_is_refused() -> None:
    good = [3, 0, 1, b"t", "p-a", 5, [1], [b"x"], 0, b"k"]
    assert protocol.decode_work_reply(protocol.encode_work("w", "x1.a", [good]), 1 << 20).entries == [good]
    for index, lie in ((6, ["one"]), (6, [0]), (7, [7]), (9, b"k" * 300), (3, b""), (3, b"t" * 256)):
        entry = list(good)
        entry[index] = lie
        with pytest.raises(ProtocolError):
            protocol.decode_work_reply(protocol.encode_work("w", "x1.a", [entry]), 1 << 20)
