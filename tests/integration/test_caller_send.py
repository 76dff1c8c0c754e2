"""`client.caller_send` (a prototype, issue 34 item 5): publish() sends a batch from the
application's thread while the publisher's I/O thread sleeps (roq/client/publisher/socket_owner.py).

Confirms, moves with their resends, ordering and backpressure must keep their meaning: random
schedules of publish(), publish_many() and concurrent publishing threads, with moves between the
queue's two exchanges and an unconfirmed limit small enough to block, must give every message to
a subscriber once, in sequence order, each with its own payload; an exchange killed under paced
traffic loses nothing. The suite's other files run with the knob on through the environment
(`ROQ_CLIENT_CALLER_SEND=1`, docs/testing.md).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.config import Config
from roq.state import read_live
from tests.integration.conftest import SharedCluster, create
from tests.profiles import examples
from tests.support.helpers import SteadyTraffic, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUEUE = "caller"
LIMIT = 48  # client.max_unconfirmed: publish() blocks for confirms within most schedules


@pytest.fixture(scope="module")
def queue(two_gcm_cluster: SharedCluster) -> SharedCluster:
    cluster = two_gcm_cluster
    cluster.wait_healthy()
    create(cluster.config, cluster.zk, cluster.paths, QUEUE, 2)
    return cluster


def caller_config(cluster: SharedCluster, on: bool = True, eager: int = 0) -> Config:
    """`eager`: client.eager_in_flight, under which a caller may send while batches are in flight."""
    return cluster.config.replace(client={"caller_send": on, "max_unconfirmed": LIMIT, "eager_in_flight": eager})


class Received:
    """A subscriber's messages by publisher, as (seq, payload) in arrival order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_publisher: dict[str, list[tuple[int, bytes]]] = {}

    def __call__(self, msg: Any) -> None:
        with self.lock:
            self.by_publisher.setdefault(msg.publisher, []).append((msg.seq, msg.payload))

    def of(self, publisher: str) -> list[tuple[int, bytes]]:
        with self.lock:
            return list(self.by_publisher.get(publisher, []))


@pytest.fixture(scope="module")
def received(queue: SharedCluster) -> Iterator[Received]:
    got = Received()
    with Subscriber(QUEUE, caller_config(queue), callback=got) as sub:
        sub.wait_connected(2, timeout=30)
        yield got


def sent_by_caller(pub: Publisher) -> int:
    return pub._link._owner.caller_sends  # the prototype's own count: no public figure yet


@pytest.mark.parametrize("on", [False, True])
def test_a_lone_publish_goes_from_the_callers_thread_only_with_the_knob(queue, received, on):
    """One message at a time, each confirmed and the I/O thread asleep again before the next:
    (nearly) every one is sent by the caller with the knob on, none without."""
    with Publisher(QUEUE, caller_config(queue, on)) as pub:
        pub.wait_for_subscribers(1, timeout=15)
        for i in range(40):
            seq = pub.publish("t", b"%d" % i)
            pub.wait_confirmed(range(seq, seq + 1), timeout=10)
            # Its turn after the ack ends with the lock let go: it sleeps (or its 100 ms tick is due).
            wait_until(lambda: not pub._link.wake_pending and not pub._link._owner.lock.locked(), timeout=5,
                       interval=0.001, message="the I/O thread to sleep")
        assert pub.confirmed == 40
        wait_until(lambda: len(received.of(pub.id)) == 40, timeout=15, message="all 40 delivered")
        assert received.of(pub.id) == [(s, b"%d" % (s - 1)) for s in range(1, 41)]
        assert (sent_by_caller(pub) >= 30) if on else sent_by_caller(pub) == 0, sent_by_caller(pub)


step = st.one_of(
    st.tuples(st.just("one"), st.integers(1, 60)),
    st.tuples(st.just("many"), st.integers(1, 3 * LIMIT)),
    st.tuples(st.just("threads"), st.integers(1, 40)),
    st.tuples(st.just("move"), st.just(0)),
    st.tuples(st.just("flush"), st.just(0)),
)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=8), eager=st.sampled_from([0, 4]))
def test_every_message_arrives_once_in_order_whatever_the_schedule(queue, received, steps, eager):
    with Publisher(QUEUE, caller_config(queue, eager=eager), prefer="x1") as pub:
        pub.wait_for_subscribers(1, timeout=15)
        payload_of: dict[int, bytes] = {}
        lock = threading.Lock()

        def publish(tag: str, count: int) -> None:
            for i in range(count):
                payload = f"{tag}-{i}".encode()
                seq = pub.publish("t", payload, timeout=20)
                with lock:
                    payload_of[seq] = payload

        for index, (kind, count) in enumerate(steps):
            if kind == "one":
                publish(f"{index}", count)
            elif kind == "many":
                payloads = [b"%d-m%d" % (index, i) for i in range(count)]
                seqs = pub.publish_many("t", payloads, timeout=20)
                payload_of.update(zip(seqs, payloads))
            elif kind == "threads":
                threads = [threading.Thread(target=publish, args=(f"{index}.{t}", count)) for t in range(3)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(60)
                assert not any(thread.is_alive() for thread in threads)
            elif kind == "move":
                pub.prefer = "x2" if pub.exchange == "x1" else "x1"
                moves = pub.moves
                pub._request_move("the test moves it")  # resends everything unconfirmed there
                # Left once the I/O thread dropped the old exchange: the next steps race the welcome.
                wait_until(lambda: pub.moves > moves, timeout=10, interval=0.005, message="the move")
            else:
                pub.flush(20)
        total = len(payload_of)
        assert sorted(payload_of) == list(range(1, total + 1))  # publish() numbered them without a gap
        pub.flush(30)
        assert pub.confirmed == total and pub.unconfirmed == 0
        wait_until(lambda: len(received.of(pub.id)) >= total, timeout=30, message=f"{total} delivered")
        assert received.of(pub.id) == sorted(payload_of.items())  # each once, in order, its own payload


def test_an_exchange_killed_while_callers_send_loses_nothing(queue):
    """Paced traffic with the knob on, the publisher's exchange SIGKILLed: it moves, and every
    confirmed message arrives once."""
    traffic = SteadyTraffic(QUEUE, caller_config(queue).replace(client={"max_unconfirmed": 50_000}), rate=2_000,
                            max_messages=60_000)
    try:
        traffic.start()
        traffic.wait_for_more(2_000, timeout=30)
        victim = traffic.pub.exchange
        assert victim is not None
        os.kill(read_live(queue.zk, queue.paths, QUEUE)[victim]["pid"], signal.SIGKILL)
        traffic.wait_for_more(4_000, timeout=60)
        report = traffic.stop()
        caller_sends = sent_by_caller(traffic.pub)
    finally:
        traffic.close()
    assert report["publisher_moves"] >= 1
    assert report["lost"] == 0 and report["duplicated"] == 0
    assert caller_sends > 0
