"""A journal on a full disk (docs/guarantees.md "A full disk"): backpressure with a clear reason, then a move.

One host's `hcm.data_dir` is a real tmpfs of a few MiB, its exchanges journal with fsync. When
the disk fills, the exchange must not crash: its acks wait, it stops reading publishers, it says
why (`storage_full`), and the leader moves it to a host with room, where the publishers resend
what was not confirmed. With no host with room it stays, holding its publishers, and resumes by
itself once space frees. Nothing confirmed is lost or delivered twice, nothing is FAILED, and no
traceback reaches a log.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.errors import RequestTimeoutError, StorageFullError
from roq.records import ExchangeStats
from roq.state import read_hosts, read_leader, read_live
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MESSAGES = 5_000
PAYLOAD = 1_000  # bytes: 5,000 of them do not fit in the 4 MiB disk
JOURNAL = ("exchange.journal=fsync", "exchange.journal_segment_bytes=262144")
# The tiny host must be fit for an exchange at first: below 1 MiB free it is full.
LEADER = ("gcm.min_free_bytes=1048576", "gcm.storage_full_grace=2")


class Collector:
    def __init__(self, queue: str, config, zk) -> None:
        self.counts: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.sub = Subscriber(queue, config, callback=self.on_message)

    def on_message(self, msg) -> None:
        with self.lock:
            self.counts[int(msg.payload.split(b" ", 1)[0])] += 1

    def missing(self, total: int) -> int:
        with self.lock:
            return sum(1 for i in range(total) if i not in self.counts)

    def duplicated(self) -> int:
        with self.lock:
            return sum(1 for count in self.counts.values() if count > 1)


def payload(i: int) -> bytes:
    return str(i).encode().ljust(PAYLOAD, b" ")


def stats_of(zk, paths, queue: str) -> ExchangeStats:
    return ExchangeStats.from_dict((read_live(zk, paths, queue).get("x1") or {}).get("stats"))


def log_text(procs, name: str) -> str:
    return procs.logs[name].read_text(errors="replace")


def assert_no_failure_in_logs(procs) -> None:
    for name in procs.logs:
        text = log_text(procs, name)
        assert "Traceback" not in text, f"a traceback in {name}'s log"
        assert "FAILED" not in text, f"an exchange FAILED in {name}'s log"
        assert "unexpected error" not in text, f"an unexpected error in {name}'s log"


class ConfirmWatch:
    """Samples `pub.confirmed`: the longest time it stood still while messages were unconfirmed."""

    def __init__(self, pub: Publisher) -> None:
        self.pub = pub
        self.longest_stall = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last, since = self.pub.confirmed, time.monotonic()
        while not self._stop.wait(0.05):  # a sampling period, not a synchronisation
            now, confirmed = time.monotonic(), self.pub.confirmed
            if confirmed != last or not self.pub.unconfirmed:
                last, since = confirmed, now
            self.longest_stall = max(self.longest_stall, now - since)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.longest_stall


def test_a_full_disk_moves_the_exchange_to_a_host_with_room_and_loses_nothing(config, zk, paths, procs,
                                                                              small_disk) -> None:
    tiny = small_disk("host-1", 4 << 20)
    procs.start("gcm", "gcm-0", *LEADER)
    procs.start("hcm", "host-1", "hcm.host=host-1", f"hcm.data_dir={tiny}", *JOURNAL)
    procs.start("hcm", "host-2", "hcm.host=host-2", *JOURNAL)
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 2, message="cluster")
    with Admin(config) as admin:
        admin.create_queue("ledger")
    wait_until(lambda: read_live(zk, paths, "ledger").get("x1"), timeout=20, message="x1 running")
    assert read_live(zk, paths, "ledger")["x1"]["host"] == "host-1", "the exchange starts on the small disk"
    collector = Collector("ledger", config, zk)
    try:
        collector.sub.wait_connected(timeout=15)
        with Publisher("ledger", config) as pub:
            pub.wait_for_subscribers(1, timeout=15)
            watch = ConfirmWatch(pub)
            started = time.monotonic()
            for i in range(MESSAGES):
                pub.publish("load", payload(i), timeout=60)
            wait_until(lambda: stats_of(zk, paths, "ledger").storage_full
                       or read_live(zk, paths, "ledger").get("x1", {}).get("host") == "host-2",
                       timeout=60, message="the disk to fill up")
            full_at = time.monotonic()
            wait_until(lambda: read_live(zk, paths, "ledger").get("x1", {}).get("host") == "host-2",
                       timeout=60, message="the exchange moved to the host with room")
            moved_at = time.monotonic()
            pub.flush(90)
            confirmed_at = time.monotonic()
            stall = watch.stop()
            assert pub.confirmed == MESSAGES
        wait_until(lambda: collector.missing(MESSAGES) == 0, timeout=60, message="every confirmed message")
        record_figures("journal on a full disk: exchange moved", messages=MESSAGES,
                       lost=collector.missing(MESSAGES), duplicated=collector.duplicated(),
                       full_to_moved_s=round(moved_at - full_at, 2),
                       all_confirmed_after_s=round(confirmed_at - started, 2),
                       longest_confirm_stall_s=round(stall, 2))
        assert collector.duplicated() == 0
    finally:
        collector.sub.close()
    hosts = read_hosts(zk, paths)
    assert hosts["host-1"].stats.get("data_total_bytes", 0) > 0, "the host reports its data disk"
    assert hosts["host-1"].stats["data_free_bytes"] < 1 << 20
    assert "storage_full" in log_text(procs, "host-1")
    assert_no_failure_in_logs(procs)


def test_with_no_host_with_room_the_exchange_holds_its_publishers_and_resumes_when_space_frees(
        config, zk, paths, procs, small_disk) -> None:
    tiny = small_disk("host-1", 4 << 20)
    ballast = tiny / "ballast"
    ballast.write_bytes(b"\0" * (5 << 19))  # 1.5 MiB left: room for a part of the 2 MB journal
    procs.start("gcm", "gcm-0", "gcm.min_free_bytes=65536", "gcm.storage_full_grace=1")
    procs.start("hcm", "host-1", "hcm.host=host-1", f"hcm.data_dir={tiny}", *JOURNAL)
    wait_until(lambda: read_leader(zk, paths) and read_hosts(zk, paths), message="cluster")
    with Admin(config) as admin:
        admin.create_queue("ledger")
    wait_until(lambda: read_live(zk, paths, "ledger").get("x1"), timeout=20, message="x1 running")
    incarnation = read_live(zk, paths, "ledger")["x1"]["incarnation"]
    total = 2_000
    collector = Collector("ledger", config, zk)
    try:
        collector.sub.wait_connected(timeout=15)
        with Publisher("ledger", config) as pub:
            pub.wait_for_subscribers(1, timeout=15)
            for i in range(total):
                pub.publish("load", payload(i), timeout=60)
            wait_until(lambda: stats_of(zk, paths, "ledger").storage_full, timeout=60, message="the disk to fill")
            held = pub.confirmed
            assert held < total
            wait_until(lambda: "no host has room" in log_text(procs, "gcm-0"), timeout=20,
                       message="the leader's ERROR line")
            report = stats_of(zk, paths, "ledger")
            assert "ENOSPC" in report.storage_error and report.held_acks > 0
            with pytest.raises(RequestTimeoutError, match="storage_full"):
                pub.flush(3)  # confirms wait, and the publisher says why
            room = config.client.max_unconfirmed - pub.unconfirmed
            with pytest.raises(StorageFullError, match="storage_full: exchange ledger/x1 cannot write its journal"):
                pub.publish_all("load", [b"0"] * (room + 1), timeout=1)  # all or nothing: nothing queued
            ballast.unlink()  # space frees: the journal writes again by itself
            freed = time.monotonic()
            pub.flush(60)
            resumed_in = time.monotonic() - freed
            assert pub.confirmed == total
        wait_until(lambda: collector.missing(total) == 0, timeout=60, message="every confirmed message")
        record_figures("journal on a full disk, no host with room", confirmed_before_full=held,
                       resumed_after_space_freed_s=round(resumed_in, 2), lost=collector.missing(total),
                       duplicated=collector.duplicated())
        assert collector.duplicated() == 0
    finally:
        collector.sub.close()
    live = read_live(zk, paths, "ledger")["x1"]
    assert (live["host"], live["incarnation"]) == ("host-1", incarnation), "it stayed, the same process"
    wait_until(lambda: not stats_of(zk, paths, "ledger").storage_full, timeout=10, message="storage_full cleared")
    assert_no_failure_in_logs(procs)

