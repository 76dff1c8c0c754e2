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
    """docs/protocol.md 5.1: with `end` = before, or the next position when
    before is 0 or beyond the stream, a done page has scanned_to = max(after, end - 1); an empty
    range (after >= before - 1) is answered, not refused: nothing, scanned_to = after, [0, exact]."""
    kept = filled(10)  # positions 1..10, next 11
    assert kept.read(3, 50, [b""], 1 << 20)[1:] == (10, True)  # before beyond the stream: not waited for
    assert kept.read(12, 11, [b""], 1 << 20)[1:] == (12, True)
    assert kept.read(7, 3, [b""], 100) == ([], 7, True) and kept.lost(7, 3, [b""]) == (0, True)
    frames, scanned_to, done = kept.read(0, 11, [b"od"], len(b"body2") + len(b"body4"))  # odd: 2, 4, 6, ...
    assert [body for _, body in frames] == [b"body2", b"body4"] and (scanned_to, done) == (5, False)


def test_a_purge_serves_nothing_below_its_floor_and_counts_it_lost_exactly() -> None:
    kept = Retention(60, 1 << 20)
    for i in range(6):
        kept.add(b"t", b"x", messages=2, now=100.0 + i)
    assert kept.purge() == (6, 12)  # every frame held, with its messages
    assert kept.served_frames == 0 and len(kept) == 0 and kept.served_from == kept.next_pos == 7
    assert kept.read(0, 100, [b""], 1 << 20)[0] == [] and kept.lost(0, 7, [b""]) == (12, True)
    assert kept.behind(2) == (0, 0, 0.0)  # nobody is behind on purged frames
    kept.add(b"t", b"after", now=200.0)
    assert [body for _, body in kept.read(0, 100, [b""], 1 << 20)[0]] == [b"after"]
    assert kept.purge(kept.served_from) == (0, 0)  # nothing more below that floor: a second purge does nothing


def test_purged_frames_the_replica_still_needs_stay_for_it_but_are_never_served() -> None:
    kept = filled(10)
    kept.protect_from = 6  # the replica holds positions 1-5 only
    assert kept.purge(8) == (7, 7)
    assert kept.oldest == 6 and kept.served_from == 8  # 6 and 7 stay, for the copy
    assert [body for _, body in kept.read(0, 100, [b""], 1 << 20)[0]] == [b"body8", b"body9", b"body10"]
    assert kept.lost(0, 8, [b""]) == (7, True) and kept.lost(0, 8, [b"even"]) == (4, True)
    assert [entry[1] for entry in kept.entries(6, 1 << 20)][:2] == [b"body6", b"body7"]  # what the link copies
    kept.protect_from = 11  # copied: they go at the next trim
    kept.trim(now=100.0)
    assert kept.oldest == 8 and kept.lost(0, 8, [b""]) == (7, True)
