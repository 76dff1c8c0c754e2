"""A replicated queue's consumer groups outlive their exchange (protocol section 7.6).

The exchange copies its groups' state to its replica; the exchange's next incarnation (restarted
on its host, or moved to another after a host loss) adopts it. Each test kills the exchange while
a group has a backlog and a member holds messages unacked, and checks: every message processed
(lost 0), and at most the member's prefetch processed twice: the messages in flight at the kill,
and acks the exchange took but had not copied yet (an ack the replica holds is not undone, and the
member gets no work on an ack's room until the replica holds it). One test gives the publisher a
1-second replay window, so its resends cannot be what saves the backlog; the other keeps the
15-second default, so its resends must not reach the group twice.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pytest

from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.records import ExchangeStats
from roq.state import read_live
from roq.zk import read_json
from tests.integration.test_disk_retention import (
    GROUP_BYTES,
    MEMORY,
    backlog_beyond_memory,
    drain_with_two_members,
    group_held,
)
from tests.integration.test_host_back import restart_host
from tests.integration.test_replication import LOST_FOR_GOOD, create_replicated, start_hosts
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MESSAGES = 4000
PREFETCH = 20


class Worker:
    """A group member processing about 2,000 messages a second, counting what it processed."""

    def __init__(self, config, queue: str) -> None:
        self.processed: Counter[str] = Counter()
        self.redelivered = 0
        self.lock = threading.Lock()
        self.sub = Subscriber(queue, config, ["jobs"], group="workers", callback=self.on_message, prefetch=PREFETCH)

    def on_message(self, msg) -> None:
        time.sleep(0.0005)
        with self.lock:
            self.processed[msg.id] += 1
            self.redelivered += msg.deliveries > 1

    def count(self) -> int:
        with self.lock:
            return len(self.processed)


def kill_under_backlog(config, zk, paths, queue: str, replay_seconds: float, kill) -> dict:
    """Publish MESSAGES, let the worker take part of them, run `kill(live)`, wait for the rest. A
    replay window under 15 s is waited out first: then only the replica's copy holds the backlog."""
    worker = Worker(config, queue)
    publisher_config = config.replace(client={"replay_seconds": replay_seconds})
    try:
        with Publisher(queue, publisher_config) as pub:
            sent = pub.publish_many("jobs", [b"%d" % i for i in range(MESSAGES)])
            pub.flush()
            confirmed_at = time.monotonic()
            wait_until(lambda: worker.count() >= MESSAGES // 4, timeout=30, message="a quarter processed")
            if replay_seconds < 15:
                wait_until(lambda: time.monotonic() > confirmed_at + replay_seconds + 0.5, timeout=20,
                           message="the replay window to pass")
            live = read_live(zk, paths, queue)["x1"]
            before = worker.count()
            killed = time.monotonic()
            kill(live)
            wait_until(lambda: worker.count() == MESSAGES, timeout=60, message="every message processed")
            recovered_in = time.monotonic() - killed
            assert len(sent) == MESSAGES
        new = read_live(zk, paths, queue)["x1"]
        assert new["incarnation"] != live["incarnation"]
        twice = sum(1 for n in worker.processed.values() if n > 1)
        figures = {"messages": MESSAGES, "processed_before_kill": before, "lost": MESSAGES - worker.count(),
                   "processed_twice": twice, "redelivered": worker.redelivered,
                   "all_processed_s_after_kill": round(recovered_in, 2)}
        record_figures(f"work-adoption-{queue}", **figures)
        # Processed twice: at most what the member held unacked at the kill (its acks died with the
        # exchange, or reached it and not its replica), never what the replica held the ack of.
        assert twice <= PREFETCH, figures
        return figures
    finally:
        worker.sub.close()


def test_a_group_backlog_survives_its_exchange_crash(config, zk, paths, procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "crash")
    kill_under_backlog(config, zk, paths, "crash", 1.0, lambda live: os.kill(live["pid"], signal.SIGKILL))


def test_a_group_backlog_survives_the_loss_of_its_exchange_host(config, zk, paths, procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "hostloss")
    figures = kill_under_backlog(config, zk, paths, "hostloss", 15.0, lambda live: procs.kill(str(live["host"])))
    assert figures["lost"] == 0


@pytest.mark.timeout(240)
def test_a_disk_retained_group_backlog_beyond_its_memory_survives_the_loss_of_its_exchange_host(
        config, zk, paths, procs) -> None:
    """Disk retention with `replicas 2` and a tiny exchange.group_max_bytes: a group with no member
    holds a backlog 20 times its memory (on disk, not in memory, publishers never held), then the
    exchange's host is SIGKILLed (HCM and exchange, its disk lost with it). The exchange's next
    incarnation, on another host, adopts the group from the replica, which reads the backlog from
    its own segment store: members get every message once, and none acked before the kill."""
    start_hosts(procs, zk, paths, *MEMORY, f"exchange.group_max_bytes={GROUP_BYTES}", gcm_settings=LOST_FOR_GOOD)
    create_replicated(config, zk, paths, "deepgroup", retention=3_600.0)
    small = config.replace(client={"max_batch_bytes": 20_000})
    # Confirms wait for the replica, which takes frames in order: it holds the acks of 0-99 then.
    first, held = backlog_beyond_memory(small, zk, paths, "deepgroup")
    assert max(held) <= GROUP_BYTES + 25_000, "memory holds a share of group_max_bytes, give or take a frame"
    assert sorted(n for n, _ in first) == list(range(100))
    live = read_live(zk, paths, "deepgroup")["x1"]
    host, before = str(live["host"]), live["incarnation"]
    os.kill(live["pid"], signal.SIGKILL)
    procs.kill(host)
    procs.wait_gone(host)
    wait_until(lambda: read_live(zk, paths, "deepgroup").get("x1", {}).get("incarnation") not in (None, before),
               timeout=30, message="a new incarnation on another host")
    assert read_live(zk, paths, "deepgroup")["x1"]["host"] != host
    wait_until(lambda: "w" in ExchangeStats.from_dict(read_live(zk, paths, "deepgroup")["x1"].get("stats")).groups,
               timeout=30, message="the new incarnation to report the adopted group")
    adopted_held = group_held(zk, paths, "deepgroup")
    seen = drain_with_two_members(small, "deepgroup", set(range(100, 1_100)))
    counts = Counter(n for n, _ in seen)
    record_figures("group backlog on disk, replicas 2, exchange host lost", delivered=len(seen),
                   distinct=len(counts), held_after_adoption=adopted_held, bound=GROUP_BYTES)
    assert adopted_held <= GROUP_BYTES + 25_000, "the adopted backlog waits on disk, not in memory"
    assert not [n for n in counts if n < 100], "nothing acked before the kill comes again"
    assert set(counts) == set(range(100, 1_100)), "nothing lost"
    assert [n for n, c in counts.items() if c > 1] == [], "nothing twice (no ack was lost, no member died)"



@pytest.mark.timeout(300)
def test_a_disk_retained_group_keeps_its_cursor_when_the_exchange_and_its_replica_die_together(
        config, zk, paths, procs) -> None:
    """Disk retention, `replicas 2`: group "w" acked 0-99 and holds 1,000 more (20 times its
    memory), then the hosts of the exchange and of its replica are SIGKILLed together (HCMs with
    their exchange and replica) and started again on their data directories. The replica held the
    group's cursor in memory only before (the exchange keeps no cursor file with a replica): the
    restarted replica reads it from beside its store of the ended incarnation, and the exchange's
    next incarnation adopts it: every unacked message once, no acked one again. The replica's host
    comes back 4 s after the exchange's: an exchange restarted on its stores waits for it longer
    than the 3 s it waited before (when it started without the groups)."""
    start_hosts(procs, zk, paths, *MEMORY, f"exchange.group_max_bytes={GROUP_BYTES}")
    create_replicated(config, zk, paths, "together", retention=3_600.0)
    small = config.replace(client={"max_batch_bytes": 20_000})
    first, _ = backlog_beyond_memory(small, zk, paths, "together")
    assert sorted(n for n, _ in first) == list(range(100))
    live = read_live(zk, paths, "together")["x1"]
    replica = read_json(zk, paths.replica_live("together", "x1"))
    assert replica and replica["host"] != live["host"]
    hosts = [str(live["host"]), str(replica["host"])]
    for host in hosts:
        procs.kill(host)
    for host in hosts:
        procs.wait_gone(host)
    settings = (*MEMORY, f"exchange.group_max_bytes={GROUP_BYTES}")
    restart_host(procs, hosts[0], f"{hosts[0]}-again", *settings)
    wait_until(lambda: read_live(zk, paths, "together").get("x1", {}).get("incarnation")
               not in (None, live["incarnation"]), timeout=60, message="x1's next incarnation")
    # The replica's host comes back later than the 3 s an exchange without a stored disk waits for it.
    back_at = time.monotonic()
    wait_until(lambda: time.monotonic() > back_at + 4, timeout=10, message="the replica's host to stay away 4 s")
    restart_host(procs, hosts[1], f"{hosts[1]}-again", *settings)
    wait_until(lambda: "w" in ExchangeStats.from_dict(read_live(zk, paths, "together")["x1"].get("stats")).groups,
               timeout=30, message="the new incarnation to report the adopted group")
    seen = drain_with_two_members(small, "together", set(range(100, 1_100)))
    counts = Counter(n for n, _ in seen)
    record_figures("group backlog on disk, replicas 2, exchange and replica killed together", delivered=len(seen),
                   distinct=len(counts))
    assert not [n for n in counts if n < 100], "nothing acked before the kill comes again"
    assert set(counts) == set(range(100, 1_100)), "nothing lost"
    assert [n for n, c in counts.items() if c > 1] == [], "nothing twice"
