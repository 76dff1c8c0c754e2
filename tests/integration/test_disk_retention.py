"""A queue whose storage policy keeps frames on disk (issue 35): real GCM, HCMs and exchange processes.

The exchanges' memory tail is made tiny (`exchange.retention_bytes`), the queue's disk retention
long, so a subscriber away for many memory tails must be served from the segment store
(exchange/disk_tail.py, exchange/tiered.py); a restarted exchange serves its earlier incarnation's
store; a store on a full disk is `storage_full` backpressure; a consumer group with no member keeps a
backlog far beyond `exchange.group_max_bytes` on disk, and its acks across a SIGKILL
(exchange/group_spill.py, exchange/group_restore.py).
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime

import pytest

from roq.client.admin import Admin
from roq.client.group_member import GroupMember
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.errors import RequestTimeoutError, StorageFullError
from roq.records import ExchangeStats
from roq.state import read_hosts, read_leader, read_live
from tests.integration.conftest import start_cluster
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MEMORY = ("exchange.retention_bytes=200000",)  # a memory tail of 200 KB
BODY = 2_000


def create_on_disk(config, zk, paths, name: str) -> None:
    with Admin(config) as admin:
        admin.create_queue(name, exchanges=1, retention=3_600.0, retention_bytes=1 << 30)
    wait_until(lambda: read_live(zk, paths, name).get("x1"), timeout=20, message="x1 running")


def stored_all(zk, paths, queue: str, messages: int) -> bool:
    """x1's latest report counts `messages` sent and its store writing: the frames that carry them
    were appended, written and synced before it (exchange/main.py: the store's tick, then the report)."""
    stats = ExchangeStats.from_dict((read_live(zk, paths, queue).get("x1") or {}).get("stats"))
    return stats.msgs_out >= messages and not stats.storage_full


def taken_then_stored(config, zk, paths, queue: str, total: int) -> dict:
    """A subscriber takes 10 messages and leaves (its position returned), `total` - 10 more are
    published and stored, the publisher closed (nothing is resent to a later incarnation, so what
    a subscriber gets after a kill comes from the store)."""
    with Publisher(queue, config) as pub:
        sub = Subscriber(queue, config)
        sub.wait_connected(1)
        publish(pub, 0, 10)
        assert receive_all(sub, 9)[-1] == 9
        position = sub.position()
        sub.close()
        publish(pub, 10, total - 10)
        # Acks do not wait for the store (docs/guarantees.md): a kill right after them may find the last
        # frames acked but not yet written. What is promised is what the store wrote: wait for a report
        # (made after the stats tick's sync) that counts all messages sent, so appended and written.
        wait_until(lambda: stored_all(zk, paths, queue, total), timeout=30, message=f"the store to write {total}")
    return position


def payload(i: int) -> bytes:
    return i.to_bytes(4, "big") + b"x" * BODY


def publish(pub: Publisher, first: int, count: int) -> None:
    for i in range(first, first + count):
        pub.publish("t", payload(i))
    pub.flush(60)


def receive_all(sub: Subscriber, upto: int) -> list[int]:
    return receive_from(sub, upto)[0]


def receive_from(sub: Subscriber, upto: int) -> tuple[list[int], set[str]]:
    """The messages' numbers up to `upto` (or until none comes for 10 s), and the incarnations they came from."""
    got: list[int] = []
    sources: set[str] = set()
    while (msg := sub.receive(timeout=10)) is not None:
        got.append(int.from_bytes(msg.payload[:4], "big"))
        sources.add(msg.incarnation)
        if got[-1] == upto:
            break
    return got, sources


def away_then_back(config, pub: Publisher, queue: str, first: int, away: int) -> tuple[dict, list[int], int]:
    """A subscriber takes `first` messages, leaves, `away` more are published, it comes back from its position."""
    sub = Subscriber(queue, config)
    sub.wait_connected(1)
    publish(pub, 0, first)
    assert receive_all(sub, first - 1)[-1] == first - 1
    position = sub.position()
    sub.close()
    publish(pub, first, away)
    with Subscriber(queue, config, position=position) as back:
        back.wait_connected(1)
        got = receive_all(back, first + away - 1)
        return position, got, back.stats().gaps


def test_a_subscriber_away_for_many_memory_tails_resumes_from_disk_with_nothing_lost(config, zk, paths, procs):
    start_cluster(procs, zk, paths, *MEMORY)
    small = config.replace(client={"max_batch_bytes": 20_000})
    create_on_disk(small, zk, paths, "deep")
    with Publisher("deep", small) as pub:
        # 2 MB while it is away: ten memory tails.
        _, got, gaps = away_then_back(small, pub, "deep", 10, 1_000)
    record_figures("durable subscriber away 10 memory tails, disk retention", resumed=len(got), gaps=gaps)
    assert got == list(range(10, 1_010)), "every message once, in order"
    assert gaps == 0
    wait_until(lambda: ExchangeStats.from_dict(read_live(zk, paths, "deep")["x1"].get("stats")).evicted_frames > 0,
               timeout=20, message="the memory tail really was left behind")


@pytest.mark.parametrize("journal", ["off", "async"])
def test_a_restarted_exchange_serves_its_earlier_incarnations_store(config, zk, paths, procs, journal):
    """Journal off: the earlier incarnation is on disk only; async: its journal reloads the memory
    tail and the store serves below it."""
    start_cluster(procs, zk, paths, *MEMORY, f"exchange.journal={journal}")
    small = config.replace(client={"max_batch_bytes": 20_000})
    create_on_disk(small, zk, paths, "kept")
    position = taken_then_stored(small, zk, paths, "kept", 510)  # 1 MB: five memory tails, on disk only
    # The publisher is gone before the kill: nothing is resent to the new incarnation, so what the
    # subscribers below get comes from the earlier incarnation's store.
    live = read_live(zk, paths, "kept")["x1"]
    host, before = live["host"], live["incarnation"]
    os.kill(live["pid"], signal.SIGKILL)  # the HCM starts a new incarnation; the data dir stays
    wait_until(lambda: read_live(zk, paths, "kept").get("x1", {}).get("incarnation") not in (None, before),
               timeout=30, message="a new incarnation")
    live = read_live(zk, paths, "kept")["x1"]
    if live["host"] != host:
        pytest.skip("the leader moved the exchange to the other host: its store stayed behind")
    assert before in live.get("archived", []), "the earlier incarnation's store is served"
    with Subscriber("kept", small, position=position) as back:
        back.wait_connected(1)
        got = receive_all(back, 509)
        gaps = back.stats().gaps
    assert got == list(range(10, 510)), "what the killed incarnation stored, once, in order"
    assert gaps == 0
    # A new subscriber from the beginning reads the earlier incarnation too (it is in `archived`),
    # and its position names it from the start: a resume before its first frame still reads it.
    with Subscriber("kept", small, start="beginning", inbox_limit=1) as early:
        assert early.position()["streams"].get(before) == 0
        resumed_early = early.position()
    with Subscriber("kept", small, position=resumed_early) as again:
        again.wait_connected(1)
        assert receive_all(again, 509) == list(range(510)), "the resume read the earlier incarnation whole"
    with Subscriber("kept", small, start="beginning") as fresh:
        fresh.wait_connected(1)
        got = receive_all(fresh, 509)
        gaps = fresh.stats().gaps
    assert got == list(range(510)), "everything the queue still stores, once, in order"
    assert gaps == 0


def test_a_store_on_a_full_disk_holds_the_publishers_with_storage_full(config, zk, paths, procs, small_disk):
    tiny = small_disk("host-1", 2 << 20)
    procs.start("gcm", "gcm-0", "gcm.min_free_bytes=65536", "gcm.storage_full_grace=600")
    procs.start("hcm", "host-1", "hcm.host=host-1", f"hcm.data_dir={tiny}", *MEMORY)
    wait_until(lambda: read_leader(zk, paths) and read_hosts(zk, paths), message="cluster")
    small = config.replace(client={"max_batch_bytes": 20_000})
    create_on_disk(small, zk, paths, "cramped")

    def stats() -> ExchangeStats:
        return ExchangeStats.from_dict((read_live(zk, paths, "cramped").get("x1") or {}).get("stats"))

    pub = Publisher("cramped", small)
    try:
        refused = None
        for i in range(2_000):  # 4 MB into 2 MiB
            try:
                pub.publish("t", payload(i), timeout=5)
            except (StorageFullError, RequestTimeoutError) as exc:
                refused = exc
                break
        wait_until(lambda: stats().storage_full, timeout=60, message="the store's disk to fill")
        report = stats()
        assert "ENOSPC" in report.storage_error
        assert pub.confirmed < 2_000, "publishers are held, not confirmed past the disk"
        assert refused is None or "storage_full" in str(refused)
    finally:
        pub.close(timeout=0)
    text = procs.logs["host-1"].read_text(errors="replace")
    assert "cannot write its segment store (ENOSPC" in text
    assert "Traceback" not in text


def test_a_subscriber_started_from_a_time_gets_what_was_stored_since_from_disk_and_memory(config, zk, paths, procs):
    start_cluster(procs, zk, paths, *MEMORY)
    small = config.replace(client={"max_batch_bytes": 20_000})
    create_on_disk(small, zk, paths, "clock")
    with Publisher("clock", small) as pub:
        publish(pub, 0, 200)
        since = time.time()
        wait_until(lambda: time.time() > since + 0.05, message="the clock to move past the first batch")
        publish(pub, 200, 1_000)  # 2 MB: ten memory tails after the time asked
    at = datetime.fromtimestamp(since, UTC)
    with Subscriber("clock", small, start=at) as sub:
        got = receive_all(sub, 1_199)
        gaps = sub.stats().gaps
    assert got == list(range(200, 1_200)), "exactly what was stored since, once, in order"
    assert gaps == 0
    env = dict(os.environ, ROQ_SEEDS=config.cluster.seeds, ROQ_ZK_HOSTS=config.zk.hosts, ROQ_ZK_ROOT=config.zk.root)
    run = subprocess.run([sys.executable, "-m", "roq.cli", "subscribe", "clock", "--from",
                          at.isoformat().replace("+00:00", "Z"), "--count", "1000", "--timeout", "15",
                          "--format", "base64"], env=env, capture_output=True, timeout=90)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    printed = [int.from_bytes(base64.b64decode(line.split(b"\t")[1])[:4], "big") for line in run.stdout.splitlines()]
    assert printed == list(range(200, 1_200))


GROUP_BYTES = 100_000  # exchange.group_max_bytes here: the backlog below is 20 times it


def group_held(zk, paths, queue: str) -> int:
    stats = ExchangeStats.from_dict((read_live(zk, paths, queue).get("x1") or {}).get("stats"))
    return sum(g.held_bytes for g in stats.groups.values())


def take(member: GroupMember, upto: int, seen: list[tuple[int, int]]) -> None:
    """Receive and ack until message `upto` came (its id and deliveries into `seen`)."""
    while (msg := member.receive(timeout=20)) is not None:
        number = int.from_bytes(msg.payload[:4], "big")
        seen.append((number, msg.deliveries))
        msg.ack()
        if number == upto:
            return


BACKLOG = 6_000  # 12 MB: 120 times exchange.group_max_bytes, three of a restore's 4 MiB read-aheads


def backlog_beyond_memory(config, zk, paths, queue: str, count: int = 1_000) -> tuple[list[tuple[int, int]], list[int]]:
    """Group "w" takes and acks messages 0-99, then has no member while `count` more come (1,000:
    2 MB, 20 times exchange.group_max_bytes), all stored: what it took, and what the groups held."""
    first: list[tuple[int, int]] = []
    with Publisher(queue, config) as pub:
        with GroupMember(queue, config, ["t"], group="w", prefetch=20, auto_ack=False) as member:
            member.wait_connected(1)
            publish(pub, 0, 100)
            take(member, 99, first)
        held: list[int] = []
        for start in range(100, 100 + count, 500):
            publish(pub, start, 500)  # never held: the backlog waits on disk
            held.append(group_held(zk, paths, queue))
        wait_until(lambda: stored_all(zk, paths, queue, 100 + count), timeout=60, message="the store to write all")
        held.append(group_held(zk, paths, queue))
    return first, held


def confirmed_while_restored(config, zk, paths, queue: str, first: int, count: int) -> float:
    """A publisher of the restarted exchange publishes `count` messages and has them confirmed (its
    flush returns): how long it took. The group has no member: its backlog is still on disk."""
    began = time.monotonic()
    with Publisher(queue, config) as pub:
        publish(pub, first, count)
    return time.monotonic() - began


def sent_by_x1(zk, paths, queue: str) -> int:
    return ExchangeStats.from_dict((read_live(zk, paths, queue).get("x1") or {}).get("stats")).msgs_out


def test_a_group_with_no_member_keeps_a_backlog_beyond_its_memory_and_its_acks_across_a_kill(
        config, zk, paths, procs):
    """A backlog of several read-aheads, the exchange SIGKILLed: its next incarnation confirms new
    publishes at once while the group's backlog is still on disk (nothing of it forwarded again:
    the new stream holds the new messages only), then hands out every message once, the backlog
    before the new ones."""
    start_cluster(procs, zk, paths, *MEMORY, f"exchange.group_max_bytes={GROUP_BYTES}")
    small = config.replace(client={"max_batch_bytes": 20_000})
    create_on_disk(small, zk, paths, "backlog")
    first, held = backlog_beyond_memory(small, zk, paths, "backlog", BACKLOG)
    record_figures("group backlog on disk", published=BACKLOG, most_held=max(held), bound=GROUP_BYTES)
    assert max(held) <= GROUP_BYTES + 25_000, "memory holds a share of group_max_bytes, give or take a frame"
    assert sorted(n for n, _ in first) == list(range(100))
    live = read_live(zk, paths, "backlog")["x1"]
    host, before = live["host"], live["incarnation"]
    os.kill(live["pid"], signal.SIGKILL)  # the acks of the first 100 were synced with the store
    wait_until(lambda: read_live(zk, paths, "backlog").get("x1", {}).get("incarnation") not in (None, before),
               timeout=30, message="a new incarnation")
    if read_live(zk, paths, "backlog")["x1"]["host"] != host:
        pytest.skip("the leader moved the exchange to the other host: its disk stayed behind")
    end = 100 + BACKLOG
    took = confirmed_while_restored(small, zk, paths, "backlog", end, 200)
    record_figures("publishers during a group restore", confirmed=200, seconds=round(took, 3))
    assert took < 30, "confirmed while the group's backlog waits on disk"
    # The killed incarnation's last report counts 6,100; a restore that forwarded the backlog again, 6,300.
    wait_until(lambda: sent_by_x1(zk, paths, "backlog") == 200, timeout=30,
               message="a report of the new stream holding the new messages only (nothing forwarded again)")
    seen = drain_with_two_members(small, "backlog", set(range(100, end + 200)))
    counts = Counter(n for n, _ in seen)
    record_figures("group backlog after SIGKILL", delivered=len(seen), distinct=len(counts))
    assert not [n for n in counts if n < 100], "nothing acked before the kill comes again"
    assert set(counts) == set(range(100, end + 200)), "nothing lost"
    assert [n for n, c in counts.items() if c > 1] == [], "nothing twice (no ack was lost, no member died)"
    order = [n for n, _ in seen]
    assert max(i for i, n in enumerate(order) if n < end) < min(i for i, n in enumerate(order) if n >= end) + 40, \
        "the backlog before the new messages (give or take what two members' prefetch holds)"


def test_with_store_sync_confirm_a_sigkill_right_after_an_ack_never_loses_the_acked_frame(config, zk, paths, procs):
    """`exchange.store_sync = confirm`, the journal off: an ack leaves only once the store fsync'ed
    the frame, so an incarnation killed the moment the publisher's flush returns (no wait for a
    report, unlike the test above) left every acked message in its store. Three kills, after a
    different number of messages each; each time a subscriber that left before them resumes from
    the killed incarnation's store."""
    start_cluster(procs, zk, paths, *MEMORY, "exchange.store_sync=confirm")
    # No replay window: the publisher stays open across the kills, and would resend what it confirmed
    # in the last client.replay_seconds to the next incarnation, which a resumed subscriber reads from
    # its start (docs/protocol.md 4.4 rule 2). Whether those resends came before the subscriber had
    # drained the killed store decided whether it got messages from before its position again (CI).
    small = config.replace(client={"max_batch_bytes": 20_000, "replay_seconds": 0.0})
    create_on_disk(small, zk, paths, "synced")
    sent = 0
    with Publisher("synced", small) as pub:
        for count in (1, 37, 300):
            sub = Subscriber("synced", small)
            sub.wait_connected(1)
            publish(pub, sent, 1)  # a marker the subscriber takes, so its position names this incarnation
            assert receive_all(sub, sent)[-1] == sent
            position = sub.position()
            sub.close()
            publish(pub, sent + 1, count)  # returns once every one of them is acked
            live = read_live(zk, paths, "synced")["x1"]
            os.kill(live["pid"], signal.SIGKILL)
            wait_until(lambda old=live["incarnation"]: read_live(zk, paths, "synced").get("x1", {}).get(
                "incarnation") not in (None, old), timeout=30, message="a new incarnation")
            if read_live(zk, paths, "synced")["x1"]["host"] != live["host"]:
                pytest.skip("the leader moved the exchange to the other host: its store stayed behind")
            with Subscriber("synced", small, position=position) as back:
                back.wait_connected(1)
                got, sources = receive_from(back, sent + count)
            want = list(range(sent + 1, sent + 1 + count))
            # In order and nothing else: all from the killed incarnation's store, none from a publisher's replay.
            assert got == want, f"after {count}: the store held {len(got)} of them ({got[:3]}...{got[-3:]})"
            assert sources == {live["incarnation"]}, "read from the killed incarnation's store alone"
            assert pub.stats().replayed == 0
            sent += count + 1


def drain_with_two_members(config, queue: str, wanted: set[int]) -> list[tuple[int, int]]:
    """Two members receive and ack until every message of `wanted` came: (number, deliveries) of each."""
    seen: list[tuple[int, int]] = []
    with GroupMember(queue, config, ["t"], group="w", prefetch=20, auto_ack=False) as a, \
            GroupMember(queue, config, ["t"], group="w", prefetch=20, auto_ack=False) as b:
        a.wait_connected(1)
        b.wait_connected(1)
        done = threading.Event()

        def drain(member: GroupMember) -> None:
            while not done.is_set():
                msg = member.receive(timeout=0.5)
                if msg is not None:
                    seen.append((int.from_bytes(msg.payload[:4], "big"), msg.deliveries))
                    msg.ack()

        workers = [threading.Thread(target=drain, args=(m,), daemon=True) for m in (a, b)]
        for worker in workers:
            worker.start()
        try:
            wait_until(lambda: {n for n, _ in seen} >= wanted, timeout=90, message="every message of the backlog")
        finally:
            done.set()
            for worker in workers:
                worker.join(10)
    return seen
