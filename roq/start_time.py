"""A start time given as text, as `--from`, Spark's `startingTimestamp` and the SSE `from=` take it.

Two spellings: ISO 8601 with its zone (`2026-11-27T10:00:00Z`, `...+01:00`), or Unix epoch
milliseconds (`1795773600000`, Kafka's `startingTimestamp` form). A time without a zone is refused
rather than guessed: the host's zone and the user's may differ.
"""

from __future__ import annotations

from datetime import datetime

EXAMPLE = "2026-11-27T10:00:00Z or epoch milliseconds such as 1795773600000"
MAX_EPOCH_MS = 253402300799999  # 9999-12-31T23:59:59.999Z: beyond it a datetime cannot say it


def looks_like_time(text: str) -> bool:
    """Whether `text` is meant as a time (a date or a number) rather than a word or a file name."""
    text = text.strip()
    return text.isdigit() or (text[:4].isdigit() and text[4:5] == "-")


def parse_start_time(text: str) -> float:
    """Unix seconds of `text`; ValueError saying what is accepted when it is neither spelling."""
    text = str(text).strip()
    if text.isdigit():
        millis = int(text)
        if millis > MAX_EPOCH_MS:
            raise ValueError(f"{text!r} is past the year 9999 as epoch milliseconds")
        return millis / 1000
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give ISO 8601 with a zone ({EXAMPLE})") from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"{text!r} has no time zone: add Z (UTC) or an offset such as +01:00")
    if at.timestamp() < 0:
        raise ValueError(f"{text!r} is before 1970-01-01T00:00:00Z: no frame was stored then")
    return at.timestamp()
