"""PublisherLink: a publisher's I/O thread, the one owner of its socket to one exchange at a time.

The link chooses the exchange, says hello, sends the log's batches, reads the replies and moves;
`Publisher` (roq.client.publisher) only appends to the log and wakes it through a pipe. The log
and its condition belong to the Publisher: the link touches the log only under that lock.

Every connection starts with `hello`: the publisher proves it owns its id (derived from a
secret token, roq.protocol.publisher_id_for) and says the lowest sequence number it will send;
the exchange's `welcome` names the highest it already holds, and the publisher sends everything
it has above that. Batches are only sent after the welcome. An exchange that receives a batch
that does not continue where the last one ended (bytes lost with a broken connection) answers
`resend`, and the publisher says hello again and resends from the welcome: an ack never covers
a message the exchange did not get.

When the exchange asks us to move, disappears from ZooKeeper, or confirms
nothing for `client.confirm_timeout`, we connect to another exchange of the
queue (least loaded first, never one that just failed us or cannot store, its
journal's disk full, while another runs)
and resend every unconfirmed message, preceded by the replay window: the
messages confirmed in the last `client.replay_seconds` (at most
`client.replay_bytes`), which a dying exchange may have confirmed without its
subscribers getting them. Exchanges and subscribers drop what they already
had, by sequence number, so the application sees each message once.

An exchange that cannot store what it takes tells us `move` with a reason starting
`storage_full` (or its statistics say `storage_full` when it stops answering): we
log it once, avoid it, and keep the reason in `storage_full` until a confirm
arrives, so that `publish()` and `flush()` say why they wait.

Moves are requested by ZooKeeper watch threads and by the I/O thread itself through one
lock-guarded request (`request_move` / `_take_move`): a request is never lost.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from kazoo.client import KazooClient
from zmq.utils.monitor import recv_monitor_message

from roq import protocol
from roq.client.chunks import ChunkLog, merge
from roq.client.topology import QueueTopology
from roq.client.wake import WakePipe
from roq.config import Config
from roq.errors import ProtocolError
from roq.paths import Paths
from roq.records import ExchangeStats
from roq.security import HANDSHAKE_FAILED, refusal_text, secure_client

STORAGE_FULL = "storage_full"  # the code a `move` reason starts with when the exchange cannot store (3.3)

log = logging.getLogger(__name__)

# Batches sent but not yet acked. More than one round trip's worth: the I/O thread may wait up to
# a GIL switch interval (5 ms) while the application thread builds messages, and at 1M msg/s
# that is 2 to 3 full batches the exchange should not go without.
MAX_IN_FLIGHT = 4
AVOID_SECONDS = 30.0  # an exchange that failed us is not chosen again for this long while others run
HELLO_RETRY = 1.0  # a hello unanswered this long is sent again (it may have been lost with a connection)
# An exchange is stale (chosen last) when its HCM says it stopped reporting (`silent`), or when its
# statistics are older than the newest of the queue's by more than its znode's `heartbeat` (the
# longest its HCM leaves unchanged statistics unwritten; 0 if absent) plus this many report intervals
# (its znode's `stats_interval`; our own exchange.stats_interval if absent).
STALE_STATS = 3.0
# A payload block this big is handed to libzmq without a copy (pyzmq then keeps it until sent).
ZERO_COPY_BYTES = 64 << 10
_NOBLOCK, _MORE_NOBLOCK = int(zmq.NOBLOCK), int(zmq.SNDMORE | zmq.NOBLOCK)


class PublisherLink:
    def __init__(self, queue: str, config: Config, zk: KazooClient, publisher_id: str, token: bytes,
                 chunk_log: ChunkLog, cond: threading.Condition, prefer: str | None,
                 on_queue_changed: Callable[[bool], None]) -> None:
        """Watch the queue and start the I/O thread. `chunk_log` is only touched under `cond`'s
        lock; `on_queue_changed(deleted)` is called from watch threads when the queue is deleted
        or created again (and on endpoint changes)."""
        self.config = config
        self.queue = queue
        self.id = publisher_id
        self._token = token
        self._log = chunk_log
        self._cond = cond
        self._on_queue_changed = on_queue_changed
        self.prefer = prefer
        self._closed = False
        self._move_lock = threading.Lock()
        self._move_request: str | None = None  # set by any thread, taken by the I/O thread
        self._awaiting_welcome = False  # batches wait until the exchange said what it holds
        self._handshakes = 0  # of the current socket's connections
        self._hello_sent = 0.0
        self._avoid: dict[tuple[str, str], float] = {}  # (exchange, incarnation) → avoided until
        self._incarnation = ""  # of the exchange we publish to
        self.exchange: str | None = None  # id of the exchange we publish to
        self.subscribers = 0  # RoQ subscribers connected to our exchange, as it last reported
        self._want_hello = False
        self._endpoint: str | None = None  # where the current exchange was when we connected
        # Set by publish() when it wakes the I/O thread; cleared by the I/O thread when it can take
        # more messages, so while batches are in flight publish() costs no system call.
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
        self._relocated_to: str | None = None  # where the leader asked us to publish
        self._relocation_seen = 0.0
        self.relocations = 0
        self._wake = WakePipe()
        paths = Paths(config.zk.root)
        try:
            self.topology = QueueTopology(zk, paths, queue, self._topology_changed)
        except Exception:
            self._wake.close()
            raise
        zk.DataWatch(paths.relocations(queue), self._on_relocations)
        self._thread = threading.Thread(target=self._run, name=f"publisher-{publisher_id}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the I/O thread (it says goodbye) and the watches; close the wake-up pipe."""
        self._closed = True
        self.wake()
        self._thread.join(timeout=5)
        self.topology.close()
        self._wake.close()

    def wake(self) -> None:
        """Wake the I/O thread (any thread)."""
        self._wake.wake()

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

    def _take_move(self) -> str | None:
        with self._move_lock:
            reason, self._move_request = self._move_request, None
        return reason

    # ------------------------------------------------------------ ZooKeeper watches

    def _on_relocations(self, data: bytes | None, _stat: object) -> bool | None:
        """The leader moves a heavy publisher off an overloaded exchange by naming it here."""
        if self._closed:
            return False  # ends the watch
        try:
            entry = json.loads(data or b"{}").get(self.id)
        except (ValueError, AttributeError):
            return None
        if not isinstance(entry, dict) or not isinstance(entry.get("at"), (int, float)) \
                or entry["at"] <= self._relocation_seen or not isinstance(entry.get("to"), str):
            return None
        self._relocation_seen = entry["at"]
        self._relocated_to = entry["to"]
        self._follow_relocation()
        return None

    def _follow_relocation(self) -> None:
        """Move to the exchange the leader named, as soon as it runs (a new one may still be starting)."""
        target = self._relocated_to
        if target and self.prefer is None and self.exchange != target and target in self.topology.snapshot():
            self.relocations += 1
            self.request_move(f"relocated by the leader to {target}")

    def _topology_changed(self) -> None:
        self._on_queue_changed(self.topology.deleted)
        self._follow_relocation()
        live = self.topology.snapshot()
        current = self.exchange
        if current is not None and current not in live:
            self.request_move(f"exchange {current} disappeared")
        elif current is not None and live[current].get("pub") != self._endpoint:
            self.request_move(f"exchange {current} restarted elsewhere")  # same id, new process
        self.wake()

    # ------------------------------------------------------------ I/O thread

    def _run(self) -> None:
        context = zmq.Context()
        sock: zmq.Socket | None = None
        monitor: zmq.Socket | None = None
        poller = zmq.Poller()  # one for the thread's life; the socket is swapped in and out
        poller.register(self._wake.fd, zmq.POLLIN)
        last_reply = time.monotonic()
        try:
            while not self._closed:
                reason = self._take_move()
                if reason and sock is not None:
                    log.info("publisher %s moving: %s", self.id, reason)
                    self._drop_socket(poller, sock, monitor)
                    sock, monitor, self.exchange = None, None, None
                    self.moves += 1
                if sock is None:
                    sock = self._connect(context)
                    last_reply = time.monotonic()
                    if sock is None:
                        self._idle(poller, 100)
                        continue
                    # A connection that breaks takes the frames in flight with it (ZeroMQ reconnects
                    # underneath): each new handshake starts with a hello, and the welcome says
                    # from where to resend.
                    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILED)
                    poller.register(sock, zmq.POLLIN)
                    poller.register(monitor, zmq.POLLIN)
                if monitor is not None and self._reconnected(monitor):
                    self.reconnects += 1
                    self._say_hello(sock, rewind=True)
                if not self._awaiting_welcome:
                    self._send_batches(sock)
                    if not self._log.in_flight:
                        # Idle: from here on publish() must wake us, and what came before is taken
                        # now. With batches in flight their acks wake us (or a full batch, below).
                        self.wake_pending = False
                        self._send_batches(sock)
                if self._want_hello or (self._awaiting_welcome and time.monotonic() - self._hello_sent > HELLO_RETRY):
                    self._want_hello = False
                    self._say_hello(sock)
                self._idle(poller, 100)
                while sock.poll(0):
                    self._handle_reply(sock, sock.recv())
                    last_reply = time.monotonic()
                waiting = self._log.in_flight or self._awaiting_welcome
                if waiting and time.monotonic() - last_reply > self.config.client.confirm_timeout:
                    self._avoid_current()
                    self._note_storage_full_stats()
                    self.request_move(f"no answer from {self.exchange} for {self.config.client.confirm_timeout:.1f}s")
            if sock is not None:
                try:
                    sock.send(protocol.encode_bye(self.id), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a full pipe: the exchange forgets us after exchange.publisher_ttl
        finally:
            if monitor is not None and sock is not None:
                sock.disable_monitor()
                monitor.close(linger=0)
            if sock is not None:
                sock.close(linger=100)
            context.term()

    def _drop_socket(self, poller: zmq.Poller, sock: zmq.Socket, monitor: zmq.Socket | None) -> None:
        poller.unregister(sock)
        if monitor is not None:
            poller.unregister(monitor)
            sock.disable_monitor()
            monitor.close(linger=0)
        sock.close(linger=0)

    def _reconnected(self, monitor: zmq.Socket) -> bool:
        """True when a handshake other than the socket's first one succeeded since the last look.
        A refused one is remembered (`refusal`, logged once) until a handshake succeeds."""
        again = False
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return again
            if event["event"] & HANDSHAKE_FAILED:
                if self.refusal is None:
                    self.refusal = refusal_text(self.config, self._endpoint or "the exchange", "publish")
                    log.error("publisher %s: %s", self.id, self.refusal)
                continue
            self.refusal = None
            self._handshakes += 1
            again = again or self._handshakes > 1

    def _idle(self, poller: zmq.Poller, timeout_ms: int) -> None:
        """Wait for a reply, a wake-up from publish(), or the timeout."""
        if dict(poller.poll(timeout_ms)).get(self._wake.fd):
            self._wake.drain()

    def _connect(self, context: zmq.Context) -> zmq.Socket | None:
        choice = self._choose_exchange()
        if choice is None:
            return None
        xid, data = choice
        endpoint = data["pub"]
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        secure_client(sock, self.config)
        sock.connect(endpoint)
        self._handshakes = 0
        self._endpoint = endpoint
        self._incarnation = str(data.get("incarnation", ""))
        if xid == self._relocated_to:
            self._relocated_to = None  # done; from now on it is just our exchange
        with self._cond:
            self.exchange = xid
        self._say_hello(sock, rewind=True)
        log.info("publisher %s publishing to %s/%s at %s", self.id, self.queue, xid, endpoint)
        return sock

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
            log.info("publisher %s resending %d confirmed messages to %s", self.id, count, self.exchange)

    def _avoid_current(self) -> None:
        if self.exchange is not None:
            self._avoid[(self.exchange, self._incarnation)] = time.monotonic() + AVOID_SECONDS

    def _choose_exchange(self) -> tuple[str, dict[str, Any]] | None:
        try:
            live = self.topology.refresh()  # fresh statistics: the watch only follows endpoints
        except Exception:  # ZooKeeper unreachable: what we saw last will do
            live = self.topology.snapshot()
        if not live:
            return None
        if self.prefer in live:
            return self.prefer, live[self.prefer]
        relocated = self._relocated_to
        if relocated is not None and relocated in live:
            return relocated, live[relocated]
        now = time.monotonic()
        self._avoid = {key: until for key, until in self._avoid.items() if until > now}
        reports = {xid: ExchangeStats.from_dict(data.get("stats")) for xid, data in live.items()}
        newest = max((report.at or 0.0 for report in reports.values()), default=0.0)
        interval = self.config.exchange.stats_interval

        def rank(item: tuple[str, dict[str, Any]]) -> tuple[float, int, float, float]:
            xid, data = item
            stats = reports[xid]
            avoided_until = self._avoid.get((xid, str(data.get("incarnation", ""))), 0.0)
            # A frozen exchange stops reporting: its HCM says so, its statistics age, and it goes last;
            # so does one that cannot store what it takes (its journal's disk is full).
            stale = int(is_stale(data, stats, newest, interval) or stats.storage_full)
            return (avoided_until, stale, stats.publishers, random.random())

        xid, data = min(live.items(), key=rank)
        return xid, data

    def _send_batches(self, sock: zmq.Socket) -> None:
        # The replay window goes first, merged back into full batches (chunks sealed at a low
        # rate hold a message or two); its seqs are consecutive and end where the log starts.
        log, client = self._log, self.config.client
        with self._cond:
            resend = log.take_resend()
        for first, flat in merge(resend, client.max_batch, client.max_batch_bytes):
            if not self._send_batch(sock, first, flat):
                return
        while len(log.in_flight) < MAX_IN_FLIGHT:
            with self._cond:
                if log.in_flight and not log.full_batch_waiting():
                    # A batch smaller than full waits for the ack of those in flight and grows
                    # meanwhile: each frame costs the exchange about 250 µs of CPU on a 2-vCPU VM,
                    # so one small frame per message kept it 60% busy at 10k msg/s (issue 23).
                    return
                chunk = log.take()
                self.full_signalled = False
            if chunk is None:
                return
            if not self._send_batch(sock, chunk.first, chunk.flat):
                return

    def _send_batch(self, sock: zmq.Socket, first: int, flat: list[bytes]) -> bool:
        """Messages first, first+1, ... as one batch: of one topic, in two parts (the payloads as
        one block the exchange passes on as it is); else as one frame."""
        topic = flat[0]
        if self.config.client.payload_blocks and type(topic) is bytes:
            topics = flat[0::2]
            if topics.count(topic) == len(topics):
                head, block = protocol.encode_batch_parts(self.id, first, time.time_ns(), topic, flat[1::2])
                return self._send_frame(sock, head, block)
        return self._send_frame(sock, protocol.encode_batch(self.id, first, time.time_ns(), flat))

    def _send_frame(self, sock: zmq.Socket, frame: bytes, block: bytes | None = None) -> bool:
        """Never block: an exchange whose queue to us is full is not reading (dead or stuck). A
        message's first part queued means its second is too."""
        try:
            if block is None:
                sock.send(frame, _NOBLOCK)
            else:
                sock.send(frame, _MORE_NOBLOCK)
                sock.send(block, _NOBLOCK, copy=len(block) < ZERO_COPY_BYTES)
            return True
        except zmq.Again:
            self._avoid_current()
            self.request_move(f"exchange {self.exchange} is not taking batches")
            return False

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
                         self.id, self.exchange, reply.seq, reply.code)
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
                self.request_move(f"exchange {self.exchange} refused us: {reply.message}")

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

    def _note_storage_full_stats(self) -> None:
        """Silent exchange: if its statistics say its storage is full, that is why."""
        stats = ExchangeStats.from_dict((self.topology.snapshot().get(self.exchange or "") or {}).get("stats"))
        if stats.storage_full:
            self._note_storage_full(f"{STORAGE_FULL}: exchange {self.queue}/{self.exchange} cannot write its "
                                    f"journal ({stats.storage_error})")


def is_stale(data: dict[str, Any], stats: ExchangeStats, newest: float, interval: float) -> bool:
    """Is this live exchange (its znode's `data`, the `stats` in it) frozen or stuck? Its HCM says it
    went `silent`; or its statistics' `at` lies more than STALE_STATS report intervals (the znode's
    `stats_interval`, else `interval`) plus the znode's `heartbeat` behind `newest`, the newest `at`
    of the queue's exchanges (their HCMs' clocks, not ours)."""
    if data.get("silent") is True:
        return True
    heartbeat = _seconds(data.get("heartbeat"), 0.0)  # absent: an HCM that rewrote them at every report
    return newest - (stats.at or 0.0) > STALE_STATS * _seconds(data.get("stats_interval"), interval) + heartbeat


def _seconds(value: Any, default: float) -> float:
    """A znode's duration, or `default` when it is not a number of seconds (absent: an older HCM)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return default
    return float(value)
