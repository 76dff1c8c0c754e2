"""What every conversation shares: msgpack framing, the data path's layout rule, the common limits.

Every data-path body is a msgpack array [kind, DATA_VERSION, ...fields] (a delivery's topic travels
in the ZeroMQ frame before its body, so that libzmq can filter by prefix). Every integer a peer
sends is range-checked, so nothing downstream can overflow or loop on it.
"""

from __future__ import annotations

from typing import Any

import msgpack

from roq.errors import ProtocolError

VERSION = 1  # the control API's
DATA_VERSION = 3  # 3: frames carry many topics (a batch's and a delivery's per-message topics)
MAX_CONTROL_FRAME = 1 << 20  # control requests are small; refuse anything bigger
MAX_SEQ = (1 << 63) - 1  # sequence numbers, positions and request ids fit a signed 64-bit integer
MAX_U64 = (1 << 64) - 1  # sent_ns: nanoseconds since the epoch, a msgpack uint64
MAX_TOPIC = 255
MAX_PREFIXES = 1024  # prefixes per fetch, position request or group
MAX_INCARNATION = 256

ACK, ERROR = "ack", "error"  # kinds more than one conversation uses


def pack(value: Any) -> bytes:
    """One frame body: msgpack with `bin` for bytes and `str` for text."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(frame: bytes | memoryview, max_size: int) -> Any:
    """Decode one frame body of at most `max_size` bytes; ProtocolError on anything else."""
    if len(frame) > max_size:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the limit of {max_size}")
    try:
        return msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=max_size,
                               max_str_len=max_size)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"frame is not valid msgpack: {type(exc).__name__}") from None


def is_int(value: Any, low: int = 0, high: int = MAX_SEQ) -> bool:
    """An integer (never a bool, never a float) in low..high."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def all_ints(values: list[Any], low: int = 0, high: int = MAX_SEQ) -> bool:
    """is_int of every value, with C-level passes instead of a call per value (a delivery's
    sequence numbers: one per message)."""
    return not values or (set(map(type, values)) == {int} and low <= min(values) and max(values) <= high)


def kind_and_version(msg: Any, what: str) -> str:
    """The kind of a data-path body [kind, DATA_VERSION, ...]; ProtocolError for any other shape."""
    if not isinstance(msg, list) or len(msg) < 2 or not isinstance(msg[0], str):
        raise ProtocolError(f"{what} must be an array [kind, version, ...]")
    if msg[1] != DATA_VERSION:
        raise ProtocolError(version_refusal(msg[1]))
    return msg[0]


def version_refusal(version: Any) -> str:
    """Why a data-path body of another version is refused: both versions named, and what to do."""
    return (f"unsupported data-path protocol version {version!r}: this peer speaks {DATA_VERSION} "
            f"(frames of many topics); upgrade the client")


def is_incarnation(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_INCARNATION
