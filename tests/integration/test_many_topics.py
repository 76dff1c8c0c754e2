"""Frames that carry many topics (docs/protocol.md 4.2), through a real exchange process.

Random mixes of topics are published as two-part batches under random sets of subscriber
prefixes. Every subscriber must end with exactly the messages whose topics start with one of its
prefixes, each once: from its live frames (each message in them its own, chains consistent with
the stream), and after XPUB dropped frames for it (`exchange.sub_hwm` is tiny and one subscriber
reads nothing until the end) from retention fetches; a prefix nobody subscribed to when the frames
were cut (a fetch longer than their routing topics) finds its messages the same way. The exchange
tracks only a few prefixes, so some examples run with an incomplete set (frames cut by exact topic).
RoQ's own batch subscriber gets each such frame as one MessageBatch, each message with its topic.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roq import protocol
from roq.client.publisher import Publisher
from roq.client.subscriber import MessageBatch, Subscriber
from roq.client.subscriber.streams import normalise
from roq.config import Config
from tests.profiles import examples
from tests.support.helpers import advertised, fast_config, lone_exchange, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MAX_PREFIXES = 6  # tracked prefixes: prefix sets beyond it leave some untracked
SUB_HWM = 4  # frames XPUB queues per subscriber before it drops for it


@pytest.fixture(scope="module")
def exchange(zookeeper) -> Iterator[dict[str, Any]]:
    cfg = fast_config(zookeeper.connect_string).replace(exchange={
        "sub_hwm": SUB_HWM, "max_prefixes": MAX_PREFIXES, "retention_seconds": 3600, "beat_interval": 0.1})
    with lone_exchange(cfg, "topics") as ready:
        yield ready


@pytest.fixture(scope="module")
def clients(zookeeper, exchange) -> Iterator[Config]:
    """The client library's config for the module's exchange, advertised as queue "topics"."""
    config = fast_config(zookeeper.connect_string)
    with advertised(config, "topics", exchange):
        yield config


class RawSubscriber:
    """A SUB socket with prefixes, synced like RoQ's subscriber (4.1); frames kept as they came."""

    def __init__(self, context: zmq.Context, ready: dict[str, Any], prefixes: list[bytes], hwm: int = 0) -> None:
        self.prefixes = normalise(prefixes)
        self.sock = context.socket(zmq.SUB)
        self.sock.linger = 0
        if hwm:
            self.sock.rcvhwm = hwm
        for prefix in self.prefixes:
            self.sock.setsockopt(zmq.SUBSCRIBE, prefix)
        self.marker = protocol.sync_topic(uuid.uuid4().hex)
        self.sock.setsockopt(zmq.SUBSCRIBE, protocol.BEAT_TOPIC)
        self.sock.setsockopt(zmq.SUBSCRIBE, self.marker)
        self.sock.connect(ready["sub"])
        self.live: list[tuple[bytes, protocol.Delivery]] = []
        self.synced_at = 0
        self.beat_at = 0  # a beat's next_pos: every frame before it came (or was dropped)
        wait_until(self._synced, timeout=10, message="a sync answer")

    def _synced(self) -> bool:
        self.drain()
        return self.synced_at > 0

    def drain(self) -> None:
        while self.sock.poll(0):
            topic, body = self.sock.recv_multipart()
            if topic == self.marker:
                self.synced_at = protocol.decode_sync(body).next_pos
            elif topic == protocol.BEAT_TOPIC:
                self.beat_at = max(self.beat_at, protocol.decode_sync(body, protocol.BEAT).next_pos)
            elif self.synced_at and topic[:1] != b"\x00":
                self.live.append((topic, protocol.decode_delivery(body)))

    def close(self) -> None:
        self.sock.close()


class RawPublisher:
    def __init__(self, context: zmq.Context, ready: dict[str, Any]) -> None:
        self.sock = context.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(ready["pub"])
        token = uuid.uuid4().bytes
        self.pid = protocol.publisher_id_for(token)
        self.sock.send(protocol.encode_hello(self.pid, token, 1))
        assert self.sock.poll(5000) and protocol.decode_exchange_reply(self.sock.recv()).kind == "welcome"
        self.seq = 1

    def publish(self, topics: list[bytes]) -> dict[int, bytes]:
        """One two-part batch of these topics; {seq: topic} once acked."""
        payloads = [b"%d" % (self.seq + i) for i in range(len(topics))]
        self.sock.send_multipart(protocol.encode_batch_parts(self.pid, self.seq, 0, topics, payloads))
        assert self.sock.poll(5000), "no ack"
        reply = protocol.decode_exchange_reply(self.sock.recv())
        assert reply.kind == "ack" and reply.seq == self.seq + len(topics) - 1, reply
        sent = {self.seq + i: topic for i, topic in enumerate(topics)}
        self.seq += len(topics)
        return sent


