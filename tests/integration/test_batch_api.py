"""The batch API end to end: Publisher.publish_many and Subscriber(batch_callback=...),
with real exchanges, the same guarantees as one message at a time."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from roq.client.publisher import Publisher
from roq.client.subscriber import MessageBatch, Subscriber
from roq.errors import BackpressureError, InvalidNameError, MessageTooLargeError, UserError
from roq.state import read_live
from tests.integration.conftest import create
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration


class Collector:
    """A batch callback that keeps every batch, and the payloads in arrival order per publisher."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[MessageBatch] = []
        self.by_publisher: dict[str, list[int]] = {}

    def __call__(self, batch: MessageBatch) -> None:
        assert len(batch.payloads) == len(batch.seqs) > 0
        with self.lock:
            self.batches.append(batch)
            self.by_publisher.setdefault(batch.publisher, []).extend(int(p) for p in batch.payloads)

    def count(self) -> int:
        with self.lock:
            return sum(map(len, self.by_publisher.values()))


def payloads(start: int, stop: int) -> list[bytes]:
    return [b"%d" % i for i in range(start, stop)]


def test_publish_many_reaches_batch_and_single_subscribers_exactly_once_in_order(config, zk, paths, cluster):
    create(config, zk, paths, "bulk", 2)
    collector = Collector()
    with Subscriber("bulk", config, batch_callback=collector) as batch_sub, \
            Subscriber("bulk", config) as single_sub, \
            Publisher("bulk", config, prefer="x1") as pub_a, \
            Publisher("bulk", config, prefer="x2") as pub_b:
        for sub in (batch_sub, single_sub):
            sub.wait_connected(2)
        for pub in (pub_a, pub_b):
            pub.wait_for_subscribers(2)
        total = 30_001
        # Lists of every size, larger than a batch too, mixed with publish() and a generator.
        seqs = pub_a.publish_many("t", payloads(0, 5000))
        assert seqs == range(1, 5001)
        assert pub_a.publish("t", b"5000") == 5001
        assert pub_a.publish_many("t", (b"%d" % i for i in range(5001, 5003))) == range(5002, 5004)
        assert pub_a.publish_many("t", []) == range(5004, 5004)
        start = 5003
        for size in (1, 2, 999, 4096, 7, 19_893):
            pub_a.publish_many(b"t", payloads(start, start + size))
            start += size
        assert start == total
        pub_b.publish_many("t", payloads(0, total))
        for pub in (pub_a, pub_b):
            pub.flush(60)
            assert pub.confirmed == total
        wait_until(lambda: collector.count() >= 2 * total, timeout=60, message="batch subscriber got all")
        assert collector.by_publisher == {pub_a.id: list(range(total)), pub_b.id: list(range(total))}
        for batch in collector.batches:
            assert batch.seqs == list(range(batch.seqs[0], batch.seqs[0] + len(batch.seqs)))
            assert [int(p) for p in batch.payloads] == [s - 1 for s in batch.seqs]
        assert [m.seq for m in collector.batches[0].messages()] == collector.batches[0].seqs
        got: dict[str, list[int]] = {pub_a.id: [], pub_b.id: []}
        while sum(map(len, got.values())) < 2 * total:
            msg = single_sub.receive(timeout=10)
            assert msg is not None, f"stalled at {sum(map(len, got.values()))} messages"
            got[msg.publisher].append(int(msg.payload))
        assert got == {pub_a.id: list(range(total)), pub_b.id: list(range(total))}
        assert batch_sub.stats().duplicates == 0 and batch_sub.stats().gaps == 0


def test_publish_many_checks_every_payload_before_queueing_any(config, zk, paths, cluster):
    create(config, zk, paths, "check", 1)
    with Publisher("check", config) as pub:
        with pytest.raises(TypeError, match="payload 1"):
            pub.publish_many("t", [b"ok", "text"])
        too_big = b"x" * (config.exchange.max_message_bytes + 1)
        with pytest.raises(MessageTooLargeError, match="payload 2"):
            pub.publish_many("t", [b"a", b"b", too_big])
        assert pub.unconfirmed == 0
        assert pub.publish_many("t", [bytearray(b"a"), memoryview(b"b")]) == range(1, 3)  # nothing was used up
        pub.flush(10)


