"""An incarnation that ended while a durable subscriber was away (roq/client/subscriber/streams.py).

Reported: a subscriber resumed from its saved position after its exchange's journal was dropped
got nothing and said gaps 0. A stream resumed from a saved position that ended with no copy left
cannot be verified: it counts one unknown gap, never 0. Drained from a copy, or seen running by
this subscriber (the publishers' replay then covered it), nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from roq import protocol
from roq.client.subscriber.streams import NoCopy, StreamSet


class Transport:
    """A replay transport with a copy of the ended incarnations in `copies` (their next position)."""

    def __init__(self, copies: dict[str, int]) -> None:
        self.copies = copies

    def fetch(self, exchange: str, incarnation: str, after: int, before: int,
              prefix: bytes) -> Iterator[protocol.Frames]:
        yield from ()  # the copy holds nothing beyond what was taken

    def position(self, exchange: str, prefixes: list[bytes]) -> protocol.StreamPosition:
        raise NoCopy(exchange)

    def ended_position(self, exchange: str, incarnation: str, prefixes: list[bytes]) -> protocol.StreamPosition:
        if incarnation not in self.copies:
            raise NoCopy(incarnation)
        end = self.copies[incarnation]
        return protocol.StreamPosition(1, incarnation, 1, end, [end - 1] * len(prefixes))


def ended(streams: StreamSet, incarnation: str) -> StreamSet:
    streams.end(incarnation, now=0.0)
    streams.drain_ended(now=0.0)
    assert incarnation not in streams.streams, "forgotten"
    return streams


def test_a_resumed_stream_that_ended_with_no_copy_counts_an_unknown_gap(caplog: pytest.LogCaptureFixture) -> None:
    streams = StreamSet([b""], Transport({}), lambda *args: None)
    streams.resume("x1.a", 100)
    ended(streams, "x1.a")
    assert (streams.gaps, streams.unknown_gaps) == (1, 1)
    assert "x1.a ended while this subscriber was away and no copy of it is left" in caplog.text


def test_a_resumed_stream_drained_from_a_copy_counts_nothing() -> None:
    streams = StreamSet([b""], Transport({"x1.a": 101}), lambda *args: None)
    streams.resume("x1.a", 100)
    assert (ended(streams, "x1.a").gaps, streams.unknown_gaps) == (0, 0)


def test_a_stream_seen_running_that_ended_with_no_copy_counts_as_before() -> None:
    streams = StreamSet([b""], Transport({}), lambda *args: None)
    streams.resume("x1.a", 100)
    streams.on_sync(protocol.Sync("x1", "x1.a", 101))  # it ran while we followed it
    assert (ended(streams, "x1.a").gaps, streams.unknown_gaps) == (0, 0)
