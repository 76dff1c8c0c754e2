"""What each client's `stats()` returns: a frozen snapshot of its counters (docs/client.md).

Counters only grow, except the gauges (`unconfirmed`, `subscribers`, `exchanges`, `exchange`).
The same names mean the same thing in all three: `exchanges` is how many exchanges the client
is connected to (a subscriber) or has joined its group on (a member), `callback_errors` how many
callbacks raised. `as_dict()` gives the plain form the command line and the tools print as JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class _Snapshot:
    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass


@dataclass(frozen=True)
class PublisherStats(_Snapshot):
    exchange: str | None  # the exchange published to (None while choosing one)
    subscribers: int  # RoQ subscribers connected to that exchange, as it last reported
    published: int  # messages queued by publish() and the batch calls
    confirmed: int  # every message up to this sequence number is confirmed
    unconfirmed: int  # messages queued and not yet confirmed
    moves: int  # times the publisher moved to another exchange
    relocations: int  # moves the leader asked for
    resends: int  # times an exchange asked for a resend (lost bytes, a refused batch)
    reconnects: int  # connections ZeroMQ re-established underneath (each followed by a hello)
    replayed: int  # confirmed messages resent after moves (the replay window)
    rejected: int  # messages an exchange rejected (`Publisher.rejected` says which and why)


@dataclass(frozen=True)
class SubscriberStats(_Snapshot):
    received: int  # messages handed to the application
    duplicates: int  # messages dropped as already handed over
    gaps: int  # messages of our topics retention no longer held when fetched
    unknown_gaps: int  # holes whose size the exchange no longer knew (counted at least 1 in gaps)
    recovered_frames: int  # frames fetched from retention and handed over
    fetches: int  # fetches from retention
    fetch_failures: int  # fetches and position checks an exchange did not answer
    resyncs: int  # catch-ups after a dropped connection
    position_checks: int  # checks that a prefix's chain ended where we were
    callback_errors: int
    exchanges: int  # exchanges the socket is connected to


@dataclass(frozen=True)
class MemberStats(_Snapshot):
    received: int  # messages handed to this member (redeliveries included)
    acked: int
    nacked: int
    redelivered: int  # messages handed to this member that an earlier delivery did not settle
    callback_errors: int
    exchanges: int  # exchanges on which this member has joined its group
