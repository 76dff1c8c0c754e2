"""A fetch below the memory tail (exchange/store_hooks.py) answers as the retention does for the
same frames, so exchange/replay.py can serve a range from either."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.retention import Retention
from exchange.segment_store import SegmentStore, StoreLimits
from exchange.store_hooks import (
    PolicyInbox,
    decode_topics,
    encode_topics,
    fetch_below_memory,
    limits_for,
    store_dir,
    stored_frame,
)
from roq.storage_policy import StoragePolicy
from tests.profiles import examples

TOPICS = [b"orders.eu", b"orders.us", b"audit", b""]
# A frame of many topics: its routing topic is their longest common prefix (exchange/grouping.py).
MIXED = [(b"orders.", ((b"orders.eu", 2), (b"orders.us", 1))), (b"", ((b"audit", 1), (b"orders.eu", 3)))]


@settings(max_examples=examples(80), deadline=None)
@given(frames=st.lists(st.tuples(st.sampled_from([(t, None) for t in TOPICS] + MIXED), st.integers(0, 600)),
                      min_size=1, max_size=60),
       after=st.integers(0, 70), span=st.integers(0, 70), max_bytes=st.integers(1, 4000),
       prefixes=st.lists(st.sampled_from([b"orders.", b"orders.us", b"aud", b"", b"x"]), max_size=3))
def test_a_fetch_from_disk_is_the_fetch_from_memory(frames: list[tuple[tuple[bytes, Any], int]], after: int, span: int,
                                                    max_bytes: int, prefixes: list[bytes]) -> None:
    memory = Retention(1e9, 1 << 40)
    with tempfile.TemporaryDirectory() as root:
        store = SegmentStore(Path(root), StoreLimits(segment_bytes=4096, index_every=500))
        for i, ((topic, topics), size) in enumerate(frames):
            body = bytes([i % 251]) * size
            messages = sum(count for _, count in topics) if topics else 1
            pos = memory.add(topic, body, messages=messages, now=0.0, topics=topics)
            store.append(stored_frame(pos, 1_800_000_000.0 + i, topic, body, messages, topics))
        assert store.flush()
        fetched = fetch_below_memory(store, after, after + span, prefixes, max_bytes)
        assert (fetched.frames, fetched.scanned_to, fetched.done) == \
            memory.read(after, after + span, prefixes, max_bytes)
        assert not fetched.damaged
        store.close()


def test_memory_only_opens_no_store_and_a_policy_gives_its_bounds() -> None:
    assert limits_for(StoragePolicy()) is None
    limits = limits_for(StoragePolicy(3600, 1 << 30))
    assert limits is not None and (limits.retention, limits.retention_bytes) == (3600, 1 << 30)
    assert store_dir("/var/lib/roq", "orders", "x1") == Path("/var/lib/roq/store/orders/x1")


def test_a_frames_topics_go_in_its_metadata_and_come_back() -> None:
    assert encode_topics(None) == b"" and decode_topics(b"") is None
    topics = ((b"orders.eu", 2), (b"audit", 1))
    assert decode_topics(encode_topics(topics)) == topics


def test_the_policy_inbox_hands_each_change_to_the_loop_once() -> None:
    inbox = PolicyInbox()
    assert inbox.first(timeout=0.01) is None  # none came: memory only
    inbox.deliver({"commands": []})  # another line: nothing for the store
    assert inbox.take() is None
    line = {"storage": {"retention": 3600, "retention_bytes": 0}}
    sender = threading.Thread(target=inbox.deliver, args=(line,))
    sender.start()
    assert inbox.first(timeout=10) == StoragePolicy(3600, 0)  # waited for it
    sender.join()
    assert inbox.take() is None  # handed over once
    inbox.deliver(line)  # the same again: no change
    assert inbox.take() is None
    inbox.deliver({"storage": {"retention": 60, "retention_bytes": 1}})
    assert inbox.take() == StoragePolicy(60, 1) and inbox.take() is None
