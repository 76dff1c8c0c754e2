"""A consumer group member: `GroupMember(queue, config, topics, group="workers")`.

Each message of the group's topics goes to one member of the group, which acks it when done
(docs/work-queues.md). Every exchange of the queue runs the group for its own stream, so a
member joins the group on every running exchange and follows the topology as a subscriber does
(roq.client.group_member.exchange_links, its I/O thread). The application acks from any thread:
acks are queued, and the I/O thread sends them as ranges. Each exchange sends at most `prefetch`
unacked messages to this member; a member that lost its membership (the exchange timed it out
during a pause) joins again. Closing leaves the group: what was not acked goes to the other
members at once.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from roq import protocol
from roq.client.group_member.exchange_links import JoinTerms, MemberLinks
from roq.client.group_member.messages import WorkMessage
from roq.client.lifecycle import ClientLifecycle
from roq.client.metadata import MetadataClient
from roq.client.stats import MemberStats
from roq.client.topology import QueueTopology
from roq.config import Config
from roq.errors import RoqError, UserError
from roq.names import check_group_name, check_topic
from roq.security import load_keys

log = logging.getLogger(__name__)

JOIN_TIMEOUT = 10.0  # s the constructor waits for the running exchanges to answer the join


class GroupMismatchError(UserError):
    """The group runs with other topics or settings (every member must agree), or is refused."""
    code = "group_mismatch"


def join_terms(config: Config, group: str, topics: Iterable[str | bytes], prefetch: int | None,
               ack_timeout: float | None, max_deliveries: int | None, dead_letter: str | bytes | None) -> JoinTerms:
    """The group's terms, checked (InvalidNameError, UserError); None takes the client's setting."""
    check_group_name(group)
    client = config.client
    prefetch = client.prefetch if prefetch is None else prefetch
    ack_timeout = client.ack_timeout if ack_timeout is None else ack_timeout
    max_deliveries = client.max_deliveries if max_deliveries is None else max_deliveries
    if not isinstance(prefetch, int) or not 1 <= prefetch <= protocol.MAX_PREFETCH:
        raise UserError(f"prefetch must be an integer from 1 to {protocol.MAX_PREFETCH}, got {prefetch!r}")
    if not 0.001 <= ack_timeout <= 86_400:
        raise UserError(f"ack_timeout must be from 0.001 to 86400 seconds, got {ack_timeout!r}")
    if not isinstance(max_deliveries, int) or not 1 <= max_deliveries <= protocol.MAX_DELIVERIES:
        raise UserError(f"max_deliveries must be an integer from 1 to {protocol.MAX_DELIVERIES}")
    checked = sorted({check_topic(t) for t in topics}) or [b""]
    letters = check_topic(dead_letter if dead_letter is not None else f"roq.dead/{group}")
    if any(letters.startswith(p) for p in checked):
        raise UserError(f"dead-letter topic {letters!r} matches the group's own topics: dead letters "
                        "would come back to the group; choose another (dead_letter=...)")
    return JoinTerms(group, checked, prefetch, ack_timeout, max_deliveries, letters)


class GroupMember(ClientLifecycle):
    def __init__(self, queue: str, config: Config, topics: Iterable[str | bytes] = (),
                 metadata: MetadataClient | None = None,
                 callback: Callable[[WorkMessage], None] | None = None, *, group: str, prefetch: int | None = None,
                 auto_ack: bool = True, ack_timeout: float | None = None, max_deliveries: int | None = None,
                 dead_letter: str | bytes | None = None, inbox_limit: int = 100_000) -> None:
        terms = join_terms(config, group, topics, prefetch, ack_timeout, max_deliveries, dead_letter)
        load_keys(config.security)
        self.config, self.queue, self.group = config, queue, group
        self.topics, self.dead_letter = terms.topics, terms.dead_letter
        self.prefetch, self.auto_ack = terms.prefetch, auto_ack
        self.ack_timeout, self.max_deliveries = terms.ack_timeout, terms.max_deliveries
        self.callback = callback
        self.received = self.acked = self.nacked = self.redelivered = self.callback_errors = 0
        self._inbox: queue_module.Queue[WorkMessage] = queue_module.Queue(inbox_limit)
        self._last: WorkMessage | None = None  # iterator style with auto_ack: acked at the next receive()
        self._closed = False
        self._use_metadata(config, metadata)
        try:
            self._links = MemberLinks(self.metadata, config, queue, terms, self._take)
        except Exception:
            self._release_metadata()
            raise
        self._links.start()
        try:
            self._wait_joined()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ API

    @property
    def topology(self) -> QueueTopology:
        return self._links.topology

    def receive(self, timeout: float | None = None) -> WorkMessage | None:
        """The next message, or None after `timeout`. With auto_ack, the message returned before
        this call is acked now (the application is done with it)."""
        if self._last is not None:
            last, self._last = self._last, None
            last.ack()
        try:
            msg = self._inbox.get(timeout=timeout)
        except queue_module.Empty:
            self.topology.check_exists()
            return None
        if self.auto_ack:
            self._last = msg
        return msg

    def __iter__(self) -> Iterator[WorkMessage]:
        while not self._closed:
            msg = self.receive(timeout=0.2)
            if msg is not None:
                yield msg

    @property
    def connected(self) -> set[str]:
        """Exchanges on which this member has joined its group."""
        return self._links.joined

    def wait_connected(self, count: int | None = None, timeout: float = 10.0) -> None:
        """Wait until this member has joined the group on `count` exchanges (default: all running)."""
        deadline = time.monotonic() + timeout
        while True:
            want = len(self.topology.snapshot()) if count is None else count
            if len(self.connected) >= want:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"joined group {self.group!r} on {len(self.connected)} of {want} exchanges")
            time.sleep(0.02)

    def stats(self) -> MemberStats:
        return MemberStats(received=self.received, acked=self.acked, nacked=self.nacked,
                           redelivered=self.redelivered, callback_errors=self.callback_errors,
                           exchanges=len(self.connected))

    def close(self) -> None:
        """Leave the group: what this member has not acked goes to the other members at once."""
        super().close()

    def _shut_down(self) -> None:
        if self._last is not None:
            last, self._last = self._last, None
            last.ack()
        self._closed = True
        links = getattr(self, "_links", None)  # None when the constructor failed before it made them
        if links is not None:
            links.close()

    # ------------------------------------------------------------ acks from any thread

    def _settle(self, msg: WorkMessage, kind: str) -> None:
        if msg.settled:
            return
        msg.settled = True
        self._links.settle(kind, msg.exchange, msg.incarnation, msg.pos, msg.idx)
        if kind == protocol.ACK:
            self.acked += 1
        else:
            self.nacked += 1

    def _wait_joined(self) -> None:
        """Every exchange running now answered the join; a refusal raises GroupMismatchError."""
        deadline = time.monotonic() + JOIN_TIMEOUT
        links = self._links
        with links.changed:
            while True:
                refused = links.refusals()
                if refused:
                    code, message = refused[0]
                    raise GroupMismatchError(f"group {self.group!r} refused this member: {code}: {message}")
                running = set(self.topology.snapshot())
                if running <= self.connected:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RoqError(f"group {self.group!r}: no answer to the join from exchanges "
                                   f"{sorted(running - self.connected)} in {JOIN_TIMEOUT:.0f}s (an exchange "
                                   "refuses the handshake of a key without the consume right on the queue: "
                                   "roq keys show NAME)")
                links.changed.wait(min(left, 0.1))

    # ------------------------------------------------------------ the I/O thread's hand-over

    def _take(self, xid: str, incarnation: str, entries: list[list[Any]]) -> None:
        callback = self.callback
        for entry in entries:
            for i in range(len(entry[6])):
                msg = WorkMessage(self, entry, i, xid, incarnation)
                self.received += 1
                if msg.deliveries > 1:
                    self.redelivered += 1
                if callback is None:
                    self._inbox.put(msg)
                    continue
                try:
                    callback(msg)
                except Exception:
                    self.callback_errors += 1
                    log.exception("group %s callback failed; the message goes back to the group", self.group)
                    if self.auto_ack:
                        msg.nack()
                    continue
                if self.auto_ack:
                    msg.ack()


GroupSubscriber = GroupMember  # its name before it was a type of its own
