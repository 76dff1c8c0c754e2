"""The publisher's chunks: split on partial acks, merged back into full batches for a resend."""

from __future__ import annotations

from roq.client.publisher import _Chunk, _merge


def chunk(first: int, count: int) -> _Chunk:
    return _Chunk(first, [x for i in range(count) for x in (b"t", b"%d" % (first + i))])


def test_a_partial_ack_splits_a_chunk_at_the_right_message() -> None:
    c = chunk(10, 5)
    head = c.split(2)
    assert (head.first, head.last, c.first, c.last) == (10, 11, 12, 14)
    assert head.flat[1::2] == [b"10", b"11"] and c.flat[1::2] == [b"12", b"13", b"14"]
    assert head.size + c.size == chunk(10, 5).size


def test_small_chunks_are_resent_as_few_full_batches_in_order() -> None:
    chunks = [chunk(1 + 2 * i, 2) for i in range(1000)]  # sealed at a low rate: 2 messages each
    batches = list(_merge(chunks, max_count=500, max_bytes=1 << 20))
    assert [len(flat) // 2 for _, flat in batches] == [500] * 4
    assert [first for first, _ in batches] == [1, 501, 1001, 1501]
    payloads = [p for _, flat in batches for p in flat[1::2]]
    assert payloads == [b"%d" % i for i in range(1, 2001)]
    assert chunks[0].flat[1::2] == [b"1", b"2"]  # the chunks themselves are untouched


def test_a_byte_limit_also_cuts_batches() -> None:
    batches = list(_merge([chunk(1, 10), chunk(11, 10), chunk(21, 10)], max_count=1000, max_bytes=25))
    assert len(batches) == 3
