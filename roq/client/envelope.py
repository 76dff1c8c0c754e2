"""Messages as text and JSON: `roq subscribe --format`, the HTTP gateway's events and its JSON envelope.

One JSON object per message (docs/cli.md, docs/http.md):

    {"topic": "orders.eu", "payload": "order 17", "encoding": "utf-8",
     "headers": {"trace-id": "4bf92f35"}, "headers_encoding": "utf-8",
     "publisher": "p-...", "seq": 17, "exchange": "x1", "time": "2024-05-01T12:00:00.123456Z"}

Bytes are never lost: `payload` is the text when the bytes are UTF-8, else their base64, and
`encoding` says which; the header values likewise, all in one `headers_encoding` (base64 as soon
as one value is not UTF-8). `topic` is text (bytes that are not UTF-8 shown as `\\xNN`). `time` is
the publisher's clock when it sent the message (RFC 3339, UTC, microseconds), null if it did not
say. The text form (`--format text`) escapes what would break a line: see `text_line`.

The envelope a caller sends (`decode_envelope`) is the same object's `payload`, `encoding`,
`headers` and `headers_encoding`; each is checked here, and a refusal is a UserError naming what.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from roq import protocol
from roq.errors import UserError

UTF8, BASE64 = "utf-8", "base64"
ENCODINGS = (UTF8, BASE64)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def encoded(raw: bytes) -> tuple[str, str]:
    """(text, "utf-8") when the bytes are UTF-8, else (base64, "base64")."""
    try:
        return raw.decode(), UTF8
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode(), BASE64


def headers_json(headers: Mapping[str, bytes]) -> tuple[dict[str, str], str]:
    """The headers as JSON values, and their one encoding: text when every value is UTF-8, else
    every value in base64."""
    try:
        return {key: value.decode() for key, value in headers.items()}, UTF8
    except UnicodeDecodeError:
        return {key: base64.b64encode(value).decode() for key, value in headers.items()}, BASE64


def rfc3339(sent_ns: int) -> str | None:
    """A publisher's send time as RFC 3339 UTC with microseconds; None for 0 (not measured)."""
    if not sent_ns:
        return None
    try:
        when = datetime.fromtimestamp(sent_ns // 1_000_000_000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):  # beyond what a date can say: a clock gone wrong
        return None
    return when.replace(microsecond=sent_ns // 1000 % 1_000_000).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def message_json(topic: bytes, payload: bytes, headers: Mapping[str, bytes] | None = None,
                 **fields: Any) -> dict[str, Any]:
    """A message as one JSON object (the module's schema); `fields` follow (publisher, seq, ...)."""
    text, encoding = encoded(payload)
    values, headers_encoding = headers_json(headers or {})
    return {"topic": _text(topic), "payload": text, "encoding": encoding, "headers": values,
            "headers_encoding": headers_encoding, **fields}


def _escaped(raw: bytes, tab: bool) -> bytes:
    out = raw.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r")
    return out.replace(b"\t", b"\\t") if tab else out


def text_line(topic: bytes, payload: bytes) -> bytes:
    """`topic<TAB>payload` and a newline, one line whatever the bytes: a backslash, LF and CR are
    written `\\\\`, `\\n` and `\\r` (in the topic also TAB, `\\t`), so a record is never split and
    `printf '%b'` or Python's `codecs.escape_decode` give the bytes back. The first TAB of a line
    separates the two."""
    if b"\\" in payload or b"\n" in payload or b"\r" in payload:
        payload = _escaped(payload, tab=False)
    if b"\\" in topic or b"\n" in topic or b"\r" in topic or b"\t" in topic:
        topic = _escaped(topic, tab=True)
    return topic + b"\t" + payload + b"\n"


def base64_line(topic: bytes, payload: bytes) -> bytes:
    """`topic<TAB>base64(payload)` and a newline: the topic escaped as in `text_line`."""
    if b"\\" in topic or b"\n" in topic or b"\r" in topic or b"\t" in topic:
        topic = _escaped(topic, tab=True)
    return topic + b"\t" + base64.b64encode(payload) + b"\n"


def _decoded(value: Any, encoding: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise UserError(f"{what} must be a string")
    if encoding == UTF8:
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise UserError(f"{what} is not valid text (a lone surrogate)") from None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise UserError(f"{what} is not valid base64") from None


def decode_envelope(item: Any) -> tuple[bytes, dict[str, bytes]]:
    """(payload, headers) from one envelope object `{"payload", "encoding", "headers",
    "headers_encoding"}`; UserError naming what is wrong (the headers' limits included)."""
    if not isinstance(item, dict):
        raise UserError("each message must be a JSON object {\"payload\": ..., \"headers\": {...}}")
    unknown = sorted(set(item) - {"payload", "encoding", "headers", "headers_encoding"})
    if unknown:
        raise UserError(f"unknown message fields {', '.join(unknown)}: a message has payload, encoding, headers "
                        "and headers_encoding")
    encoding, headers_encoding = item.get("encoding", UTF8), item.get("headers_encoding", UTF8)
    for name, value in (("encoding", encoding), ("headers_encoding", headers_encoding)):
        if value not in ENCODINGS:
            raise UserError(f"{name} must be \"utf-8\" or \"base64\", not {value!r}")
    if "payload" not in item:
        raise UserError("a message needs a payload")
    payload = _decoded(item["payload"], encoding, "payload")
    headers = item.get("headers") or {}
    if not isinstance(headers, dict):
        raise UserError("headers must be a JSON object of strings")
    raw = {key: _decoded(value, headers_encoding, f"header {key!r}") for key, value in headers.items()}
    return payload, protocol.check_headers(raw)
