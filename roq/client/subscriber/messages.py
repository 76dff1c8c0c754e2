"""What a subscriber hands to its application: a `Message` each (iterator and callback styles), or
a `MessageBatch` per exchange frame (batch callback style)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

from roq.client.headers import EMPTY_HEADERS


class Message(NamedTuple):  # a tuple: cheap to build, once per message
    """One message. `topic` is text (str, as given to `publish()`); `topic_bytes` the exact bytes.
    `headers`: the publisher's headers (str → bytes), an empty mapping when it gave none."""
    topic: str
    payload: bytes
    publisher: str
    seq: int
    exchange: str
    sent_ns: int
    incarnation: str = ""
    pos: int = 0
    headers: Mapping[str, bytes] = EMPTY_HEADERS

    @property
    def topic_bytes(self) -> bytes:
        return self.topic.encode("utf-8", "surrogateescape")


class MessageBatch(NamedTuple):
    """Consecutive messages of one publisher and topic, as one exchange frame brought them
    (duplicates already removed): what a `batch_callback` gets, with no object per message.
    `headers[i]` are message i's headers when any message of the batch has some (else None)."""
    topic: str
    payloads: list[bytes]
    publisher: str
    seqs: list[int]  # seqs[i] is the sequence number of payloads[i], ascending
    exchange: str
    sent_ns: int
    incarnation: str = ""
    pos: int = 0
    headers: list[Mapping[str, bytes]] | None = None

    @property
    def topic_bytes(self) -> bytes:
        return self.topic.encode("utf-8", "surrogateescape")

    def messages(self) -> Iterator[Message]:
        """The batch as one Message each, for code written against the per-message API."""
        headers = self.headers or [EMPTY_HEADERS] * len(self.seqs)
        for payload, seq, own in zip(self.payloads, self.seqs, headers):
            yield Message(self.topic, payload, self.publisher, seq, self.exchange, self.sent_ns,
                          self.incarnation, self.pos, own or EMPTY_HEADERS)
