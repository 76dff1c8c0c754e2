"""A disk-retained queue's groups read their backlog from the segment store (exchange/group_spill.py).

Real segment store on a temporary directory, the exchange's own retention, feed and groups; the
frames are numbered, retained, stored and offered as exchange/fanout.py does.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.disk_tail import DiskTail
from exchange.group_feed import GroupFeed
from exchange.group_spill import GroupSpill
from exchange.groups import Groups, GroupSettings
from exchange.retention import Retention
from roq import protocol
from roq.storage_policy import StoragePolicy
from tests.profiles import examples

SETTINGS = GroupSettings((b"jobs",), 30.0, 5, b"")
MAX_BYTES = 20_000


class Stream:
    """An exchange's frames path: retention (a tiny memory tail), its store, the groups."""

    def __init__(self, root: Path, on_disk: bool = True) -> None:
        self.retention = Retention(3600.0, 5_000)
        self.disk = DiskTail(root, "inc1", "q/x1")
        self.disk.start(StoragePolicy(retention=3600.0 if on_disk else 0.0))
        self.groups = Groups(group_ttl=60.0)
        self.feed = GroupFeed(self.groups)
        self.spill = GroupSpill(self.groups, self.feed, self.retention, self.disk, MAX_BYTES)
        self.feed.before_live = self.spill.mark
        self.next_id = 0

    def publish(self, messages: int, size: int, topic: bytes = b"jobs") -> None:
        pos = self.retention.next_pos
        ids = list(range(self.next_id, self.next_id + messages))
        self.next_id += messages
        payloads = [i.to_bytes(4, "big") + b"x" * size for i in ids]
        body = protocol.encode_delivery("x1", "inc1", pos, [], "p", 0, ids, payloads)
        self.retention.add(topic, body, messages)
        self.disk.append(pos, topic, body, messages, None)
        self.disk.flush(0.0)
        self.feed.offer(pos, topic, "p", 0, ids, payloads, None)

    def work(self, route: bytes, rounds: int = 10_000) -> list[int]:
        """`route` takes and acks everything the group has, read-aheads included."""
        got: list[int] = []
        group = self.groups.groups["g"]
        for _ in range(rounds):
            self.spill.turn()
            served = self.groups.dispatch(group)
            if not served and not group.spilled_from and not group.ready:
                break
            for _, units in served:
                for unit in units:
                    got += [int.from_bytes(p[:4], "big") for p in unit.payloads[unit.idx:unit.idx + unit.count]]
                    self.groups.ack("g", route, [(unit.pos, unit.idx, unit.count)])
        return got


@settings(max_examples=examples(25), deadline=None)
@given(frames=st.lists(st.tuples(st.integers(1, 20), st.integers(10, 3_000)), min_size=1, max_size=120),
       prefetch=st.integers(1, 50))
def test_a_group_with_no_member_keeps_its_backlog_on_disk_and_hands_out_each_message_once(frames, prefetch):
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        stream.groups.join("g", b"m1", SETTINGS, prefetch)
        stream.groups.leave("g", b"m1")
        most, spilled = 0, False
        for messages, size in frames:
            stream.publish(messages, size)
            spilled = spilled or bool(stream.groups.groups["g"].spilled_from)
            stream.spill.turn()
            stream.groups.tick()
            most = max(most, stream.groups.held_bytes)
        # The bound, give or take the one frame that crossed it.
        assert most <= MAX_BYTES + max(m * (s + 4) for m, s in frames)
        assert "g" in stream.groups.groups, "never dropped with its messages"
        assert spilled or sum(m * (s + 4) for m, s in frames) <= MAX_BYTES + 3_004 * 20
        stream.groups.join("g", b"m2", SETTINGS, prefetch)
        got = stream.work(b"m2")
        assert Counter(got) == Counter(range(stream.next_id)), "every message once"
        assert got == sorted(got), "in order (one member, no redelivery)"
        assert stream.groups.held_bytes == 0
        stream.disk.close()


def test_a_memory_only_queue_keeps_todays_bound() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp), on_disk=False)
        stream.groups.join("g", b"m1", SETTINGS, 10)
        stream.groups.leave("g", b"m1")
        for _ in range(40):
            stream.publish(1, 1_000)
        assert not stream.spill.enabled
        assert stream.groups.held_bytes > MAX_BYTES, "nothing spilled: the exchange holds publishers or sheds"
        assert not stream.groups.groups["g"].spilled_from


def test_a_reset_drops_what_waits_on_disk_too() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        stream.groups.join("g", b"m1", SETTINGS, 10)
        stream.groups.leave("g", b"m1")
        for _ in range(60):
            stream.publish(1, 1_000)
        assert stream.groups.groups["g"].spilled_from
        stream.groups.reset("g")
        stream.groups.join("g", b"m2", SETTINGS, 10)
        stream.publish(1, 10)
        assert stream.work(b"m2") == [stream.next_id - 1]


def test_an_idle_spilled_group_lives_as_long_as_the_queue_retention() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stream = Stream(Path(tmp))
        stream.spill.turn()
        assert stream.groups.group_ttl == 3600.0