def test_publish_many_with_a_topic_per_payload_reaches_each_prefix_once_in_order(config, zk, paths, cluster):
    """One list over many topics (docs/protocol.md 3.2): each subscriber gets exactly the messages of
    its prefix, in the publisher's order; a wrong topic list queues nothing."""
    create(config, zk, paths, "spread", 1)
    with Subscriber("spread", config, ["a/"]) as sub_a, Subscriber("spread", config, ["b/"]) as sub_b, \
            Publisher("spread", config) as pub:
        for sub in (sub_a, sub_b):
            sub.wait_connected(1)
        pub.wait_for_subscribers(2)
        with pytest.raises(UserError, match="2 topics for 3 payloads"):
            pub.publish_many(["a/1", "a/2"], payloads(0, 3))
        with pytest.raises(InvalidNameError):
            pub.publish_many(("a/1", ""), payloads(0, 2))
        assert pub.unconfirmed == 0
        topics = [f"a/{i % 7}" if i % 3 else f"b/{i % 5}" for i in range(3000)]
        assert pub.publish_many(topics, payloads(0, 3000)) == range(1, 3001)
        pub.flush(30)
        for sub, prefix in ((sub_a, "a/"), (sub_b, "b/")):
            want = [(t, i) for i, t in enumerate(topics) if t.startswith(prefix)]
            got = []
            while len(got) < len(want):
                msg = sub.receive(timeout=10)
                assert msg is not None, f"{prefix}: stalled at {len(got)} of {len(want)}"
                got.append((msg.topic, int(msg.payload)))
            assert got == want
            assert sub.receive(timeout=0.2) is None  # nothing of the other prefix
            assert sub.stats().gaps == 0


def test_publish_many_blocks_under_backpressure_and_says_how_much_was_queued(config, zk, paths, cluster):
    tight = config.replace(client={"max_unconfirmed": 100, "confirm_timeout": 30.0})
    create(tight, zk, paths, "tight", 1)
    collector = Collector()
    pid = read_live(zk, paths, "tight")["x1"]["pid"]
    with Subscriber("tight", tight, batch_callback=collector) as sub, \
            Publisher("tight", tight) as pub:
        sub.wait_connected(1)
        pub.wait_for_subscribers(1)
        os.kill(pid, signal.SIGSTOP)  # the exchange confirms nothing while stopped
        try:
            with pytest.raises(BackpressureError) as raised:
                pub.publish_many("t", payloads(0, 250), timeout=0.5)
            assert raised.value.queued == 100 and pub.unconfirmed == 100
        finally:
            os.kill(pid, signal.SIGCONT)
        pub.flush(30)
        # With room made as confirms arrive, a list larger than the limit goes through in parts.
        assert pub.publish_many("t", payloads(100, 1000)) == range(101, 1001)
        pub.flush(30)
        wait_until(lambda: collector.count() >= 1000, timeout=30, message="all delivered")
        assert collector.by_publisher == {pub.id: list(range(1000))}


def test_batch_subscriber_sees_each_message_once_across_a_publisher_move(config, zk, paths, cluster):
    create(config, zk, paths, "bmove", 2)
    collector = Collector()
    with Subscriber("bmove", config, batch_callback=collector) as sub, \
            Publisher("bmove", config, prefer="x1") as pub:
        sub.wait_connected(2)
        pub.wait_for_subscribers(1)
        pub.publish_many("t", payloads(0, 20_000))
        pub.flush(30)
        pub.prefer = None
        os.kill(read_live(zk, paths, "bmove")["x1"]["pid"], signal.SIGKILL)
        wait_until(lambda: pub.exchange == "x2", timeout=10, message="the publisher to move to x2")
        pub.publish_many("t", payloads(20_000, 40_000))
        pub.flush(30)
        wait_until(lambda: collector.count() >= 40_000, timeout=30, message="all delivered")
        assert collector.by_publisher == {pub.id: list(range(40_000))}  # the replayed ones dropped, in order
        assert pub.replayed > 0 and sub.stats().duplicates >= pub.replayed


def test_a_failing_batch_callback_is_counted_and_the_stream_goes_on(config, zk, paths, cluster):
    create(config, zk, paths, "boom", 1)
    collector = Collector()
    calls = [0]

    def flaky(batch: MessageBatch) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("the application failed")
        collector(batch)

    with Subscriber("boom", config, batch_callback=flaky) as sub, Publisher("boom", config) as pub:
        sub.wait_connected(1)
        pub.wait_for_subscribers(1)
        pub.publish_many("t", [b"0"])
        pub.flush(10)
        wait_until(lambda: sub.stats().callback_errors == 1, timeout=10, message="the failure counted")
        pub.publish_many("t", payloads(1, 10))
        pub.flush(10)
        wait_until(lambda: collector.count() >= 9, timeout=10, message="the rest delivered")
        assert collector.by_publisher == {pub.id: list(range(1, 10))}
        assert sub.position()["streams"]  # the failed batch counts as taken: a resume starts after it
