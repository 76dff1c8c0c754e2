"""Message headers in the codecs (docs/protocol.md 3.2, 4.2, 7.3): property tests that every valid
map round-trips through a batch, a delivery, a work entry and the JSON envelope, that anything else
a peer could send is refused with ProtocolError and nothing else, and that the text and base64
lines of `roq subscribe` never split a record."""

from __future__ import annotations

import base64
import codecs
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.groups import MAX_DELIVERIES, NACKED, Groups, GroupSettings
from roq import protocol
from roq.client.envelope import base64_line, decode_envelope, message_json, text_line
from roq.errors import ProtocolError, UserError
from tests.profiles import examples

PID = protocol.publisher_id_for(b"h" * 16)

keys = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x7f",
                             min_codepoint=0x20), min_size=1, max_size=40) \
    .filter(lambda k: len(k.encode()) <= protocol.MAX_HEADER_KEY and not k.lower().startswith("roq-"))
values = st.binary(max_size=300) | st.sampled_from([b"", b"\xff" * protocol.MAX_HEADER_VALUE])
headers_maps = st.dictionaries(keys, values, max_size=10).filter(
    lambda h: sum(len(k.encode()) + len(v) for k, v in h.items()) <= protocol.MAX_HEADERS_BYTES)


def unpacked(frame: bytes) -> Any:
    return msgpack.unpackb(frame, raw=False)


@settings(max_examples=examples(150), deadline=None)
@given(headers=headers_maps, priority=st.integers(0, 255), key=st.binary(max_size=255))
def test_headers_round_trip_through_batch_delivery_and_work_entry(headers, priority, key):
    slot = protocol.attributed_topic(b"orders", priority, 0, key, headers)
    frame = protocol.encode_batch(PID, 1, 0, [slot, b"payload", b"orders", b"plain"])
    batch = protocol.decode_publisher_frame(frame, 1 << 24)
    assert isinstance(batch, protocol.Batch)
    topic, got_priority, _, got_key, got_headers = protocol.message_attributes(batch.flat[0])
    assert (topic, got_priority, got_key, got_headers or {}) == (b"orders", priority, key, headers)
    assert protocol.headers_size(headers) == sum(len(k.encode()) + len(v) for k, v in headers.items())
    attrs = [[0, priority, 0, key, headers]] if headers else [[0, priority, 0, key]]
    delivery = protocol.decode_delivery(protocol.encode_delivery("x1", "x1.ab", 3, [], PID, 0, [1, 2],
                                                                 [b"payload", b"plain"], attrs))
    assert delivery.headers() == ([headers, {}] if headers else None)
    entry = [3, 0, 1, b"orders", PID, 0, [1], [b"payload"], priority, key] + ([headers] if headers else [])
    reply = protocol.decode_work_reply(protocol.encode_work("g", "x1.ab", [entry]), 1 << 24)
    assert reply.entries == [entry]


@settings(max_examples=examples(150), deadline=None)
@given(headers=headers_maps, payload=st.binary(max_size=200))
def test_the_json_envelope_gives_back_the_bytes_it_was_made_from(headers, payload):
    shown = message_json(b"t", payload, headers)
    assert decode_envelope({k: shown[k] for k in ("payload", "encoding", "headers", "headers_encoding")}) == (
        payload, headers)


@settings(max_examples=examples(300), deadline=None)
@given(topic=st.binary(min_size=1, max_size=255), payload=st.binary(max_size=200))
def test_a_text_or_base64_line_is_one_line_and_gives_the_bytes_back(topic, payload):
    for line in (text_line(topic, payload), base64_line(topic, payload)):
        assert line.endswith(b"\n") and line.count(b"\n") == 1 and b"\r" not in line
    shown_topic, shown_payload = text_line(topic, payload)[:-1].split(b"\t", 1)
    assert codecs.escape_decode(shown_topic)[0] == topic and codecs.escape_decode(shown_payload)[0] == payload
    assert base64.b64decode(base64_line(topic, payload)[:-1].split(b"\t", 1)[1]) == payload


scalars = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.binary(max_size=20) \
    | st.text(max_size=20) | st.floats(allow_nan=False)
map_keys = st.text(max_size=10) | st.binary(max_size=10) | st.integers(-5, 5)
hostile_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                              | st.dictionaries(map_keys, inner, max_size=4), max_leaves=20)


