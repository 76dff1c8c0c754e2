"""What a subscriber hands to its application: a `Message` each (iterator and callback styles), or
a `MessageBatch` per exchange frame, its messages of any topics (batch callback style)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

from roq import protocol
from roq.client.headers import EMPTY_HEADERS
from roq.names import topic_text


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
    """The fresh messages of one exchange frame, from one publisher (duplicates already removed):
    what a `batch_callback` gets, with no object per message. A frame may hold messages of many
    topics (docs/protocol.md 4.2): `topic` is the frame's routing topic, a prefix of every
    message's topic (their one topic when they have one); `topics[i]` is message i's own topic, or
    `topics` is None when every message's topic is `topic`. `message_topics()` gives the list
    either way.
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
    topics: list[str] | None = None  # each message's topic; None: all are `topic`

    @property
    def topic_bytes(self) -> bytes:
        return self.topic.encode("utf-8", "surrogateescape")

    def message_topics(self) -> list[str]:
        """Each message's topic, in order (`topics`, or `topic` repeated)."""
        return self.topics if self.topics is not None else [self.topic] * len(self.seqs)

    def messages(self) -> Iterator[Message]:
        """The batch as one Message each, for code written against the per-message API."""
        headers = self.headers or [EMPTY_HEADERS] * len(self.seqs)
        for topic, payload, seq, own in zip(self.message_topics(), self.payloads, self.seqs, headers):
            yield Message(topic, payload, self.publisher, seq, self.exchange, self.sent_ns,
                          self.incarnation, self.pos, own or EMPTY_HEADERS)


def frame_batch(routing: bytes, d: protocol.Delivery, fresh: range | list[int]) -> MessageBatch:
    """The batch of frame `d` (routing topic `routing`) holding its messages `fresh` (ascending
    indexes; all of them as a range): one per frame, whatever topics its messages have."""
    headers: list[Mapping[str, bytes]] | None = d.headers() if d.attrs else None  # type: ignore[assignment]
    payloads, seqs, own, topics = d.payloads, d.seqs, headers, d.topics
    if len(fresh) != len(seqs):  # duplicates left out: copy the rest (the whole frame is shared)
        payloads, seqs = [payloads[i] for i in fresh], [seqs[i] for i in fresh]
        own = [headers[i] for i in fresh] if headers else None
        topics = [topics[i] for i in fresh] if topics is not None else None
    if topics is not None and topics.count(topics[0]) == len(topics):
        routing, topics = topics[0], None  # what is left (of a fetched frame, say) has one topic
    return MessageBatch(topic_text(routing), payloads, d.publisher, seqs, d.exchange, d.sent_ns, d.incarnation, d.pos,
                        own, topic_texts(topics) if topics is not None else None)


def topic_texts(topics: list[bytes]) -> list[str]:
    """The topics as text, converting each distinct one once (a frame repeats few of them)."""
    names = {t: topic_text(t) for t in set(topics)}
    return list(map(names.__getitem__, topics))
