"""PublisherLink: a publisher's I/O thread, the one owner of its socket to one exchange at a time.

The link chooses the exchange, says hello, sends the log's batches, reads the replies and moves;
`Publisher` (roq.client.publisher.api) only appends to the log and wakes it through a pipe. The log
and its condition belong to the Publisher: the link touches the log only under that lock. A move
(asked, the exchange gone, or no confirm for `client.confirm_timeout`) resends the replay window and
everything unconfirmed to another exchange; a `storage_full` exchange is avoided; move requests from
watch threads are never lost (`request_move` / `_take_move`). The rules: docs/client.md "How a
publisher's link works", docs/protocol.md section 3.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from roq import protocol
from roq.client.io_thread import QueueIoThread
from roq.client.metadata import MetadataClient
from roq.client.publisher.batches import BatchSender
from roq.client.publisher.chunks import ChunkLog
from roq.client.publisher.exchange_choice import ExchangeChoice
from roq.client.publisher.exchange_socket import ExchangeSocket
from roq.client.publisher.socket_owner import SocketOwner
from roq.config import Config
from roq.errors import ProtocolError
from roq.records import ExchangeStats
from roq.security import refusal_text

STORAGE_FULL = "storage_full"  # the code a `move` reason starts with when the exchange cannot store (3.3)

log = logging.getLogger(__name__)

HELLO_RETRY = 1.0  # a hello unanswered this long is sent again (it may have been lost with a connection)


class PublisherLink(QueueIoThread):
    def __init__(self, queue: str, config: Config, metadata: MetadataClient, publisher_id: str, token: bytes,
                 chunk_log: ChunkLog, cond: threading.Condition, prefer: str | None,
                 on_queue_changed: Callable[[bool], None]) -> None:
        """Watch the queue and start the I/O thread. `chunk_log` is only touched under `cond`'s
        lock; `on_queue_changed(deleted)` is called from watch threads when the queue is deleted
        or created again (and on endpoint changes)."""
        self.id = publisher_id
        self._token = token
        self._log = chunk_log
        self._cond = cond
        self._on_queue_changed = on_queue_changed
        self.prefer = prefer
        self._move_lock = threading.Lock()
        self._move_request: str | None = None  # set by any thread, taken by the I/O thread
        self._awaiting_welcome = False  # batches wait until the exchange said what it holds
        self._hello_sent = 0.0
        self._last_reply = 0.0  # the confirm timeout counts from here (the I/O thread, or a caller's send)
        self._choice = ExchangeChoice(publisher_id, config.exchange.stats_interval)
        self._incarnation = ""  # of the exchange we publish to
        self.xid: str | None = None  # id of the exchange we publish to
        self.subscribers = 0  # RoQ subscribers connected to our exchange, as it last reported
        self._want_hello = False
        self._endpoint: str | None = None  # where the current exchange was when we connected
        # Set by publish() when it wakes the I/O thread (or sends itself, client.caller_send); cleared by
        # the I/O thread when it can take more, so while batches are in flight publish() costs no system call.
        self.wake_pending = False
        # Set by publish() when it wakes the I/O thread for a full batch while others are in flight;
        # cleared when the I/O thread takes a batch.
        self.full_signalled = False
        self.moves = 0
        self.resends = 0  # times an exchange asked us to resend (lost bytes, a refused batch)
        self.reconnects = 0  # connections ZeroMQ re-established under us (each followed by a hello)
        self.replayed = 0  # confirmed messages resent after moves
        self.rejected: list[tuple[int, str, str]] = []
        self.storage_full: str | None = None  # why confirms wait: an exchange's `storage_full` reason
        # Why the exchange we connect to refused our handshake (no publish right, unknown key, too many
        # connections); None once a handshake succeeds. libzmq keeps retrying underneath.
        self.refusal: str | None = None
        self.relocations = 0
        self._sender = BatchSender(publisher_id, config, chunk_log, cond, self._batch_taken)
        # Held by the I/O thread but while it sleeps, when publish() may send itself (client.caller_send)
        self._owner = SocketOwner(config.client.caller_send)
        super().__init__(metadata, config, queue, f"publisher-{publisher_id}", self._topology_changed,
                         self._on_relocations)
        self._on_relocations(self.topology.relocations)
        self._start_thread()  # it says goodbye to the exchange when closed

    def _batch_taken(self) -> None:
        self.full_signalled = False

    def request_hello(self) -> None:
        """Ask the I/O thread to say hello again (the welcome reports the subscribers)."""
        self._want_hello = True
        self.wake()

    def request_move(self, reason: str) -> None:
        """Ask the I/O thread to move (any thread); the first reason since the last move wins."""
        with self._move_lock:
            if self._move_request is None:
                self._move_request = reason
        self.wake()

    def send_from_caller(self) -> bool:
        """client.caller_send: send what may go from the calling thread if the I/O thread sleeps
        with an exchange that welcomed us; False when it did not (then wake the I/O thread)."""
        return self._owner.try_send(self._send_from_caller, self.wake)

    def _send_from_caller(self, sock: zmq.Socket) -> bool:
        """What the I/O thread's turn would send, by the same rules (BatchSender's), under the lock."""
        if self._closed or self._awaiting_welcome or self._want_hello or self._move_request is not None:
            return False  # the I/O thread has more to do than send: its turn
        if not self._log.in_flight:  # the confirm timeout counts from here, not from the silence before
            self._last_reply = time.monotonic()
        self._send_round(sock)
        return True

    def _send_round(self, sock: zmq.Socket) -> None:
        """Send what may go. Idle after it: from here on publish() must wake us (or send itself),
        and what came before is taken now. With batches in flight their acks wake us."""
        self._send_batches(sock)
        if not self._log.in_flight or self._sender.eager_idle():
            self.wake_pending = False
            self._send_batches(sock)

    def _take_move(self) -> str | None:
        with self._move_lock:
            reason, self._move_request = self._move_request, None
        return reason

    # ------------------------------------------------------------ topology (the metadata client's thread)

    def _on_relocations(self, relocations: dict[str, Any]) -> None:
        """The leader moves a heavy publisher off an overloaded exchange by naming it here."""
        if not self._closed and self._choice.relocation(relocations) is not None:
            self._follow_relocation()

    def _follow_relocation(self) -> None:
        """Move to the exchange the leader named, as soon as it runs (a new one may still be starting)."""
        target = self._choice.relocated_to
        if target and self.prefer is None and self.xid != target and target in self.topology.snapshot():
            self.relocations += 1
            self.request_move(f"relocated by the leader to {target}")

    def _topology_changed(self) -> None:
        self._on_queue_changed(self.topology.deleted)
        self._follow_relocation()
        live = self.topology.snapshot()
        current = self.xid
        if current is not None and current not in live:
            self.request_move(f"exchange {current} disappeared")
        elif current is not None and live[current].get("pub") != self._endpoint:
            self.request_move(f"exchange {current} restarted elsewhere")  # same id, new process
        self.wake()

    # ------------------------------------------------------------ I/O thread

    def _run(self) -> None:
        context = zmq.Context()
        conn: ExchangeSocket | None = None
        poller = zmq.Poller()  # one for the thread's life; the socket is swapped in and out
        poller.register(self._wake.fd, zmq.POLLIN)
        self._last_reply = time.monotonic()
        owner = self._owner
        owner.lock.acquire()  # the socket is ours except while we sleep (owner.released())
        try:
            while not self._closed:
                reason = self._take_move()
                if reason and conn is not None:
                    log.info("publisher %s moving: %s", self.id, reason)
                    owner.offer(None)
                    conn.drop(poller)
                    conn, self.xid = None, None
                    self.moves += 1
                if conn is None:
                    conn = self._connect(context, poller)
                    self._last_reply = time.monotonic()
                    if conn is None:
                        with owner.released():
                            self._idle(poller, 100)
                        continue
                    owner.offer(conn.sock)
                self._turn(conn)
                timeout = 0 if owner.readable(conn.sock) else 100
                with owner.released():
                    self._idle(poller, timeout)
                while conn.sock.poll(0):
                    self._handle_reply(conn.sock, conn.sock.recv())
                    self._last_reply = time.monotonic()
                waiting = self._log.in_flight or self._awaiting_welcome
                if waiting and time.monotonic() - self._last_reply > self.config.client.confirm_timeout:
                    self._avoid_current()
                    if full := _storage_full_in_stats(self.topology.snapshot(), self.queue, self.xid):
                        self._note_storage_full(full)
                    self.request_move(f"no answer from {self.xid} for {self.config.client.confirm_timeout:.1f}s")
            if conn is not None:
                try:
                    conn.sock.send(protocol.encode_bye(self.id), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a full pipe: the exchange forgets us after exchange.publisher_ttl
        finally:
            owner.offer(None)
            if conn is not None:
                conn.close(linger=100)
            owner.lock.release()
            context.term()

    def _turn(self, conn: ExchangeSocket) -> None:
        """Hello again after a reconnection; send what may go; hello when asked or unanswered."""
        sock = conn.sock
        reconnected, refused = conn.handshakes()
        if refused and self.refusal is None:
            self.refusal = refusal_text(self.config, conn.endpoint, "publish")
            log.error("publisher %s: %s", self.id, self.refusal)
        elif refused is False:
            self.refusal = None
        if reconnected:
            self.reconnects += 1
            self._say_hello(sock, rewind=True)
        if not self._awaiting_welcome:
            self._send_round(sock)
        if self._want_hello or (self._awaiting_welcome and time.monotonic() - self._hello_sent > HELLO_RETRY):
            self._want_hello = False
            self._say_hello(sock)

    def _idle(self, poller: zmq.Poller, timeout_ms: int) -> None:
        """Wait for a reply, a wake-up from publish(), or the timeout."""
        if dict(poller.poll(timeout_ms)).get(self._wake.fd):
            self._wake.drain()

    def _connect(self, context: zmq.Context, poller: zmq.Poller) -> ExchangeSocket | None:
        choice = self._choose_exchange()
        if choice is None:
            return None
        xid, data = choice
        conn = ExchangeSocket(context, self.config, data["pub"])
        self._endpoint = conn.endpoint
        self._incarnation = str(data.get("incarnation", ""))
        self._choice.connected(xid)
        with self._cond:
            self.xid = xid
        self._say_hello(conn.sock, rewind=True)
        conn.watch(poller, self._owner.poll_target(conn.sock))
        log.info("publisher %s publishing to %s/%s at %s", self.id, self.queue, xid, conn.endpoint)
        return conn

    def _say_hello(self, sock: zmq.Socket, rewind: bool = False) -> None:
        """`hello` with the lowest sequence number we may send. With `rewind`, batches wait for
        the welcome, which says from where to send again."""
        with self._cond:
            self._log.trim_replay(time.monotonic())
            from_seq = self._log.lowest_held()
            if rewind:
                self._awaiting_welcome = True
        self._hello_sent = time.monotonic()
        try:
            sock.send(protocol.encode_hello(self.id, self._token, from_seq), zmq.NOBLOCK)
        except zmq.Again:
            pass  # retried after HELLO_RETRY, or we move on the confirm timeout

    def _on_welcome(self, last: int) -> None:
        """The exchange holds everything of ours up to `last`: send everything above it again,
        the replay window's part first (caller: the I/O thread, awaiting a welcome)."""
        with self._cond:
            self._awaiting_welcome = False
            count = self._log.rewind(last, time.monotonic())
            self.replayed += count
        if count:
            log.info("publisher %s resending %d confirmed messages to %s", self.id, count, self.xid)

    def _avoid_current(self) -> None:
        if self.xid is not None:
            self._choice.avoid(self.xid, self._incarnation)

    def _choose_exchange(self) -> tuple[str, dict[str, Any]] | None:
        try:
            live = self.topology.refresh()  # fresh statistics: the watch only follows endpoints
        except Exception:  # ZooKeeper unreachable: what we saw last will do
            live = self.topology.snapshot()
        return self._choice.choose(live, self.prefer)

    def _send_batches(self, sock: zmq.Socket) -> None:
        if not self._sender.send(sock):
            self._avoid_current()
            self.request_move(f"exchange {self.xid} is not taking batches")

    def _handle_reply(self, sock: zmq.Socket, frame: bytes) -> None:
        try:
            reply = protocol.decode_exchange_reply(frame)
        except ProtocolError as err:
            log.warning("publisher %s: bad reply from exchange: %s", self.id, err)
            return
        kind = reply.kind
        if kind == protocol.ACK:
            self._on_ack(reply.seq, reply.subscribers)
        elif kind == protocol.WELCOME:
            self._on_ack(reply.seq, reply.subscribers)
            if self._awaiting_welcome:
                self._on_welcome(reply.seq)
        elif kind == protocol.RESEND:
            # Replies to batches sent before our hello arrive before its welcome: ignore them.
            if not self._awaiting_welcome:
                log.info("publisher %s: %s asks to resend from %d (%s); saying hello again",
                         self.id, self.xid, reply.seq, reply.code)
                if reply.code == protocol.MALFORMED:
                    log.error("publisher %s: exchange refused a batch as malformed: %s", self.id, reply.message)
                self.resends += 1
                self._say_hello(sock, rewind=True)
        elif kind == protocol.REJECT:
            self.rejected.append((reply.seq, reply.code, reply.message))
            log.error("publisher %s: message %s rejected: %s", self.id, reply.seq, reply.message)
        elif kind == protocol.MOVE:
            if reply.message.startswith(STORAGE_FULL):
                self._avoid_current()  # it reads nothing until it has room: others first
                self._note_storage_full(reply.message)
            self.request_move(f"exchange asked: {reply.message}")
        elif kind == protocol.ERROR:
            log.error("publisher %s: exchange refused a frame: %s: %s", self.id, reply.code, reply.message)
            if reply.code == "refused":  # our hello: limits, or (never from us) a token mismatch
                self._avoid_current()
                self.request_move(f"exchange {self.xid} refused us: {reply.message}")

    def _on_ack(self, seq: int, subscribers: int | None) -> None:
        with self._cond:
            if subscribers is not None:
                self.subscribers = subscribers
            if seq > self._log.acked:
                self.storage_full = None  # confirms flow again
            self._log.confirm(seq, time.monotonic())
            self._cond.notify_all()

    def _note_storage_full(self, reason: str) -> None:
        if self.storage_full is None:
            log.warning("publisher %s: %s; confirms wait until it has room or the leader moves it to a host "
                        "that has (nothing unconfirmed is lost)", self.id, reason)
        self.storage_full = reason


def _storage_full_in_stats(live: dict[str, Any], queue: str, xid: str | None) -> str | None:
    """Silent exchange: if its statistics say its storage is full, that is why."""
    stats = ExchangeStats.from_dict((live.get(xid or "") or {}).get("stats"))
    if stats.storage_full:
        return f"{STORAGE_FULL}: exchange {queue}/{xid} cannot write its journal ({stats.storage_error})"
    return None