@settings(max_examples=examples(300), deadline=None)
@given(headers=hostile_values)
def test_any_headers_slot_a_peer_sends_is_taken_only_when_valid_and_else_refused_with_a_reason(headers):
    frame = protocol.encode_batch(PID, 1, 0, [[b"t", 0, 0, b"", headers], b"x"])
    batch = protocol.decode_publisher_frame(frame, 1 << 20)
    assert isinstance(batch, protocol.Batch)
    try:
        taken = protocol.message_attributes(batch.flat[0])[4]
    except ProtocolError as refused:
        assert str(refused)
        return
    assert taken is None or protocol.headers_size(taken) <= protocol.MAX_HEADERS_BYTES
    assert headers in ({}, None) or taken == headers


@pytest.mark.parametrize("raw, says", [
    (b"\x82\xa1k\xc4\x011\xa1k\xc4\x012", "twice"),  # {"k": 1, "k": 2}: msgpack's own decoder keeps one
    (b"\x81\x01\xc4\x01v", "must be str"),  # an int key
    (b"\x81\xc4\x01k\xc4\x01v", "must be str"),  # a bin key
    (b"\x81\xa2\xff\xfe\xc4\x01v", "UTF-8"),  # a str key that is not UTF-8
])
def test_maps_whose_keys_lie_are_refused_one_message_at_a_time(raw: bytes, says: str) -> None:
    """What msgpack's packer cannot write, written by hand: the batch still decodes (the other
    messages go on) and this message's headers are refused with the reason."""
    head = msgpack.packb(["batch", 3, PID, 1, 0], use_bin_type=True)
    slot = b"\x95" + msgpack.packb(b"t", use_bin_type=True) + b"\x00\x00\xc4\x00" + raw
    frame = b"\x96" + head[1:] + b"\x94" + slot + msgpack.packb(b"x", use_bin_type=True) \
        + msgpack.packb(b"t", use_bin_type=True) + msgpack.packb(b"y", use_bin_type=True)
    batch = protocol.decode_publisher_frame(frame, 1 << 20)
    assert isinstance(batch, protocol.Batch) and batch.flat[2:] == [b"t", b"y"]
    with pytest.raises(ProtocolError, match=says):
        protocol.message_attributes(batch.flat[0])


def test_receivers_take_roqs_own_headers_publishers_may_not_send_them() -> None:
    own = {"roq-reason": b"nack", **{f"k{i}": b"" for i in range(protocol.MAX_HEADERS)}}
    with pytest.raises(ProtocolError, match="RoQ's own|at most"):
        protocol.headers_size(own)
    assert protocol.headers_size(own, own=True) == sum(len(k) for k in own) + 4
    delivery = protocol.encode_delivery("x1", "x1.ab", 3, [], PID, 0, [1], [b"p"], [[0, 0, 0, b"", own]])
    assert protocol.decode_delivery(delivery).headers() == [own]
    too_many = {f"k{i}": b"" for i in range(protocol.MAX_HEADERS + protocol.MAX_OWN_HEADERS + 1)}
    with pytest.raises(ProtocolError):
        protocol.decode_delivery(protocol.encode_delivery("x1", "x1.ab", 3, [], PID, 0, [1], [b"p"],
                                                          [[0, 0, 0, b"", too_many]]))


def test_an_application_gets_a_clear_error_for_headers_it_cannot_send() -> None:
    assert protocol.check_headers({"a": "text", "b": bytearray(b"\x00")}) == {"a": b"text", "b": b"\x00"}
    assert protocol.check_headers(None) == {}
    for bad, says in (([("a", "b")], "mapping"), ({"a": "\udcff"}, "not valid text"), ({"roq-x": b""}, "RoQ's own"),
                      ({1: b""}, "str")):
        with pytest.raises(UserError, match=says):
            protocol.check_headers(bad)


def test_a_publishers_slot_is_sized_with_its_headers_and_packs_as_the_list() -> None:
    slot = protocol.attributed_topic(b"t", 0, 0, b"k", {"trace": b"x" * 100})
    sized = protocol.Attributed(slot, 1 + 1 + 105)
    assert len(sized) == 107  # what batch sizing (roq/client/publisher/chunks.py) counts
    assert protocol.encode_batch(PID, 1, 0, [sized, b"p"]) == protocol.encode_batch(PID, 1, 0, [slot, b"p"])


