"""What a subscriber has handed over: sequence runs, and its saved position."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roq.client.subscriber.checkpoint import Checkpoint, SeenSequences, load_checkpoint, run_share, save_checkpoint
from roq.errors import ConfigError


@given(st.lists(st.integers(min_value=1, max_value=300), max_size=400))
def test_runs_remember_exactly_the_numbers_added_in_any_order(seqs: list[int]) -> None:
    seen, model = SeenSequences(), set()
    for seq in seqs:
        assert seen.add(seq) == (seq not in model)
        model.add(seq)
    covered = {s for a, b in zip(seen.starts, seen.ends) for s in range(a, b + 1)}
    assert covered == model
    assert all(b + 1 < a for b, a in zip(seen.ends, seen.starts[1:]))  # disjoint, not adjacent


def test_a_replayed_frame_after_a_move_is_recognised() -> None:
    seen = SeenSequences()
    assert seen.add_run(1, 3)
    assert not seen.add_run(2, 4)  # overlaps: the per-message path decides
    assert [seen.add(s) for s in (2, 3, 4)] == [False, False, True]


def test_older_messages_recovered_late_are_still_new() -> None:
    seen = SeenSequences()
    seen.add_run(11, 20)  # a later frame arrived first
    assert [seen.add(s) for s in range(1, 11)] == [True] * 10  # the fetched hole
    assert (seen.starts, seen.ends) == ([1], [20])


def test_position_round_trips_through_a_file(tmp_path) -> None:
    position = Checkpoint()
    for seq in (1, 2, 3, 7):
        position.seen("pub-a").add(seq)
    position.advance("x1.abcd", 41)
    path = tmp_path / "q" / "billing.json"
    save_checkpoint(path, position.to_json())
    loaded = load_checkpoint(path)
    assert loaded is not None and loaded.to_json() == position.to_json()
    assert not loaded.seen("pub-a").add(7) and loaded.seen("pub-a").add(4)


def test_a_damaged_position_file_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not a subscriber position"):
        load_checkpoint(path)
    path.write_text(json.dumps({"version": 1, "publishers": {"p": {"floor": 0, "runs": [[5, 9], [7, 12]]}},
                                "streams": {}}))
    with pytest.raises(ConfigError, match="overlapping"):
        load_checkpoint(path)
    assert load_checkpoint(tmp_path / "missing.json") is None


def test_a_long_lived_publisher_is_not_forgotten_after_many_short_lived_ones() -> None:
    """A regression: the dedup memory evicted the first publisher inserted, not the least
    recently seen, so 10,000 one-message publishers made a busy publisher's replay a duplicate."""
    from roq.client.subscriber.checkpoint import Checkpoint
    position = Checkpoint()
    for seq in range(1, 1101):
        position.seen("long-lived", now=0.0).add(seq)
    for i in range(12_000):
        position.seen(f"short-{i}", now=1.0).add(1)
        if i % 100 == 0:
            position.seen("long-lived", now=1.0)  # still publishing
    replayed = [seq for seq in range(1, 1101) if position.seen("long-lived", now=2.0).add(seq)]
    assert replayed == [] and position.forgotten == 0


def test_publishers_are_forgotten_only_once_idle_beyond_the_limit() -> None:
    from roq.client.subscriber import checkpoint as module
    position = module.Checkpoint()
    old_limit = module.PUBLISHER_LIMIT
    module.PUBLISHER_LIMIT = 10
    try:
        for i in range(20):
            position.seen(f"p{i}", now=0.0).add(1)
        assert len(position.publishers) == 20  # all recent: kept beyond the soft limit
        position.seen("late", now=module.FORGET_AFTER + 1)
        assert len(position.publishers) == 10 and "late" in position.publishers
    finally:
        module.PUBLISHER_LIMIT = old_limit


def test_a_bounded_position_keeps_the_most_recently_seen_publishers_and_shares_the_runs() -> None:
    position = Checkpoint()
    for i in range(5):
        seen = position.seen(f"p{i}")
        for seq in range(1, 2 * (10 + i), 2):  # 10 + i runs each: only odd numbers
            seen.add(seq)
    position.seen("p1")  # now the most recently seen
    data = position.to_json(max_publishers=3, max_runs=20)
    assert list(data["publishers"]) == ["p3", "p4", "p1"]  # least recently seen first, as saved
    kept = {p: len(s["runs"]) for p, s in data["publishers"].items()}
    assert kept == {"p3": 6, "p4": 6, "p1": 6} and sum(kept.values()) <= 20
    p1 = data["publishers"]["p1"]
    assert p1["runs"][-1] == [21, 21] and p1["floor"] == p1["runs"][0][0] - 1  # the latest kept, older folded
    restored = Checkpoint.from_json(data).seen("p1")
    assert [restored.add(s) for s in (1, 9, 21, 22)] == [False, False, False, True]
    assert position.to_json() == Checkpoint.from_json(position.to_json()).to_json()  # unbounded: unchanged


@pytest.mark.parametrize("counts, budget, share", [
    ([1, 5, 100, 1000], 100, 47), ([1, 2], 100, 2), ([], 5, 0), ([3, 3, 3], 0, 0), ([10] * 1000, 10_000, 10),
])
def test_run_share_is_the_most_each_may_keep_within_the_budget(counts: list[int], budget: int, share: int) -> None:
    assert run_share(counts, budget) == share
    assert sum(min(c, share) for c in counts) <= budget
