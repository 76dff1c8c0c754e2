"""A subscriber that starts from a time (`Subscriber(start=datetime)`, `roq subscribe --from TIME`).

Before the subscriber's I/O thread starts, each running exchange is asked which of its frames was
the first stored at or after that time (`position_at`, docs/protocol.md section 5.6); everything
before it counts as taken, as with a saved position, so the subscriber fetches the rest from the
exchange's retention (memory, then the queue's segment store on disk) and goes on live. An exchange
that does not answer in time starts from the beginning of what it retains (said in a WARNING).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import zmq

from roq.client.subscriber.replay import ReplayClient
from roq.client.subscriber.streams import FetchFailed
from roq.config import Config

log = logging.getLogger(__name__)


def unix_time(start: datetime) -> float:
    """A start time as Unix seconds; ValueError for a time without a time zone (ambiguous)."""
    if start.tzinfo is None or start.utcoffset() is None:
        raise ValueError(f"start={start.isoformat()} has no time zone: give one (datetime(..., tzinfo=UTC))")
    return start.timestamp()


def archived(running: dict[str, Any]) -> list[str]:
    """The earlier incarnations a running exchange serves from its store or journal (its `archived`)."""
    listed = running.get("archived")
    return [inc for inc in listed if isinstance(inc, str) and inc] if isinstance(listed, list) else []


def taken_before(config: Config, live: Callable[[], dict[str, dict[str, Any]]], at: float) -> dict[str, int]:
    """Per running incarnation, and per earlier one a running exchange still serves, the last
    position stored before Unix time `at` (0: none)."""
    context = zmq.Context()
    replay = ReplayClient(config, live, lambda: False)
    replay.bind(context)
    points: dict[str, int] = {}
    try:
        for xid, running in live().items():
            incarnation = running.get("incarnation")
            if not isinstance(incarnation, str):
                continue
            for asked in [incarnation, *archived(running)]:
                try:
                    answer = replay.position_at(xid, at, "" if asked == incarnation else asked)
                except FetchFailed as exc:
                    log.warning("exchange %s did not say where %s starts in %s (%s): read from its oldest frame",
                                xid, datetime.fromtimestamp(at).isoformat(), asked, exc)
                    continue
                if answer.incarnation == asked:
                    points[asked] = answer.pos - 1
    finally:
        replay.close()
        context.term()
    return points
