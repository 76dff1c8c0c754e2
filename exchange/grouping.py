"""How a batch of many topics is cut into delivery frames (docs/protocol.md section 4.2).

Consecutive messages whose topics start with the same tracked prefixes (the same `key`,
exchange/chains.py) go into one frame; its routing topic (the ZeroMQ frame libzmq filters on) is
the longest common prefix of its topics. Runs, not one frame per key: a subscriber may take
frames of several keys (prefixes "a" and "b"; or "a", which frames of keys (a,) and (a, ab) both
reach), and frames in batch order keep a publisher's messages in order across topics
(docs/guarantees.md). A tracked prefix that matches one topic
of a group matches all of them, so it is a prefix of that routing topic, and any prefix of the
routing topic matches every message: XPUB's prefix filter hands the frame to exactly the
subscribers whose prefixes match its messages, and each of them wants every message in it.

That needs every subscribed prefix to be tracked: while one is not (chains.complete is False),
messages are grouped by their exact topic instead (a frame per run of equal keys would otherwise
route by a prefix that an untracked subscription does not share).

The common case, one key for the whole batch, is decided with C-level calls (set, map over the
chains' cache, os.path.commonprefix): no Python loop per message.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NamedTuple

from exchange.chains import PrefixChains


def routing_topic(distinct: Any) -> bytes:
    """The longest common prefix of a frame's distinct topics (one topic: that topic)."""
    if len(distinct) == 1:
        return next(iter(distinct))
    prefix: bytes = os.path.commonprefix(list(distinct))
    return prefix


def groups_of(chains: PrefixChains, topics: list[bytes], distinct: set[bytes]) -> list[list[int]] | None:
    """The messages' indexes per frame (runs of one key, in batch order); None when the whole batch
    is one frame. `distinct` is set(topics)."""
    if len(distinct) == 1:
        return None
    if chains.complete:
        listed = list(distinct)
        keys = chains.keys(listed)
        if keys.count(keys[0]) == len(keys):
            return None
        per_message: Any = map(dict(zip(listed, keys)).__getitem__, topics)
    else:
        per_message = topics  # some subscribed prefix is not tracked: one frame per topic
    runs: list[list[int]] = []
    current: Any = None
    for index, key in enumerate(per_message):
        if key != current or not runs:
            runs.append([index])
            current = key
        else:
            runs[-1].append(index)
    return runs


class Frame(NamedTuple):
    """One delivery frame's messages: `topics` is None when all have the routing `topic`; `attrs`
    are [index in this frame, priority, not_before_ms, key(, headers)]."""
    topic: bytes
    topics: list[bytes] | None
    seqs: list[int]
    payloads: list[bytes]
    attrs: list[list[Any]] | None
    whole: bool  # the frame holds every message given (a two-part batch's block may be spliced)


def frames_of(chains: PrefixChains, seqs: list[int], topics: list[bytes], payloads: list[bytes],
              attrs: list[list[Any]] | None = None, distinct: set[bytes] | None = None) -> Iterator[Frame]:
    """The frames that carry these messages (attrs indexed as `topics` is), in order."""
    distinct = set(topics) if distinct is None else distinct
    groups = groups_of(chains, topics, distinct)
    if groups is None:
        yield Frame(routing_topic(distinct), topics if len(distinct) > 1 else None, seqs, payloads, attrs or None,
                    True)
        return
    by_index = {a[0]: a for a in attrs or ()}
    for indexes in groups:
        group_topics = [topics[i] for i in indexes]
        group_distinct = set(group_topics)
        group_attrs = [[n, *by_index[i][1:]] for n, i in enumerate(indexes) if i in by_index] if by_index else None
        yield Frame(routing_topic(group_distinct), group_topics if len(group_distinct) > 1 else None,
                    [seqs[i] for i in indexes], [payloads[i] for i in indexes], group_attrs or None, False)
