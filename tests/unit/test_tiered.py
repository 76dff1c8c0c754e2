"""exchange/tiered.py: a stream served from a real segment store below its memory tail reads, page
after page, exactly the frames a reader would get from an unbounded memory, and counts the rest lost."""

from __future__ import annotations

import tempfile
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange import tiered
from exchange.retention import Retention
from exchange.segment_store import SegmentStore, StoreLimits
from exchange.store_hooks import stored_frame
from roq import protocol
from roq.errors import ProtocolError
from tests.profiles import examples

TOPICS = [b"a", b"ab", b"b"]


def build(frames: list[int], memory_bytes: int, deleted_below: int, directory: str) -> tuple[Retention, SegmentStore]:
    retention = Retention(3600.0, memory_bytes)
    store = SegmentStore(directory, StoreLimits(segment_bytes=4096, index_every=256))
    for i, topic_index in enumerate(frames):
        topic, body = TOPICS[topic_index], bytes([i % 256]) * (50 + i % 70)
        pos = retention.add(topic, body, 1)
        store.append(stored_frame(pos, float(i), topic, body, 1))
    store.flush()
    store.delete_below(deleted_below)
    return retention, store


def read_all(retention: Retention, store: SegmentStore, after: int, prefixes: list[bytes],
             page: int) -> tuple[list[tuple[bytes, bytes]], int]:
    found: list[tuple[bytes, bytes]] = []
    lost = 0
    before = retention.next_pos
    for _ in range(10_000):
        result = tiered.read(retention, store, after, before, prefixes, page)
        found += result.frames
        lost += result.lost
        assert result.scanned_to >= after, "paging never goes back"
        if result.done and result.scanned_to >= before - 1:
            return found, lost
        assert result.scanned_to > after or result.frames, "each page makes progress"
        after = result.scanned_to
    raise AssertionError("paging did not end")


@settings(max_examples=examples(60), deadline=None)
@given(frames=st.lists(st.integers(0, 2), min_size=1, max_size=120), memory=st.integers(200, 3000),
       deleted=st.integers(1, 60), after=st.integers(0, 130), prefix=st.sampled_from([[], [b"a"], [b"b"], [b"ab"]]),
       page=st.integers(1, 2000))
def test_pages_over_disk_and_memory_are_every_matching_frame_once(frames, memory, deleted, after, prefix, page):
    with tempfile.TemporaryDirectory() as directory:
        retention, store = build(frames, memory, deleted, directory)
        try:
            found, lost = read_all(retention, store, after, prefix, page)
            served = tiered.served_from(retention, store)
            assert served == min(store.first_pos, retention.served_from)
            matching = [(i + 1, (TOPICS[t], bytes([i % 256]) * (50 + i % 70))) for i, t in enumerate(frames)
                        if i + 1 > after and (not prefix or TOPICS[t].startswith(tuple(prefix)))]
            wanted = [frame for _, frame in matching]
            expected = [frame for pos, frame in matching if pos >= served]
            assert found == expected
            assert lost == len(wanted) - len(expected), "what neither holds is counted lost"
        finally:
            store.close()


@settings(max_examples=examples(60), deadline=None)
@given(count=st.integers(1, 120), memory=st.integers(200, 3000), deleted=st.integers(1, 60),
       asked=st.integers(-3, 125))
def test_a_time_maps_to_the_first_frame_stored_since_on_disk_and_in_memory(count, memory, deleted, asked):
    """Frames one second apart; the store has their wall times, the memory its monotonic ones."""
    base = time.time() - 1_000.0
    offset = time.monotonic() - time.time()
    with tempfile.TemporaryDirectory() as directory:
        retention = Retention(3600.0, memory)
        store = SegmentStore(directory, StoreLimits(segment_bytes=4096, index_every=256))
        try:
            for i in range(count):
                body = bytes(60)
                pos = retention.add(b"t", body, 1, now=base + i + offset)
                store.append(stored_frame(pos, base + i, b"t", body, 1))
            store.flush()
            store.delete_below(deleted)
            oldest = tiered.served_from(retention, store)
            pos = tiered.position_at(retention, store, base + asked - 0.5)  # half a second before frame `asked`
            assert pos == min(max(asked + 1, oldest), retention.next_pos)
        finally:
            store.close()


def test_the_memory_finds_the_first_frame_stored_at_or_after_a_time() -> None:
    retention = Retention(3600.0, 1 << 20)
    for stored_at in (1.0, 2.0, 2.0, 5.0):
        retention.add(b"t", b"x", 1, now=stored_at)
    assert [retention.position_at(t) for t in (0.0, 1.0, 1.5, 2.0, 4.9, 5.0, 6.0)] == [1, 1, 2, 2, 4, 4, 5]


def test_position_at_round_trips_and_refuses_a_bad_time() -> None:
    request = protocol.decode_replay_request(protocol.encode_position_at_request(7, 1_795_000_000.25, "x1.ab"))
    assert request == protocol.PositionAtRequest(7, "x1.ab", 1_795_000_000.25)
    reply = protocol.decode_replay_reply(protocol.encode_position_at(7, "x1.ab", 3, 90, 40), 1 << 20)
    assert reply == protocol.TimePosition(7, "x1.ab", 3, 90, 40)
    for bad in (-1.0, float("nan"), float("inf"), True, "10:00", 2.0 ** 41):
        with pytest.raises(ProtocolError, match="at"):
            protocol.decode_replay_request(protocol.pack(["position_at", 3, 7, "", bad]))
