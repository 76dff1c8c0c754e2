"""Edges of a replica's state transfers (exchange/replica_disk.py), on real segment stores: what a
store adopted short, or emptied, or broken, answers to a restarted primary's `fill_ended` offers."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import zmq

from exchange import replica_adoption, replica_disk
from exchange.replica import Replica
from exchange.replica_disk import ReplicaDisk
from exchange.replica_groups import ServedStores
from exchange.retention import Retention
from exchange.segment_store import SegmentStore, StoreLimits, StoreState
from exchange.store_hooks import stored_frame
from exchange.transfer_marker import read_missing, write_missing
from roq import protocol
from tests.unit import test_replication
from tests.unit.test_replica_disk import (
    ON_DISK,
    copy_until_the_disk_refuses,
    fill_up,
    jumped_copy,
    transfer_ended_whole,
    transfer_page,
)
from tests.unit.test_replication import INC, INC2, TOPIC, X, body, config, dealer, follow, proof, vouch

ctx = test_replication.ctx  # the zmq.Context fixture


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


def test_with_store_sync_confirm_a_follow_vouches_only_for_what_the_store_fsynced(
        ctx: zmq.Context, small_disk, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 42 finding 3: under `exchange.store_sync = confirm` a page refused by a full disk is
    answered broken; once the disk has room again, the `following N` that answers the next follow
    covers only frames the store fsync'ed (the primary confirms up to N), not frames just written
    to the page cache."""
    disk = small_disk("replica", 1 << 20)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (900 << 10))
    r = Replica(ctx, config(store_sync="confirm"), X, "127.0.0.1", "127.0.0.1", store_root=disk / "x1~r")
    r.disk.start(ON_DISK)
    vouch(r, INC)
    synced_through = [0]  # the copy's next_pos at the store's last fdatasync
    real_fdatasync = os.fdatasync

    def observed(fd: int) -> None:
        real_fdatasync(fd)
        synced_through[0] = r.copies[INC].next_pos
    monkeypatch.setattr(os, "fdatasync", observed)
    monkeypatch.setattr(replica_disk, "RETRY_EVERY", 0.0)  # a refused store is tried again at once
    try:
        primary = dealer(ctx, r.repl_endpoint)
        copy_until_the_disk_refuses(r, primary)
        held = r.copies[INC].next_pos
        assert held > synced_through[0], "the refused page's frames wait in memory, unsynced"
        filler.unlink()
        answer = follow(r, primary)
        assert answer.kind == protocol.FOLLOWING and answer.next_pos == held, answer
        assert answer.next_pos <= synced_through[0], "following vouched for frames the store never fsync'ed"
    finally:
        r.close()


def test_an_adoption_whose_store_goes_mid_plan_is_still_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Review 42 finding 2: the store an adoption plan reads goes while the plan is worked out (a
    transfer replaced it: closed, its directory removed) or its disk fails reads. The reads that
    fail count as damaged ranges (logged, passed over): the plan ends and the ask that waits for it
    is answered, where an OSError used to escape the loop turn (the replica crashed)."""
    monkeypatch.setattr(replica_adoption, "READ_PAGE_BYTES", 200)  # a step per few frames
    ended, asker = f"{X}.ended", f"{X}.asker"
    store = SegmentStore(tmp_path / ended, StoreLimits(segment_bytes=4 << 10, index_every=256))
    for pos in range(1, 60):
        store.append(stored_frame(pos, time.time(), TOPIC, body(ended, pos), 1))
    assert store.flush(sync=True)
    copy = Retention(3_600.0, 1 << 30, first_pos=50)  # memory holds 50-59, the store 1-59
    for pos in range(50, 60):
        copy.add(TOPIC, body(ended, pos), 1, time.monotonic(), {})
    record = protocol.GroupRecord("g", (TOPIC,), 30_000, 5, b"dead", 1, [])
    adoptions = replica_adoption.Adoptions()
    ask = protocol.Adopt(asker, X, b"", (0, 0))
    assert adoptions.answer(ask, {ended: copy}, {ended: [record]}, {}, (), {ended: store}, b"route") is None
    assert adoptions.turn() is None and adoptions.planning  # a first read of the store done
    store.close()
    shutil.rmtree(store.directory)
    with caplog.at_level("WARNING", logger="exchange.replica_adoption"):
        answered = None
        for _ in range(1_000):
            answered = adoptions.turn()
            if not adoptions.planning:
                break
        assert answered is not None, "the ask waiting for the plan was never answered"
        assert answered[0] == b"route" and protocol.decode_replica_reply(answered[1]).incarnation == asker
        page = adoptions.answer(protocol.Adopt(asker, X, b"", (0, 1)), {}, {}, {}, (), {})
    assert page is not None, "a page over the store that went was not answered"
    assert any("cannot be read" in r.getMessage() for r in caplog.records)


def test_an_adoption_plan_reads_the_store_a_transfer_put_in_place_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 42 finding 2, the other half: the plan looks the copy's store up by name at each read.
    Here the adopted store of INC (40-59, its transfer unfinished) is replaced, mid-plan, by the
    restarted primary's whole transfer (1-79): the plan goes on in the new store and its groups'
    backlog is every position from where it began to 79, none passed over as unreadable."""
    monkeypatch.setattr(replica_adoption, "READ_PAGE_BYTES", 200)
    root = tmp_path / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    jumped_copy(disk, 40, 20)
    disk.close()
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    asker = f"{X}.asker"
    record = protocol.GroupRecord("g", (TOPIC,), 30_000, 5, b"dead", 1, [])
    copy = Retention(3_600.0, 1 << 30, first_pos=80)  # nothing in memory: all on disk
    adoptions = replica_adoption.Adoptions()
    ask = protocol.Adopt(asker, X, b"", (0, 0))
    assert adoptions.answer(ask, {INC: copy}, {INC: [record]}, {}, (), ServedStores(disk), b"route") is None
    assert adoptions.turn() is None and adoptions.planning
    transfer_ended_whole(disk, 80)  # the adopted store is replaced by the whole one
    answered = None
    for _ in range(1_000):
        answered = adoptions.turn()
        if not adoptions.planning:
            break
    assert answered is not None
    adoption = protocol.decode_replica_reply(answered[1])
    assert isinstance(adoption, protocol.Adoption)
    positions = {pos for pos, _, _, _ in adoption.groups[0].pending}
    assert set(range(40, 80)) <= positions, f"backlog passed over: {sorted(set(range(40, 80)) - positions)}"
    disk.close()


