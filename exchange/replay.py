"""The replay socket: retention fetches and position checks, with bounded memory.

A ROUTER socket queues replies for peers that do not read them; unbounded, a few hundred fetches
that are never read pin gigabytes. Every reply leaves as a tracked zero-copy frame, so the bytes
libzmq still holds are known per connection and in total; a fetch beyond either budget is
answered with a small `busy` error (retry after reading what you asked for) instead of a page.

Besides its own running incarnation (none on a replica), a server may hold `archives`: copies of
other incarnations' streams (a replica's copies of its primary, an exchange's journal of its
earlier incarnations). Fetches naming one are served from it; a position request naming one
answers where that copy ends (every prefix's chain is taken to end there: the asker fetches the
whole range) once `on_ended` agreed: a replica seals the copy then, and refuses (`running`) while
the cluster still lists that incarnation as running (protocol section 6.3).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import zmq

from exchange import tiered
from exchange.chains import PrefixChains
from exchange.retention import Retention
from exchange.segment_store import SegmentStore
from roq import protocol
from roq.config import ExchangeConfig
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

REPLAY_HWM = 64  # replies queued per connection; small ones only, the byte budget bounds the rest


class LiveStream(NamedTuple):
    """The stream an exchange is writing (a replica has none: it serves only stored copies)."""
    retention: Retention
    chains: PrefixChains
    incarnation: str


class ReplayServer:
    def __init__(self, sock: zmq.Socket, limits: ExchangeConfig, count: Callable[[str, int], None],
                 live: LiveStream | None = None, archives: Mapping[str, Retention] | None = None,
                 on_ended: Callable[[str], bool] | None = None,
                 on_progress: Callable[[protocol.Progress], None] | None = None,
                 store_of: Callable[[str], SegmentStore | None] | None = None) -> None:
        """`limits`: the fetch and reply byte bounds (`exchange.fetch_max_bytes`, `replay_budget_bytes`;
        a connection holds at most two fetches' worth). `count(name, n)` adds to the exchange's
        counters (fetches, fetched_frames, malformed, busy). `live` is None on a replica, which only
        serves `archives`. `store_of(incarnation)`: its segment store, which serves what the
        memory no longer holds (exchange/tiered.py), and an earlier incarnation held only there."""
        self.sock = sock
        self.retention = live.retention if live is not None else None
        self.chains = live.chains if live is not None else None
        self.incarnation = live.incarnation if live is not None else ""
        self.archives: Mapping[str, Retention] = archives if archives is not None else {}
        self.on_ended = on_ended  # may a stored incarnation be read as ended (sealing it)? False: `running`
        self.on_progress = on_progress  # a durable subscriber's report (consumer lag); never answered
        self.store_of = store_of if store_of is not None else _no_store
        self.fetch_max_bytes = limits.fetch_max_bytes
        self.budget = limits.replay_budget_bytes
        self.per_connection = 2 * limits.fetch_max_bytes
        self._count = count
        self._in_flight: deque[tuple[zmq.MessageTracker, bytes, int]] = deque()  # (tracker, peer, bytes)
        self.held = 0  # reply bytes libzmq still holds
        self._held_by: dict[bytes, int] = {}

    def drain(self, budget: int = 16) -> None:
        for _ in range(budget):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 2:
                self.handle(frames[0], frames[1])
            elif len(frames) > 2:  # a request is one frame: refused, with the id its first frame names
                self._count("malformed", 1)
                self._send(frames[0], protocol.encode_replay_error(
                    _request_id_of(frames[1]), protocol.MALFORMED,
                    f"a request is one frame; this message had {len(frames) - 1}"))

    def handle(self, ident: bytes, payload: bytes) -> None:
        try:
            req = protocol.decode_replay_request(payload)
        except ProtocolError as err:
            self._count("malformed", 1)
            self._send(ident, protocol.encode_replay_error(_request_id_of(payload), err.code, str(err)))
            return
        if isinstance(req, protocol.PositionRequest):
            self._send(ident, self._position(req))
            return
        if isinstance(req, protocol.PositionAtRequest):
            self._send(ident, self._position_at(req))
            return
        if isinstance(req, protocol.Progress):
            if self.on_progress is not None:
                self.on_progress(req)
            return
        memory, incarnation = self._store(req.incarnation)
        if memory is None:
            self._send(ident, self._unknown(req.request_id, req.incarnation))
            return
        self.release()
        limit = min(req.max_bytes or self.fetch_max_bytes, self.fetch_max_bytes)
        if self.held + limit > self.budget or self._held_by.get(ident, 0) + limit > self.per_connection:
            self._count("busy", 1)
            self._send(ident, protocol.encode_replay_error(
                req.request_id, "busy", f"{self._held_by.get(ident, 0)} bytes of replies to this connection "
                f"and {self.held} in all are not yet sent: read them, then ask again"))
            return
        disk = self.store_of(incarnation)
        before = req.before or memory.next_pos
        # Frames the store has not written yet (its disk refuses writes, or the writer is behind)
        # are not lost: a page ends before them, and one that would start there says `pending`.
        page = tiered.read(memory, disk, req.after, before, req.prefixes, limit, wait_pending=True)
        if not page.frames and not page.done and page.scanned_to <= req.after:
            self._send(ident, protocol.encode_replay_error(
                req.request_id, "pending", f"position {req.after + 1} waits to be written to the segment store "
                "(its disk refuses writes, or the writer is behind): ask again later"))
            return
        self._count("fetches", 1)
        self._count("fetched_frames", len(page.frames))
        reply, *parts = protocol.encode_frames_message(
            req.request_id, incarnation, tiered.served_from(memory, disk), page.frames, page.scanned_to, page.done,
            page.lost, page.exact)
        self._send(ident, reply, tracked=True, parts=parts)

    def _store(self, incarnation: str) -> tuple[Retention | None, str]:
        """The stream a request names ("": our own running one); its memory part (empty for an
        earlier incarnation whose frames are only on disk)."""
        if self.retention is not None and incarnation in ("", self.incarnation):
            return self.retention, self.incarnation
        archive = self.archives.get(incarnation)
        disk = self.store_of(incarnation) if incarnation else None
        if disk is None:
            return archive, incarnation
        if archive is None:
            archive = Retention(0.0, 0, tombstones=0, first_pos=disk.end_pos)
        # A stored incarnation is never purged (a purge drops it whole): below its memory part
        # (empty, or reloaded from the journal) the store serves from its oldest frame.
        archive.floor = min(archive.floor, disk.first_pos)
        return archive, incarnation

    def _unknown(self, request_id: int, incarnation: str) -> bytes:
        return protocol.encode_replay_error(
            request_id, "unknown_incarnation", f"{incarnation or 'no incarnation'} is not held here "
            f"(running: {self.incarnation or 'none'}, stored: {len(self.archives)})")

    def _position(self, req: protocol.PositionRequest) -> bytes:
        """Where the stream is, and per prefix the last position of its chain (tracking it from now
        on if it was not: the answer is then the current position, so the asker fetches the range).
        For a stored, ended incarnation: where its copy ends, which seals it."""
        if req.incarnation and req.incarnation != self.incarnation:
            stored, _ = self._store(req.incarnation)
            if stored is None:
                return self._unknown(req.request_id, req.incarnation)
            if self.on_ended is not None and not self.on_ended(req.incarnation):
                return protocol.encode_replay_error(
                    req.request_id, "running", f"{req.incarnation} is still running as far as this replica "
                    "knows: its copy is not sealed; ask again once the incarnation ended")
            end = stored.next_pos
            served = tiered.served_from(stored, self.store_of(req.incarnation))
            return protocol.encode_position(req.request_id, req.incarnation, served, end,
                                            [end - 1] * len(req.prefixes))
        if self.retention is None or self.chains is None:
            return self._unknown(req.request_id, req.incarnation)
        next_pos = self.retention.next_pos
        last = [self.chains.track(prefix, next_pos) for prefix in req.prefixes]
        served = tiered.served_from(self.retention, self.store_of(self.incarnation))
        return protocol.encode_position(req.request_id, self.incarnation, served, next_pos, last)

    def _position_at(self, req: protocol.PositionAtRequest) -> bytes:
        """The first position stored at or after a time, of the running stream or a stored one
        (a stored incarnation is not sealed by this: it only reads)."""
        memory, incarnation = self._store(req.incarnation)
        if memory is None:
            return self._unknown(req.request_id, req.incarnation)
        disk = self.store_of(incarnation)
        return protocol.encode_position_at(req.request_id, incarnation, tiered.served_from(memory, disk),
                                           memory.next_pos, tiered.position_at(memory, disk, req.at))

    def _send(self, ident: bytes, body: bytes, tracked: bool = False, parts: Sequence[Any] = ()) -> None:
        """`parts`: large payloads' parts after a `frames` answer (the Frames retention holds: libzmq
        shares their buffers); the last part sent is the tracked one."""
        size = len(body) + sum(map(len, parts))
        try:
            self.sock.send(ident, zmq.SNDMORE | zmq.NOBLOCK)
            if not tracked:
                self.sock.send(body, zmq.NOBLOCK)
                return
            if parts:
                self.sock.send(body, zmq.SNDMORE | zmq.NOBLOCK)
                for part in parts[:-1]:
                    self.sock.send(part, zmq.SNDMORE | zmq.NOBLOCK, copy=False)
                body = parts[-1]
            # A new Frame over the same buffer: sent without a copy, and tracked.
            data = body.buffer if isinstance(body, zmq.Frame) else body
            tracker = self.sock.send(zmq.Frame(data, track=True, copy=False), zmq.NOBLOCK, copy=False, track=True)
        except zmq.ZMQError:
            return  # the subscriber is gone or its queue is full; it will ask again
        self._in_flight.append((tracker, ident, size))
        self.held += size
        self._held_by[ident] = self._held_by.get(ident, 0) + size

    def release(self) -> None:
        """Forget replies libzmq has finished with (written to the kernel, or dropped with their
        connection). All are looked at: one connection that never reads must not hold up the
        accounting of the others."""
        if not self._in_flight:
            return
        still: deque[tuple[zmq.MessageTracker, bytes, int]] = deque()
        for entry in self._in_flight:
            tracker, ident, size = entry
            if not tracker.done:
                still.append(entry)
                continue
            self.held -= size
            left = self._held_by[ident] - size
            if left:
                self._held_by[ident] = left
            else:
                del self._held_by[ident]
        self._in_flight = still


def _no_store(incarnation: str) -> SegmentStore | None:
    return None


def replay_socket(context: zmq.Context) -> zmq.Socket:
    """The ROUTER a replay server answers on (an exchange's or a replica's), unbound."""
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    sock.sndhwm = REPLAY_HWM
    sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_CONTROL_FRAME)  # requests are small
    return sock


def _request_id_of(payload: bytes) -> int | None:
    """Best-effort request id of a refused request, so the error can be matched."""
    try:
        msg = protocol.msgpack.unpackb(payload, raw=False) if len(payload) <= protocol.MAX_CONTROL_FRAME else None
    except Exception:
        return None
    if isinstance(msg, list) and len(msg) > 2 and isinstance(msg[2], int) and not isinstance(msg[2], bool) \
            and 0 <= msg[2] <= protocol.MAX_SEQ:
        return msg[2]
    return None
