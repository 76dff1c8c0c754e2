"""Large payloads as ZeroMQ parts of their own (docs/protocol.md 3.2.2 and 4.2).

A payload block (a two-part batch's payloads, a delivery's field 9) may hold a small integer in
place of a `bin`: the payload is then the ZeroMQ part of that index among the parts that follow
the block's message, so that its bytes are never packed into, nor copied out of, a msgpack value.
The k-th integer slot of a block (counting from 0) is k, and every part is named once: a decoder
checks both, so that parts and slots cannot be paired in two ways.

Parts are kept as the objects the socket gave (pyzmq `Frame`s, which share libzmq's buffer when
sent on) or as bytes; anything with a length and a buffer will do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from roq.errors import ProtocolError

LARGE_PAYLOAD_BYTES = 16 << 10  # the client's default threshold (client.large_payload_bytes)
MAX_PARTS = 4096  # large payloads' parts after one batch's block (a delivery has at most as many)


def resolve(slots: list[Any], parts: Sequence[Any], what: str) -> list[Any]:
    """A block's payloads with each integer slot replaced by its part; ProtocolError (saying what
    is wrong with `what`) unless the k-th integer slot is k and every part is named."""
    payloads: list[Any] = []
    named = 0
    for slot in slots:
        if type(slot) is int:
            if slot != named or named >= len(parts):
                raise ProtocolError(f"{what}: integer slot {named} names part {slot}; slots must number the "
                                    f"{len(parts)} parts after the block 0, 1, 2, ... in order")
            payloads.append(parts[named])
            named += 1
        else:
            payloads.append(slot)
    if named != len(parts):
        raise ProtocolError(f"{what}: {len(parts)} parts follow the block but {named} slots name one")
    return payloads


def split(payloads: list[Any]) -> tuple[list[Any], list[Any]]:
    """The inverse of `resolve`: each payload that is not bytes (a part of its own) becomes the
    next integer slot. Returns (slots, parts)."""
    slots: list[Any] = []
    parts: list[Any] = []
    for payload in payloads:
        if type(payload) is bytes:
            slots.append(payload)
        else:
            slots.append(len(parts))
            parts.append(payload)
    return slots, parts


def as_bytes(part: Any) -> bytes:
    """A part's bytes: a pyzmq Frame's once (it caches them), bytes as they are."""
    if type(part) is bytes:
        return part
    data = getattr(part, "bytes", None)
    return data if isinstance(data, bytes) else bytes(part)


def as_view(part: Any) -> memoryview:
    """A part's bytes without a copy: a read-only view of a pyzmq Frame's buffer (the view keeps
    the Frame, and so libzmq's message, alive), or of bytes."""
    buffer = getattr(part, "buffer", None)
    return (buffer if isinstance(buffer, memoryview) else memoryview(part)).toreadonly()


class LargeBody:
    """A delivery body whose large payloads follow it as ZeroMQ parts: what retention holds and
    fetch replies carry for such a frame. Its length is all its bytes, for byte budgets."""

    __slots__ = ("body", "parts", "size")

    def __init__(self, body: bytes, parts: Sequence[Any]) -> None:
        self.body = body
        self.parts = tuple(parts)
        self.size = len(body) + sum(map(len, self.parts))

    def __len__(self) -> int:
        return self.size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LargeBody) and self.body == other.body and \
            [as_bytes(p) for p in self.parts] == [as_bytes(p) for p in other.parts]

    __hash__ = None  # type: ignore[assignment]

    def inline(self) -> bytes:
        """The same delivery with every payload a `bin` in the body: what the journal writes and a
        replica is sent (those paths pack the bytes anyway), and what an older reader can take."""
        msg = msgpack.unpackb(self.body, raw=False)
        msg[9] = [as_bytes(p) for p in resolve(msg[9], self.parts, "delivery")]
        packed: bytes = msgpack.packb(msg, use_bin_type=True)
        return packed


def inline(body: Any) -> bytes:
    """A retained body as one `bin`-only delivery (LargeBody.inline), bytes as they are."""
    return body.inline() if isinstance(body, LargeBody) else body
