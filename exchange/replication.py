"""The primary's side of replication: every retained frame is copied to the replica, and a
publisher's ack waits until the replica holds everything the stream held when it was earned.

A DEALER to the replica's `repl` endpoint (the HCM says where, on stdin); every frame carries this
incarnation's copy secret, pages go out at most WINDOW_PAGES unacknowledged, and `held` is what the
confirm gate (exchange/confirms.py) releases acks by. Frames the replica lacks stay in retention
(`protect_from`); a replica silent for RESYNC_AFTER is asked to `follow` again; `sealed` means this
incarnation must confirm nothing more. Consumer groups' state, marks and admin commands go on the
same connection. The whole design: docs/replication.md.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

import zmq

from exchange.replica_transfer import TransferOut
from exchange.retention import Retention
from exchange.segment_store import SegmentStore
from roq import protocol
from roq.config import Config
from roq.errors import ProtocolError
from roq.security import secure_client

log = logging.getLogger(__name__)

WINDOW_PAGES = 16  # pages sent and not yet acknowledged
RESYNC_AFTER = 2.0  # seconds without an answer while pages are out: ask the replica where it is


def copy_page_bytes(config: Config) -> int:
    """Payload of one `copy` frame (at least one delivery, so a big one may exceed it)."""
    return max(config.exchange.fetch_max_bytes // 4, 64 << 10)


def max_copy_frame(config: Config) -> int:
    """The largest `copy` frame a replica takes: a page plus one delivery of the largest batch."""
    return copy_page_bytes(config) + config.exchange.max_batch_bytes + (64 << 10)


class ReplicaLink:
    def __init__(self, context: zmq.Context, config: Config, retention: Retention, incarnation: str,
                 xid: str, proof: bytes) -> None:
        self.context = context
        self.proof = proof
        self.config = config
        self.retention = retention
        self.incarnation = incarnation
        self.xid = xid
        self.page_bytes = copy_page_bytes(config)
        self.endpoint: str | None = None
        self.sock: zmq.Socket | None = None
        self.following = False  # the replica said where it is
        self.held = 1  # every position below this is held by the current replica
        self.sent = 1  # next position to copy
        self._pages: deque[int] = deque()  # end position (exclusive) of each page not yet acknowledged
        self._asked = 0.0  # when we last said follow / sent a page with nothing heard since
        self.sealed = False
        self.broken = ""  # why the replica said it cannot store our copy (`broken`); "" while it can
        self.copied_frames = 0
        self.adoption: protocol.Adoption | None = None  # the replica's answer to `adopt`
        self.follows = 0  # times the replica said where it is: a new one needs the group state again
        # Marks (protocol 7.6): the replica answers one once it holds every group frame sent before it.
        self.marks_sent = 0  # serial of the last mark sent
        self.marked = 0  # the highest serial answered
        self._marks_dropped = 0  # marks sent before the last follow: no longer waited for
        self.recorded: set[str] = set()  # admin commands the replica said it holds (`applied` answered)
        self.transfer = TransferOut(incarnation, proof, self.page_bytes)  # what our disk holds below a jump
        # Our earlier incarnations' stores (exchange/disk_tail.py) go to each replica that follows us,
        # one at a time, after the running one's transfer: a host lost with its disk loses none of them.
        self.ended_stores: Callable[[], Mapping[str, SegmentStore]] = dict
        self.ended_transfer: TransferOut | None = None
        self._ended_done: set[str] = set()  # earlier incarnations this replica said it holds, or taken up
        retention.protect_from = self.held

    # ------------------------------------------------------------ wiring

    def point_to(self, endpoint: str | None) -> None:
        """Follow the replica at `endpoint` (None: there is none now)."""
        if endpoint == self.endpoint:
            return
        self._close_socket()
        self.endpoint = endpoint
        self.following = False
        if endpoint is None:
            log.warning("no replica: confirms wait until one is running")
            return
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = WINDOW_PAGES * 4
        secure_client(sock, self.config)
        sock.connect(endpoint)
        self.sock = sock
        self._follow()
        log.info("replicating to %s", endpoint)

    def close(self) -> None:
        self._close_socket()

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    def _follow(self) -> None:
        self._pages.clear()
        self._asked = time.monotonic()
        self._send(protocol.encode_follow(self.incarnation, self.xid, self.proof))

    def _send(self, frame: bytes) -> bool:
        if self.sock is None:
            return False
        try:
            self.sock.send(frame, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False  # not connected yet or queue full: the resync timer asks again

    # ------------------------------------------------------------ the loop's calls

    @property
    def blocked(self) -> bool:
        """Retention is over its byte bound with frames the replica lacks: take no more batches."""
        return self.retention.bytes > self.retention.max_bytes

    def pump(self, now: float) -> None:
        """Copy what the replica lacks, within the window; ask again if it went quiet."""
        if self.sock is None or self.sealed:
            return
        if (self._pages or not self.following or self.marks_waiting) and now - self._asked > RESYNC_AFTER:
            if not self.broken:
                log.warning("replica %s silent for %.1fs; asking where it is", self.endpoint, now - self._asked)
            self.following = False
            self._follow()
            return
        if not self.following:
            return
        self._pump_copies(now)
        # The transfer from disk only uses what the copy leaves of the window: confirms come first.
        room = len(self._pages) < WINDOW_PAGES // 2
        self.transfer.pump(now, self._send, room)
        if self.transfer.in_sync:
            self._pump_ended(now, room)

    def _pump_ended(self, now: float, room: bool) -> None:
        """Transfer our earlier incarnations' stores, oldest name first, one at a time (`fill_ended`)."""
        stores = self.ended_stores()
        transfer = self.ended_transfer
        if transfer is not None and (transfer.in_sync or transfer.ended not in stores):
            transfer = None  # done (or its store went with our retention): the next one
        if transfer is None:
            name = next((name for name in sorted(stores) if name not in self._ended_done), None)
            if name is None:
                self.ended_transfer = None
                return
            self._ended_done.add(name)
            transfer = TransferOut(self.incarnation, self.proof, self.page_bytes, ended=name)
            transfer.store_of = lambda: self.ended_stores().get(name)
            transfer.start_whole()
        self.ended_transfer = transfer
        transfer.pump(now, self._send, room)

    def _pump_copies(self, now: float) -> None:
        retention = self.retention
        while len(self._pages) < WINDOW_PAGES and self.sent < retention.next_pos:
            start = max(self.sent, retention.oldest)
            entries = retention.entries(start, self.page_bytes)
            if not entries and start < retention.next_pos:
                return
            # No entries at all: our memory evicted everything the replica lacks (an idle stream).
            # An empty page jumps the copy to our next position, so the transfer of our disk starts.
            # A frame with large payloads' parts is copied inline (its bytes in the body): a copy page
            # packs every body anyway (protocol section 6.1).
            inlined = [[topic, protocol.inline(body), messages] for topic, body, messages in entries]
            page = protocol.encode_copy(self.incarnation, start, inlined, self.proof, jump=start > self.sent)
            if not self._send(page):
                return
            if start > self.sent:  # the replica's copy starts here: what our disk holds below follows apart
                # From our store's first position, whatever the replica had asked for: at a jump it
                # drops what it held of this copy (a copy holds consecutive positions).
                self.transfer.start(start, 1)
            if not self._pages:
                self._asked = now
            self.sent = start + len(entries)
            self._pages.append(self.sent)

    def on_reply(self, frame: bytes) -> None:
        try:
            reply = protocol.decode_replica_reply(frame)
        except ProtocolError as err:
            log.warning("bad reply from replica %s: %s", self.endpoint, err)
            return
        if reply.incarnation != self.incarnation:
            return
        if isinstance(reply, protocol.Adoption):
            self.adoption = reply
            return
        if isinstance(reply, protocol.Recorded):
            self.recorded.add(reply.command_id)
            return
        if isinstance(reply, protocol.Filled):
            if not reply.ended:
                self.transfer.on_filled(reply)
            elif self.ended_transfer is not None:
                self.ended_transfer.on_filled(reply)
            return
        self._asked = time.monotonic()
        if isinstance(reply, protocol.Broken):
            self._on_broken(reply.reason)
            return
        if isinstance(reply, protocol.Marked):
            self.marked = max(self.marked, min(reply.serial, self.marks_sent))
            return
        if reply.kind == protocol.SEALED:
            if not self.sealed:
                log.error("replica %s sealed incarnation %s (a subscriber saw it end): nothing more is "
                          "confirmed here; restarting as a new incarnation", self.endpoint, self.incarnation)
            self.sealed = True
            return
        if self.broken:  # `following` and `copied` come only from a store that takes writes
            log.warning("replica %s stores our copy again", self.endpoint)
            self.broken = ""
        if reply.kind == protocol.FOLLOWING:
            if self.following:
                # An answer to a copy: the replica lost our thread (it restarted, or a gap): say
                # follow again, so that it applies its rules for a new follower, and go on from there.
                self.following = False
                self._follow()
                return
            # Start where it is: frames below our oldest were confirmed with an earlier replica.
            if reply.next_pos == 0:
                self.transfer.start(0, 0)  # a new copy: a transfer starts again at its jump
            self._ended_done.clear()  # each follow (a new replica, maybe) is offered our earlier stores again
            self.ended_transfer = None
            self.following = True
            self.follows += 1
            self._marks_dropped = self.marks_sent  # the state sent to this follow covers what they marked
            self._pages.clear()
            self.sent = max(reply.next_pos, 1)  # pump starts at our oldest if that is later
            self._set_held(max(reply.next_pos, 1))
            return
        if reply.kind == protocol.COPIED:
            while self._pages and self._pages[0] <= reply.next_pos:
                self._pages.popleft()
            self.copied_frames += max(0, reply.next_pos - self.held)
            self._set_held(max(reply.next_pos, self.held))  # one connection: acks never go back

    def _on_broken(self, reason: str) -> None:
        """The replica cannot store our copy: nothing more is confirmed on its strength (`held` stays);
        ask it again after RESYNC_AFTER (its disk may take writes again; a replica that gives up is
        started again by its HCM, and a new one follows afresh)."""
        if not self.broken:
            log.error("replica %s cannot store our copy (%s): confirms wait until it can, or until its "
                      "replacement holds what they wait for", self.endpoint, reason or "no reason given")
        self.broken = reason or "broken"
        self.following = False
        self._pages.clear()

    def ask_adoption(self, page: tuple[int, int] | None) -> bool:
        """Ask the replica for the consumer groups our exchange's earlier incarnation left: page
        (group, after) of them, or all at once (None)."""
        return self._send(protocol.encode_adopt(self.incarnation, self.xid, self.proof, page))

    def send_groups(self, frame: bytes) -> bool:
        """Our consumer groups' state (protocol.encode_groups or encode_applied), replacing the last one sent."""
        return self.following and self._send(frame)

    def mark(self) -> int | None:
        """Ask the replica to say when it holds every group frame sent so far: its answer raises
        `marked` to the serial returned (None: the mark could not be sent)."""
        if not self.following:
            return None
        serial = self.marks_sent + 1
        if not self._send(protocol.encode_mark(self.incarnation, serial, self.proof)):
            return None
        if not self._pages and not self.marks_waiting:
            self._asked = time.monotonic()  # nothing was out: silence counts from now
        self.marks_sent = serial
        return serial

    @property
    def marks_waiting(self) -> bool:
        """A mark sent since the last follow is not answered yet."""
        return self.marks_sent > max(self.marked, self._marks_dropped)

    def _set_held(self, next_pos: int) -> None:
        """`held` as the current replica reports it (it may go down when a new replica starts)."""
        self.held = min(next_pos, self.retention.next_pos)
        self.retention.protect_from = self.held
