"""The exchange's retention buffer: positions, bounds, topic filters, paging."""

from __future__ import annotations

from exchange.retention import Retention


def filled(count: int, seconds: float = 60, max_bytes: int = 1 << 20) -> Retention:
    kept = Retention(seconds, max_bytes)
    for i in range(count):
        kept.add(b"even" if i % 2 == 0 else b"odd", b"body%d" % (i + 1), now=100.0 + i)
    return kept


def test_positions_are_consecutive_and_ranges_are_exclusive() -> None:
    kept = filled(10)
    assert kept.next_pos == 11 and kept.oldest == 1
    frames, scanned_to, done = kept.read(3, 6, [b""], 1 << 20)
    assert [body for _, body in frames] == [b"body4", b"body5"]
    assert (scanned_to, done) == (5, True)


def test_topic_prefixes_filter_what_is_returned_but_not_what_is_scanned() -> None:
    frames, scanned_to, done = filled(10).read(0, 11, [b"od"], 1 << 20)
    assert [body for _, body in frames] == [b"body2", b"body4", b"body6", b"body8", b"body10"]
    assert scanned_to == 10 and done


def test_byte_bound_evicts_oldest_first_and_reads_start_at_the_oldest_kept() -> None:
    kept = filled(10, max_bytes=4 * len(b"evenbody1"))
    assert kept.oldest > 1 and kept.bytes <= kept.max_bytes and kept.evicted == kept.oldest - 1
    frames, _, _ = kept.read(0, 100, [b""], 1 << 20)
    assert len(frames) == kept.next_pos - kept.oldest


def test_time_bound_evicts_frames_older_than_the_window() -> None:
    kept = filled(10, seconds=5)
    kept.trim(now=100.0 + 9 + 0.5)  # frames stored at 100..109; keep those from 104.5 on
    assert kept.oldest == 6 and len(kept) == 5


def test_paging_always_makes_progress_and_covers_the_range_once() -> None:
    kept = filled(25)
    after, seen = 0, []
    for _ in range(100):
        frames, scanned_to, done = kept.read(after, 26, [b""], max_bytes=12)
        assert frames, "a page is never empty while frames remain"
        seen += [body for _, body in frames]
        if done:
            break
        assert scanned_to > after
        after = scanned_to
    assert seen == [b"body%d" % i for i in range(1, 26)]


def test_empty_and_inverted_ranges_return_nothing() -> None:
    kept = filled(5)
    assert kept.read(5, 6, [b""], 100) == ([], 5, True)
    assert kept.read(4, 2, [b""], 100)[0] == []
    assert Retention(1, 100).read(0, 1, [b""], 100) == ([], 0, True)


def test_scanned_to_is_what_protocol_5_1_says() -> None:
    """docs/protocol.md 5.1 (issue 31 point 10 m): with `end` = before, or the next position when
    before is 0 or beyond the stream, a done page has scanned_to = max(after, end - 1); an empty
    range (after >= before - 1) is answered, not refused: nothing, scanned_to = after, [0, exact]."""
    kept = filled(10)  # positions 1..10, next 11
    assert kept.read(3, 50, [b""], 1 << 20)[1:] == (10, True)  # before beyond the stream: not waited for
    assert kept.read(12, 11, [b""], 1 << 20)[1:] == (12, True)
    assert kept.read(7, 3, [b""], 100) == ([], 7, True) and kept.lost(7, 3, [b""]) == (0, True)
    frames, scanned_to, done = kept.read(0, 11, [b"od"], len(b"body2") + len(b"body4"))  # odd: 2, 4, 6, ...
    assert [body for _, body in frames] == [b"body2", b"body4"] and (scanned_to, done) == (5, False)
