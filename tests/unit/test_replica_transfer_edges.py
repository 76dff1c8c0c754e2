"""Edges of a replica's state transfers (exchange/replica_disk.py), on real segment stores: what a
store adopted short, or emptied, or broken, answers to a restarted primary's `fill_ended` offers."""

from __future__ import annotations

from pathlib import Path

from exchange.replica_disk import ReplicaDisk
from tests.unit.test_replica_disk import ON_DISK, jumped_copy, transfer_ended_whole, transfer_page
from tests.unit.test_replication import INC, body


def test_a_store_transferred_whole_over_an_unfinished_adopted_one_no_longer_lacks_anything(tmp_path: Path) -> None:
    """Review 42 finding 1: an adopted store whose transfer did not finish (it lacks 1-39) and that
    ends short of the primary's offer is taken again whole; the whole one must not inherit the
    stale `lacks below 40`, or the next offer writes a second copy of what it holds under it."""
    root = tmp_path / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    jumped_copy(disk, 40, 20)  # 40-59, the transfer of 1-39 never came
    disk.close()
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    assert disk.missing == {INC: 40}
    transfer_ended_whole(disk, 80)  # the primary's store of INC ends at 79: ours is short, taken whole
    assert disk.missing == {}, "the whole store still says it lacks what lies below 40"
    # The primary restarts again, its store of INC now starting at 10 (retention): nothing is due.
    assert disk.fill_ended(transfer_page(INC, 10, 7, 80, True, ended=INC)) == 80
    stored = disk.store_of(INC)
    assert stored is not None and (stored.first_pos, stored.end_pos) == (1, 80)
    assert [frame.body for frame in stored.read(1, 80, 1 << 20).frames] == [body(INC, pos) for pos in range(1, 80)]
    disk.close()
