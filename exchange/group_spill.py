"""Consumer groups of a disk-retained queue read their backlog from the segment store.

A queue whose storage policy keeps frames on disk (docs/segment-store.md) has every frame in the
store in position order already, so a group need not hold its whole backlog in memory. Each group
gets a share of `exchange.group_max_bytes` (the bound divided by the number of groups): a group
over its share, or any group while the groups together hold more than the bound, is *spilled*: it
remembers the first position it was not offered (`Group.spilled_from`) and takes no frame live
from then on. Once it holds less than half its share (its members acked), the next frames are
read from the store (or the memory tail: exchange/tiered.py) and offered to it alone, half a
share at a time, until it reaches the stream's end and takes frames live again. Each group refills
within its own share, so an idle one never starves another. So a group keeps its backlog with no
member for as long as the store keeps the frames, memory holds what is in flight and a
read-ahead, and publishers are never held nor groups dropped for the groups' bytes.

Positions stay the stream's own: a message read back carries the position it was stored with, so
the members' acks (protocol section 7) are the same. Frames the store no longer holds (retention
deleted their segment) are passed over and logged. With a replica, the replica writes the same
frames to its own store (exchange/replica_disk.py) and what it is sent of a group is its cursor:
the in-memory messages, where its backlog on disk starts (`upto`) and the frames it skips (`gap`),
protocol section 7.6; an adopting exchange reads the backlog back the same way (exchange/group_sync.py).
A queue that keeps frames in memory only keeps the behaviour of exchange/groups.py exactly (the
bound holds the publishers, idle groups are shed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from exchange.disk_tail import DiskTail
from exchange.group_feed import GroupFeed
from exchange.groups import Group, Groups
from exchange.retention import Retention
from exchange.tiered import read
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

READ_AHEAD_BYTES = 4 << 20  # bodies read from the store in one page for one group


class GroupSpill:
    def __init__(self, groups: Groups, feed: GroupFeed, retention: Retention, disk: DiskTail,
                 max_bytes: int) -> None:
        self.groups, self.feed, self.retention, self.disk = groups, feed, retention, disk
        self.max_bytes = max_bytes
        self.base_ttl = groups.group_ttl
        self.lost = 0  # frames a spilled group found gone from the store (retention deleted them)
        # A restored group's backlogs of earlier incarnations, read before this stream's frames
        # (GroupCursors.read_backlog, exchange/group_restore.py): False once none is left to read.
        self.backlog: Callable[[Group, int], bool] = lambda group, max_bytes: False

    @property
    def enabled(self) -> bool:
        """The queue keeps its frames on disk now: backlogs may wait there."""
        return self.disk.store is not None and self.disk.policy.on_disk

    def share(self) -> int:
        """What one group may hold in memory."""
        return max(1, self.max_bytes // max(1, len(self.groups.groups)))

    def mark(self, pos: int) -> None:
        """Before the frame at `pos` is offered live: the groups over their share take it later, from disk."""
        if not self.enabled:
            return
        share, over = self.share(), self.groups.held_bytes > self.max_bytes
        for group in self.groups.groups.values():
            if not group.spilled_from and (over or group.held_bytes > share):
                group.spilled_from = pos

    def turn(self) -> None:
        """Each groups' turn: a read-ahead from the store for every spilled group that has room;
        an idle group is kept at least as long as the queue's retention."""
        ttl = self.base_ttl
        if self.enabled:
            ttl = max(ttl, self.disk.policy.retention)
        self.groups.group_ttl = ttl
        share = self.share()
        for group in list(self.groups.groups.values()):
            # Each within its own share: a group without members must not starve one with members.
            while group.spilled_from and group.held_bytes < share // 2:
                before = group.spilled_from
                if self.backlog(group, min(READ_AHEAD_BYTES, max(1, share // 2))):
                    continue
                self._read_ahead(group, share)
                if group.spilled_from and group.spilled_from <= before:
                    break  # nothing readable yet (cannot happen with a consistent store): next turn

    def _read_ahead(self, group: Group, share: int) -> None:
        """One page of the frames after `group.spilled_from`, offered to `group` alone (up to its
        `spill_gap`, which it then skips)."""
        gap_from, gap_to = group.spill_gap
        if gap_from and group.spilled_from >= gap_from:
            group.spilled_from, group.spill_gap = max(group.spilled_from, gap_to), (0, 0)
            if group.spilled_from >= self.retention.next_pos:
                group.spilled_from = 0
            return
        after, end = group.spilled_from - 1, gap_from or self.retention.next_pos
        page = read(self.retention, self.disk.store, after, end, list(group.settings.prefixes),
                    min(READ_AHEAD_BYTES, max(1, share // 2)),  # so it holds its share, give or take a frame
                    wait_pending=True)  # frames the store has not written yet (a full disk) are waited for
        if page.lost:
            self.lost += page.lost
            log.warning("consumer group %s: %d messages after position %d were gone from the store "
                        "(its retention deleted them) before the group took them", group.name, page.lost, after)
        for topic, body in page.frames:
            self._offer(group, topic, body)
        group.spilled_from = page.scanned_to + 1
        if group.spilled_from >= end and not gap_from:
            group.spilled_from = 0  # caught up: frames come live again

    def _offer(self, group: Group, topic: bytes, body: object) -> None:
        try:
            d = protocol.decode_delivery(body)  # type: ignore[arg-type]
        except ProtocolError:
            log.exception("consumer group %s: a stored frame does not decode; passed over", group.name)
            return
        self.feed.offer(d.pos, topic, d.publisher, d.sent_ns, d.seqs, [protocol.as_bytes(p) for p in d.payloads],
                        [tuple(a) for a in d.attrs] if d.attrs else None, only=group, topics=d.topics)
