"""What `roq publish` and `roq subscribe` do with messages: publish an argument or lines within a
time budget, and print what arrives as text, JSON or base64 (docs/cli.md, "Publishing and
subscribing").

`--timeout` of `roq publish` bounds what the command waits for from the cluster, in all:
connecting to ZooKeeper, room under backpressure and the confirms (WaitBudget). Time spent
reading its input is not counted, so `tail -f log | roq publish ...` runs as long as its input
does. The topic, headers and attributes are checked before anything connects; each line as it is
read, and a bad one (too large) stops the command once what was published before it is
confirmed (within what is left of the budget). Ctrl-C stops it at once.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from roq import protocol
from roq.client.envelope import base64_line, message_json, rfc3339, text_line
from roq.config import Config
from roq.errors import RequestTimeoutError, RoqError, UserError

FORMATS = ("text", "json", "base64")


class WaitBudget:
    """Seconds the command may still wait for the cluster; each wait takes what it spent off."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.left = seconds

    def remaining(self) -> float:
        return max(self.left, 0.0)

    def spend(self, since: float) -> None:
        self.left -= time.monotonic() - since


@dataclass(frozen=True)
class Attributes:
    """What `roq publish` gives every message besides its topic and payload."""
    priority: int | None = None
    delay: float | None = None  # seconds from when each message is published
    key: str | None = None
    headers: dict[str, bytes] | None = None

    @property
    def any(self) -> bool:
        return self.priority is not None or self.delay is not None or self.key is not None or bool(self.headers)


def parse_headers(pairs: Iterable[str]) -> dict[str, bytes]:
    """`--header KEY=VALUE` options as a headers map (the value may hold `=`; bytes of the command
    line that are not UTF-8 are kept as they are); UserError naming what is wrong."""
    headers: dict[str, bytes] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            raise UserError(f"--header {pair!r}: expected KEY=VALUE")
        if key in headers:
            raise UserError(f"--header {key!r} given twice: a message has one value per key")
        headers[key] = value.encode("utf-8", "surrogateescape")
    return protocol.check_headers(headers)


def argument_bytes(text: str) -> bytes:
    """A command-line argument's bytes as the shell passed them (Python decodes argv with surrogate escapes)."""
    return text.encode("utf-8", "surrogateescape")


def lines_of(source: Any) -> Iterator[bytes]:
    """Each line of a binary file, its LF (not a CR before it) dropped."""
    for line in source:
        yield line[:-1] if line.endswith(b"\n") else line


def publish_messages(config: Config, queue: str, topic: str, payloads: Iterable[bytes], attributes: Attributes,
                     timeout: float) -> tuple[int, int]:
    """Publish `payloads` (read as they come) and wait for their confirms, waiting for the cluster
    `timeout` seconds in all; (published, confirmed). A refusal (an unknown queue, a timeout)
    raises after closing the publisher without waiting again."""
    from roq.client.publisher import Publisher
    budget = WaitBudget(timeout)
    started = time.monotonic()
    connect = min(config.client.request_timeout, budget.remaining())  # the seeds' first answer
    pub = Publisher(queue, config.replace(client={"request_timeout": max(connect, 0.1)}))
    budget.spend(started)
    sent = 0
    publish = pub.publish
    waiting: float | None = None  # when the wait in progress began
    try:
        if budget.remaining() <= 0:
            raise RequestTimeoutError(f"connecting took all of --timeout {timeout:g}s")
        for payload in payloads:
            waiting = time.monotonic()
            if attributes.any:
                not_before = time.time() + attributes.delay if attributes.delay is not None else None
                publish(topic, payload, budget.remaining(), priority=attributes.priority, not_before=not_before,
                        key=attributes.key, headers=attributes.headers)
            else:
                publish(topic, payload, budget.remaining())
            budget.spend(waiting)
            waiting = None
            sent += 1
        waiting = time.monotonic()
        pub.flush(budget.remaining())
        waiting = None
    except RoqError:
        # A refused line, no room: what was published before it still gets what is left of the time.
        if waiting is not None:
            budget.spend(waiting)
        with contextlib.suppress(RoqError):
            pub.flush(budget.remaining())
        raise
    finally:
        confirmed = pub.confirmed
        pub.close(timeout=0)  # flushed already, or given up on (Ctrl-C too): never a second wait
    return sent, confirmed


# ---------------------------------------------------------------- printing


def message_fields(msg: Any) -> dict[str, Any]:
    """A received message's JSON object (roq.client.envelope's schema); a group member's message
    also says its deliveries, priority and key."""
    fields: dict[str, Any] = {"publisher": msg.publisher, "seq": msg.seq, "exchange": msg.exchange,
                              "time": rfc3339(msg.sent_ns)}
    if hasattr(msg, "deliveries"):  # a WorkMessage
        key = msg.key_bytes
        fields.update(id=msg.id, deliveries=msg.deliveries, priority=msg.priority,
                      key=key.decode("utf-8", "backslashreplace") if key is not None else None)
    return message_json(msg.topic_bytes, msg.payload, msg.headers, **fields)


def formatter(name: str) -> Callable[[Any], bytes]:
    """How `--format name` writes one received message: one line each, whatever the bytes."""
    if name == "json":
        return lambda msg: json.dumps(message_fields(msg), ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    if name == "base64":
        return lambda msg: base64_line(msg.topic_bytes, msg.payload)
    return lambda msg: text_line(msg.topic_bytes, msg.payload)
