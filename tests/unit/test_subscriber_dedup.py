"""The subscriber's duplicate and gap accounting, on decoded deliveries."""

from __future__ import annotations

from roq.client.subscriber import Subscriber
from roq.protocol import Delivery


def bare_subscriber() -> Subscriber:
    sub = Subscriber.__new__(Subscriber)  # the accounting needs no sockets
    sub._last_seq, sub._topic_last = {}, {}
    sub.received = sub.duplicates = sub.gaps = 0
    sub._closed = False
    got: list[int] = []
    sub.callback = lambda m: got.append(m.seq)
    sub.got = got  # type: ignore[attr-defined]
    return sub


def test_replayed_messages_reach_the_application_once() -> None:
    sub = bare_subscriber()
    sub._deliver(b"t", Delivery("x1", "p", 0, 0, [1, 2, 3], [b"a", b"b", b"c"]))
    sub._deliver(b"t", Delivery("x2", "p", 0, 0, [2, 3, 4], [b"b", b"c", b"d"]))  # after a move
    assert sub.got == [1, 2, 3, 4] and sub.duplicates == 2 and sub.gaps == 0  # type: ignore[attr-defined]


def test_gaps_are_counted_per_topic_not_confused_by_filtering() -> None:
    sub = bare_subscriber()
    sub._deliver(b"a", Delivery("x1", "p", 0, 0, [1], [b""]))
    sub._deliver(b"a", Delivery("x1", "p", 0, 1, [3], [b""]))  # seq 2 was another topic: no gap
    assert sub.gaps == 0
    sub._deliver(b"a", Delivery("x1", "p", 0, 7, [9], [b""]))  # frames 4..7 of topic a were dropped
    assert sub.gaps == 1 and sub.got == [1, 3, 9]  # type: ignore[attr-defined]
