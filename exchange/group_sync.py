"""Consumer groups across incarnations: adopted at start, copied to the replica as they change.

With a replica, a starting exchange first adopts the groups its earlier incarnation left
(exchange/group_adopt.py). Afterwards the members' acks go to the replica as they come, and the
groups' whole state when it changed, at most every GROUP_SYNC (protocol section 7.6); an ack's
credit comes back to its member once the replica holds it (a mark answered), so that a failover
never delivers again what was acked.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from exchange.fanout import Fanout
from exchange.group_adopt import GroupAdoption
from exchange.groups import Member
from exchange.parts import Parts
from roq import protocol

log = logging.getLogger(__name__)

GROUP_SYNC = 0.1  # s between two copies of the groups' state to the replica ...
GROUP_SYNC_BYTES_PER_S = 20e6  # ... or longer for a big one
MAX_GROUP_STATE = 16 << 20  # a bigger state is not copied (the last copy stands)


class GroupSync:
    def __init__(self, parts: Parts, fanout: Fanout) -> None:
        self.link = parts.link  # None: no replica keeps the groups (adopt still takes what it is given)
        self.groups = parts.groups
        self.retention = parts.retention
        self.incarnation, self.copy_secret = parts.stream.incarnation, parts.stream.copy_secret
        self.adoption = GroupAdoption(parts, fanout, self._send_state_now)
        self._groups_sent: tuple[float, Any, int] = (0.0, None, 0)  # when, what, how big
        # Members' acks waiting for the replica: those in frames sent before a mark, by its serial;
        # and those in no frame yet (their `done` could not go), which the next state sent covers.
        self._acks_marked: deque[tuple[int, list[tuple[Member, int]]]] = deque()
        self._acks_unsent: list[tuple[Member, int]] = []
        self._marks_follow = 0  # the link's `follows` the marks above were sent under
        self._state_groups: set[str] = set()  # the groups of the last state copied
        self._state_too_big = False  # the last state was not copied (MAX_GROUP_STATE): acks cannot wait

    # ------------------------------------------------------------ at start

    @property
    def adopting(self) -> bool:
        """Until the replica answered the whole adoption (or did not, in time)."""
        return self.adoption.adopting

    def adoption_step(self) -> None:
        self.adoption.step()

    def adopt(self, adoption: protocol.Adoption) -> None:
        self.adoption.adopt(adoption)

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

    def _send_state_now(self) -> None:
        """Our own groups' state to the replica at the next turn (an adoption ended)."""
        self._groups_sent = (0.0, None, 0)

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
