"""Frames of many topics: how a batch is cut (exchange/grouping.py), what retention finds for a
prefix (exchange/retention.py) and what a reader keeps of a fetched frame (Delivery.matching)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.chains import PrefixChains
from exchange.grouping import frames_of, groups_of, routing_topic
from exchange.retention import Retention
from roq import protocol
from roq.errors import ProtocolError
from tests.profiles import examples

PID = protocol.publisher_id_for(b"t" * 16)


def chains_of(*prefixes: bytes, limit: int = 100) -> PrefixChains:
    chains = PrefixChains(limit)
    for prefix in prefixes:
        chains.subscribe(prefix, 1)
    return chains


def test_the_routing_topic_is_the_longest_common_prefix() -> None:
    assert routing_topic({b"eu/fr"}) == b"eu/fr"
    assert routing_topic({b"eu/fr", b"eu/de"}) == b"eu/"
    assert routing_topic({b"eu/fr", b"us"}) == b""
    assert routing_topic({b"ab", b"abc"}) == b"ab"


def test_one_subscriber_prefix_makes_the_whole_batch_one_frame() -> None:
    chains = chains_of(b"m/")
    topics = [b"m/%d" % (i % 9) for i in range(100)]
    assert groups_of(chains, topics, set(topics)) is None
    (frame,) = frames_of(chains, list(range(1, 101)), topics, [b"p"] * 100)
    assert frame.whole and frame.topic == b"m/" and frame.topics == topics


def test_topics_with_other_prefixes_go_to_frames_of_their_own_in_batch_order() -> None:
    chains = chains_of(b"a", b"b")
    topics = [b"b1", b"b2", b"a1", b"c", b"d", b"a2"]
    assert groups_of(chains, topics, set(topics)) == [[0, 1], [2], [3, 4], [5]]
    frames = list(frames_of(chains, [10, 11, 12, 13, 14, 15], topics, [b"0", b"1", b"2", b"3", b"4", b"5"],
                            attrs=[[1, 3, 0, b"k"]]))
    assert [(f.topic, f.seqs, f.topics) for f in frames] == [
        (b"b", [10, 11], [b"b1", b"b2"]), (b"a1", [12], None), (b"", [13, 14], [b"c", b"d"]), (b"a2", [15], None)]
    assert frames[0].attrs == [[1, 3, 0, b"k"]] and frames[1].attrs is None
    assert not any(f.whole for f in frames)


def test_a_later_message_of_an_earlier_key_is_not_moved_ahead() -> None:
    """A subscriber of "a" takes frames of keys (a,) and (a, ab): in batch order, its messages stay in order."""
    chains = chains_of(b"a", b"ab")
    topics = [b"ab1", b"ac", b"ab2"]
    frames = list(frames_of(chains, [1, 2, 3], topics, [b"x"] * 3))
    assert [s for f in frames for s in f.seqs] == [1, 2, 3] and len(frames) == 3


def test_an_untracked_subscribed_prefix_cuts_by_exact_topic() -> None:
    chains = chains_of(b"a", b"b", b"c", limit=2)  # "a" dropped over the limit while subscribed
    assert not chains.complete
    topics = [b"a1", b"a1", b"a2", b"a1"]
    assert groups_of(chains, topics, set(topics)) == [[0, 1], [2], [3]]
    chains.unsubscribe(b"a")
    assert chains.complete and groups_of(chains, topics, set(topics)) is None


def test_a_dropped_prefix_tracked_again_makes_the_set_complete() -> None:
    chains = chains_of(b"a", b"b", b"c", limit=2)
    chains.unsubscribe(b"b")  # room again
    chains.track(b"a", 5)
    assert chains.complete and chains.counts[b"a"] == 1


@settings(max_examples=examples(300))
@given(topics=st.lists(st.text("ab/", min_size=1, max_size=4).map(str.encode), min_size=1, max_size=30),
       prefixes=st.lists(st.text("ab/", max_size=3).map(str.encode), max_size=5))
def test_every_frame_reaches_exactly_the_prefixes_of_its_messages(topics: list[bytes], prefixes: list[bytes]) -> None:
    chains = chains_of(*prefixes)
    frames = list(frames_of(chains, list(range(1, len(topics) + 1)), topics, [b"x"] * len(topics)))
    assert [s for f in frames for s in f.seqs] == list(range(1, len(topics) + 1))  # each once, in order
    for frame in frames:
        own = frame.topics or [frame.topic] * len(frame.seqs)
        assert all(t.startswith(frame.topic) for t in own)
        for prefix in prefixes:  # XPUB's filter on the routing topic = "some message matches"
            assert frame.topic.startswith(prefix) == any(t.startswith(prefix) for t in own)
            assert all(t.startswith(prefix) for t in own) or not frame.topic.startswith(prefix)


def _mixed_body(pos: int, topics: list[bytes]) -> bytes:
    return protocol.encode_delivery("x1", "x1.ab", pos, [], PID, 0, list(range(1, len(topics) + 1)),
                                    [b"p"] * len(topics), None, topics)


def test_retention_finds_a_prefix_longer_than_the_routing_topic_and_counts_its_losses() -> None:
    store = Retention(60, 1 << 20, tombstones=10)
    topics = [b"ab1", b"ab2", b"ac", b"ab1"]
    store.add(b"a", _mixed_body(1, topics), 4, topics=protocol.topic_counts(topics))
    store.add(b"ad", protocol.encode_delivery("x1", "x1.ab", 2, [], PID, 0, [9], [b"p"]), 1)
    assert [t for t, _ in store.read(0, 3, [b"ab1"], 1 << 20)[0]] == [b"a"]
    assert [t for t, _ in store.read(0, 3, [b"a"], 1 << 20)[0]] == [b"a", b"ad"]
    assert store.read(0, 3, [b"ae"], 1 << 20)[0] == []
    store.purge()
    assert store.lost(0, 3, [b"ab"]) == (3, True)
    assert store.lost(0, 3, [b"a"]) == (5, True)
    assert store.lost(0, 3, [b"ac", b"ad"]) == (2, True)


def test_a_reader_keeps_only_the_messages_of_its_prefix() -> None:
    topics = [b"ab1", b"ac", b"ab2"]
    body = protocol.encode_delivery("x1", "x1.ab", 3, [], PID, 0, [4, 5, 6], [b"1", b"2", b"3"],
                                    [[2, 1, 0, b"k"]], topics)
    d = protocol.decode_delivery(body)
    mine = d.matching(b"a", (b"ab",))
    assert mine is not None and mine.seqs == [4, 6] and mine.payloads == [b"1", b"3"]
    assert mine.topics == [b"ab1", b"ab2"] and mine.attrs == [[1, 1, 0, b"k"]]
    assert d.matching(b"a", (b"a",)) is d and d.matching(b"a", (b"b",)) is None
    assert protocol.body_topics(body) == ((b"ab1", 1), (b"ac", 1), (b"ab2", 1))


def test_a_spliced_delivery_is_byte_for_byte_the_packed_one() -> None:
    payloads, topics = [b"a", b"bb", b"c"], [b"t/1", b"t/2", b"t/1"]
    block = protocol.msgpack.packb(payloads, use_bin_type=True)
    for own in (None, topics):
        assert protocol.encode_delivery_spliced("x1", "x1.ab", 5, [[1, 4]], PID, 9, [1, 2, 3], block, own) == \
            protocol.encode_delivery("x1", "x1.ab", 5, [[1, 4]], PID, 9, [1, 2, 3], payloads, None, own)


def test_version_2_frames_are_refused_naming_both_versions() -> None:
    old = protocol.pack(["delivery", 2, "x1", "x1.ab", 1, [], PID, 0, [1], [b"p"]])
    with pytest.raises(ProtocolError, match="version 2: this peer speaks 3"):
        protocol.decode_delivery(old)
    with pytest.raises(ProtocolError, match="version 2: this peer speaks 3"):
        protocol.decode_publisher_frame(protocol.pack(["batch", 2, PID, 1, 0, [b"t", b"x"]]), 1 << 20)


def test_a_two_part_batch_names_one_topic_per_payload_or_is_refused_whole() -> None:
    head, block = protocol.encode_batch_parts(PID, 1, 0, [b"a", b"b", b"a"], [b"1", b"2", b"3"])
    batch = protocol.decode_publisher_frame(head, 1 << 20, block)
    assert isinstance(batch, protocol.Batch) and batch.topics() == [b"a", b"b", b"a"]
    assert batch.messages() == [b"a", b"1", b"b", b"2", b"a", b"3"]
    head, block = protocol.encode_batch_parts(PID, 1, 0, [b"a", b"a"], [b"1", b"2"])
    assert protocol.decode_publisher_frame(head, 1 << 20, block).topic == b"a"  # type: ignore[union-attr]
    for topics in ([b"a"], [b"a", 5], []):
        bad = protocol.pack(["batch", protocol.DATA_VERSION, PID, 1, 0, topics])
        with pytest.raises(protocol.RefusedBatch):
            protocol.decode_publisher_frame(bad, 1 << 20, protocol.msgpack.packb([b"1", b"2"]))
