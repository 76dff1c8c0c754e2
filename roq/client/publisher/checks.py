"""What a Publisher accepts, checked before anything is queued: topics (each checked once, then
remembered), a message's attributes and headers (its topic slot, docs/protocol.md section 3.2)
and payloads (bytes, within exchange.max_message_bytes). Every failure is a UserError, TypeError
or MessageTooLargeError naming the offender; nothing here touches the log."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from roq import protocol
from roq.errors import MessageTooLargeError, UserError
from roq.names import check_topic
from roq.protocol import Attributed

TOPIC_CACHE = 10_000  # validated topics remembered; the cache starts again when full

Headers = Mapping[str, bytes | str]


class TopicChecks:
    """Topic slots as the log holds them, for one publisher (`max_message`: the exchange's limit)."""

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.known: dict[str | bytes, bytes] = {}  # validated topics, so publish() checks each once

    def remember(self, topic: str | bytes) -> bytes:
        checked = check_topic(topic)
        if len(self.known) >= TOPIC_CACHE:
            self.known.clear()
        self.known[topic] = checked
        return checked

    def each(self, topics: Iterable[str | bytes], count: int) -> list[bytes]:
        """Each of `count` messages' own topic, checked (each distinct one once); UserError unless
        there is exactly one per message."""
        known = self.known
        checked = [known.get(topic) or self.remember(topic) for topic in topics]
        if len(checked) != count:
            raise UserError(f"{len(checked)} topics for {count} payloads: give one topic, or one per payload")
        return checked

    def attributed_slot(self, topic: str | bytes, priority: int | None, not_before: float | None,
                        key: str | bytes | None, headers: Headers | None = None) -> tuple[Attributed, int]:
        """The topic slot of a message with attributes: [topic, priority, not_before_ms, key] or
        [topic, priority, not_before_ms, key, headers] (protocol section 3.2), sized as it travels
        (its headers' bytes count in the batch's size), and the size of its headers."""
        priority = 0 if priority is None else priority
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= protocol.MAX_PRIORITY:
            raise UserError(f"priority must be an integer from 0 (first) to {protocol.MAX_PRIORITY}, got {priority!r}")
        not_before_ms = 0
        if not_before is not None:
            if not isinstance(not_before, (int, float)) or isinstance(not_before, bool) or not 0 <= not_before < 1e15:
                raise UserError(f"not_before must be a Unix time in seconds, got {not_before!r}")
            not_before_ms = round(not_before * 1000)
        raw_key = key.encode() if isinstance(key, str) else b"" if key is None else key
        if not isinstance(raw_key, bytes) or len(raw_key) > protocol.MAX_KEY:
            raise UserError(f"key must be str or bytes of at most {protocol.MAX_KEY} bytes, got {key!r}")
        checked = protocol.check_headers(headers)
        headers_size = protocol.headers_size(checked) if checked else 0
        slot = protocol.attributed_topic(self.remember(topic), priority, not_before_ms, raw_key, checked)
        return Attributed(slot, len(slot[0]) + len(raw_key) + headers_size), headers_size

    def slots(self, topic: str | bytes, items: list[bytes], headers: list[Headers]) -> list[Any]:
        """Each message's topic slot (with its headers, if any); MessageTooLargeError for a payload
        whose headers take it over the limit."""
        slots: list[Any] = []
        plain = self.remember(topic)
        for i, (payload, own) in enumerate(zip(items, headers)):
            if not own:
                slots.append(plain)
                continue
            slot, size = self.attributed_slot(topic, None, None, None, own)
            if len(payload) + size > self.max_message:
                raise MessageTooLargeError(f"payload {i} of {len(payload)} bytes and {size} bytes of headers exceeds "
                                           f"exchange.max_message_bytes={self.max_message}")
            slots.append(slot)
        return slots


def checked_payloads(payloads: Iterable[bytes], max_size: int) -> list[bytes]:
    """The payloads as a list of bytes, checked with C-level calls; raises TypeError or
    MessageTooLargeError (naming the first offender) before anything is queued."""
    items = payloads if type(payloads) is list else list(payloads)
    if items and set(map(type, items)) != {bytes}:
        for i, payload in enumerate(items):
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise TypeError(f"payload {i} must be bytes, not {type(payload).__name__}")
        items = list(map(bytes, items))
    if items and max(map(len, items)) > max_size:
        i = next(i for i, payload in enumerate(items) if len(payload) > max_size)
        raise MessageTooLargeError(f"payload {i} of {len(items[i])} bytes exceeds "
                                   f"exchange.max_message_bytes={max_size}")
    return items
