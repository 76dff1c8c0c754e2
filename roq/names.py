"""Validation of the names users choose: queues, hosts, durable subscribers, consumer groups, topics."""

from __future__ import annotations

import re
from typing import TypeGuard

from roq.errors import InvalidNameError

# ZooKeeper-safe, shell-safe, and short enough to show in a table. Used with fullmatch:
# `$` would also match before a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
MAX_TOPIC_BYTES = 255
MAX_EXCHANGES = 64  # per queue; a typo like 10000 should not flood the cluster


def check_queue_name(name: object) -> str:
    return _check("queue", name)


def check_host_name(name: object) -> str:
    return _check("host", name)


def check_subscriber_name(name: object) -> str:
    return _check("durable subscriber", name)


def check_group_name(name: object) -> str:
    """A consumer group's name: the grammar of the others (at most protocol.MAX_GROUP_NAME, 63)."""
    return _check("group", name)


def is_name(name: object) -> TypeGuard[str]:
    """The grammar of every name above (queue, host, durable subscriber), without raising."""
    return isinstance(name, str) and bool(_NAME.fullmatch(name)) and name not in (".", "..")


def _check(kind: str, name: object) -> str:
    if not is_name(name):
        raise InvalidNameError(
            f"invalid {kind} name {name!r}: use 1-63 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return name


def check_topic(topic: object) -> bytes:
    """Topics are byte strings (str is UTF-8 encoded), 1-255 bytes, not starting with NUL.

    A leading NUL is reserved for the exchange's own marker topics. A str may hold surrogate
    escapes (a received message's `topic` for bytes that are not UTF-8): they stand for those bytes."""
    if isinstance(topic, str):
        try:
            topic = topic.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise InvalidNameError(f"invalid topic {topic!r}: not encodable as UTF-8") from None
    if not isinstance(topic, bytes) or not 0 < len(topic) <= MAX_TOPIC_BYTES or topic[:1] == b"\x00":
        raise InvalidNameError(f"invalid topic {topic!r}: must be 1-{MAX_TOPIC_BYTES} bytes, "
                               "not starting with a NUL byte")
    return topic


def topic_text(raw: bytes) -> str:
    """A topic (or a key) as the application sees it: its UTF-8 text, bytes that are not UTF-8
    kept as surrogate escapes (as os.fsdecode does), so that check_topic gives the same bytes back."""
    return raw.decode("utf-8", "surrogateescape")