def test_a_group_keeps_headers_per_unit_and_says_why_it_dead_letters() -> None:
    dead: list[tuple[bytes, list[Any], str]] = []
    groups = Groups(on_dead=lambda group, unit, reason: dead.append((unit.topic, unit.entry(), reason)),
                    clock=lambda: 100.0, wall=lambda: 1e6)
    settings_ = GroupSettings((b"jobs",), 30.0, 2, b"dead")
    group, _ = groups.join("g", b"m1", settings_, 10)
    assert group is not None
    groups.offer(1, b"jobs", PID, 0, [1, 2, 3], [b"a", b"b", b"c"],
                 [(0, 0, 0, b"", {"h": b"1"}), (1, 0, 0, b"", {"h": b"1"})])
    (_, units), = groups.dispatch(group)
    assert [u.entry()[6:] for u in units] == [[[1, 2], [b"a", b"b"], 0, b"", {"h": b"1"}], [[3], [b"c"], 0, b""]]
    groups.nack("g", b"m1", [(1, 0, 1)], requeue=False)
    assert dead == [(b"jobs", [1, 0, 1, b"jobs", PID, 0, [1], [b"a"], 0, b"", {"h": b"1"}], NACKED)]
    for _ in range(2):  # delivered twice: the second comes back for good
        groups.nack("g", b"m1", [(1, 1, 2)], requeue=True)
        groups.dispatch(group)
    assert [reason for _, _, reason in dead] == [NACKED, MAX_DELIVERIES, MAX_DELIVERIES]


def test_a_message_without_headers_shares_one_empty_mapping_that_cannot_change_and_pickles() -> None:
    import pickle

    from roq.client.group_member import WorkMessage
    from roq.client.subscriber import EMPTY_HEADERS, Message, MessageBatch
    msg = Message("orders", b"p", PID, 1, "x1", 0)
    again = pickle.loads(pickle.dumps(msg))
    assert again == msg and again.headers is EMPTY_HEADERS and EMPTY_HEADERS == {} and not EMPTY_HEADERS
    with pytest.raises(TypeError):
        EMPTY_HEADERS["k"] = b"v"  # type: ignore[index]
    assert msg.topic_bytes == b"orders" and Message("\udcff", b"", PID, 1, "x1", 0).topic_bytes == b"\xff"
    batch = MessageBatch("t", [b"a", b"b"], PID, [1, 2], "x1", 0, headers=[{"h": b"1"}, {}])
    assert [m.headers for m in batch.messages()] == [{"h": b"1"}, {}]
    # The messages of one work entry share a map on the wire: each gets its own.
    entry = [3, 0, 1, b"jobs", PID, 0, [1, 2], [b"a", b"b"], 0, b"", {"h": b"1"}]
    first, second = (WorkMessage(None, entry, i, "x1", "x1.ab") for i in range(2))  # type: ignore[arg-type]
    first.headers["h"] = b"changed"  # type: ignore[index]
    assert second.headers == {"h": b"1"}


def test_an_exchange_that_adopts_a_group_forwards_its_pending_messages_with_their_headers() -> None:
    """Protocol 7.6: the pending message is forwarded again in the new incarnation's stream and
    offered to its group, with its priority, key and headers (a real Forwarder on loopback)."""
    import zmq

    from exchange.forwarder import Forwarder
    from exchange.parts import Site
    from roq.config import ExchangeConfig
    forwarder = Forwarder.open(zmq.Context.instance(), ExchangeConfig(), Site("x1", "127.0.0.1", "127.0.0.1"))
    try:
        body = protocol.encode_delivery("x1", "x1.0ld", 1, [], PID, 5, [1, 2], [b"a", b"b"],
                                        [[1, 3, 0, b"k", {"trace-id": b"4bf9"}]])
        record = protocol.GroupRecord("g", (b"jobs",), 30_000, 5, b"dead", 2, [(1, 1, 1, 2)])
        forwarder.group_sync.adopt(protocol.Adoption("x1.new", "x1.0ld", [record], {PID: 2}, [(1, b"jobs", body)]))
        (unit,) = forwarder.groups.groups["g"].levels[3].queues[b"k"]
        assert unit.entry()[6:] == [[2], [b"b"], 3, b"k", {"trace-id": b"4bf9"}] and unit.deliveries == 2
        frames, _, _ = forwarder.retention.read(0, forwarder.retention.next_pos, [b"jobs"], 1 << 20)
        (again,) = [protocol.decode_delivery(b) for _, b in frames]
        assert (again.seqs, again.attrs) == ([2], [[0, 3, 0, b"k", {"trace-id": b"4bf9"}]])
    finally:
        forwarder.close()
