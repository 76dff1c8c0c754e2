"""The batch API's pure parts: payload checks, MessageBatch (one per frame, whatever its topics),
argument checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roq import protocol
from roq.client.publisher.checks import checked_payloads as _checked_payloads
from roq.client.subscriber import Message, MessageBatch, Subscriber
from roq.client.subscriber.messages import frame_batch
from roq.config import Config
from roq.errors import MessageTooLargeError


def test_payload_lists_are_checked_whole_and_buffers_become_bytes() -> None:
    same = [b"a", b"bc"]
    assert _checked_payloads(same, 10) is same  # the common case costs no copy
    assert _checked_payloads((b"a", bytearray(b"b"), memoryview(b"c")), 10) == [b"a", b"b", b"c"]
    assert _checked_payloads(iter([]), 10) == []
    with pytest.raises(TypeError, match="payload 1 must be bytes, not int"):
        _checked_payloads([b"a", 3], 10)
    with pytest.raises(MessageTooLargeError, match="payload 2 of 11 bytes"):
        _checked_payloads([b"a", b"b", b"x" * 11], 10)


def test_a_message_batch_unfolds_into_messages() -> None:
    batch = MessageBatch(b"t", [b"x", b"y"], "p-1", [7, 8], "x1", 99, "x1.ab", 3)
    assert list(batch.messages()) == [Message(b"t", b"x", "p-1", 7, "x1", 99, "x1.ab", 3),
                                      Message(b"t", b"y", "p-1", 8, "x1", 99, "x1.ab", 3)]


PID = protocol.publisher_id_for(b"b" * 16)


def delivery(seqs: list[int], topics: list[bytes] | None, attrs: list[list[object]] | None = None
             ) -> protocol.Delivery:
    """A delivery frame through the wire codec, as the subscriber's socket hands it over."""
    body = protocol.encode_delivery("x1", "x1.ab", 5, [], PID, 9, seqs, [b"%d" % s for s in seqs], attrs, topics)
    return protocol.decode_delivery(body)


def test_a_batch_of_many_topics_unfolds_with_each_message_topic() -> None:
    batch = MessageBatch("m/", [b"x", b"y"], "p-1", [7, 8], "x1", 99, "x1.ab", 3, None, ["m/a", "m/b"])
    assert batch.message_topics() == ["m/a", "m/b"]
    assert [(m.topic, m.payload, m.seq) for m in batch.messages()] == [("m/a", b"x", 7), ("m/b", b"y", 8)]
    assert batch.topic_bytes == b"m/"
    one = MessageBatch("t", [b"x"], "p-1", [7], "x1", 99)
    assert one.topics is None and one.message_topics() == ["t"]


def test_a_frame_of_mixed_topics_is_one_batch_with_each_message_topic() -> None:
    topics = [b"m/%d" % (i % 7) for i in range(50)]
    batch = frame_batch(b"m/", delivery(list(range(1, 51)), topics), range(50))
    assert batch.topic == "m/" and batch.topics == [t.decode() for t in topics]
    assert batch.seqs == list(range(1, 51)) and batch.pos == 5 and batch.publisher == PID


def test_a_frame_of_one_topic_is_a_batch_without_topics() -> None:
    batch = frame_batch(b"t", delivery([1, 2], None), range(2))
    assert (batch.topic, batch.topics, batch.message_topics()) == ("t", None, ["t", "t"])


def test_duplicates_leave_the_rest_of_the_frame_with_their_own_topics_and_headers() -> None:
    attrs: list[list[object]] = [[1, 0, 0, b"", {"h": b"1"}], [3, 0, 0, b"", {"h": b"3"}]]
    d = delivery([1, 2, 3, 4], [b"a/x", b"a/y", b"a", b"a"], attrs)
    batch = frame_batch(b"a", d, [1, 3])
    assert (batch.seqs, batch.payloads, batch.topics) == ([2, 4], [b"2", b"4"], ["a/y", "a"])
    assert batch.headers == [{"h": b"1"}, {"h": b"3"}]
    rest = frame_batch(b"a", d, [2, 3])  # what is left has the routing topic alone
    assert (rest.topic, rest.topics, rest.headers) == ("a", None, [{}, {"h": b"3"}])
    other = frame_batch(b"a", d, [1])  # ... or one topic longer than it: the batch's topic
    assert (other.topic, other.topics, other.seqs) == ("a/y", None, [2])


def test_topics_that_are_not_utf8_round_trip_through_the_batch() -> None:
    topics = [b"k/\xff", b"k/ok"]
    batch = frame_batch(b"k/", delivery([1, 2], topics), range(2))
    assert [t.encode("utf-8", "surrogateescape") for t in batch.message_topics()] == topics


@given(st.lists(st.sampled_from([b"r", b"r/a", b"r/b", b"r/ab"]), min_size=1, max_size=30), st.data())
def test_any_fresh_subset_of_a_frame_keeps_each_message_topic(topics: list[bytes], data: st.DataObject) -> None:
    seqs = list(range(10, 10 + len(topics)))
    fresh = sorted(data.draw(st.sets(st.integers(0, len(topics) - 1), min_size=1)))
    batch = frame_batch(b"r", delivery(seqs, topics), fresh)
    assert batch.seqs == [seqs[i] for i in fresh]
    assert [t.encode() for t in batch.message_topics()] == [topics[i] for i in fresh]
    assert (batch.topics is None) == (len({topics[i] for i in fresh}) == 1)
    assert batch.topic == "r" if batch.topics is not None else batch.topic == batch.message_topics()[0]
    assert all(t.startswith(batch.topic) for t in batch.message_topics())


def test_a_subscriber_takes_one_kind_of_callback() -> None:
    with pytest.raises(ValueError, match="not both"):
        Subscriber("q", Config(), callback=print, batch_callback=print)
