"""The primary's side of a state transfer: what its disk holds below a new replica's copy.

A replica that starts following after the primary's memory moved on gets its copy from the oldest
frame the memory holds (a `copy` with `jump`: exchange/replication.py), so that confirms wait only
for that bounded catch-up. What lies below, in the primary's segment store (hours of it, maybe),
goes as `fill` pages (protocol section 6.5) beside the copy pages on the same connection: read from
the store a page at a time, at most FILL_WINDOW pages unanswered, sent only while the copy pages
leave room, so memory stays bounded and confirms never wait for it. The replica writes them to a
store of its own and answers `filled next_pos`; at `end` (where its copy starts) the replica is
in sync. A silent replica gets the pages again from where it last answered; a page it cannot
place (a gap) is answered with where it is, and the transfer goes on from there. After either
sign of loss one page is out at a time, and the window doubles back with each answer that moves
on: a full window resent into a loss that recurs with it would never get its first page through. The same class
sends a store of an earlier incarnation whole (`fill_ended`: exchange/replication.py offers each).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from exchange.segment_store import SegmentStore
from roq import protocol

log = logging.getLogger(__name__)

FILL_WINDOW = 4  # fill pages sent and not yet answered
RESEND_AFTER = 2.0  # seconds without an answer while fill pages are out: send again from the last answer


def _no_store() -> SegmentStore | None:
    return None


class TransferOut:
    def __init__(self, incarnation: str, proof: bytes, page_bytes: int, ended: str = "") -> None:
        """`ended`: the transfer of that earlier incarnation's store (`fill_ended`), whole; else of
        the running incarnation's store below the replica's copy."""
        self.incarnation = incarnation
        self.ended = ended
        self.proof = proof
        self.page_bytes = page_bytes
        self.store_of: Callable[[], SegmentStore | None] = _no_store  # our segment store (exchange/disk_tail.py)
        self.end = 0  # where the replica's copy starts: the transfer fills what lies below (0: none)
        self.first = 0  # where the transfer began
        self.next = 0  # the next position to send
        self.acked = 0  # the replica holds the transfer up to here
        self._jump = False  # the next page starts a new transfer at the replica
        self._out: deque[int] = deque()  # end position of each page not yet answered
        self._asked = 0.0  # when the oldest page out was sent, or an answer last came (pump's clock)
        self._heard = False  # an answer came since the last pump
        self.window = FILL_WINDOW  # pages out at most: 1 after a loss, doubling with each answer
        self.filled_frames = 0

    @property
    def in_sync(self) -> bool:
        """No transfer is due or under way: the replica holds what our store does (as far as we know)."""
        return self.end == 0

    def start(self, end: int, wanted_from: int) -> None:
        """The copy at the replica jumped to `end`, from `wanted_from` (what it had asked for):
        transfer what our store holds between."""
        store = self.store_of()
        self._out.clear()
        if store is None or end <= max(store.first_pos, wanted_from) or store.first_pos >= store.end_pos:
            self.end = 0
            return
        self.first = max(wanted_from, store.first_pos)
        self.end, self.next, self.acked, self._jump, self.window = end, self.first, 0, True, FILL_WINDOW
        log.info("state transfer to the replica: positions %d-%d from our segment store", self.next, end - 1)

    def start_whole(self) -> None:
        """Transfer all our store holds (an earlier incarnation's: it ended, its end is fixed)."""
        store = self.store_of()
        self._out.clear()
        if store is None or store.first_pos >= store.end_pos:
            self.end = 0
            return
        self.first = self.next = store.first_pos
        self.end, self.acked, self._jump, self.window = store.end_pos, 0, True, FILL_WINDOW
        log.info("state transfer of %s to the replica: positions %d-%d", self.ended, self.first, self.end - 1)

    def pump(self, now: float, send: Callable[[bytes], bool], room: bool) -> None:
        """Send what fits in the window while the copy leaves `room`; send again if silent."""
        if self.end == 0:
            return
        if self._heard:
            self._heard, self._asked = False, now
        if self._out and now - self._asked > RESEND_AFTER:
            self._out.clear()
            self.window = 1
            self.next, self._jump = (self.acked, False) if self.acked else (self.first, True)
        store = self.store_of()
        while room and store is not None and len(self._out) < self.window and self.next < self.end:
            page = self._page(store)
            if page is None:
                return
            first, frames = page
            if not send(protocol.encode_fill(self.incarnation, first, self.end, frames, self.proof, self._jump,
                                             self.ended)):
                return
            self._jump = False
            if not self._out:
                self._asked = now
            self.next = first + len(frames)
            self._out.append(self.next)

    def _page(self, store: SegmentStore) -> tuple[int, list[list[object]]] | None:
        """The next consecutive run of frames from our store (a gap, where retention or damage
        took positions, starts a new transfer at the replica). A loop, not a recursion: a store
        with many damaged stretches is passed one read at a time."""
        while True:
            start = max(self.next, store.first_pos)
            if start >= self.end:
                self.end = 0  # our retention deleted the rest meanwhile: nothing left to transfer
                return None
            result = store.read(start, self.end, self.page_bytes)
            if result.frames and result.frames[0].pos > start:
                start = result.frames[0].pos  # damaged records skipped: go on from the frame after them
            frames: list[list[object]] = []
            for frame in result.frames:
                if frame.pos != start + len(frames):
                    break  # damaged records skipped: send up to the gap, the next page jumps
                frames.append([int(frame.stored_at * 1e6), frame.topic, frame.body, frame.messages])
            if frames:
                if start > self.next:
                    self._jump = True
                return start, frames
            if result.next_pos <= start:
                return None
            self.next, self._jump = result.next_pos, True

    def on_filled(self, reply: protocol.Filled) -> None:
        if self.end == 0 or reply.end_pos != self.end or reply.ended != self.ended:
            return
        self._heard = True
        if reply.next_pos == 0:
            log.warning("the replica takes no state transfer toward position %d", self.end)
            self.end = 0
            return
        self.filled_frames += max(0, reply.next_pos - max(self.acked, 1))
        moved_on = reply.next_pos > self.acked
        self.acked = max(self.acked, reply.next_pos)
        if reply.next_pos >= self.end:
            log.info("state transfer complete: the replica holds our store up to position %d", self.end - 1)
            self.end = 0
            self._out.clear()
            return
        expected = self._out[0] if self._out else self.next
        if reply.next_pos < expected:  # a page it could not place: go on from where it is
            self._out.clear()
            self.next, self.window = reply.next_pos, 1
            return
        if moved_on:
            self.window = min(FILL_WINDOW, self.window * 2)
        while self._out and self._out[0] <= reply.next_pos:
            self._out.popleft()
