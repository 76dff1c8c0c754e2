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
# An adoption under way never ends before its last page: the groups not reached yet hold their
# backlog only at the replica, so ending it would lose confirmed work. A silent replica is asked
# again with backoff, up to this long between two asks ...
MAX_PAGE_WAIT = 30.0
STALL_WARNING = 10.0  # ... and a stall this long is logged at warning, then once a minute
STALL_LOG_EVERY = 60.0


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


def page_lie(reply: protocol.Adoption, first: protocol.Adoption) -> str:
    """Why a paged answer cannot be true ("": it can), `first` being the adoption's first answer
    (the group states): a page must move forward, stay within the groups, and hold only frames of
    its group, ascending, above `after` and below the group's end (`upto`). Frames of messages not
    pending in `first` are no lie (see `not_pending`)."""
    assert reply.page is not None
    group, after, next_group, next_after = reply.page
    count = len(first.groups)
    if not first.ended:
        return "" if not reply.frames and (next_group, next_after) == (0, 0) else "frames without groups"
    if next_group > count or (next_group, next_after) <= (group, after) and next_group < count:
        return f"the next page {(next_group, next_after)} does not move forward from {(group, after)}"
    if group >= count:
        return "" if not reply.frames else f"frames of group {group} of {count}"
    record = first.groups[group]
    last = next_after if next_group == group else record.upto - 1
    if next_group == group and next_after >= record.upto:
        return f"the next page starts at {next_after}, beyond the group's end {record.upto}"
    positions = [pos for pos, _, _ in reply.frames]
    if positions != sorted(set(positions)):
        return "frames not ascending"
    for pos in positions:
        if not after < pos <= last:
            return f"a frame at {pos}, not a message of group {group} after {after}"
    return ""


def not_pending(reply: protocol.Adoption, first: protocol.Adoption) -> set[int]:
    """The positions of a true page's frames that are no pending message of its group in `first`.
    A replica whose host crashed mid-adoption plans again from its group files, synced on its tick:
    acks it had then lost, so more pending, and it answers the same page so on every ask."""
    assert reply.page is not None
    if reply.page[0] >= len(first.groups):
        return set()
    record = first.groups[reply.page[0]]
    pending = {p[0] for p in record.pending}
    return {pos for pos, _, _ in reply.frames if pos not in pending and not record.is_pending_whole(pos)}


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
        self._whole_asked = -1  # the link's follows when the whole adoption was asked last (-1: never)
        self._last_page = 0.0  # when the last page came (the stall figure counts from it)
        self._stall_logged = 0.0
        self._follows = 0  # the link's follows when we last asked: a new follow is asked at once

    @property
    def waiting_groups(self) -> int:
        """Groups of the ended incarnation whose pages have not all come yet (a figure)."""
        under_way, asked = self._under_way, self._asked
        return 0 if under_way is None or asked is None else len(under_way.groups) - asked[0]

    def stalled_for(self, now: float) -> float:
        """Seconds since the last page of an adoption under way came (0: none under way)."""
        return now - self._last_page if self._under_way is not None else 0.0

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
        if self._under_way is None and now > self._deadline and not self.link.following:
            self._give_up()  # no replica answers at all: none holds groups we could adopt
            return
        if now >= self._asked_at + self._wait or self.link.follows != self._follows:
            self._tries += 1  # else backing off (a new follow, the replica back, is asked at once)
            if self._under_way is not None:
                self._log_stall(now)
            if self.link.ask_adoption(self._asked):
                self._follows = self.link.follows
            self._asked_at = now
        if self._under_way is None and self._whole_asked != self.link.follows:
            # A replica of before pages drops the paged ask: asked whole, again at each new follow (its
            # answer may have been lost with its restart). Asked after the page: a replica in pages
            # then works the plan out and leaves the whole ask unanswered.
            if self.link.ask_adoption(None):
                self._whole_asked = self.link.follows

    @property
    def _wait(self) -> float:
        """How long an ask waits for its answer: PAGE_TIMEOUT, doubling after each 4 asks, at most
        MAX_PAGE_WAIT (a replica host restarting is asked often, a long-silent one not flooded)."""
        return min(PAGE_TIMEOUT * 2 ** (self._tries // 4), MAX_PAGE_WAIT)

    def _log_stall(self, now: float) -> None:
        stalled = self.stalled_for(now)
        if stalled >= STALL_WARNING and now >= self._stall_logged + STALL_LOG_EVERY:
            self._stall_logged = now
            log.warning("the replica has not answered the adoption at page %s for %.0fs: %d consumer groups "
                        "wait for their backlog (never dropped); publishers and members are held until it "
                        "answers", self._asked, stalled, self.waiting_groups)

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
        if self._under_way is not None and not reply.ended:
            # Not a repeat: the replica no longer holds the ended incarnation (it restarted without its
            # disk, or a new replica replaced it): the backlog not reached yet is gone with both hosts.
            log.error("the replica no longer holds the consumer groups being adopted (at page %s): %d groups "
                      "start without the backlog not reached", self._asked, self.waiting_groups)
            self._end()
            return
        if (group, after) != self._asked:
            return  # an answer to an earlier ask, taken already
        lie = page_lie(reply, self._under_way.first if self._under_way is not None else reply)
        if lie:
            log.warning("adoption: the replica's answer to page %s lies (%s): dropped, asked again",
                        self._asked, lie)
            return
        if self._under_way is None:
            self.commands.mark_applied(reply.applied)  # an earlier incarnation's: not again
            if not reply.ended:
                self.adopting = False
                return
            self._under_way = _Adopting(reply, [self.groups.adopt(record) for record in reply.groups])
        under_way = self._under_way
        self.pages += 1
        self._last_page = now
        if group < len(under_way.groups):
            dropped = not_pending(reply, under_way.first)
            if dropped:  # taken without them: dropping the page would ask the same one for ever
                log.warning("adoption: the replica's page %s holds %d frames that are no pending message of "
                            "group %d (its group state older than the one it answered first): left out",
                            self._asked, len(dropped), group)
            self._forward_group(under_way, group, {pos: (topic, body) for pos, topic, body in reply.frames
                                                   if pos not in dropped}, more=next_group == group)
        if next_group >= len(under_way.groups):
            self._end()
            return
        self._asked, self._asked_at, self._tries = (next_group, next_after), now, 0
        if self.link.ask_adoption(self._asked):  # lost: asked again after PAGE_TIMEOUT
            self._follows = self.link.follows

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
