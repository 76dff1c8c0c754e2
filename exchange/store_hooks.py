"""The exchange's calls into its segment store (docs/segment-store.md "What the exchange wires in").

Kept apart from the exchange's loop so that wiring the store in is a few calls: where a store
lives, what limits a queue's storage policy gives it, and a fetch below the memory tail with the
same contract as `Retention.read`, so exchange/replay.py can serve a range from memory and the rest
from disk alike.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

from exchange.retention import TopicCounts
from exchange.segment_store import SegmentStore, StoredFrame, StoreLimits
from roq.storage_policy import StoragePolicy, policy_from_line

STORE_DIR = "store"  # under hcm.data_dir: <STORE_DIR>/<queue>/<xid>/
SEGMENT_BYTES = 64 << 20  # one segment file's size before the next is started


class StoreFetch(NamedTuple):
    frames: list[tuple[bytes, bytes]]  # (topic, body), as Retention.read gives them
    scanned_to: int  # every position up to it was looked at
    done: bool  # False: max_bytes cut the page short
    damaged: list[tuple[int, int]]  # [first, end) positions whose records failed their checks: lost


class PolicyInbox:
    """The storage policy the HCM last sent, handed from the stdin thread to the loop: `deliver`
    every line from the HCM (lines without a policy are ignored), `take` in the loop (None: no
    change since the last take). `first` waits for the first one, which comes right after the
    configuration (hcm/channel.py), so the store is opened with the queue's policy."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._latest: StoragePolicy | None = None
        self._taken: StoragePolicy | None = None

    def deliver(self, message: dict[str, Any]) -> None:
        policy = policy_from_line(message)
        if policy is not None:
            with self._changed:
                self._latest = policy
                self._changed.notify_all()

    def take(self) -> StoragePolicy | None:
        with self._changed:
            if self._latest is None or self._latest == self._taken:
                return None
            self._taken = self._latest
            return self._taken

    def first(self, timeout: float) -> StoragePolicy | None:
        """The first policy, waiting up to `timeout` seconds (None: none came: memory only)."""
        with self._changed:
            self._changed.wait_for(lambda: self._latest is not None, timeout)
        return self.take()


def store_dir(data_dir: str | Path, queue: str, xid: str) -> Path:
    return Path(data_dir) / STORE_DIR / queue / xid


def limits_for(policy: StoragePolicy, segment_bytes: int = SEGMENT_BYTES) -> StoreLimits | None:
    """The store limits of a queue's policy; None for memory only (no store is opened)."""
    if not policy.on_disk:
        return None
    return StoreLimits(segment_bytes=segment_bytes, retention=policy.retention, retention_bytes=policy.retention_bytes)


def stored_frame(pos: int, stored_at: float, topic: bytes, body: bytes, messages: int,
                 topics: TopicCounts = None) -> StoredFrame:
    """What the store keeps of a frame the retention keeps (`Retention.add`'s arguments, with a wall
    clock time): its distinct topics, when it has more than one, go in the metadata."""
    return StoredFrame(pos, stored_at, topic, body, messages, encode_topics(topics))


def encode_topics(topics: TopicCounts) -> bytes:
    """A frame's distinct topics and their message counts as msgpack [[topic, count], ...]; b"": none."""
    return b"" if topics is None else msgpack.packb([[topic, count] for topic, count in topics])


def decode_topics(meta: bytes) -> TopicCounts:
    if not meta:
        return None
    return tuple((bytes(topic), int(count)) for topic, count in msgpack.unpackb(meta))


def holds(frame: StoredFrame, wanted: tuple[bytes, ...]) -> bool:
    """Whether a message of the frame has a topic starting with one of `wanted` (Retention.read's test)."""
    if frame.topic.startswith(wanted):
        return True
    topics = decode_topics(frame.meta)
    return topics is not None and any(topic.startswith(wanted) for topic, _ in topics)


def fetch_below_memory(store: SegmentStore, after: int, before: int, prefixes: list[bytes],
                       max_bytes: int) -> StoreFetch:
    """Frames with after < pos < before holding a message whose topic starts with one of `prefixes`
    (all if none), about `max_bytes` of bodies (at least one frame if any): `Retention.read` for
    what the memory no longer holds. Positions deleted by retention are passed over, as evicted ones
    are by `Retention.read` (the caller counts them lost)."""
    before = min(before, store.end_pos)
    pos = max(after + 1, store.first_pos)
    wanted = tuple(prefixes)
    match_all = not prefixes or b"" in prefixes
    found: list[tuple[bytes, bytes]] = []
    damaged: list[tuple[int, int]] = []
    size = 0
    while pos < before:
        page = store.read(pos, before, max_bytes)
        damaged += page.damaged
        for frame in page.frames:
            if match_all or holds(frame, wanted):
                if found and size + len(frame.body) > max_bytes:
                    return StoreFetch(found, frame.pos - 1, False, damaged)
                found.append((frame.topic, frame.body))
                size += len(frame.body)
        if page.next_pos <= pos:  # nothing more readable (cannot happen with a consistent store)
            break
        pos = page.next_pos
    return StoreFetch(found, max(after, before - 1), True, damaged)
