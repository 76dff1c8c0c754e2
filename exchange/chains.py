"""Per-prefix chains: how a subscriber tells, from positions alone, that frames never reached it.

The exchange numbers every frame it sends (`pos`, per incarnation) and libzmq filters frames by
the subscribers' topic prefixes. For every prefix some subscriber subscribed to, the exchange
remembers the position of the last frame whose topic starts with it, and each frame carries,
for each such prefix it matches, `[len(prefix), prev]`: no frame of that prefix lies strictly
between `prev` and `pos`. A subscriber follows the chains of its own prefixes; a `prev` above
what it has handled for a prefix is a hole (the XPUB high-water mark dropped frames for it, a
connection broke), fetched from retention before the frame is handed over. The first frame of a
topic is covered like any other, since chains follow prefixes, not topics.

A prefix starts being tracked at the position where its first subscription arrived (the chain
then starts there: the subscriber's sync point is later). Forgetting a prefix is always safe:
when it is tracked again its chain restarts at the current position, which only makes a
subscriber fetch more than it needed. So prefixes are forgotten when their subscription count
falls to zero, and beyond `limit` prefixes the least recently matched are forgotten first.
Unsubscribe events can be forged by any peer of the XPUB socket; the worst they do is this.

The same matches decide how a batch of many topics is cut into frames (exchange/grouping.py): a
topic's `key` is the tuple of tracked prefixes it starts with. That is exact only while every
subscribed prefix is tracked: `complete` says so (a prefix dropped over `limit` while still
subscribed makes it False until it is unsubscribed or tracked again).
"""

from __future__ import annotations

from collections import OrderedDict

CACHE_LIMIT = 100_000  # topics whose matching prefixes are cached


class PrefixChains:
    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self.last: OrderedDict[bytes, int] = OrderedDict()  # tracked prefix → position of its last frame
        self.counts: dict[bytes, int] = {}  # subscriptions seen per prefix (may be forged: a hint)
        self._lengths: list[int] = []  # distinct lengths of tracked prefixes
        self._matches: dict[bytes, tuple[bytes, ...]] = {}  # topic → tracked prefixes it starts with
        self.dropped: dict[bytes, int] = {}  # subscribed prefixes forgotten over `limit`, their counts

    @property
    def complete(self) -> bool:
        """Every prefix some subscriber is subscribed to is tracked."""
        return not self.dropped

    def subscribe(self, prefix: bytes, next_pos: int) -> None:
        self.track(prefix, next_pos)
        self.counts[prefix] = self.counts.get(prefix, 0) + 1

    def unsubscribe(self, prefix: bytes) -> None:
        if prefix in self.dropped:
            left = self.dropped.pop(prefix) - 1
            if left > 0:
                self.dropped[prefix] = left
            return
        count = self.counts.get(prefix, 0) - 1
        if count > 0:
            self.counts[prefix] = count
            return
        self.counts.pop(prefix, None)
        if self.last.pop(prefix, None) is not None:
            self._changed()

    def track(self, prefix: bytes, next_pos: int) -> int:
        """Follow `prefix` from now on (if not yet); returns its chain's last position."""
        last = self.last.get(prefix)
        if last is None:
            last = self.last[prefix] = next_pos - 1  # no frame of it after this was sent untracked
            if prefix in self.dropped:
                self.counts[prefix] = self.dropped.pop(prefix)
            if len(self.last) > self.limit:
                dropped, _ = self.last.popitem(last=False)
                subscribed = self.counts.pop(dropped, 0)
                if subscribed > 0:
                    self.dropped[dropped] = subscribed
            self._changed()
        return last

    def keys(self, topics: list[bytes]) -> list[tuple[bytes, ...]]:
        """Each topic's key: the tracked prefixes it starts with (C-level lookups when cached)."""
        keys = list(map(self._matches.get, topics))
        if None in keys:
            keys = [self._match(t) if k is None else k for t, k in zip(topics, keys)]
        return keys  # type: ignore[return-value]

    def links(self, topic: bytes, pos: int) -> list[list[int]]:
        """The chains a frame at `pos` on `topic` carries, and advance them to it."""
        matched = self._matches.get(topic)
        if matched is None:
            matched = self._match(topic)
        if not matched:
            return []
        last = self.last
        links = []
        for prefix in matched:
            links.append([len(prefix), last[prefix]])
            last[prefix] = pos
            last.move_to_end(prefix)
        return links

    def _match(self, topic: bytes) -> tuple[bytes, ...]:
        tracked = self.last
        matched = tuple(topic[:n] for n in self._lengths if n <= len(topic) and topic[:n] in tracked)
        if len(self._matches) >= CACHE_LIMIT:
            self._matches.clear()
        self._matches[topic] = matched
        return matched

    def _changed(self) -> None:
        self._lengths = sorted({len(p) for p in self.last})
        self._matches.clear()
