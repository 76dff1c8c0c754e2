"""Replicated queues and the journal, with real processes: what a confirm means survives the loss of what held it.

A confirm means "held by two exchange processes on two hosts" (replicas = 2), or "fsync'ed"
(exchange.journal = fsync). Each test kills what held a confirmed message and checks that every
confirmed message still reaches the application once: lost = 0, duplicated = 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
import zmq

from roq import protocol
from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.paths import Paths
from roq.records import ExchangeStats
from roq.state import read_hosts, read_leader, read_live
from roq.zk import read_json
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

HOSTS = ("host-1", "host-2", "host-3")

# A publisher in its own process, so that it can die together with its exchange's host. It
# prints the count of confirmed messages (a lower bound: printed after the ack arrived).
PUBLISHER = textwrap.dedent("""
    import sys, time
    from roq.config import load_config
    from roq.client.publisher import Publisher
    config = load_config(sys.argv[1])
    pub = Publisher(sys.argv[2], config)
    sent = 0
    while True:
        pub.publish("load", str(sent).encode(), timeout=60)
        sent += 1
        if sent % 50 == 0:
            print(pub.confirmed, flush=True)
            time.sleep(0.005)
""")
PADDED_PUBLISHER = PUBLISHER.replace("str(sent).encode()", "str(sent).encode().ljust(1000)")  # int() takes it back


# A lost host that holds a disk-retained queue's slots is waited for (gcm.journal_reassign_grace);
# tests whose host never comes back have it moved at once.
LOST_FOR_GOOD = ("gcm.journal_reassign_grace=0",)


def start_hosts(procs, zk, paths, *settings: str, gcm_settings: tuple[str, ...] = ()) -> None:
    procs.start("gcm", "gcm-0", "gcm.reassign_grace=0", *gcm_settings)
    for host in HOSTS:
        procs.start("hcm", host, f"hcm.host={host}", *settings)
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == len(HOSTS), message="cluster")


def create_replicated(config, zk, paths: Paths, name: str, exchanges: int = 1, replicas: int = 2,
                      retention: float | None = None) -> None:
    """`retention`: a disk storage policy of that many seconds (None: the default, memory only)."""
    with Admin(config) as admin:
        admin.create_queue(name, exchanges=exchanges, replicas=replicas, retention=retention)

    def ready() -> bool:
        live = read_live(zk, paths, name)
        return len(live) == exchanges and (replicas == 1 or all(
            zk.exists(paths.replica_live(name, xid)) for xid in live))
    wait_until(ready, timeout=20, message="exchanges and replicas running")


def fetch_copy(endpoint: str, incarnation: str) -> protocol.Frames:
    """The first page of a replica's copy of `incarnation` (a fetch does not seal it)."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(endpoint)
        sock.send(protocol.encode_fetch(1, incarnation, 0, 0, [], 1 << 20))
        assert sock.poll(5000), "the replica did not answer"
        answer = protocol.decode_replay_reply(sock.recv(), 1 << 30)
        assert isinstance(answer, protocol.Frames)
        return answer
    finally:
        sock.close()


def host_of(zk, paths: Paths, queue: str, xid: str = "x1") -> str:
    return str(read_live(zk, paths, queue)[xid]["host"])


class Collector:
    """A subscriber counting each message number it is handed."""

    def __init__(self, queue: str, config, zk, durable: str | None = None) -> None:
        self.counts: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.sub = Subscriber(queue, config, durable=durable, callback=self.on_message)

    def on_message(self, msg) -> None:
        with self.lock:
            self.counts[int(msg.payload)] += 1

    def missing(self, confirmed: int) -> list[int]:
        with self.lock:
            return [i for i in range(confirmed) if i not in self.counts]

    def duplicated(self) -> int:
        with self.lock:
            return sum(1 for c in self.counts.values() if c > 1)


