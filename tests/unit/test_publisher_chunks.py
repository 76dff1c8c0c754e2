"""The publisher's message log: chunks split on partial acks, merged back into full batches for a
resend, confirms, the replay window, and rewinds after a welcome."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from roq.client.publisher.chunks import Chunk, ChunkLog, merge
from tests.profiles import examples


def chunk(first: int, count: int) -> Chunk:
    return Chunk(first, [x for i in range(count) for x in (b"t", b"%d" % (first + i))])


def test_a_partial_ack_splits_a_chunk_at_the_right_message() -> None:
    c = chunk(10, 5)
    head = c.split(2)
    assert (head.first, head.last, c.first, c.last) == (10, 11, 12, 14)
    assert head.flat[1::2] == [b"10", b"11"] and c.flat[1::2] == [b"12", b"13", b"14"]
    assert head.size + c.size == chunk(10, 5).size


def test_small_chunks_are_resent_as_few_full_batches_in_order() -> None:
    chunks = [chunk(1 + 2 * i, 2) for i in range(1000)]  # sealed at a low rate: 2 messages each
    batches = list(merge(chunks, max_count=500, max_bytes=1 << 20))
    assert [len(flat) // 2 for _, flat in batches] == [500] * 4
    assert [first for first, _ in batches] == [1, 501, 1001, 1501]
    payloads = [p for _, flat in batches for p in flat[1::2]]
    assert payloads == [b"%d" % i for i in range(1, 2001)]
    assert chunks[0].flat[1::2] == [b"1", b"2"]  # the chunks themselves are untouched


def test_a_byte_limit_also_cuts_batches() -> None:
    batches = list(merge([chunk(1, 10), chunk(11, 10), chunk(21, 10)], max_count=1000, max_bytes=25))
    assert len(batches) == 3


def replay_window() -> ChunkLog:
    """A log with a 15 s replay window and batches of 100 messages."""
    return ChunkLog(max_batch=100, max_batch_bytes=256 << 10, replay_seconds=15.0, replay_bytes=64 << 20)


def test_a_slow_publishers_confirms_share_replay_chunks() -> None:
    log = replay_window()
    for i in range(250):  # one message confirmed at a time, 1 ms apart
        log.remember(chunk(1 + i, 1), now=100.0 + i / 1000)
    assert [c.count for c in log.replay] == [100, 100, 50]  # a batch at most, not 250 chunks
    assert [p for c in log.replay for p in c.flat[1::2]] == [b"%d" % i for i in range(1, 251)]
    assert log.replay_size == sum(c.size for c in log.replay) == chunk(1, 250).size
    log.remember(chunk(251, 1), now=102.0)  # more than a second later: a new chunk
    log.remember(chunk(300, 1), now=102.0)  # not consecutive: a new chunk
    assert [c.count for c in log.replay] == [100, 100, 50, 1, 1]


def test_merged_replay_chunks_are_kept_for_the_replay_time_of_their_newest_message() -> None:
    log = replay_window()
    log.remember(chunk(1, 1), now=100.0)
    log.remember(chunk(2, 1), now=100.9)
    log.trim_replay(now=115.5)
    assert len(log.replay) == 1  # message 2 was confirmed less than 15 s ago
    log.trim_replay(now=116.0)
    assert not log.replay and log.replay_size == 0


def fill(log: ChunkLog, count: int, start: int = 0) -> None:
    flat = [x for i in range(start, start + count) for x in (b"t", b"%d" % (i + 1))]
    log.append(flat, count)


def test_acks_confirm_prefixes_and_a_welcome_rewinds_to_what_the_exchange_holds() -> None:
    log = replay_window()
    fill(log, 250)
    sent = [log.take() for _ in range(3)]
    assert [(c.first, c.last) for c in sent] == [(1, 100), (101, 200), (201, 250)]
    assert log.confirm(150, now=10.0) and log.acked == 150 and list(log.in_flight) == [200, 250]
    assert not log.confirm(120, now=10.0)  # an older ack changes nothing
    # A new exchange holds up to 60 (say, from an earlier visit): everything above goes again.
    assert log.rewind(60, now=11.0) == 90  # 61..150 were confirmed: from the replay window
    assert [(c.first, c.last) for c in log.take_resend()] == [(61, 100), (101, 150)]
    assert [(c.first, c.last) for c in log.unsent] == [(151, 200), (201, 250)] and not log.in_flight
    assert log.lowest_held() == 1


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("publish"), st.integers(1, 300)),
                          st.tuples(st.just("send"), st.integers(1, 4)),
                          st.tuples(st.just("ack"), st.integers(0, 1200)),
                          st.tuples(st.just("welcome"), st.integers(0, 1200))), max_size=40))
def test_every_message_is_unconfirmed_or_in_the_window_exactly_once(steps: list[tuple[str, int]]) -> None:
    """Whatever the order of publishes, sends, acks and welcomes: each message up to acked is in
    the replay window (nothing trims here), each above it in exactly one unconfirmed part, in order."""
    log = ChunkLog(max_batch=50, max_batch_bytes=1 << 20, replay_seconds=1e9, replay_bytes=1 << 40)
    for kind, n in steps:
        if kind == "publish":
            fill(log, n, log.next_seq - 1)
        elif kind == "send":
            for _ in range(n):
                log.take()
        elif kind == "ack":
            log.confirm(min(n, log.next_seq - 1), now=1.0)
        else:
            last = min(n, log.next_seq - 1)
            log.confirm(last, now=1.0)
            log.rewind(last, now=1.0)
            log.take_resend()
    confirmed = [int(p) for c in log.replay for p in c.flat[1::2]]
    assert confirmed == list(range(1, log.acked + 1))
    pending = [int(p) for part in (log.sent, log.unsent) for c in part for p in c.flat[1::2]]
    pending += [int(p) for p in log.open_messages()[1::2]]
    assert pending == list(range(log.acked + 1, log.next_seq))


def test_a_move_requested_by_a_watch_thread_is_never_lost() -> None:
    """A regression: a flag set by kazoo watch threads and cleared unconditionally by the I/O
    loop lost requests; now a request is taken atomically, and one made after a take is kept."""
    import threading

    from roq.client.publisher.exchange_link import PublisherLink
    pub = PublisherLink.__new__(PublisherLink)  # the request itself needs no socket
    from roq.client.wake import WakePipe
    pub._move_lock, pub._move_request, pub._wake = threading.Lock(), None, WakePipe()
    pub._wake.close()  # wake-ups are no-ops: there is no I/O thread
    pub.request_move("exchange x1 disappeared")
    assert pub._take_move() == "exchange x1 disappeared"
    assert pub._take_move() is None
    taken: list[str | None] = []
    threads = [threading.Thread(target=pub.request_move, args=(f"r{i}",)) for i in range(50)]
    for thread in threads:
        thread.start()
        taken.append(pub._take_move())
    for thread in threads:
        thread.join()
    taken.append(pub._take_move())
    assert any(taken), "every burst of requests leads to at least one move"
