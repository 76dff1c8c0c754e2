"""Message attributes a batch's topic slot may carry (section 3.2): priority, not-before and key
for consumer groups, headers for every subscriber; the headers' limits and checks."""

from __future__ import annotations

import re
from typing import Any

from roq.errors import ProtocolError, UserError
from roq.protocol.codec import is_int

MAX_PRIORITY = 255
MAX_KEY = 255
ATTRS_LEN = 4  # [topic, priority, not_before_ms, key] in a batch's topic slot ...
HEADERS_ATTRS_LEN = 5  # ... or [topic, priority, not_before_ms, key, headers]

# Headers (section 3.2): a small map per message, str keys to bin values. A publisher's are held
# to these limits; RoQ's own (dead letters: `roq-` keys, which publishers may not use) may add up
# to MAX_OWN_HEADERS entries of MAX_OWN_HEADERS_BYTES more, which receivers must accept.
MAX_HEADERS = 64
MAX_HEADER_KEY = 128  # bytes of a key's UTF-8
MAX_HEADER_VALUE = 8192
MAX_HEADERS_BYTES = 65536  # keys' UTF-8 and values together, per message (and within max_message_bytes)
MAX_OWN_HEADERS = 16
MAX_OWN_HEADERS_BYTES = 4096
RESERVED_HEADER_PREFIX = "roq-"  # any case: RoQ's own headers
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


class BadMap:
    """What the publisher frame's decoder makes of a map that cannot be headers (a key that is not
    text, a repeated key), so that the message holding it is rejected with `reason`, alone."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def header_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any] | BadMap:
    """msgpack's object_pairs_hook for publisher frames: a dict, unless a key is not a str or is
    repeated (a map's count must not lie about what it holds)."""
    headers = {}
    for key, value in pairs:
        if type(key) is not str:
            return BadMap(f"header keys must be str (UTF-8 text), not {type(key).__name__}")
        if key in headers:
            return BadMap(f"header key {key[:MAX_HEADER_KEY]!r} appears twice")
        headers[key] = value
    return headers


def headers_size(headers: Any, own: bool = False) -> int:
    """The size of a valid headers map: its keys' UTF-8 bytes and its values' bytes together.
    ProtocolError saying what is wrong otherwise (section 3.2): at most MAX_HEADERS entries; keys
    str of 1-MAX_HEADER_KEY UTF-8 bytes without control characters (U+0000-U+001F, U+007F), not
    starting with `roq-` (any case); values bin of at most MAX_HEADER_VALUE bytes; MAX_HEADERS_BYTES
    in all. `own`: a map RoQ may have added its own `roq-` headers to (deliveries, work entries)."""
    if isinstance(headers, BadMap):
        raise ProtocolError(headers.reason)
    if not isinstance(headers, dict):
        raise ProtocolError("headers must be a map of str keys to bin values")
    most, most_bytes = (MAX_HEADERS + MAX_OWN_HEADERS, MAX_HEADERS_BYTES + MAX_OWN_HEADERS_BYTES) if own \
        else (MAX_HEADERS, MAX_HEADERS_BYTES)
    if len(headers) > most:
        raise ProtocolError(f"{len(headers)} headers: at most {most} per message")
    size = 0
    for key, value in headers.items():
        if not isinstance(key, str):
            raise ProtocolError("header keys must be str (UTF-8 text)")
        try:
            raw = key.encode()
        except UnicodeEncodeError:
            raise ProtocolError(f"header key {key[:MAX_HEADER_KEY]!r} is not valid UTF-8") from None
        if not 0 < len(raw) <= MAX_HEADER_KEY or _CONTROL_CHARACTER.search(key):
            raise ProtocolError(f"header key {key[:MAX_HEADER_KEY]!r}: keys are 1-{MAX_HEADER_KEY} bytes of UTF-8 "
                                "without control characters")
        if not own and key[:4].lower() == RESERVED_HEADER_PREFIX:
            raise ProtocolError(f"header key {key!r}: keys starting with {RESERVED_HEADER_PREFIX!r} are RoQ's own")
        if not isinstance(value, bytes) or len(value) > MAX_HEADER_VALUE:
            raise ProtocolError(f"header {key!r}: values are bin of at most {MAX_HEADER_VALUE} bytes")
        size += len(raw) + len(value)
    if size > most_bytes:
        raise ProtocolError(f"headers of {size} bytes: at most {most_bytes} per message (keys and values)")
    return size


def check_headers(headers: Any) -> dict[str, bytes]:
    """An application's headers as they travel: a dict of str keys to bytes (a str value is
    UTF-8 encoded); UserError saying what is wrong (section 3.2's limits, the `roq-` prefix)."""
    if headers is None:
        return {}
    try:
        items = list(headers.items())
    except AttributeError:
        raise UserError(f"headers must be a mapping of str keys to bytes or str values, not "
                        f"{type(headers).__name__}") from None
    out = {}
    for key, value in items:
        if isinstance(value, str):
            try:
                value = value.encode()
            except UnicodeEncodeError:
                raise UserError(f"header {key!r}: the value is not valid text") from None
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        out[key] = value
    try:
        headers_size(out)
    except ProtocolError as exc:
        raise UserError(str(exc)) from None
    return out


def attributed_topic(topic: bytes, priority: int, not_before_ms: int, key: bytes,
                     headers: dict[str, bytes] | None = None) -> list[Any]:
    """A batch's topic slot for a message with attributes: priority, not-before and key matter to
    consumer groups only; headers reach every subscriber."""
    if headers:
        return [topic, priority, not_before_ms, key, headers]
    return [topic, priority, not_before_ms, key]


class Attributed:
    """A publisher's topic slot for a message with attributes, as its log holds it: `len()` is
    the slot's size on the wire (topic, key and headers), so that batches are sized with the
    headers' bytes; packed as the slot itself (encode_batch)."""

    __slots__ = ("slot", "size")

    def __init__(self, slot: list[Any], size: int) -> None:
        self.slot = slot
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attributed) and other.slot == self.slot

    __hash__ = None  # type: ignore[assignment]


