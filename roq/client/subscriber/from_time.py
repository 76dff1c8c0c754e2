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
    return _names(running.get("archived"))


def stored(replica: dict[str, Any] | None) -> list[str]:
    """The ended incarnations a replica serves from its copies and stores (its `stored`), oldest first."""
    return _names(replica.get("stored") if isinstance(replica, dict) else None)


def _names(listed: Any) -> list[str]:
    return [inc for inc in listed if isinstance(inc, str) and inc] if isinstance(listed, list) else []


def earlier_incarnations(live: dict[str, dict[str, Any]],
                         replicas: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """`(xid, incarnation, where)` of every ended incarnation that a replica (`stored`) or a running
    exchange (`archived`) still serves, oldest first per exchange as the replica lists them, none
    twice and none the topology shows running. `where`: whom to ask about it, the replica's replay
    endpoint or the running exchange's id. So an exchange whose host was lost with its disk still
    has its earlier incarnations, and the lost one, read from the replica (protocol 4.4 rule 2)."""
    running = {x.get("incarnation") for x in live.values()}
    found: dict[str, tuple[str, str, str]] = {}
    for xid in dict.fromkeys([*replicas, *live]):
        replica = replicas.get(xid) or {}
        endpoint = replica.get("replay")
        listed = [(inc, endpoint) for inc in stored(replica)] if isinstance(endpoint, str) else []
        listed += [(inc, xid) for inc in archived(live.get(xid) or {})]
        for incarnation, where in listed:
            if incarnation not in running and incarnation not in found:
                found[incarnation] = (xid, incarnation, where)
    return list(found.values())


def taken_before(config: Config, live: Callable[[], dict[str, dict[str, Any]]], at: float,
                 replicas: Callable[[], dict[str, dict[str, Any]]] = dict) -> dict[str, int]:
    """Per running incarnation, and per ended one a replica or a running exchange still serves, the
    last position stored before Unix time `at` (0: none)."""
    context = zmq.Context()
    replay = ReplayClient(config, live, lambda: False)
    replay.bind(context)
    exchanges = live()
    # (whom to ask, the incarnation, its name in the request: "" for the exchange's running one)
    asks = [(xid, inc, "") for xid, running in exchanges.items() if isinstance(inc := running.get("incarnation"), str)]
    asks += [(where, inc, inc) for _, inc, where in earlier_incarnations(exchanges, replicas())]
    points: dict[str, int] = {}
    try:
        for where, asked, named in asks:
            try:
                answer = replay.position_at(where, at, named)
            except FetchFailed as exc:
                log.warning("%s did not say where %s starts in %s (%s): read from its oldest frame",
                            where, datetime.fromtimestamp(at).isoformat(), asked, exc)
                continue
            if answer.incarnation == asked:
                points[asked] = answer.pos - 1
    finally:
        replay.close()
        context.term()
    return points