def publish_with_a_subscriber_away(config, zk, queue: str, durable: str, taken: int, total: int) -> None:
    """Publish `taken` messages that durable subscriber `durable` takes, close it (its position is
    saved), publish the rest while it is away, all confirmed, and close the publisher."""
    first = Collector(queue, config, zk, durable=durable)
    first.sub.wait_connected(timeout=15)
    with Publisher(queue, config) as pub:
        pub.wait_for_subscribers(1, timeout=15)
        for i in range(taken):
            pub.publish("load", str(i).encode())
        pub.flush(30)
        wait_until(lambda: not first.missing(taken), timeout=20, message=f"the first {taken}")
        first.sub.close()
        for i in range(taken, total):
            pub.publish("load", str(i).encode())
        pub.flush(30)
        assert pub.confirmed == total


def start_publisher(procs, queue: str, script: str = PUBLISHER) -> tuple[subprocess.Popen, list[int], threading.Thread]:
    """PUBLISHER in its own process group, and the confirmed counts it prints, as they come."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    publisher = subprocess.Popen([sys.executable, "-c", script, str(procs.config_path), queue],
                                 stdout=subprocess.PIPE, env=env, start_new_session=True)
    lines: list[int] = []

    def read() -> None:
        assert publisher.stdout is not None
        for line in publisher.stdout:
            lines.append(int(line))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return publisher, lines, reader


def kill_with_host(procs, publisher: subprocess.Popen, reader: threading.Thread, host: str) -> float:
    """The same instant: the publisher (and its replay window) and `host` go; returns when."""
    os.killpg(publisher.pid, signal.SIGKILL)
    procs.kill(host)
    killed_at = time.monotonic()
    publisher.wait(timeout=10)
    reader.join(timeout=5)
    return killed_at


def test_g_publisher_and_its_exchange_host_killed_together_lose_nothing_confirmed(config, zk, paths, procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "orders")
    exchange_host = host_of(zk, paths, "orders")
    replica = read_json(zk, paths.replica_live("orders", "x1"))
    assert replica and replica["host"] != exchange_host, "the replica must run on another host"
    collector = Collector("orders", config, zk)
    collector.sub.wait_connected(timeout=15)
    publisher, lines, reader = start_publisher(procs, "orders")
    try:
        wait_until(lambda: lines and lines[-1] >= 3000, timeout=30, message="3,000 confirmed messages")
        killed_at = kill_with_host(procs, publisher, reader, exchange_host)
        confirmed = lines[-1]
        wait_until(lambda: not collector.missing(confirmed), timeout=30,
                   message=f"the {confirmed} confirmed messages to arrive")
        record_figures("replication g (processes): publisher + exchange host killed",
                       confirmed=confirmed, received=len(collector.counts), lost=len(collector.missing(confirmed)),
                       duplicated=collector.duplicated(), drained_in_s=round(time.monotonic() - killed_at, 2))
        assert collector.duplicated() == 0
    finally:
        if publisher.poll() is None:
            os.killpg(publisher.pid, signal.SIGKILL)
        collector.sub.close()


def test_h_a_subscriber_away_while_its_exchange_host_dies_resumes_from_the_replica(config, zk, paths,
                                                                                   procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "events")
    config = config.replace(client={"state_dir": str(procs.workdir / "subscribers")})
    publish_with_a_subscriber_away(config, zk, "events", "audit", taken=1000, total=3000)
    # The publisher is gone too, with its replay window: only the replica can give 1000-2999 back.
    old = read_live(zk, paths, "events")["x1"]
    procs.kill(str(old["host"]))  # the exchange's retention dies with its host
    wait_until(lambda: (read_live(zk, paths, "events").get("x1") or {}).get("incarnation") != old["incarnation"],
               timeout=15, message="x1 gone")
    back = Collector("events", config, zk, durable="audit")
    try:
        wait_until(lambda: set(back.counts) >= set(range(1000, 3000)), timeout=30,
                   message="the messages published while the subscriber was away")
        record_figures("replication h (processes): subscriber away, exchange host killed",
                       confirmed=3000, received_after_resume=len(back.counts),
                       lost=len([i for i in range(1000, 3000) if i not in back.counts]),
                       duplicated=back.duplicated() + sum(1 for i in back.counts if i < 1000))
        assert back.duplicated() == 0
        assert not [i for i in back.counts if i < 1000], "taken before the restart: not again"
    finally:
        back.sub.close()


@pytest.mark.parametrize("store_sync", ["interval", "confirm"])
def test_j_an_exchange_host_lost_with_its_disk_under_load_loses_nothing_the_replica_stored(config, zk, paths,
                                                                                          procs, store_sync) -> None:
    """Disk retention, a memory tail of 200 KB: a durable subscriber away from the start while
    ~4 MB (20 memory tails) are confirmed under load, then the exchange's host and the publisher
    killed together: every confirmed message comes back once, from the replica's segment store.
    With `exchange.store_sync = confirm` both stores fsync before a confirm (the replica before
    it answers `copied`), and confirms still flow under load."""
    start_hosts(procs, zk, paths, "exchange.retention_bytes=200000", f"exchange.store_sync={store_sync}",
                gcm_settings=LOST_FOR_GOOD)
    create_replicated(config, zk, paths, "deep", retention=3_600.0)
    config = config.replace(client={"state_dir": str(procs.workdir / "subscribers")})
    publish_with_a_subscriber_away(config, zk, "deep", "audit", taken=10, total=10)
    exchange_host = host_of(zk, paths, "deep")
    old = read_live(zk, paths, "deep")["x1"]
    replica = read_json(zk, paths.replica_live("deep", "x1"))
    assert replica and replica["host"] != exchange_host
    copy_dir = procs.workdir / str(replica["host"]) / "data" / "store" / "deep" / "x1~r" / str(old["incarnation"])
    publisher, lines, reader = start_publisher(procs, "deep", PADDED_PUBLISHER)
    back: Collector | None = None
    try:
        wait_until(lambda: lines and lines[-1] >= 4000, timeout=60, message="4,000 confirmed messages")
        killed_at = kill_with_host(procs, publisher, reader, exchange_host)
        confirmed = lines[-1]  # the script numbers its messages from 0: the 10 taken before are not asked again
        wait_until(lambda: (read_live(zk, paths, "deep").get("x1") or {}).get("incarnation") not in
                   (None, old["incarnation"]), timeout=20, message="x1 back on another host")
        stored = sum(path.stat().st_size for path in copy_dir.glob("*.seg"))
        assert stored > 10 * 200_000, f"the replica's store holds many memory tails ({stored} bytes at {copy_dir})"
        back = Collector("deep", config, zk, durable="audit")
        wanted = set(range(confirmed))
        wait_until(lambda: wanted <= set(back.counts), timeout=60,
                   message=f"the {confirmed} confirmed messages, from the replica's store")
        record_figures(f"replication j (processes): exchange host lost with its disk, disk retention, "
                       f"store_sync {store_sync}",
                       confirmed=confirmed, received=len(back.counts), lost=len(wanted - set(back.counts)),
                       duplicated=back.duplicated(), drained_in_s=round(time.monotonic() - killed_at, 2))
        assert back.duplicated() == 0
    finally:
        if publisher.poll() is None:
            os.killpg(publisher.pid, signal.SIGKILL)
        if back is not None:
            back.sub.close()


def test_k_a_late_replica_catches_up_from_the_primary_disk_then_takes_over(config, zk, paths, procs) -> None:
    """Disk retention, a memory tail of 200 KB: ~3 MB confirmed, then the replica's host killed;
    the new replica's copy starts at the primary's memory tail and the rest comes from the primary's
    segment store by state transfer (protocol 6.5). Then the exchange's host is killed: a durable
    subscriber away since message 10 gets every confirmed message once, from the new replica."""
    memory = "exchange.retention_bytes=200000"
    start_hosts(procs, zk, paths, memory, gcm_settings=LOST_FOR_GOOD)
    procs.start("hcm", "host-4", "hcm.host=host-4", memory)  # room for the exchange and a new replica
    wait_until(lambda: len(read_hosts(zk, paths)) == 4, message="four hosts")
    create_replicated(config, zk, paths, "late", retention=3_600.0)
    config = config.replace(client={"state_dir": str(procs.workdir / "subscribers")})
    publish_with_a_subscriber_away(config, zk, "late", "audit", taken=10, total=10)
    with Publisher("late", config) as pub:
        for i in range(10, 3000):
            pub.publish("load", str(i).encode().ljust(1000))
        pub.flush(60)
        old_replica = read_json(zk, paths.replica_live("late", "x1"))
        assert old_replica
        procs.kill(str(old_replica["host"]))
        procs.wait_gone(str(old_replica["host"]))
        for i in range(3000, 3100):  # confirmed only once the new replica holds the memory tail
            pub.publish("load", str(i).encode().ljust(1000))
        pub.flush(60)
    primary = read_live(zk, paths, "late")["x1"]
    new = read_json(zk, paths.replica_live("late", "x1"))
    assert new and new["host"] not in (old_replica["host"], primary["host"])
    copy_dir = procs.workdir / str(new["host"]) / "data" / "store" / "late" / "x1~r" / str(primary["incarnation"])
    wait_until(lambda: (copy_dir / f"{1:020d}.seg").exists() and not list(copy_dir.parent.glob("*~base")),
               timeout=60, message=f"the state transfer to complete at {copy_dir}")
    wait_until(lambda: ExchangeStats.from_dict(read_live(zk, paths, "late")["x1"].get("stats")).transferred_to > 1
               and ExchangeStats.from_dict(read_live(zk, paths, "late")["x1"].get("stats")).transfer_end == 0,
               timeout=20, message="the exchange to report the transfer done")
    procs.kill(str(primary["host"]))  # the primary's disk goes with it: only the new replica holds 10-3099
    wait_until(lambda: (read_live(zk, paths, "late").get("x1") or {}).get("incarnation") not in
               (None, primary["incarnation"]), timeout=20, message="x1 back on another host")
    back = Collector("late", config, zk, durable="audit")
    try:
        wanted = set(range(10, 3100))
        wait_until(lambda: wanted <= set(back.counts), timeout=60, message="every confirmed message")
        record_figures("replication k (processes): late replica caught up from disk, then the exchange host lost",
                       confirmed=3100, received_after_resume=len(back.counts), lost=len(wanted - set(back.counts)),
                       duplicated=back.duplicated() + sum(1 for i in back.counts if i < 10))
        assert back.duplicated() == 0
        assert not [i for i in back.counts if i < 10], "taken before: not again"
    finally:
        back.sub.close()


def receive_numbers(sub: Subscriber, wanted: set[int], timeout: float = 60.0) -> Counter[int]:
    """How many times `sub` handed each message number over, until it has every one of `wanted`."""
    counts: Counter[int] = Counter()
    deadline = time.monotonic() + timeout
    while not wanted <= set(counts) and time.monotonic() < deadline:
        msg = sub.receive(timeout=1)
        if msg is not None:
            counts[int(msg.payload)] += 1
    return counts


def test_l_an_earlier_incarnation_reaches_a_new_replica_and_outlives_its_exchange_host(config, zk, paths,
                                                                                       procs) -> None:
    """Disk retention, a memory tail of 200 KB: 1,000 messages (~1 MB) confirmed in incarnation A,
    then the exchange process killed (its HCM restarts it as B, which serves A's store), 500 more
    confirmed in B, then the replica's host killed: the new replica gets B's store by transfer
    (`fill`) and A's (`fill_ended`, protocol 6.5). Then B's host is lost with its disk: a subscriber
    from the beginning whose position was taken while B ran gets every message of A once, and a
    subscriber first started now, from the beginning (or from a time before A), gets every message
    of A and B once, from the new replica alone, which lists both as `stored` (protocol section 1)."""
    memory = "exchange.retention_bytes=200000"
    start_hosts(procs, zk, paths, memory, gcm_settings=LOST_FOR_GOOD)
    procs.start("hcm", "host-4", "hcm.host=host-4", memory)  # room for a new replica, then the exchange
    wait_until(lambda: len(read_hosts(zk, paths)) == 4, message="four hosts")
    create_replicated(config, zk, paths, "earlier", retention=3_600.0)
    before_any = datetime.fromtimestamp(time.time() - 1, timezone.utc)
    with Publisher("earlier", config) as pub:
        for i in range(1000):
            pub.publish("load", str(i).encode().ljust(1000))
        pub.flush(60)
    live = read_live(zk, paths, "earlier")["x1"]
    host, first = live["host"], live["incarnation"]
    os.kill(live["pid"], signal.SIGKILL)  # its HCM starts a new incarnation there, the store kept
    wait_until(lambda: read_live(zk, paths, "earlier").get("x1", {}).get("incarnation") not in (None, first),
               timeout=30, message="a new incarnation")
    live = read_live(zk, paths, "earlier")["x1"]
    if live["host"] != host:
        pytest.skip("the leader moved the exchange to another host: its store stayed behind")
    second = live["incarnation"]
    assert first in live.get("archived", []), "the restarted exchange serves the earlier store"
    with Subscriber("earlier", config, start="beginning", inbox_limit=1) as early:
        position = early.position()
    assert position["streams"].get(first) == 0, "the earlier incarnation is in the position, unread"
    with Publisher("earlier", config) as pub:
        for i in range(1000, 1500):
            pub.publish("load", str(i).encode().ljust(1000))
        pub.flush(60)
    old_replica = read_json(zk, paths.replica_live("earlier", "x1"))
    assert old_replica and old_replica["host"] != host
    procs.kill(str(old_replica["host"]))
    procs.wait_gone(str(old_replica["host"]))

    def new_replica_host() -> str | None:
        new = read_json(zk, paths.replica_live("earlier", "x1"))
        return str(new["host"]) if new and new["host"] != old_replica["host"] else None
    wait_until(new_replica_host, timeout=60, message="a new replica")
    stored = procs.workdir / str(new_replica_host()) / "data" / "store" / "earlier" / "x1~r" / str(first)
    # The running incarnation's own transfer comes first: A's store whole means B's is too.
    wait_until(lambda: (stored / f"{1:020d}.seg").exists() and not list(stored.parent.glob("*~base")),
               timeout=60, message=f"the earlier incarnation transferred to {stored}")
    procs.kill(host)  # B's host, with A's store on its disk: only the new replica holds A and B now
    wait_until(lambda: (read_live(zk, paths, "earlier").get("x1") or {}).get("host") not in (None, host),
               timeout=30, message="x1 back on another host")
    wait_until(lambda: (read_json(zk, paths.replica_live("earlier", "x1")) or {}).get("stored") == [first, second],
               timeout=30, message="the replica lists A and B as stored, oldest first")
    with Subscriber("earlier", config, position=position) as back:
        counts = receive_numbers(back, set(range(1000)))
        gaps = back.gaps
    record_figures("replication l (processes): an earlier incarnation transferred to a new replica, then "
                   "the exchange host lost", confirmed=1000, received=len(counts),
                   lost=1000 - len(set(counts) & set(range(1000))), duplicated=sum(1 for c in counts.values() if c > 1))
    assert set(range(1000)) <= set(counts), f"{1000 - len(counts)} of the earlier incarnation's messages missing"
    assert max(counts.values()) == 1 and gaps == 0
    with Subscriber("earlier", config, start="beginning") as new:
        counts = receive_numbers(new, set(range(1500)))
        gaps = new.gaps
    record_figures("replication l (processes): a subscriber first started after the exchange host was lost, "
                   "from the beginning", confirmed=1500, received=len(counts),
                   lost=1500 - len(set(counts) & set(range(1500))), duplicated=sum(1 for c in counts.values() if c > 1))
    assert set(counts) == set(range(1500)), f"{1500 - len(counts)} messages of A and B missing"
    assert max(counts.values()) == 1 and gaps == 0
    with Subscriber("earlier", config, start=before_any) as from_time:  # position_at asked at the replica
        counts = receive_numbers(from_time, set(range(1500)))
        gaps = from_time.gaps
    assert set(counts) == set(range(1500)) and max(counts.values()) == 1 and gaps == 0, "from a time, the same"


def test_confirms_wait_for_the_replica(config, zk, paths, procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "held")
    replica = read_json(zk, paths.replica_live("held", "x1"))
    assert replica
    with Publisher("held", config) as pub:
        pub.publish("t", b"one")
        pub.flush(15)
        os.kill(int(replica["pid"]), signal.SIGSTOP)  # frozen replica: nothing can be confirmed
        try:
            pub.publish("t", b"two")
            with pytest.raises(Exception):
                pub.flush(1.5)
            assert pub.confirmed == 1
        finally:
            os.kill(int(replica["pid"]), signal.SIGCONT)
        pub.flush(20)
        assert pub.confirmed == 2


def test_i_journal_restart_keeps_a_durable_subscriber_whole(config, zk, paths, procs) -> None:
    """exchange.journal = fsync, replicas = 1: the exchange killed and restarted on its host; a
    durable subscriber that was away reads what the dead incarnation confirmed from the journal."""
    start_hosts(procs, zk, paths, "exchange.journal=fsync")
    create_replicated(config, zk, paths, "ledger", replicas=1)
    config = config.replace(client={"state_dir": str(procs.workdir / "subscribers")})
    # The publisher is closed: its replay window must not be what saves the subscriber.
    publish_with_a_subscriber_away(config, zk, "ledger", "books", taken=500, total=2000)
    old = read_live(zk, paths, "ledger")["x1"]
    os.kill(int(old["pid"]), signal.SIGKILL)
    wait_until(lambda: (read_live(zk, paths, "ledger").get("x1") or {}).get("incarnation") not in
               (None, old["incarnation"]), timeout=20, message="the restarted incarnation")
    assert old["incarnation"] in read_live(zk, paths, "ledger")["x1"].get("archived", [])
    back = Collector("ledger", config, zk, durable="books")
    try:
        wait_until(lambda: set(back.counts) >= set(range(500, 2000)), timeout=30,
                   message="what the dead incarnation confirmed, from its journal")
        assert back.duplicated() == 0
        assert not [i for i in back.counts if i < 500]
    finally:
        back.sub.close()


def test_a_lost_replica_is_replaced_and_caught_up_before_confirms_resume(config, zk, paths, procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "audit")
    old = read_json(zk, paths.replica_live("audit", "x1"))
    assert old
    collector = Collector("audit", config, zk)
    collector.sub.wait_connected(timeout=15)
    with Publisher("audit", config) as pub:
        pub.wait_for_subscribers(1, timeout=15)
        for i in range(2000):
            pub.publish("load", str(i).encode())
        pub.flush(30)
        procs.kill(str(old["host"]))  # the replica's host: confirms wait for a new replica
        killed_at = time.monotonic()
        # Only once it is dead: until then the replica may still hold and confirm what comes next.
        procs.wait_gone(str(old["host"]))
        for i in range(2000, 4000):
            pub.publish("load", str(i).encode())
        pub.flush(60)
        resumed_in = time.monotonic() - killed_at
        new = read_json(zk, paths.replica_live("audit", "x1"))
        assert new and new["host"] not in (old["host"], host_of(zk, paths, "audit")), (old, new)
        # Caught up: the new replica holds the whole retained stream, not just what came after it.
        live = read_live(zk, paths, "audit")["x1"]
        wait_until(lambda: read_live(zk, paths, "audit")["x1"]["stats"].get("replicated_to", 0)
                   == read_live(zk, paths, "audit")["x1"]["stats"].get("next_pos", -1), timeout=10,
                   message="the new replica to hold the whole stream")
        assert live["incarnation"] == read_live(zk, paths, "audit")["x1"]["incarnation"]
        # State transfer: the new replica's copy starts at the stream's first position, from before it ran.
        page = fetch_copy(new["replay"], live["incarnation"])
        assert page.oldest == 1 and protocol.decode_delivery(page.frames[0][1]).pos == 1
    wait_until(lambda: not collector.missing(4000), timeout=30, message="every confirmed message")
    record_figures("replication: replica host killed", confirmed=4000, lost=len(collector.missing(4000)),
                   duplicated=collector.duplicated(), confirms_resumed_in_s=round(resumed_in, 2))
    assert collector.duplicated() == 0
    collector.sub.close()
