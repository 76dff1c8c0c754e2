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
from roq.state import read_live
from tests.integration.test_replication import create_replicated, start_hosts
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