def test_an_ended_copy_whose_retention_emptied_its_store_is_answered_whole(tmp_path: Path) -> None:
    """Review 42 finding 6, the retention half: the ended copy of INC jumped to 40 and its
    retention then deleted everything it held; a transfer of what lay below 40 is answered
    complete once it reaches 40 (nothing is served below an empty store), not left unanswered."""
    root = tmp_path / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    jumped_copy(disk, 40, 20)
    disk.open(INC2)
    disk.tick(now=time.time() + 10 * 3_600)  # past the retention of every frame
    stored = disk.store_of(INC)
    assert stored is not None and stored.first_pos == stored.end_pos == 60
    assert transfer_ended_whole(disk, 60)[-1] == 60
    disk.close()


def test_an_ended_copy_whose_store_broke_answers_that_it_takes_no_transfer(tmp_path: Path) -> None:
    """Review 42 finding 6: the ended copy's store broke (an fsync failed: it takes nothing more), so
    the transfer of what lies below its start can never join it: the offer is answered 0 (none is
    taken here) at once, and the primary goes on to its other stores, instead of no answer ever."""
    root = tmp_path / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    jumped_copy(disk, 40, 20)
    disk.open(INC2)
    broken = disk.stores[INC]
    broken.state, broken.error = StoreState.BROKEN, OSError(5, "Input/output error")  # as a failed fsync leaves it
    assert disk.fill_ended(transfer_page(INC, 1, 7, 60, True, ended=INC)) == 0
    assert not list(root.glob("*~base/*.seg")), "a transfer that can never join was written"
    disk.close()


def test_a_transfer_joins_an_adopted_store_where_it_starts_now_not_where_it_started(tmp_path: Path) -> None:
    """Review 42 finding 7: an adopted store of INC that lacks what lies below 40 (its transfer did
    not finish) and whose retention then deleted its oldest segments (40 to about 50) takes the
    restarted primary's transfer up to where it starts now: served whole, no hole where retention
    deleted its start."""
    root = tmp_path / "x1~r"
    store = SegmentStore(root / INC, StoreLimits(segment_bytes=4 << 10, index_every=256))
    old, now = time.time() - 2 * 3_600, time.time()
    for pos in range(40, 60):  # bodies of about 500 bytes: several segments
        store.append(stored_frame(pos, old if pos < 50 else now, TOPIC, body(INC, pos, 500), 1))
    assert store.flush(sync=True)
    store.close()
    write_missing(root / INC, 40)
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    assert disk.missing == {INC: 40}
    disk.tick()
    adopted = disk.store_of(INC)
    assert adopted is not None and 40 < adopted.first_pos < 60, "retention deleted no segment or all of them"
    start = adopted.first_pos
    disk.open(INC2)
    answers, first, jump = [], 1, True
    for _ in range(100):  # the restarted primary's store of INC: 1-59, bodies as this one's
        now_us = int(time.time() * 1e6)
        frames = [[now_us, TOPIC, body(INC, pos, 500), 1] for pos in range(first, min(first + 7, 60))]
        held = disk.fill_ended(protocol.Fill(INC2, first, 60, frames, jump, proof(INC2), INC))
        assert held is not None
        answers.append(held)
        if held >= 60:
            break
        first, jump = held, False
    stored = disk.store_of(INC)
    assert stored is not None
    got = [frame.pos for frame in stored.read(1, 60, 1 << 22).frames]
    assert got == list(range(1, 60)), f"a hole from {start}: {sorted(set(range(1, 60)) - set(got))}"
    disk.close()


def test_a_transfer_marker_refused_by_a_full_disk_is_written_once_there_is_room(
        small_disk, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 42, the minor finding: a copy that starts at a jump on a full disk cannot note the
    transfer due below it (transfer_marker.py). That is a full disk, not a broken one: its store
    takes no page (`refusing writes`, the full-disk tolerance) until the marker is written, and
    once the disk has room it is, and pages are taken again."""
    monkeypatch.setattr(replica_disk, "RETRY_EVERY", 0.0)
    mount = small_disk("replica", 1 << 20)
    root = mount / "x1~r"
    disk = ReplicaDisk(root)
    disk.start(ON_DISK)
    fill_up(mount / "filler")
    disk.open(INC, 40)
    assert disk.stores[INC].state is not StoreState.BROKEN, "a full disk counted as a broken one"
    assert not disk.accepts(INC) and "refusing writes" in disk.problem(INC)
    disk.tick()  # a flush with nothing to write goes through: the marker is still due
    assert not disk.accepts(INC)
    (mount / "filler").unlink()
    assert disk.accepts(INC)
    assert read_missing(root / INC) == 40
    disk.close()
