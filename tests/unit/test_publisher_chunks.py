"""The publisher's chunks: split on partial acks, merged back into full batches for a resend."""

from __future__ import annotations

from collections import deque

from roq.client.publisher import Publisher, _Chunk, _merge
from roq.config import Config


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


def replay_window() -> Publisher:
    """A publisher's replay bookkeeping alone (no cluster): what _remember and _trim_replay use."""
    pub = object.__new__(Publisher)
    pub.config = Config().replace(client={"max_batch": 100, "replay_seconds": 15.0})
    pub._replay, pub._replay_size = deque(), 0
    return pub


def test_a_slow_publishers_confirms_share_replay_chunks() -> None:
    pub = replay_window()
    for i in range(250):  # one message confirmed at a time, 1 ms apart
        pub._remember(chunk(1 + i, 1), now=100.0 + i / 1000)
    assert [c.count for c in pub._replay] == [100, 100, 50]  # a batch at most, not 250 chunks
    assert [p for c in pub._replay for p in c.flat[1::2]] == [b"%d" % i for i in range(1, 251)]
    assert pub._replay_size == sum(c.size for c in pub._replay) == chunk(1, 250).size
    pub._remember(chunk(251, 1), now=102.0)  # more than a second later: a new chunk
    pub._remember(chunk(300, 1), now=102.0)  # not consecutive: a new chunk
    assert [c.count for c in pub._replay] == [100, 100, 50, 1, 1]


def test_merged_replay_chunks_are_kept_for_the_replay_time_of_their_newest_message() -> None:
    pub = replay_window()
    pub._remember(chunk(1, 1), now=100.0)
    pub._remember(chunk(2, 1), now=100.9)
    pub._trim_replay(now=115.5)
    assert len(pub._replay) == 1  # message 2 was confirmed less than 15 s ago
    pub._trim_replay(now=116.0)
    assert not pub._replay and pub._replay_size == 0


def test_a_move_requested_by_a_watch_thread_is_never_lost() -> None:
    """Issue 16 point 11: a flag set by kazoo watch threads and cleared unconditionally by the I/O
    loop lost requests; now a request is taken atomically, and one made after a take is kept."""
    import threading

    from roq.client.publisher import Publisher
    pub = Publisher.__new__(Publisher)  # the request itself needs no socket
    pub._move_lock, pub._move_request, pub._wake_w = threading.Lock(), None, -1
    pub._request_move("exchange x1 disappeared")
    assert pub._take_move() == "exchange x1 disappeared"
    assert pub._take_move() is None
    taken: list[str | None] = []
    threads = [threading.Thread(target=pub._request_move, args=(f"r{i}",)) for i in range(50)]
    for thread in threads:
        thread.start()
        taken.append(pub._take_move())
    for thread in threads:
        thread.join()
    taken.append(pub._take_move())
    assert any(taken), "every burst of requests leads to at least one move"
