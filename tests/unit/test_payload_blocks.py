"""Two-part batches (protocol 3.2): a batch of one topic whose payloads travel as one msgpack
array, which the exchange splices into its delivery without packing each payload again.

The splice must give exactly the bytes the ordinary encoder gives (subscribers see one format),
and a block that is anything but an array of bin must be refused whole, whatever it holds."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roq import protocol
from roq.errors import ProtocolError
from tests.profiles import examples

PID = protocol.publisher_id_for(b"k" * 16)
# Payload sizes around msgpack's bin8/bin16/bin32 boundaries, and empty ones.
sizes = st.sampled_from([0, 1, 255, 256, 65535, 65536]) | st.integers(0, 600)
payload_lists = st.lists(sizes.map(lambda n: b"p" * n), min_size=1, max_size=20)
chains = st.lists(st.tuples(st.integers(0, 255), st.integers(0, 99)), max_size=4).map(
    lambda cs: [[length, prev] for length, prev in cs])


@settings(max_examples=examples(60), deadline=None)
@given(payloads=payload_lists, chain=chains, pos=st.integers(100, (1 << 63) - 1),
       first=st.integers(1, 1 << 62), sent_ns=st.integers(0, (1 << 64) - 1))
def test_a_spliced_delivery_is_byte_for_byte_the_packed_one(payloads, chain, pos, first, sent_ns):
    seqs = list(range(first, first + len(payloads)))
    _, block = protocol.encode_batch_parts(PID, first, sent_ns, b"t", payloads)
    spliced = protocol.encode_delivery_spliced("x1", "x1.0badcafe", pos, chain, PID, sent_ns, seqs, memoryview(block))
    assert spliced == protocol.encode_delivery("x1", "x1.0badcafe", pos, chain, PID, sent_ns, seqs, payloads)
    assert protocol.decode_delivery(spliced).payloads == payloads


def test_a_two_part_batch_decodes_to_its_topic_and_payloads():
    head, block = protocol.encode_batch_parts(PID, 7, 9, b"orders", [b"a", b"", b"c"])
    batch = protocol.decode_publisher_frame(head, 1 << 20, memoryview(block))
    assert isinstance(batch, protocol.Batch)
    assert (batch.topic, batch.payloads, batch.count, batch.first_seq) == (b"orders", [b"a", b"", b"c"], 3, 7)
    assert batch.messages() == [b"orders", b"a", b"orders", b"", b"orders", b"c"]


HOSTILE_BLOCKS = {
    "not msgpack": b"\xc1",
    "truncated": msgpack.packb([b"abc"])[:-1],
    "trailing bytes": msgpack.packb([b"abc"]) + b"\x00",
    "not an array": msgpack.packb({b"a": b"b"}),
    "an empty array": msgpack.packb([]),
    "a str payload": msgpack.packb([b"ok", "text"]),
    "an int payload": msgpack.packb([b"ok", 5]),
    "a nested array": msgpack.packb([[b"a"]]),
    "an array header claiming 2^32-1 elements": b"\xdd\xff\xff\xff\xff",
    "a bin header claiming 4 GiB": b"\x91\xc6\xff\xff\xff\xff",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_BLOCKS))
def test_a_hostile_block_refuses_the_batch_whole(name):
    head, _ = protocol.encode_batch_parts(PID, 3, 0, b"t", [])
    with pytest.raises(protocol.RefusedBatch) as refused:
        protocol.decode_publisher_frame(head, 1 << 20, HOSTILE_BLOCKS[name])
    assert (refused.value.publisher, refused.value.first_seq) == (PID, 3)  # answered `resend malformed`


def test_the_two_forms_do_not_mix():
    one_frame = protocol.encode_batch(PID, 1, 0, [b"t", b"a"])
    with pytest.raises(protocol.RefusedBatch):  # a flat batch with a second part
        protocol.decode_publisher_frame(one_frame, 1 << 20, msgpack.packb([b"a"]))
    head, _ = protocol.encode_batch_parts(PID, 1, 0, b"t", [])
    with pytest.raises(protocol.RefusedBatch):  # a topic header without its block
        protocol.decode_publisher_frame(head, 1 << 20)
    with pytest.raises(ProtocolError):  # only a batch may have two parts
        protocol.decode_publisher_frame(protocol.encode_bye(PID), 1 << 20, msgpack.packb([b"a"]))


def test_a_block_beyond_the_batch_limit_is_refused_before_it_is_decoded():
    head, block = protocol.encode_batch_parts(PID, 1, 0, b"t", [b"x" * 4000])
    with pytest.raises(protocol.RefusedBatch, match="exceeds"):
        protocol.decode_publisher_frame(head, len(head) + 100, block)


@settings(max_examples=examples(300), deadline=None)
@given(block=st.binary(max_size=64))
def test_any_block_is_refused_or_yields_only_bin_payloads(block):
    head, _ = protocol.encode_batch_parts(PID, 1, 0, b"t", [])
    try:
        batch = protocol.decode_publisher_frame(head, 1 << 16, block)
    except protocol.RefusedBatch:
        return
    assert isinstance(batch, protocol.Batch) and batch.payloads
    assert all(type(p) is bytes for p in batch.payloads)
    # What the exchange would splice is exactly what it would have packed.
    seqs = list(range(1, batch.count + 1))
    assert protocol.encode_delivery_spliced("x1", "x1.ab", 5, [], PID, 0, seqs, block) == \
        protocol.encode_delivery("x1", "x1.ab", 5, [], PID, 0, seqs, batch.payloads)
