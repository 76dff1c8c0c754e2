"""What HTTP callers may cost the gateway, each and together (docs/http.md "Limits").

A caller is the name of its token with `web.auth` on, its address with it off. Each publish
request holds a slot while it runs (`web.max_publish_requests`, `web.max_publish_requests_per_client`)
and reserves what it costs from one budget shared by all of them (`web.publish_memory_bytes`): every
byte of its body twice (the body, then its messages cut from it) and PUBLISH_MESSAGE_COST per message
(the objects that carry it), reserved chunk by chunk as the body is read. With `split=lines` the
messages are counted in the bytes as they arrive (`bytes.count`, no object per line), so a body of
more than `web.max_request_messages` lines is refused before anything is cut from it.

On failure nothing is published and nothing stays reserved: a request over a per-request bound is
answered 413 `too_large` as soon as it crosses it (the rest of its body is read and dropped by
the server), a caller over its own share 429 `too_many_requests`, and any caller when the
gateway's shares are all taken 503 `busy`, both with Retry-After.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from roq.config import PUBLISH_MESSAGE_COST, WebConfig
from roq.errors import MessageTooLargeError, RoqError, UnavailableError, UserError


class GatewayBusyError(UnavailableError):
    """Every slot, or the whole budget, of the gateway is taken: any caller may retry soon."""
    code = "busy"


class CallerLimitError(RoqError):
    """This caller holds its whole share: it must finish something first."""
    code = "too_many_requests"


class Slots:
    """At most `total` holders at once, and at most `per_caller` with the same caller (0: no
    per-caller bound). `what` and the setting names make the refusals say what to change."""

    def __init__(self, what: str, total: int, per_caller: int, settings: tuple[str, str],
                 busy: type[RoqError] = GatewayBusyError) -> None:
        self.what, self.total, self.per_caller, self.settings, self.busy = what, total, per_caller, settings, busy
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self.in_use = 0

    def take(self, caller: str) -> None:
        with self._lock:
            mine = self._held.get(caller, 0)
            if self.per_caller and mine >= self.per_caller:
                raise CallerLimitError(f"{caller} already has {mine} {self.what} open here "
                                       f"({self.settings[1]}={self.per_caller}): finish one first")
            if self.in_use >= self.total:
                raise self.busy(f"this gateway serves {self.settings[0]}={self.total} {self.what} already: "
                                "retry later or use another gateway")
            self._held[caller] = mine + 1
            self.in_use += 1

    def give_back(self, caller: str) -> None:
        with self._lock:
            left = self._held.pop(caller) - 1
            if left:
                self._held[caller] = left
            self.in_use -= 1

    @contextlib.contextmanager
    def held(self, caller: str) -> Iterator[None]:
        self.take(caller)
        try:
            yield
        finally:
            self.give_back(caller)


class Budget:
    """Bytes of memory shared by the publish requests in flight."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._lock = threading.Lock()
        self.used = 0

    def reserve(self, amount: int) -> None:
        with self._lock:
            if self.used + amount > self.total:
                raise GatewayBusyError(f"the publish requests in flight here hold web.publish_memory_bytes="
                                       f"{self.total} already: retry later or use another gateway")
            self.used += amount

    def release(self, amount: int) -> None:
        with self._lock:
            self.used -= amount


