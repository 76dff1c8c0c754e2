"""A starting replicated exchange adopts the consumer groups its earlier incarnation left.

It asks its replica (`adopt`, protocol section 7.6) once the replica follows, and takes the groups
before reading any publisher or member (their resends must meet the adopted groups). The replica
answers a page at a time: group by group, about 4 MiB of frames each (so neither side builds a
reply the size of a backlog of gigabytes, and the loop turns between two pages); a replica of
before pages answers the whole adoption at once, which is taken the same way. The pending
messages are forwarded again in the new stream, group by group, each offered to its group only
with its delivery count. With a disk storage policy a group whose frames are more than its share
of exchange.group_max_bytes (or take more than one page) is not handed them in memory: it reads
them back from our store a read-ahead at a time (exchange/group_spill.py), skipping the other
groups' frames forwarded after its own (its `spill_gap`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exchange.fanout import Fanout
from exchange.grouping import frames_of
from exchange.groups import Group
from exchange.parts import Parts
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

ADOPT_TIMEOUT = 3.0  # s a replicated exchange waits at start for the first answer about the groups ...
# ... or, restarted on a disk that holds its earlier incarnations' stores, this long: its replica's host
# may be restarting too (every host restarted), and only the replica holds the groups' cursors.
STORED_ADOPT_TIMEOUT = 15.0
PAGE_TIMEOUT = 1.5  # s without the page asked for: asked again (the first: whole, for a replica of before pages)
# Asks of one page before the adoption ends with what came (the groups not reached yet start empty:
# their backlog is lost, logged). A minute: a replica whose host restarts mid-adoption is back well
# within it, and the exchange holds publishers and members meanwhile.
PAGE_TRIES = 40


@dataclass
class _Adopting:
    """An adoption under way: its first answer (groups, publishers' highs), the groups taken."""
    first: protocol.Adoption
    groups: list[Group]
    current: int = -1  # the group whose frames are being forwarded
    start: int = 0  # where its frames start in our stream
    offer: bool = True  # they are offered to it (else it reads them back from the store)
    spilled: list[tuple[Group, int, int]] = field(default_factory=list)  # (group, first, end) read back
    messages: int = 0


class GroupAdoption:
    def __init__(self, parts: Parts, fanout: Fanout, send_state_now: Callable[[], None]) -> None:
        self.link = parts.link
        self.groups, self.feed, self.spill, self.disk = parts.groups, parts.feed, parts.spill, parts.disk
        self.commands, self.retention, self.chains = parts.commands, parts.retention, parts.chains
        self.publisher_ttl = parts.config.publisher_ttl
        self._send, self._send_state_now = fanout.send, send_state_now
        self.adopting = self.link is not None  # until the replica answered (or did not in time)
        self.pages = 0  # pages taken
        self._started = time.monotonic()
        self._under_way: _Adopting | None = None
        self._asked: tuple[int, int] | None = None  # the page asked for last (None: nothing yet)
        self._asked_at = 0.0
        self._tries = 0
        self._whole_asked = False

    def step(self) -> None:
        """Once per loop turn while adopting: take an answer, or ask (again)."""
        link = self.link
        assert link is not None
        now = time.monotonic()
        if link.adoption is not None:
            reply, link.adoption = link.adoption, None
            if reply.page is None:
                if self._under_way is None:  # the whole adoption at once (a replica of before pages)
                    self.adopting = False
                    self.adopt(reply)
            else:
                self._take_page(reply, now)
        elif self._asked is None:
            if link.following and link.ask_adoption((0, 0)):
                self._asked, self._asked_at = (0, 0), now
            elif now > self._deadline:
                self._give_up()
        elif now > self._asked_at + PAGE_TIMEOUT:
            self._ask_again(now)

    def _ask_again(self, now: float) -> None:
        assert self.link is not None and self._asked is not None
        if self._under_way is None and not self._whole_asked:
            self._whole_asked = self.link.ask_adoption(None)  # a replica of before pages refused the page
        if self._under_way is None and now > self._deadline:
            self._give_up()
            return
        self._tries += 1
        if self._tries >= PAGE_TRIES:
            log.error("the replica stopped answering the adoption at page %s for %.0fs; going on with what "
                      "came: the groups not adopted yet lose their backlog", self._asked, PAGE_TRIES * PAGE_TIMEOUT)
            self._end()
            return
        self.link.ask_adoption(self._asked)
        self._asked_at = now

    @property
    def _timeout(self) -> float:
        return STORED_ADOPT_TIMEOUT if self.disk.archived else ADOPT_TIMEOUT

    @property
    def _deadline(self) -> float:
        return self._started + self._timeout

    def _give_up(self) -> None:
        self.adopting = False
        log.warning("no answer from the replica about earlier consumer groups in %.0fs; starting without",
                    self._timeout)

    def _take_page(self, reply: protocol.Adoption, now: float) -> None:
        assert reply.page is not None and self.link is not None
        group, after, next_group, next_after = reply.page
        if (group, after) != self._asked:
            return  # an answer to an earlier ask, taken already
        if self._under_way is None:
            self.commands.mark_applied(reply.applied)  # an earlier incarnation's: not again
            if not reply.ended:
                self.adopting = False
                return
            self._under_way = _Adopting(reply, [self.groups.adopt(record) for record in reply.groups])
        under_way = self._under_way
        self.pages += 1
        if group < len(under_way.groups):
            self._forward_group(under_way, group, {pos: (topic, body) for pos, topic, body in reply.frames},
                                more=next_group == group)
        if next_group >= len(under_way.groups):
            self._end()
            return
        self._asked, self._asked_at, self._tries = (next_group, next_after), now, 0
        self.link.ask_adoption(self._asked)  # lost: asked again after PAGE_TIMEOUT

    def adopt(self, adoption: protocol.Adoption) -> None:
        """Take the whole adoption at once (a replica of before pages)."""
        self.commands.mark_applied(adoption.applied)  # an earlier incarnation's: not again
        if not adoption.ended:
            return
        self._under_way = _Adopting(adoption, [self.groups.adopt(record) for record in adoption.groups])
        frames = {pos: (topic, body) for pos, topic, body in adoption.frames}
        for index in range(len(adoption.groups)):
            self._forward_group(self._under_way, index, frames, more=False)
        self._end()

    def _forward_group(self, under_way: _Adopting, index: int, frames: dict[int, tuple[bytes, bytes]],
                       more: bool) -> None:
        """A page of group `index`'s frames forwarded again (`more`: pages of it follow)."""
        record, group = under_way.first.groups[index], under_way.groups[index]
        pending: dict[int, list[tuple[int, int, int]]] = {}
        for pos, idx, count, deliveries in record.pending:
            pending.setdefault(pos, []).append((idx, count, deliveries))
        wanted = [pos for pos in sorted(frames) if not record.is_pending_whole(pos) or group.matches(frames[pos][0])]
        if under_way.current != index:  # its first page
            under_way.current, under_way.start = index, self.retention.next_pos
            # Over its share: on disk, read back later (its deliveries counted afresh), not in memory.
            under_way.offer = not self.spill.enabled or (
                not more and sum(len(frames[p][1]) for p in wanted) <= self.spill.share())
        for pos in wanted:
            topic, body = frames[pos]
            runs = pending.get(pos) if not record.is_pending_whole(pos) else [(0, 1 << 62, 0)]
            if runs:
                under_way.messages += self._forward_again(group, topic, body, runs, under_way.offer)
        if not under_way.offer:
            self.disk.flush(time.monotonic())  # written before the memory tail lets them go
            if not more and self.retention.next_pos > under_way.start:
                under_way.spilled.append((group, under_way.start, self.retention.next_pos))

    def _end(self) -> None:
        under_way, self._under_way = self._under_way, None
        self.adopting = False
        if under_way is None:
            return
        last = self.retention.next_pos
        self.feed.adopted(under_way.first.high, time.monotonic() + self.publisher_ttl, last)
        for group, first, end in under_way.spilled:  # the frames after a group's own were forwarded for the others
            group.spilled_from, group.spill_gap = first, (end, last) if last > end else (0, 0)
        log.info("adopted %d consumer groups of %s: %d pending messages", len(under_way.groups),
                 under_way.first.ended, under_way.messages)
        self._send_state_now()

    def _forward_again(self, group: Group, topic: bytes, body: bytes, runs: list[tuple[int, int, int]],
                       offer: bool = True) -> int:
        try:
            d = protocol.decode_delivery(body)
        except ProtocolError:
            return 0
        count = 0
        for idx, length, deliveries in runs:
            end = min(len(d.seqs), idx + length)
            if idx >= end:
                continue
            attrs = [[a[0] - idx, *a[1:]] for a in d.attrs or () if idx <= a[0] < end]
            # Cut as a batch is (exchange/grouping.py): each frame reaches the subscribers of its messages.
            for frame in frames_of(self.chains, d.seqs[idx:end], d.message_topics(topic)[idx:end],
                                   d.payloads[idx:end], attrs):
                pos = self._send(frame.topic, d.publisher, d.sent_ns, frame.seqs, frame.payloads,
                                 sum(map(len, frame.payloads)), frame.attrs, offer=False, topics=frame.topics)
                if offer:
                    self.groups.offer(pos, frame.topic, d.publisher, d.sent_ns, frame.seqs, frame.payloads,
                                      [tuple(a) for a in frame.attrs or ()] or None, only=group,
                                      deliveries=deliveries, topics=frame.topics)
            count += end - idx
        return count