class Replay:
    def __init__(self, context: zmq.Context, ready: dict[str, Any]) -> None:
        self.sock = context.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(ready["replay"])
        self.ids = itertools.count(1)

    def fetch(self, after: int, prefix: bytes) -> list[tuple[bytes, protocol.Delivery]]:
        """Every retained frame after `after` with a message of `prefix`, page by page."""
        found = []
        while True:
            request_id = next(self.ids)
            self.sock.send(protocol.encode_fetch(request_id, "", after, 0, [prefix], 1 << 16))
            assert self.sock.poll(5000), "no answer to a fetch"
            page = protocol.decode_replay_reply(self.sock.recv(), 1 << 30)
            assert isinstance(page, protocol.Frames) and page.request_id == request_id, page
            assert page.lost == 0 and page.lost_exact
            found += [(topic, protocol.decode_delivery(body)) for topic, body in page.frames]
            if page.done:
                return found
            after = page.scanned_to

    def next_pos(self) -> int:
        self.sock.send(protocol.encode_position_request(next(self.ids), []))
        assert self.sock.poll(5000)
        answer = protocol.decode_replay_reply(self.sock.recv(), 1 << 30)
        assert isinstance(answer, protocol.StreamPosition)
        return answer.next_pos

    def close(self) -> None:
        self.sock.close()


def messages_of(frames: list[tuple[bytes, protocol.Delivery]], prefix: bytes) -> list[tuple[int, int, bytes]]:
    """(pos, seq, topic) of the messages of `prefix` in frames, as a reader keeps them (5.1)."""
    out = []
    for routing, d in frames:
        mine = d.matching(routing, (prefix,))
        if mine is not None:
            out += [(d.pos, seq, topic) for seq, topic in zip(mine.seqs, mine.message_topics(routing))]
    return out


def check_live(sub: RawSubscriber, stream: dict[bytes, list[tuple[bytes, protocol.Delivery]]],
               expected: dict[bytes, dict[int, bytes]]) -> None:
    """Live frames: each message the subscriber's, none twice, in publisher order, chains true to the stream."""
    seen: set[int] = set()
    for routing, d in sub.live:
        prefix = next(p for p in sub.prefixes if routing.startswith(p))  # XPUB filtered on it
        topics = d.message_topics(routing)
        assert all(t.startswith(prefix) and t.startswith(routing) for t in topics), (prefix, routing, topics)
        assert not seen & set(d.seqs), "a message came twice"
        assert not seen or d.seqs[0] > max(seen), "a publisher's messages out of order across topics"
        seen |= set(d.seqs)
        assert all(expected[prefix][s] == t for s, t in zip(d.seqs, topics))
        prev = d.chains.get(len(prefix))
        if prev is not None:  # no frame of the prefix between prev and pos
            between = [pos for pos, _, _ in messages_of(stream[prefix], prefix) if prev < pos < d.pos]
            assert not between, (prefix, prev, d.pos, between)


topic_text = st.text(alphabet="ab/", min_size=1, max_size=4).map(str.encode)
prefix_text = st.text(alphabet="ab/", min_size=0, max_size=3).map(str.encode)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(topic_text, min_size=1, max_size=40), min_size=1, max_size=6),
       prefix_sets=st.lists(st.lists(prefix_text, min_size=1, max_size=4), min_size=1, max_size=3),
       late_prefix=prefix_text)
def test_every_subscriber_gets_exactly_its_messages_once(exchange, batches, prefix_sets, late_prefix):
    context = zmq.Context.instance()
    replay = Replay(context, exchange)
    subs = [RawSubscriber(context, exchange, prefixes) for prefixes in prefix_sets]
    slow = RawSubscriber(context, exchange, prefix_sets[0], hwm=1)  # reads nothing until the end: drops
    pub = RawPublisher(context, exchange)
    try:
        start = replay.next_pos() - 1
        published: dict[int, bytes] = {}
        for topics in batches:
            published |= pub.publish(topics)
            for sub in subs:
                sub.drain()
        end = replay.next_pos()
        everyone = subs + [slow]
        wanted = {p for sub in everyone for p in sub.prefixes} | {late_prefix}
        stream = {p: [f for f in replay.fetch(start, p) if f[1].pos < end] for p in wanted}
        expected = {p: {s: t for s, t in published.items() if t.startswith(p)} for p in wanted}
        for p in wanted:  # a fetch of p: exactly p's messages, each once (a prefix nobody had included)
            got = messages_of(stream[p], p)
            assert sorted(seq for _, seq, _ in got) == sorted(expected[p]), p
            assert all(expected[p][seq] == topic for _, seq, topic in got)
        for sub in everyone:
            wait_until(lambda sub=sub: (sub.drain() or True) and sub.beat_at >= end, timeout=10,
                       message="a beat past the last frame")
            check_live(sub, stream, expected)
            for prefix in sub.prefixes:  # live, and what XPUB dropped fetched back: exactly p's messages
                live = {s for routing, d in sub.live if routing.startswith(prefix) for s in d.seqs}
                fetched = {seq for _, seq, _ in messages_of(stream[prefix], prefix)}
                assert live <= fetched == set(expected[prefix])
    finally:
        for sub in subs:
            sub.close()
        slow.close()
        replay.close()
        pub.sock.close()