class Reservation:
    """What one request reserved from the budget so far; all given back by `release`."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.amount = 0

    def add(self, amount: int) -> None:
        self.budget.reserve(amount)
        self.amount += amount

    def release(self) -> None:
        self.budget.release(self.amount)
        self.amount = 0


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int  # the whole body
    max_messages: int  # messages cut from it (split=lines)
    max_message_bytes: int  # one message: the whole body when it is not split


async def read_messages(chunks: AsyncIterator[bytes], limits: BodyLimits, split_lines: bool,
                        reservation: Reservation) -> list[bytes]:
    """The request's messages: its body, or with `split_lines` its lines (LF or CRLF, neither kept;
    a final line ending adds no empty message). Bounds are checked as each chunk arrives, before
    the next is read and before any message is cut."""
    most = limits.max_bytes if split_lines else min(limits.max_bytes, limits.max_message_bytes)
    parts: list[bytes] = []
    size = newlines = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > most:
            raise MessageTooLargeError(_too_large(split_lines, most))
        found = chunk.count(b"\n") if split_lines else 0
        newlines += found
        if newlines > limits.max_messages:
            raise MessageTooLargeError(f"a request may hold at most web.max_request_messages={limits.max_messages} "
                                       "messages (lines)")
        reservation.add(2 * len(chunk) + found * PUBLISH_MESSAGE_COST)
        parts.append(chunk)
    body = b"".join(parts)
    del parts  # the chunks go before the lines are cut: the body counts twice, not three times
    if not split_lines:
        reservation.add(PUBLISH_MESSAGE_COST)
        return [body]
    unterminated = bool(body) and not body.endswith(b"\n")
    if newlines + unterminated > limits.max_messages:
        raise MessageTooLargeError(f"a request may hold at most web.max_request_messages={limits.max_messages} "
                                   "messages (lines)")
    reservation.add(unterminated * PUBLISH_MESSAGE_COST)
    lines = body.split(b"\n")
    del body  # what the lines are cut from goes before the CRLF lines are copied shorter
    return without_line_ends(lines)


async def read_envelope(chunks: AsyncIterator[bytes], limits: BodyLimits, reservation: Reservation) -> list[Any]:
    """The request's JSON envelope (`envelope=json`): one message object, or an array of them.
    The body is bounded as it arrives, like a split body; parsing reserves what the parsed objects
    may cost (every byte of the body again, and PUBLISH_MESSAGE_COST per message)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limits.max_bytes:
            raise MessageTooLargeError(_too_large(True, limits.max_bytes))
        reservation.add(3 * len(chunk))  # the body, its parsed strings, the messages' bytes
        parts.append(chunk)
    try:
        value = json.loads(b"".join(parts))
    except (ValueError, RecursionError):
        raise UserError("envelope=json: the body is not JSON (one message object, or an array of them)") from None
    items = value if isinstance(value, list) else [value]
    if len(items) > limits.max_messages:
        raise MessageTooLargeError(f"a request may hold at most web.max_request_messages={limits.max_messages} "
                                   "messages")
    reservation.add(len(items) * PUBLISH_MESSAGE_COST)
    return items


def without_line_ends(lines: list[bytes]) -> list[bytes]:
    """Pieces of a body cut at LF as lines: the CR of CRLF dropped (in place: each long line goes as
    its copy comes), and the empty piece after a final line ending too. The last piece ends with no
    LF, so a CR at its end is the line's own and stays."""
    last = lines.pop() if lines else b""
    for i, line in enumerate(lines):
        if line.endswith(b"\r"):
            lines[i] = line[:-1]
    if last:
        lines.append(last)
    return lines


def _too_large(split_lines: bool, most: int) -> str:
    if split_lines:
        return f"a request body may hold at most web.max_body_bytes={most} bytes"
    return (f"a request body without split=lines is one message: at most {most} bytes "
            "(exchange.max_message_bytes, web.max_body_bytes)")


class Limits:
    """The gateway's bounds on publish requests and streams (web.* settings)."""

    def __init__(self, web: WebConfig, max_message_bytes: int, max_unconfirmed: int) -> None:
        # A request larger than what the gateway's publisher may hold unconfirmed could never be taken.
        self.body = BodyLimits(web.max_body_bytes, min(web.max_request_messages, max_unconfirmed), max_message_bytes)
        self.publishes = Slots("publish requests", web.max_publish_requests, web.max_publish_requests_per_client,
                               ("web.max_publish_requests", "web.max_publish_requests_per_client"))
        self.budget = Budget(web.publish_memory_bytes)

    @contextlib.contextmanager
    def publishing(self, caller: str) -> Iterator[Reservation]:
        """A publish request's slot and reservation, both given back when it ends however it ends."""
        with self.publishes.held(caller):
            reservation = Reservation(self.budget)
            try:
                yield reservation
            finally:
                reservation.release()
