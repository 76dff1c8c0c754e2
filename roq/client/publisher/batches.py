"""How a publisher's link sends the log's batches to its exchange: never blocking, at most
MAX_IN_FLIGHT unacknowledged, a batch smaller than full only while none is in flight (or, with
client.eager_in_flight, a small one while fewer than that many are).

The replay window goes first, merged back into full batches. A batch of one topic travels in two
parts (the payloads as one block the exchange passes on as it is), any other as one frame. A send
the socket refuses (the exchange's queue to us is full: it is not reading) stops the round and
returns False: the link moves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq

from roq import protocol
from roq.client.publisher.chunks import ChunkLog, merge
from roq.config import Config

# Batches sent but not yet acked. More than one round trip's worth: the I/O thread may wait up to
# a GIL switch interval (5 ms) while the application thread builds messages, and at 1M msg/s
# that is 2 to 3 full batches the exchange should not go without.
MAX_IN_FLIGHT = 4
# A payload block this big is handed to libzmq without a copy (pyzmq then keeps it until sent):
# client.zero_copy_send_bytes' default.
ZERO_COPY_BYTES = 64 << 10
_NOBLOCK, _MORE_NOBLOCK = int(zmq.NOBLOCK), int(zmq.SNDMORE | zmq.NOBLOCK)


class BatchSender:
    def __init__(self, publisher_id: str, config: Config, chunk_log: ChunkLog, cond: threading.Condition,
                 on_take: Callable[[], None]) -> None:
        """`chunk_log` is only touched under `cond`'s lock; `on_take()` is called (under it) each
        time a batch is taken from the log."""
        self.id = publisher_id
        self.config = config
        self._log = chunk_log
        self._cond = cond
        self._on_take = on_take

    def send(self, sock: zmq.Socket) -> bool:
        """Send what may go now; False when the socket would block (the rest waits for the next)."""
        log, client = self._log, self.config.client
        with self._cond:
            resend = log.take_resend()
        # The replay window's seqs are consecutive and end where the log starts; chunks sealed at a
        # low rate hold a message or two, so they are merged back into full batches.
        for first, flat in merge(resend, client.max_batch, client.max_batch_bytes):
            if not self._send_batch(sock, first, flat):
                return False
        while len(log.in_flight) < MAX_IN_FLIGHT:
            with self._cond:
                if log.in_flight and not log.full_batch_waiting() and not self.may_go_early():
                    # A batch smaller than full waits for the ack of those in flight and grows
                    # meanwhile: each frame costs the exchange about 250 µs of CPU on a 2-vCPU VM,
                    # so one small frame per message kept it 60% busy at 10k msg/s.
                    return True
                chunk = log.take()
                self._on_take()
            if chunk is None:
                return True
            if not self._send_batch(sock, chunk.first, chunk.flat):
                return False
        return True

    def may_go_early(self) -> bool:
        """client.eager_in_flight (a prototype): a small batch goes while few are in flight, so at a
        low rate a message need not wait for the acks of those before it (caller holds the lock)."""
        log, client = self._log, self.config.client
        waiting = log.open_count()
        return len(log.in_flight) < client.eager_in_flight and 0 < waiting <= client.eager_batch_messages

    def eager_idle(self) -> bool:
        """With client.eager_in_flight: nothing waits to be sent and a small batch could still go
        now, so publish() must wake the I/O thread (at a high rate the log is rarely empty here,
        and acks wake it as before)."""
        log = self._log
        return len(log.in_flight) < self.config.client.eager_in_flight and not log.open_count() \
            and not log.unsent

    def _send_batch(self, sock: zmq.Socket, first: int, flat: list[bytes]) -> bool:
        """Messages first, first+1, ... as one batch: without attributes, in two parts (the topics,
        then the payloads' block the exchange splices); with some, as one frame."""
        if self.config.client.payload_blocks and type(flat[0]) is bytes:
            topics = flat[0::2]
            if set(map(type, topics)) == {bytes}:  # an attributed topic is a list (or an Attributed)
                head, block, *parts = protocol.encode_batch_message(self.id, first, time.time_ns(), topics,
                                                                    flat[1::2], self.config.client.large_payload_bytes)
                return _send_frame(sock, head, block, parts, self.config.client.zero_copy_send_bytes)
        return _send_frame(sock, protocol.encode_batch(self.id, first, time.time_ns(), flat))


def _send_frame(sock: zmq.Socket, frame: bytes, block: bytes | None = None, parts: list[bytes] | None = None,
                zero_copy: int = ZERO_COPY_BYTES) -> bool:
    """Never block: an exchange whose queue to us is full is not reading (dead or stuck). A
    message's first part queued means the rest is too. `parts`: large payloads, each a part of its
    own after the block. The block and parts of at least `zero_copy` bytes (0: none) go to libzmq
    without a copy (the log keeps the bytes until acked)."""
    zero_copy = zero_copy or 1 << 62
    try:
        if block is None:
            sock.send(frame, _NOBLOCK)
        else:
            sock.send(frame, _MORE_NOBLOCK)
            sock.send(block, _MORE_NOBLOCK if parts else _NOBLOCK, copy=len(block) < zero_copy)
            if parts:
                _send_parts(sock, parts, zero_copy)
        return True
    except zmq.Again:
        return False


def _send_parts(sock: zmq.Socket, parts: list[bytes], zero_copy: int) -> None:
    last = len(parts) - 1
    for index, part in enumerate(parts):
        sock.send(part, _NOBLOCK if index == last else _MORE_NOBLOCK, copy=len(part) < zero_copy)
