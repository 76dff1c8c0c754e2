"""exchange/disk_tail.py over real segment stores in a temporary directory: a store per
incarnation, earlier ones served read-only after a restart, policies applied, a purge."""

from __future__ import annotations

import time
from pathlib import Path

from exchange.disk_tail import DiskTail
from roq.storage_policy import StoragePolicy

ON_DISK = StoragePolicy(retention=3_600.0)


def fill(tail: DiskTail, first: int, count: int) -> None:
    for pos in range(first, first + count):
        tail.append(pos, b"t", bytes(100), 1, None)
    tail.flush(0.0)


def test_a_memory_only_policy_opens_no_store(tmp_path: Path) -> None:
    tail = DiskTail(tmp_path, "x1.a", "q/x1")
    tail.start(StoragePolicy())
    fill(tail, 1, 5)
    assert tail.store is None and not tail.full and not tmp_path.joinpath("x1.a").exists()


def test_a_restart_serves_the_earlier_incarnations_store_until_the_policy_drops_it(tmp_path: Path) -> None:
    first = DiskTail(tmp_path, "x1.a", "q/x1")
    first.start(ON_DISK)
    fill(first, 1, 50)
    first.tick()
    first.close()
    second = DiskTail(tmp_path, "x1.b", "q/x1")
    second.start(ON_DISK)
    stored = second.store_of("x1.a")
    assert stored is not None and (stored.first_pos, stored.end_pos) == (1, 51)
    assert second.store_of("x1.b") is second.store and second.store_of("x1.c") is None
    second.inbox.deliver({"storage": {"retention": 0, "retention_bytes": 0}})  # queue.set: memory only
    second.tick()
    assert "x1.a" not in second.archived and not tmp_path.joinpath("x1.a").exists()
    second.close()


def test_positions_that_skip_start_the_store_again_and_a_purge_drops_earlier_stores(tmp_path: Path) -> None:
    earlier = DiskTail(tmp_path, "x1.a", "q/x1")
    earlier.start(ON_DISK)
    fill(earlier, 1, 5)
    earlier.close()
    tail = DiskTail(tmp_path, "x1.b", "q/x1")
    tail.start(ON_DISK)
    assert set(tail.archived) == {"x1.a"}
    fill(tail, 1, 10)
    fill(tail, 20, 5)  # memory only meanwhile: the store cannot hold a hole
    assert tail.store is not None and (tail.store.first_pos, tail.store.end_pos) == (20, 25)
    fill(tail, 25, 3)
    tail.purge(28)
    assert not tail.archived and not tmp_path.joinpath("x1.a").exists() and tail.store.end_pos == 28
    tail.close()


def test_the_figures_count_every_incarnations_files_and_name_the_oldest_frame(tmp_path: Path) -> None:
    memory_only = DiskTail(tmp_path / "none", "x1.a", "q/x1")
    memory_only.start(StoragePolicy())
    assert memory_only.figures() == {}  # no store: the statistics keep their defaults
    earlier = DiskTail(tmp_path, "x1.a", "q/x1")
    earlier.start(ON_DISK)
    before = time.time()
    fill(earlier, 1, 5)
    earlier.close()
    tail = DiskTail(tmp_path, "x1.b", "q/x1")
    tail.start(ON_DISK)
    assert tail.figures()["store_oldest_pos"] == 0  # nothing of this incarnation on disk yet
    fill(tail, 1, 10)
    figures = tail.figures()
    on_disk = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert figures["store_bytes"] == on_disk and figures["store_segments"] == 2
    assert figures["store_state"] == "ok" and figures["store_oldest_pos"] == 1
    oldest = figures["store_oldest_time"]
    assert oldest is not None and before <= oldest <= time.time()
    tail.purge(11)  # the earlier incarnation's store goes: the oldest time is this one's
    assert tail.figures()["store_segments"] == 1
    tail.close()


def test_positions_are_durable_only_once_a_sync_covered_them(tmp_path: Path) -> None:
    tail = DiskTail(tmp_path, "x1.a", "q/x1")
    tail.start(ON_DISK)
    assert tail.durable_before(1) == 1  # nothing appended: nothing waits
    for pos in range(1, 6):
        tail.append(pos, b"t", bytes(100), 1, None)
    tail.flush(0.0)  # written, not synced: acks must still wait
    assert tail.durable_before(6) == 1
    tail.sync(0.0)
    assert tail.durable_before(6) == 6 and tail.store is not None and tail.store.end_pos == 6
    tail.append(6, b"t", bytes(100), 1, None)
    assert tail.durable_before(7) == 6
    tail.tick()  # the stats tick's sync covers it too
    assert tail.durable_before(7) == 7
    tail.append(7, b"t", bytes(100), 1, None)
    tail.apply(StoragePolicy())  # made memory only: nothing waits for the store any more
    assert tail.durable_before(8) == 8
    tail.close()
