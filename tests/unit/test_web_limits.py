"""The gateway's bounds as pure logic (roq_web/limits.py): lines counted exactly at the bound, in
chunks cut anywhere; what a request reserves; per-caller and total slots."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from roq.config import PUBLISH_MESSAGE_COST
from roq.errors import MessageTooLargeError
from roq_web.limits import BodyLimits, Budget, CallerLimitError, GatewayBusyError, Reservation, Slots, read_messages

LIMITS = BodyLimits(max_bytes=10_000, max_messages=5, max_message_bytes=100)


def read(body: bytes, cuts: list[int], split: bool = True, budget: int = 1 << 20) -> tuple[list[bytes], int]:
    """The messages read from `body` arriving in chunks cut at `cuts`, and what was reserved."""
    async def chunks() -> AsyncIterator[bytes]:
        start = 0
        for cut in sorted(c % (len(body) + 1) for c in cuts) + [len(body)]:
            if cut > start:
                yield body[start:cut]
                start = cut

    reservation = Reservation(Budget(budget))
    messages = anyio.run(read_messages, chunks(), LIMITS, split, reservation)
    return messages, reservation.amount


@given(lines=st.lists(st.binary(max_size=8).map(lambda b: b.replace(b"\n", b"")), max_size=5),
       crlf=st.booleans(), final=st.booleans(), cuts=st.lists(st.integers(min_value=0), max_size=4))
def test_up_to_the_bound_the_lines_are_the_messages_however_the_body_is_cut(
        lines: list[bytes], crlf: bool, final: bool, cuts: list[int]) -> None:
    end = b"\r\n" if crlf else b"\n"
    body = end.join(lines) + (end if final and lines else b"")
    messages, reserved = read(body, cuts)
    # One CR before the LF belongs to the line ending: a line's own last CR goes only when the body
    # ends its lines with LF alone (with CRLF, that CR is the ending's and the line's stays), and
    # never from a last line with no ending after it.
    ended = [i < len(lines) - 1 or final for i in range(len(lines))]
    want = [line[:-1] if line.endswith(b"\r") and not crlf and has_end else line
            for line, has_end in zip(lines, ended, strict=True)]
    if lines and not final and lines[-1] == b"":
        want.pop()  # an empty last line without its ending is no line
    assert messages == want
    assert reserved == 2 * len(body) + len(messages) * PUBLISH_MESSAGE_COST


@pytest.mark.parametrize("body", [b"a\n" * 6, b"a\n" * 5 + b"b", b"\n" * 50_000])
def test_one_line_over_the_bound_is_refused(body: bytes) -> None:
    with pytest.raises(MessageTooLargeError, match="web.max_request_messages=5"):
        read(body, [1, 7])


def test_bodies_are_bounded_as_they_arrive_and_one_message_by_its_own_bound() -> None:
    with pytest.raises(MessageTooLargeError, match="web.max_body_bytes=10000"):
        read(b"x" * 10_001, [5_000])
    assert read(b"x" * 100, [], split=False)[0] == [b"x" * 100]
    with pytest.raises(MessageTooLargeError, match="exchange.max_message_bytes"):
        read(b"x" * 101, [], split=False)


def test_a_request_that_would_pass_the_budget_is_refused_and_the_budget_is_whole_again() -> None:
    budget = Budget(1_000)
    held = Reservation(budget)
    held.add(600)
    with pytest.raises(GatewayBusyError, match="web.publish_memory_bytes=1000"):
        Reservation(budget).add(401)
    held.release()
    assert budget.used == 0
    with pytest.raises(GatewayBusyError):
        read(b"x\n" * 5, [], budget=10)


def test_slots_are_bounded_per_caller_and_in_all() -> None:
    slots = Slots("streams", 3, 2, ("web.max_streams", "web.max_streams_per_client"))
    slots.take("a")
    slots.take("a")
    with pytest.raises(CallerLimitError, match="web.max_streams_per_client=2"):
        slots.take("a")
    slots.take("b")
    with pytest.raises(GatewayBusyError, match="web.max_streams=3"):
        slots.take("c")
    slots.give_back("a")
    slots.take("c")
    assert slots.in_use == 3
    unbounded = Slots("streams", 2, 0, ("web.max_streams", "web.max_streams_per_client"))
    unbounded.take("a")
    unbounded.take("a")  # 0: no per-caller bound
    with pytest.raises(GatewayBusyError):
        unbounded.take("a")
