"""The subscribers' side: every accepted frame numbered, retained, journaled and published.

Each frame sent to subscribers (the messages of one group, exchange/grouping.py) gets the next
position of this incarnation's stream, carries the chains of the subscribed prefixes its routing
topic matches (exchange/chains.py), is kept in the retention
buffer (and the journal) and goes out on XPUB as [topic, body], so libzmq filters by topic
prefix. Slow subscribers: XPUB keeps at most `exchange.sub_hwm` frames per subscriber and drops
beyond that for that subscriber only; the subscriber sees the broken chain and fetches the
missing frames from retention through the replay socket (exchange/replay.py). A subscription to a
sync marker topic is answered with the next position, so a subscriber knows from where on its
subscription is live; beats tell idle subscribers where the stream is.
"""

from __future__ import annotations

from typing import Any

import zmq

from exchange.parts import Parts
from roq import protocol

MAX_SUBSCRIBERS = 100_000  # sync markers remembered (the subscriber count)
# A plain int: or-ing pyzmq's enum flags costs microseconds on the per-frame path.
_MORE = int(zmq.SNDMORE)
ZERO_COPY_BYTES = 64 << 10  # frames this big are sent without copying (smaller: the copy is cheaper)


class Fanout:
    def __init__(self, parts: Parts) -> None:
        self.xid = parts.stream.xid
        self.incarnation = parts.stream.incarnation
        self.back = parts.back
        self.retention = parts.retention
        self.chains = parts.chains
        self.stats = parts.stats
        self.groups = parts.groups
        self.offer = parts.feed.offer
        self.journal = parts.journal  # None once the journal is switched off (exchange/durability.py)
        self.disk = parts.disk  # keeps what the retention keeps, on disk, with a disk storage policy
        # Sync markers subscribed, counted: one per RoQ subscriber (a reconnecting subscriber's new
        # subscription may arrive before its old connection's unsubscription).
        self.subscribers: dict[bytes, int] = {}
        # While a publisher drain holds deliveries (exchange.send_held_frames): each one's parts, in
        # stream order, sent by `release()` just before the drain's acks.
        self._held: list[list[Any]] | None = None

    @property
    def subscriber_count(self) -> int:
        return len(self.subscribers)

    def send(self, topic: bytes, pub: str, sent_ns: int, seqs: list[int], payloads: list[bytes], size: int,
             attrs: list[list[Any]] | None = None, offer: bool = True, block: Any = None,
             topics: list[bytes] | None = None, large: bool = False) -> int:
        """Number, retain and publish one frame of accepted messages (and offer it to the groups);
        `topic` is its routing topic, `topics` each message's topic when they differ from it (a
        frame of many topics, exchange/grouping.py), `size` the payloads' total. `attrs`: [index,
        priority, not_before_ms, key] of messages published with attributes. `block`: the payloads
        as the publisher encoded them (a two-part batch), spliced into the frame as they are.
        `large`: payloads that are not bytes are parts of their own (pyzmq Frames, protocol
        section 4.2), sent after the body as the same objects. Returns the frame's position."""
        pos = self.retention.next_pos
        links = self.chains.links(topic, pos)
        parts: list[Any] = []
        if large:
            slots, parts = protocol.split(payloads)  # the block's integer slots already number them so
        if block is not None:
            body = protocol.encode_delivery_spliced(self.xid, self.incarnation, pos, links, pub, sent_ns,
                                                    seqs, block, topics)
        else:
            body = protocol.encode_delivery(self.xid, self.incarnation, pos, links, pub, sent_ns, seqs,
                                            slots if parts else payloads, attrs, topics)
        kept: Any = protocol.LargeBody(body, parts) if parts else body
        counts = protocol.topic_counts(topics) if topics else None
        self.retention.add(topic, kept, len(seqs), topics=counts)
        if self.disk.store is not None:
            self.disk.append(pos, topic, kept, len(seqs), counts)
        if self.groups and offer:
            # Groups keep bytes (their work frames pack the payloads): a large payload is copied here.
            self.offer(pos, topic, pub, sent_ns, seqs, list(map(protocol.as_bytes, payloads)) if parts else payloads,
                       [tuple(a) for a in attrs] if attrs else None, topics=topics)
        if self.journal is not None:
            self.journal.append(pos, topic, kept.inline() if parts else body, len(seqs))
        if self._held is None:
            self._publish(topic, body, parts)
        else:
            self._held.append([topic, body, parts])
        totals = self.stats.totals
        totals.msgs_out += len(seqs)
        totals.bytes_in += size  # every accepted payload is sent once, here
        totals.bytes_out += size
        totals.frames_out += 1
        return pos

    def hold(self) -> None:
        """Keep the deliveries of the frames sent from now on until `release()`; they are numbered,
        retained and journaled at once."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        """Send the held deliveries, in order, back to back: libzmq's I/O thread is woken once for
        them (and for the acks sent right after), not once per delivery. Holding ends."""
        self.flush()
        self._held = None

    def flush(self) -> None:
        """Send the held deliveries now (an ack is about to go early); holding goes on."""
        held = self._held
        if held:
            self._held = []
            for topic, body, parts in held:
                self._publish(topic, body, parts)

    def _publish(self, topic: bytes, body: bytes, parts: list[Any]) -> None:
        self.back.send(topic, _MORE)  # two sends: send_multipart costs more than the send itself
        # A big frame goes to libzmq without a copy: retention keeps the bytes alive anyway.
        self.back.send(body, _MORE if parts else 0, copy=len(body) < ZERO_COPY_BYTES)
        if parts:
            self._send_parts(parts)

    def _send_parts(self, parts: list[Any]) -> None:
        """The large payloads after the body: the Frames they came in, so libzmq shares their buffers."""
        last = len(parts) - 1
        send = self.back.send
        for index, part in enumerate(parts):
            send(part, 0 if index == last else _MORE, copy=False)

    def drain_subscriptions(self) -> None:
        while True:
            try:
                event = self.back.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, topic = event[:1], event[1:]
            if topic[:1] == b"\x00":  # our own marker topics, not a user's subscription
                if topic.startswith(protocol.SYNC_PREFIX):
                    self._on_marker(kind, topic)
            elif kind == b"\x01":
                self.stats.subscriptions += 1
                self.chains.subscribe(topic, self.retention.next_pos)
            elif kind == b"\x00":
                self.stats.subscriptions = max(0, self.stats.subscriptions - 1)
                self.chains.unsubscribe(topic)

    def _on_marker(self, kind: bytes, marker: bytes) -> None:
        subscribers = self.subscribers
        if kind == b"\x00":
            left = subscribers.get(marker, 0) - 1
            if left > 0:
                subscribers[marker] = left
            else:
                subscribers.pop(marker, None)
            self.stats.subscribers = len(subscribers)
            return
        if kind != b"\x01":
            return
        if marker in subscribers or len(subscribers) < MAX_SUBSCRIBERS:
            subscribers[marker] = subscribers.get(marker, 0) + 1
            self.stats.subscribers = len(subscribers)
        # The subscriber's subscriptions arrived together with (before) its marker, so they are
        # active now: every frame from the next position on reaches it live.
        body = protocol.encode_sync(self.xid, self.incarnation, self.retention.next_pos)
        try:
            self.back.send_multipart([marker, body], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the subscriber falls back to its sync timeout

    def beat(self) -> None:
        body = protocol.encode_sync(self.xid, self.incarnation, self.retention.next_pos, protocol.BEAT)
        try:
            self.back.send_multipart([protocol.BEAT_TOPIC, body], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
