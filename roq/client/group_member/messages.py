"""What a consumer group member hands to its application: a `WorkMessage` each, to ack or nack."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from roq import protocol
from roq.client.headers import EMPTY_HEADERS
from roq.names import topic_text

if TYPE_CHECKING:
    from roq.client.group_member.api import GroupMember


class WorkMessage:
    """One message handed to this member: ack() it when done, or nack() it. `topic` and `key` are
    text (str, as given to `publish()`; None: no key), `topic_bytes` and `key_bytes` the exact bytes;
    `headers` the publisher's (str → bytes; a dead letter's also say where it came from)."""

    __slots__ = ("topic_bytes", "payload", "publisher", "seq", "exchange", "sent_ns", "incarnation", "pos", "idx",
                 "deliveries", "priority", "key_bytes", "headers", "_member", "settled")

    def __init__(self, member: GroupMember, entry: list[Any], i: int, xid: str, incarnation: str) -> None:
        self.topic_bytes: bytes = entry[3]
        self.publisher: str = entry[4]
        self.sent_ns: int = entry[5]
        self.seq: int = entry[6][i]
        self.payload: bytes = entry[7][i]
        self.exchange, self.incarnation = xid, incarnation
        self.pos: int = entry[0]
        self.idx: int = entry[1] + i
        self.deliveries: int = entry[2]
        self.priority: int = entry[8]
        self.key_bytes: bytes | None = entry[9] or None
        # Each message its own copy: the messages of an entry share one map on the wire.
        self.headers: Mapping[str, bytes] = dict(entry[10]) if len(entry) > 10 else EMPTY_HEADERS
        self._member = member
        self.settled = False

    @property
    def topic(self) -> str:
        return topic_text(self.topic_bytes)

    @property
    def key(self) -> str | None:
        return topic_text(self.key_bytes) if self.key_bytes is not None else None

    @property
    def id(self) -> str:
        """Unique per message, the same on every redelivery and after failover: an idempotency key."""
        return f"{self.publisher}:{self.seq}"

    @property
    def redelivered(self) -> bool:
        return self.deliveries > 1

    def ack(self) -> None:
        """Done: the group forgets the message (a second ack or nack does nothing)."""
        self._member._settle(self, protocol.ACK)

    def nack(self, requeue: bool = True) -> None:
        """Not done: back to the group now (counts as a delivery), or with `requeue=False`
        straight to the group's dead-letter topic."""
        self._member._settle(self, protocol.NACK if requeue else "drop")

    def __repr__(self) -> str:
        headers = f", headers={dict(self.headers)!r}" if self.headers else ""
        return (f"WorkMessage(id={self.id!r}, topic={self.topic!r}, deliveries={self.deliveries}, "
                f"priority={self.priority}, key={self.key!r}{headers}, {len(self.payload)} bytes)")
