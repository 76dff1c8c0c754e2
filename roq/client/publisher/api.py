"""Publisher: thread-safe `publish()`, adaptive batching, confirms, backpressure, failover.

`publish()` only appends to the unconfirmed log (roq.client.publisher.chunks) and wakes the I/O
thread (roq.client.publisher.exchange_link, `PublisherLink`), which owns the ZeroMQ socket.
Batching needs no timer: while batches are in flight, new messages accumulate and leave together
in the next batch; an idle publisher's lone message leaves at once. Every message has a sequence
number; the exchange acks cumulatively and confirmed messages leave the log. The log is only
touched under the Publisher's lock, by the application's threads and the I/O thread alike.

When more than `client.max_unconfirmed` messages wait, `publish()` blocks, and
raises BackpressureError after `client.publish_timeout` — nothing is dropped; StorageFullError
(a BackpressureError) when the exchange said it cannot store them (its journal's disk is full).
The link says hello to each exchange, resends from its welcome, and moves to another exchange
(resending the replay window and everything unconfirmed) when one asks, disappears or stops
confirming: see roq.client.publisher.exchange_link. A deleted queue makes `publish()` raise
QueueNotFoundError.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

from roq import protocol
from roq.client.lifecycle import ClientLifecycle
from roq.client.metadata import MetadataClient
from roq.client.publisher.checks import TopicChecks, checked_payloads
from roq.client.publisher.chunks import ChunkLog
from roq.client.publisher.exchange_link import PublisherLink
from roq.client.stats import PublisherStats
from roq.client.topology import QueueTopology
from roq.config import Config
from roq.errors import (
    BackpressureError,
    MessageTooLargeError,
    QueueNotFoundError,
    RefusedError,
    RequestTimeoutError,
    RoqError,
    StorageFullError,
    UserError,
    error_from_code,
)
from roq.security import load_keys

# publish() looks for a full batch (to wake the I/O thread while batches are in flight) once per
# this many + 1 messages: a batch of up to client.max_batch is noticed within that many.
FULL_CHECK_EVERY = 127

T = TypeVar("T")


class _FromLink(Generic[T]):
    """A read-only attribute of the publisher's link: the I/O thread's state, read from outside."""

    def __init__(self, doc: str, attr: str = "") -> None:
        self.__doc__ = doc
        self.attr = attr  # the link's name for it, when not the same

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = self.attr or name

    @overload
    def __get__(self, obj: None, owner: type) -> _FromLink[T]: ...

    @overload
    def __get__(self, obj: Publisher, owner: type) -> T: ...

    def __get__(self, obj: Publisher | None, owner: type) -> T | _FromLink[T]:
        if obj is None:
            return self
        value: T = getattr(obj._link, self.attr)
        return value


class Publisher(ClientLifecycle):
    def __init__(self, queue: str, config: Config, metadata: MetadataClient | None = None,
                 token: bytes | None = None, prefer: str | None = None) -> None:
        """`prefer` names an exchange id to use while it runs (default: least loaded). `token` is
        the publisher's secret (default: random); its id is derived from it."""
        self.config = config
        load_keys(config.security)  # a missing or unreadable key fails here, not at the first connect
        self.queue = queue
        token = token if token is not None else secrets.token_bytes(16)
        self.id = protocol.publisher_id_for(token)
        self._use_metadata(config, metadata)
        # A plain lock (not re-entrant): publish() takes it directly, the fastest way to hold it.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        client = config.client
        self._log = ChunkLog(client.max_batch, client.max_batch_bytes, client.replay_seconds, client.replay_bytes)
        self._checks = TopicChecks(config.exchange.max_message_bytes)
        self._topics = self._checks.known  # publish() looks a topic up here before checking it
        self._max_message = config.exchange.max_message_bytes
        self._max_unconfirmed = config.client.max_unconfirmed
        self._caller_send = config.client.caller_send
        self._closed = False
        self.queue_deleted = False
        try:
            self._link = PublisherLink(queue, config, self.metadata, self.id, token, self._log, self._cond, prefer,
                                       self._queue_changed)
        except Exception:
            self._release_metadata()
            raise

    # ------------------------------------------------------------ API

    def publish(self, topic: str | bytes, payload: bytes, timeout: float | None = None, *,
                priority: int | None = None, not_before: float | None = None, key: str | bytes | None = None,
                headers: Mapping[str, bytes | str] | None = None) -> int:
        """Queue one message; returns its sequence number. Blocks under backpressure.

        `priority` (0..255, lower first; default 0), `not_before` (Unix time, seconds) and `key` (fair
        delivery across keys) matter to consumer groups only (docs/work-queues.md); subscribers
        get the message at once whatever they say. `headers`: a small map that travels with the
        message to every subscriber and group member (`msg.headers`): str keys (1-128 bytes of UTF-8,
        not starting with `roq-`), bytes values (a str is UTF-8 encoded) of at most 8 KiB; at most
        64, 64 KiB in all, counted with the payload against exchange.max_message_bytes."""
        checked: Any
        headers_size = 0
        if priority is None and not_before is None and key is None and not headers:
            try:
                checked = self._topics.get(topic)
            except TypeError:  # unhashable: check_topic explains
                checked = None
            if checked is None:
                checked = self._checks.remember(topic)
        else:
            checked, headers_size = self._checks.attributed_slot(topic, priority, not_before, key, headers)
        if type(payload) is not bytes:
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise TypeError("payload must be bytes")
            payload = bytes(payload)
        if len(payload) + headers_size > self._max_message:
            with_headers = f" and {headers_size} bytes of headers" if headers_size else ""
            raise MessageTooLargeError(f"payload of {len(payload)} bytes{with_headers} exceeds "
                                       f"exchange.max_message_bytes={self._max_message}")
        limit = self._max_unconfirmed
        log = self._log
        with self._lock:
            if self._closed or self.queue_deleted:
                self._raise_closed()
            seq = log.next_seq
            if seq - 1 - log.acked >= limit:
                self._wait_for_room(self.config.client.publish_timeout if timeout is None else timeout)
                seq = log.next_seq
            log.next_seq = seq + 1
            log.open.append(checked)
            log.open.append(payload)
        link = self._link
        if not link.wake_pending:  # one wake-up per batch, not one system call per message
            link.wake_pending = True
            if not (self._caller_send and link.send_from_caller()):
                link.wake()
        elif not link.full_signalled and not seq & FULL_CHECK_EVERY and log.full_batch_waiting():
            link.full_signalled = True  # a full batch may go while others are in flight
            link.wake()
        return seq

    def publish_many(self, topic: str | bytes | Sequence[str | bytes], payloads: Iterable[bytes],
                     timeout: float | None = None) -> range:
        """Queue `payloads` as consecutive messages, in order; returns their sequence numbers.
        `topic`: every message's topic, or a list (or tuple) with each payload's own topic — a
        batch carries messages of any topics (docs/protocol.md 3.2), so a list spread over many
        topics costs about what a list of one topic does.

        The same guarantees as `publish()`, a list at a time and with no Python work per message:
        every payload is checked before any is queued, so a wrong type raises TypeError and an
        oversize payload MessageTooLargeError with nothing queued. Under backpressure the list is
        queued in parts as confirms make room; when no room comes for `timeout` seconds
        (`client.publish_timeout` by default) BackpressureError is raised, and its `queued`
        attribute says how many leading payloads were queued (those will be delivered).
        """
        items = checked_payloads(payloads, self._max_message)
        checked: bytes | list[Any]
        if isinstance(topic, (str, bytes)):
            checked = self._checks.remember(topic)  # once per list: no need for publish()'s cache lookup
        else:
            checked = self._checks.each(topic, len(items))
        wait = self.config.client.publish_timeout if timeout is None else timeout
        with self._lock:
            first = self._log.next_seq
            done, send_here = 0, False
            while done < len(items):
                done += self._append_part(checked, items, done, wait)
                # Before waiting for room the I/O thread must send what is queued; the last part
                # may go from here once the lock is let go (client.caller_send).
                send_here = self._wake_link(defer=done == len(items))
        if send_here:
            self._send_or_wake()
        return range(first, first + len(items))

    def publish_all(self, topic: str | bytes, payloads: Iterable[bytes], timeout: float | None = None,
                    headers: list[Mapping[str, bytes | str]] | None = None) -> range:
        """`publish_many`, all or nothing: waits until the whole list fits under
        `client.max_unconfirmed`, then queues it in one step. BackpressureError after `timeout`
        with nothing queued; a list longer than the limit is a UserError. `headers[i]`: message i's
        headers (as `publish()` takes them), checked before anything is queued."""
        checked: Any = self._checks.remember(topic)
        items = checked_payloads(payloads, self._max_message)
        if headers is not None:
            if len(headers) != len(items):
                raise UserError(f"{len(headers)} headers for {len(items)} payloads")
            checked = self._checks.slots(topic, items, headers)
        limit = self._max_unconfirmed
        if len(items) > limit:
            raise UserError(f"{len(items)} messages at once exceed client.max_unconfirmed={limit}")
        wait = self.config.client.publish_timeout if timeout is None else timeout
        log = self._log
        with self._lock:
            fits = self._cond.wait_for(
                lambda: log.unconfirmed + len(items) <= limit or self._closed or self.queue_deleted, wait)
            if self._closed or self.queue_deleted:
                self._raise_closed()
            if not fits:
                raise _backpressure(self._link, f"{log.unconfirmed} messages unconfirmed for {wait:.1f}s, no room "
                                                f"for {len(items)} more")
            first = log.next_seq
            send_here = False
            if items:
                self._append_part(checked, items, 0, wait)  # it fits: one part
                send_here = self._wake_link(defer=True)
        if send_here:
            self._send_or_wake()
        return range(first, first + len(items))

    def _wake_link(self, defer: bool = False) -> bool:
        """Wake the I/O thread for what was queued: once until it takes more, and again when a full
        batch may go while others are in flight (what publish() does inline, its hot path; the
        caller holds the lock). With `defer` and client.caller_send, True instead of the first
        wake-up: the caller calls `_send_or_wake()` once it let go of the lock."""
        link = self._link
        if not link.wake_pending:
            link.wake_pending = True
            if defer and self._caller_send:
                return True
            link.wake()
        elif not link.full_signalled and self._log.full_batch_waiting():
            link.full_signalled = True
            link.wake()
        return False

    def _send_or_wake(self) -> None:
        """client.caller_send: send from this thread if the I/O thread sleeps, or else wake it
        (never under the lock: the send takes it)."""
        if not self._link.send_from_caller():
            self._link.wake()

    def _append_part(self, topic: bytes | list[Any], items: list[bytes], done: int, wait: float) -> int:
        """Append as many of items[done:] as the unconfirmed limit allows (caller holds the lock);
        waits up to `wait` for room, then raises BackpressureError. `topic`: every message's, or a
        list of each one's topic slot."""
        if self._closed or self.queue_deleted:
            self._raise_closed()
        limit = self._max_unconfirmed
        if self._log.unconfirmed >= limit:
            try:
                self._wait_for_room(wait, f" ({done} of {len(items)} queued)")
            except BackpressureError as err:
                err.queued = done
                raise
        take = min(limit - self._log.unconfirmed, len(items) - done)
        part = items if take == len(items) else items[done:done + take]
        flat: list[Any] = [topic] * (2 * take)
        if isinstance(topic, list):
            flat[::2] = topic[done:done + take]
        flat[1::2] = part  # interleave topic and payload with one C-level slice assignment
        self._log.append(flat, take)
        return take

    def _wait_for_room(self, wait: float, detail: str = "") -> None:
        """Block until fewer than `client.max_unconfirmed` messages await a confirm (caller holds
        the lock): BackpressureError after `wait` seconds, RoqError if closed meanwhile."""
        limit = self._max_unconfirmed
        if not self._cond.wait_for(lambda: self._log.unconfirmed < limit or self._closed, wait):
            _raise_if_refused(self._link, self._log)
            raise _backpressure(self._link, f"{self._log.unconfirmed} messages unconfirmed for {wait:.1f}s{detail}")
        if self._closed or self.queue_deleted:
            self._raise_closed()

    def _raise_closed(self) -> None:
        if self.queue_deleted:
            raise QueueNotFoundError(f"queue {self.queue!r} was deleted: {self._log.unconfirmed} messages "
                                     "are unconfirmed (they are sent if the queue is created again)")
        raise RoqError("publisher is closed")

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every message published so far is confirmed."""
        with self._cond:
            target = self._log.next_seq - 1
            if not self._cond.wait_for(lambda: self._log.acked >= target, timeout):
                _raise_if_refused(self._link, self._log)
                why = f": {self._link.storage_full}" if self._link.storage_full else ""
                left = target - self._log.acked
                raise RequestTimeoutError(f"{left} message{'s' if left != 1 else ''} still unconfirmed after "
                                          f"{timeout:.1f}s{why}")

    def wait_confirmed(self, seqs: range, timeout: float) -> None:
        """Wait until messages `seqs` (and every one before them) are confirmed: RequestTimeoutError
        after `timeout` seconds (it may still be confirmed later), QueueNotFoundError or RoqError
        if the queue is deleted or the publisher closed meanwhile, MessageTooLargeError (or the
        exchange's own error) if an exchange rejected one of them."""
        if not seqs:
            return
        seq = seqs[-1]
        with self._cond:
            log = self._log
            if not self._cond.wait_for(lambda: log.acked >= seq or self._closed or self.queue_deleted, timeout):
                _raise_if_refused(self._link, self._log)
                raise RequestTimeoutError(f"message {seq} not confirmed after {timeout:.1f}s: it may still be "
                                          "delivered (the exchange may be failing over)")
            if log.acked < seq:
                self._raise_closed()
        for rejected, code, message in self._link.rejected:
            if rejected in seqs:
                raise error_from_code(code, message)

    def wait_for_subscribers(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until our exchange reports `count` RoQ subscribers connected to it (each one
        counts once, whatever its topics; it is live on the exchange from then on)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._link.subscribers < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    _raise_if_refused(self._link, self._log)
                    raise RequestTimeoutError(f"exchange reports {self.subscribers} subscribers, "
                                              f"wanted {count}, after {timeout:.1f}s")
                self._link.request_hello()
                self._cond.wait(min(remaining, 0.05))

    @property
    def unconfirmed(self) -> int:
        with self._cond:
            return self._log.unconfirmed

    @property
    def confirmed(self) -> int:
        return self._log.acked

    def stats(self) -> PublisherStats:
        link, log = self._link, self._log
        with self._cond:
            published, confirmed, unconfirmed = log.next_seq - 1, log.acked, log.unconfirmed
        return PublisherStats(exchange=link.xid, subscribers=link.subscribers, published=published,
                              confirmed=confirmed, unconfirmed=unconfirmed, moves=link.moves,
                              relocations=link.relocations, resends=link.resends, reconnects=link.reconnects,
                              replayed=link.replayed, rejected=len(link.rejected))

    def close(self, timeout: float = 10.0) -> None:
        """Flush (up to `timeout`), say goodbye, stop the I/O thread."""
        try:
            if not self._closed and timeout > 0:
                self.flush(timeout)
        finally:
            super().close()

    def _shut_down(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._link.close()

    # ------------------------------------------------------------ the link's state, read from outside

    exchange = _FromLink[str | None]("Id of the exchange we publish to (None while choosing).", "xid")
    subscribers = _FromLink[int]("RoQ subscribers connected to our exchange, as it last reported.")
    topology = _FromLink[QueueTopology]("The running exchanges of the queue, as the link follows them.")
    moves = _FromLink[int]("Times we moved to another exchange.")
    resends = _FromLink[int]("Times an exchange asked us to resend (lost bytes, a refused batch).")
    reconnects = _FromLink[int]("Connections ZeroMQ re-established under us (each followed by a hello).")
    replayed = _FromLink[int]("Confirmed messages resent after moves.")
    rejected = _FromLink[list[tuple[int, str, str]]]("(seq, code, message) of each message an exchange rejected.")
    relocations = _FromLink[int]("Moves the leader asked for.")

    @property
    def prefer(self) -> str | None:
        """An exchange id to use while it runs (None: least loaded); read whenever the link chooses one."""
        return self._link.prefer

    @prefer.setter
    def prefer(self, value: str | None) -> None:
        self._link.prefer = value

    def _request_move(self, reason: str) -> None:
        """Ask the I/O thread to move (any thread); the first reason since the last move wins."""
        self._link.request_move(reason)

    def _queue_changed(self, deleted: bool) -> None:
        """The link's watch: the queue was deleted or created again (or its endpoints changed)."""
        with self._cond:
            self.queue_deleted = deleted
            self._cond.notify_all()


def _backpressure(link: PublisherLink, waiting: str) -> BackpressureError:
    """The error for confirms that did not come in time: StorageFullError when the exchange said
    it cannot store what it takes, with its reason."""
    if link.storage_full:
        return StorageFullError(f"{waiting}: {link.storage_full}")
    return BackpressureError(f"{waiting}; is the queue's exchange reachable?")


def _raise_if_refused(link: PublisherLink, log: ChunkLog) -> None:
    """A wait timed out while our exchange refuses our handshake: say that, not a timeout."""
    if link.refusal is not None:
        raise RefusedError(f"{link.refusal}; {log.unconfirmed} messages unconfirmed")