def _live_count(sub: RawSubscriber) -> int:
    return sum(len(d.seqs) for _, d in sub.live)


def test_a_mixed_batch_under_one_prefix_is_one_frame(exchange):
    """The fast path: one subscriber prefix, many topics, one delivery with each message's topic."""
    context = zmq.Context.instance()
    sub = RawSubscriber(context, exchange, [b"m/"])
    pub = RawPublisher(context, exchange)
    try:
        topics = [b"m/%d" % (i % 7) for i in range(50)]
        pub.publish(topics)
        wait_until(lambda: (sub.drain() or True) and _live_count(sub) >= 50, timeout=10, message="the frame")
        ((routing, d),) = sub.live
        assert routing == b"m/" and d.topics == topics and d.seqs == list(range(1, 51))
    finally:
        sub.close()
        pub.sock.close()


def test_a_version_2_batch_is_refused_naming_both_versions(exchange):
    context = zmq.Context.instance()
    pub = RawPublisher(context, exchange)
    try:
        pub.sock.send(protocol.pack(["batch", 2, pub.pid, 1, 0, [b"t", b"x"]]))
        assert pub.sock.poll(5000)
        reply = protocol.decode_exchange_reply(pub.sock.recv())
        assert reply.kind == "error" and reply.code == "malformed"
        assert "version 2" in reply.message and "speaks 3" in reply.message
    finally:
        pub.sock.close()


subscribed = st.lists(st.text(alphabet="ab/", min_size=1, max_size=3), max_size=3)  # none: every topic


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(topic_text, min_size=1, max_size=60), min_size=1, max_size=5), prefixes=subscribed)
def test_a_batch_subscriber_gets_each_frame_as_one_batch_with_each_message_topic(exchange, clients, batches,
                                                                                 prefixes):
    """Subscriber(batch_callback=...): one call per frame, whatever topics it mixes (the stored
    frames, fetched back, are the truth), each message with its own topic, in publisher order."""
    got: list[MessageBatch] = []
    replay = Replay(zmq.Context.instance(), exchange)
    try:
        with Subscriber("topics", clients, prefixes, batch_callback=got.append) as sub, \
                Publisher("topics", clients) as pub:
            sub.wait_connected(1)
            start = replay.next_pos() - 1
            published: dict[int, bytes] = {}
            for topics in batches:
                seqs = pub.publish_many(topics, [b"%d" % len(published) for _ in topics])
                published |= dict(zip(seqs, topics))
            pub.flush(20)
            end = replay.next_pos()
            mine = tuple(sub.topics)
            frames = [(routing, d.matching(routing, mine)) for routing, d in replay.fetch(start, b"")
                      if start < d.pos < end and d.publisher == pub.id]
            frames = [(routing, d) for routing, d in frames if d is not None]
            wanted = sorted(s for s, t in published.items() if t.startswith(mine))
            assert sorted(s for _, d in frames for s in d.seqs) == wanted  # the stored frames hold them all
            wait_until(lambda: sum(len(b.seqs) for b in got) >= len(wanted), timeout=20, message="every message")
        by_pos = {d.pos: (routing, d) for routing, d in frames}
        assert sorted(b.pos for b in got) == sorted(by_pos), "not one batch per frame"
        for batch in got:
            routing, d = by_pos[batch.pos]
            assert (batch.seqs, batch.publisher) == (d.seqs, pub.id)
            topics = [t.encode() for t in batch.message_topics()]
            assert topics == d.message_topics(routing) == [published[s] for s in batch.seqs]
            # The routing topic; the one topic of a batch that has one (a fetched frame may be cut to it).
            assert batch.topic_bytes == (routing if len(set(topics)) > 1 else topics[0])
            assert (batch.topics is None) == (len(set(topics)) == 1)
        # Publisher order per topic (docs/guarantees.md: a frame fetched back after XPUB dropped it
        # may come after newer frames of another subscribed prefix).
        arrived = [(topic, seq) for b in got for topic, seq in zip(b.message_topics(), b.seqs)]
        for topic in {t for t, _ in arrived}:
            seqs = [seq for t, seq in arrived if t == topic]
            assert seqs == sorted(seqs), topic
    finally:
        replay.close()


def test_round_robin_topics_under_one_prefix_are_one_batch_call(clients):
    """The batch API's topics curve (bench/compare.py --curves): 100 topics round-robin in one
    publish_many call reach a batch subscriber in one call, not one per topic."""
    got: list[MessageBatch] = []
    with Subscriber("topics", clients, ["rr/"], batch_callback=got.append) as sub, \
            Publisher("topics", clients) as pub:
        sub.wait_connected(1)
        topics = [f"rr/{i % 100}" for i in range(300)]
        pub.publish_many(topics, [b"x"] * 300)
        pub.flush(20)
        wait_until(lambda: sum(len(b.seqs) for b in got) >= 300, timeout=20, message="every message")
    ((batch,),) = (got,)
    assert batch.topic == "rr/" and batch.topics == topics and batch.seqs == list(range(1, 301))