def slot_of(value: Any) -> Any:
    """msgpack's `default` for batches: an Attributed slot packs as its list."""
    if isinstance(value, Attributed):
        return value.slot
    raise TypeError(f"cannot pack {type(value).__name__}")


def message_attributes(slot: list[Any]) -> tuple[bytes, int, int, bytes, dict[str, bytes] | None]:
    """(topic, priority, not_before_ms, key, headers or None) from an attributed topic slot;
    ProtocolError saying what is malformed. The topic itself is checked by the caller."""
    if len(slot) not in (ATTRS_LEN, HEADERS_ATTRS_LEN):
        raise ProtocolError("an attributed message's topic must be [topic, priority 0..255, not_before_ms "
                            "0..2^63-1, key of 0-255 bytes] or the same and a headers map")
    topic, priority, not_before_ms, key = slot[:ATTRS_LEN]
    if not isinstance(topic, bytes) or not is_int(priority, 0, MAX_PRIORITY) or not is_int(not_before_ms) \
            or not isinstance(key, bytes) or len(key) > MAX_KEY:
        raise ProtocolError("an attributed message's topic must be [topic, priority 0..255, not_before_ms "
                            "0..2^63-1, key of 0-255 bytes] or the same and a headers map")
    headers = slot[4] if len(slot) == HEADERS_ATTRS_LEN else None
    if headers is not None:
        headers_size(headers)
    return topic, priority, not_before_ms, key, headers or None


def valid_headers(headers: Any) -> bool:
    """A headers map as an exchange sends it (RoQ's own `roq-` headers allowed)."""
    try:
        headers_size(headers, own=True)
    except ProtocolError:
        return False
    return True


def message_headers(attrs: list[list[Any]] | None, count: int) -> list[dict[str, bytes]] | None:
    """Each message's headers, by index, from a delivery's (or fetched frame's) `attrs` ({} for a
    message without); None when no message of the frame has any."""
    if not attrs:
        return None
    with_headers = [a for a in attrs if len(a) == HEADERS_ATTRS_LEN and a[4]]
    if not with_headers:
        return None
    out: list[dict[str, bytes]] = [{} for _ in range(count)]
    for a in with_headers:
        out[a[0]] = a[4]
    return out
