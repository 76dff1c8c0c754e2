"""Consumer groups across incarnations: adopted at start, copied to the replica as they change.

With a replica, a starting exchange first asks it for the groups its earlier incarnation left
and takes them before reading any publisher or member (their resends must meet the adopted
groups); the pending messages are forwarded again in the new stream. With a disk storage policy a
group whose backlog is over its share of exchange.group_max_bytes is not handed it in memory: it
reads it back from our store a read-ahead at a time (exchange/group_spill.py), skipping the other
groups' backlogs forwarded after its own (its `spill_gap`). Afterwards the members' acks
go to the replica as they come, and the groups' whole state when it changed, at most every
GROUP_SYNC (protocol section 7.6); an ack's credit comes back to its member once the replica
holds it (a mark answered), so that a failover never delivers again what was acked.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from exchange.fanout import Fanout
from exchange.grouping import frames_of
from exchange.groups import Group, Member
from exchange.parts import Parts
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

ADOPT_TIMEOUT = 3.0  # s a replicated exchange waits at start for the groups its predecessor left
GROUP_SYNC = 0.1  # s between two copies of the groups' state to the replica ...
GROUP_SYNC_BYTES_PER_S = 20e6  # ... or longer for a big one
MAX_GROUP_STATE = 16 << 20  # a bigger state is not copied (the last copy stands)


class GroupSync:
    def __init__(self, parts: Parts, fanout: Fanout) -> None:
        self.link = parts.link  # None: no replica keeps the groups (adopt still takes what it is given)
        self.groups = parts.groups
        self.feed = parts.feed
        self.spill, self.disk = parts.spill, parts.disk
        self.commands = parts.commands
        self.retention = parts.retention
        self.publisher_ttl = parts.config.publisher_ttl
        self.incarnation, self.copy_secret = parts.stream.incarnation, parts.stream.copy_secret
        self._send = fanout.send
        self.chains = parts.chains
        self.adopting = self.link is not None  # until the replica answered (or ADOPT_TIMEOUT)
        self._adopt_asked = False
        self._adopt_deadline = time.monotonic() + ADOPT_TIMEOUT
        self._groups_sent: tuple[float, Any, int] = (0.0, None, 0)  # when, what, how big
        # Members' acks waiting for the replica: those in frames sent before a mark, by its serial;
        # and those in no frame yet (their `done` could not go), which the next state sent covers.
        self._acks_marked: deque[tuple[int, list[tuple[Member, int]]]] = deque()
        self._acks_unsent: list[tuple[Member, int]] = []
        self._marks_follow = 0  # the link's `follows` the marks above were sent under
        self._state_groups: set[str] = set()  # the groups of the last state copied
        self._state_too_big = False  # the last state was not copied (MAX_GROUP_STATE): acks cannot wait

    # ------------------------------------------------------------ at start

    def adoption_step(self) -> None:
        """Ask the replica for the groups our previous incarnation left, and take them."""
        link = self.link
        assert link is not None
        if link.adoption is not None:
            adoption, link.adoption = link.adoption, None
            self.adopting = False
            self.adopt(adoption)
        elif link.following and not self._adopt_asked:
            self._adopt_asked = link.ask_adoption()
        elif time.monotonic() > self._adopt_deadline:
            self.adopting = False
            log.warning("no answer from the replica about earlier consumer groups in %.0fs; starting without",
                        ADOPT_TIMEOUT)

    def adopt(self, adoption: protocol.Adoption) -> None:
        """Take the groups of `adoption.ended`: their pending messages are forwarded again, in our
        stream (so our replica holds them too), and offered to their group only, with their delivery
        counts. A publisher's resends up to its highest sequence number there are not new to groups."""
        self.commands.mark_applied(adoption.applied)  # an earlier incarnation's: not again
        if not adoption.ended:
            return
        frames = {pos: (topic, body) for pos, topic, body in adoption.frames}
        adopted = 0
        spilled: list[tuple[Group, int, int]] = []  # groups that read their backlog back: (group, first, end)
        for record in adoption.groups:
            group = self.groups.adopt(record)
            pending: dict[int, list[tuple[int, int, int]]] = {}
            for pos, idx, count, deliveries in record.pending:
                pending.setdefault(pos, []).append((idx, count, deliveries))
            wanted = [pos for pos in sorted(frames)
                      if not record.is_pending_whole(pos) or group.matches(frames[pos][0])]
            # Over its share: on disk, read back later (its deliveries counted afresh), not in memory.
            offer = not self.spill.enabled or sum(len(frames[p][1]) for p in wanted) <= self.spill.share()
            first = self.retention.next_pos
            for pos in wanted:
                topic, body = frames[pos]
                runs = pending.get(pos) if not record.is_pending_whole(pos) else [(0, 1 << 62, 0)]
                if runs:
                    adopted += self._forward_again(group, topic, body, runs, offer)
            if not offer and self.retention.next_pos > first:
                spilled.append((group, first, self.retention.next_pos))
                self.disk.flush(time.monotonic())  # written before the memory tail lets them go
        last = self.retention.next_pos
        self.feed.adopted(adoption.high, time.monotonic() + self.publisher_ttl, last)
        for group, first, end in spilled:  # the frames after a group's own were forwarded for the others
            group.spilled_from, group.spill_gap = first, (end, last) if last > end else (0, 0)
        log.info("adopted %d consumer groups of %s: %d pending messages", len(adoption.groups), adoption.ended,
                 adopted)
        self._groups_sent = (0.0, None, 0)  # our own state to the replica at once

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

    # ------------------------------------------------------------ while running

    def replicate(self, now: float) -> None:
        """Copy the members' acks to the replica as they come, and the groups' state when it changed,
        at most every GROUP_SYNC (longer for a big state), so a restarted exchange adopts them
        (protocol section 7.6); then mark, so that the acks' credit comes back once the replica
        holds them."""
        link = self.link
        assert link is not None
        if link.follows != self._marks_follow:  # a new follow: marks sent before it may go unanswered,
            self._marks_follow = link.follows  # and the state sent to it covers their acks
            for _, acks in self._acks_marked:
                self._acks_unsent += acks
            self._acks_marked.clear()
        done = self.groups.take_done()
        acks = self.groups.take_settling()
        covered: list[tuple[Member, int]] = []  # acks in a frame handed to the link this turn
        if done:  # at once: an ack copied is an ack a failover keeps
            if link.following and link.send_groups(protocol.encode_done(self.incarnation, done, self.copy_secret)):
                covered = acks
            else:
                self._acks_unsent += acks
                self._want_group_state()  # it carries them
        state = self._copy_group_state(now)
        if state and self._acks_unsent:
            covered += self._acks_unsent
            self._acks_unsent = []
        if covered:
            serial = link.mark()
            if serial is not None:
                self._acks_marked.append((serial, covered))
            else:
                self._acks_unsent += covered
                self._want_group_state()

    def _want_group_state(self) -> None:
        """Copy the groups' state again when it is next due, changed or not."""
        last, _, size = self._groups_sent
        self._groups_sent = (last, None, size)

    def _copy_group_state(self, now: float) -> bool | None:
        """Send the groups' state if it changed and is due, at once if a group came or went (a new
        group's acks must not reach the replica before the group does: it would adopt nothing of it).
        True: sent; False: not sent; None: too big to copy (the last copy stands)."""
        assert self.link is not None
        last, signature, size = self._groups_sent
        fresh = (self.link.follows, self.groups.signature())
        regrouped = self.groups.groups.keys() != self._state_groups
        if fresh == signature or (now < last + max(GROUP_SYNC, size / GROUP_SYNC_BYTES_PER_S) and not regrouped):
            return False
        frame = protocol.encode_groups(self.incarnation, self.groups.records(self.retention.next_pos),
                                       self.copy_secret)
        if len(frame) > MAX_GROUP_STATE:
            if size <= MAX_GROUP_STATE:
                log.warning("consumer group state of %d bytes is too big to copy to the replica: the last "
                            "copy stands (a failover delivers again what was acked since)", len(frame))
            self._groups_sent = (now, fresh, len(frame))
            self._state_groups, self._state_too_big = set(self.groups.groups), True
            return None
        if self.link.send_groups(frame):
            self._groups_sent = (now, fresh, len(frame))
            self._state_groups, self._state_too_big = set(self.groups.groups), False
            return True
        return False

    def settle_acks(self) -> None:
        """Free the credit of the acks the replica holds now (it answered their mark); or of all of
        them while we have no replica, or a state too big to copy: nothing can hold them then (a
        next replica, or a smaller state, carries them)."""
        link = self.link
        assert link is not None
        if link.endpoint is None or self._state_too_big:
            self.groups.hold_acks = False
            self.groups.settled(self.groups.take_settling() + self._acks_unsent +
                                [a for _, acks in self._acks_marked for a in acks])
            self._acks_unsent = []
            self._acks_marked.clear()
            return
        self.groups.hold_acks = True
        while self._acks_marked and self._acks_marked[0][0] <= link.marked:
            self.groups.settled(self._acks_marked.popleft()[1])
