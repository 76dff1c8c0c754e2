"""The publishers of one exchange: who owns which id, and what the exchange holds of each.

A publisher proves it owns its id in `hello` (the id is derived from a secret token only the
publisher knows, roq.protocol.publisher_id_for), and the id is bound to the connection the hello
came on: a batch or bye claiming the id from any other connection is refused, so no peer can
push another publisher's sequence numbers or make its messages look like duplicates.

Per publisher the exchange keeps `last`, the highest sequence number handled (forwarded, or
refused message by message with a `reject`). A batch must start at or below `last + 1`: the part
at or below `last` is a duplicate (a replay after a move), the rest is forwarded, and the ack
names the new `last`. A batch that starts beyond `last + 1` is answered with `resend last+1`
and changes nothing, so an ack never covers a message that did not arrive.

State is bounded: publishers unseen for `publisher_ttl` are forgotten (longer than any
publisher's replay window, so nothing it can still resend is mistaken for new), each connection
may own at most `max_per_connection` ids, and the exchange at most `max_publishers`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from roq import protocol

PRUNE_INTERVAL = 5.0  # seconds between sweeps for expired publishers


@dataclass
class Session:
    last: int  # highest sequence number handled
    route: bytes  # routing id of the connection that owns the id
    seen: float  # monotonic time of the last frame


@dataclass(frozen=True)
class Verdict:
    """What to do with a batch: forward its messages from index `skip` on (and ack), or refuse
    it with `resend next_seq` (code says why)."""
    skip: int = 0
    resend: int = 0
    code: str = ""
    message: str = ""

    @property
    def refused(self) -> bool:
        return bool(self.code)


@dataclass
class PublisherSessions:
    ttl: float = 600.0
    max_publishers: int = 100_000
    max_per_connection: int = 64
    sessions: dict[str, Session] = field(default_factory=dict)
    by_route: dict[bytes, set[str]] = field(default_factory=dict)
    expired: int = 0  # publishers forgotten after the time-to-live
    _next_prune: float = 0.0

    def hello(self, route: bytes, hello: protocol.Hello, now: float | None = None) -> tuple[int, str]:
        """Bind the id to `route` if the token proves ownership. Returns (last_seq, "") for the
        welcome, or (0, error message) when refused."""
        now = time.monotonic() if now is None else now
        if protocol.publisher_id_for(hello.token) != hello.publisher:
            return 0, "the token does not match the publisher id (id = \"p-\" + blake2b-96 of the token, hex)"
        session = self.sessions.get(hello.publisher)
        if session is None:
            if len(self.sessions) >= self.max_publishers:
                self.prune(now, force=True)
                if len(self.sessions) >= self.max_publishers:
                    return 0, f"this exchange serves {self.max_publishers} publishers already"
            if len(self.by_route.get(route, ())) >= self.max_per_connection:
                return 0, f"a connection may publish as at most {self.max_per_connection} ids"
            session = self.sessions[hello.publisher] = Session(hello.from_seq - 1, route, now)
        elif session.route != route:
            if len(self.by_route.get(route, ())) >= self.max_per_connection:
                return 0, f"a connection may publish as at most {self.max_per_connection} ids"
            self._unbind(session.route, hello.publisher)
            session.route = route
        # Everything below from_seq was handled elsewhere: the publisher will never send it again.
        session.last = max(session.last, hello.from_seq - 1)
        session.seen = now
        self.by_route.setdefault(route, set()).add(hello.publisher)
        return session.last, ""

    def batch(self, route: bytes, batch: protocol.Batch, now: float) -> Verdict:
        session = self.sessions.get(batch.publisher)
        if session is None or session.route != route:
            return Verdict(code=protocol.HELLO_REQUIRED,
                           message=f"this connection has not said hello as {batch.publisher}: "
                                   "send hello, then resend from the welcome's last_seq + 1")
        session.seen = now
        expected = session.last + 1
        if batch.first_seq > expected:
            return Verdict(resend=expected, code=protocol.OUT_OF_ORDER,
                           message=f"batch starts at {batch.first_seq}, expected {expected}: "
                                   f"resend from {expected}")
        return Verdict(skip=min(expected - batch.first_seq, batch.count))

    def advance(self, publisher: str, newest: int) -> int:
        """Record that everything up to `newest` was handled; returns the publisher's last."""
        session = self.sessions[publisher]
        if newest > session.last:
            session.last = newest
        return session.last

    def last(self, publisher: str) -> int:
        session = self.sessions.get(publisher)
        return session.last if session else 0

    def refusal_point(self, route: bytes, publisher: str) -> int:
        """next_seq for a resend to `route`: 0 unless it owns `publisher`."""
        session = self.sessions.get(publisher)
        return session.last + 1 if session is not None and session.route == route else 0

    def bye(self, route: bytes, publisher: str) -> bool:
        """The publisher leaves this connection; its `last` stays until the time-to-live.
        False (nothing changes) unless `route` owns the id."""
        session = self.sessions.get(publisher)
        if session is None or session.route != route:
            return False
        self._unbind(route, publisher)
        session.route = b""
        return True

    def routes(self) -> set[bytes]:
        return {route for route, ids in self.by_route.items() if ids}

    def prune(self, now: float, force: bool = False) -> None:
        """Forget publishers unseen for `ttl` (at most every PRUNE_INTERVAL unless forced)."""
        if not force and now < self._next_prune:
            return
        self._next_prune = now + PRUNE_INTERVAL
        horizon = now - self.ttl
        for publisher in [p for p, s in self.sessions.items() if s.seen < horizon]:
            session = self.sessions.pop(publisher)
            self._unbind(session.route, publisher)
            self.expired += 1

    def _unbind(self, route: bytes, publisher: str) -> None:
        ids = self.by_route.get(route)
        if ids is not None:
            ids.discard(publisher)
            if not ids:
                del self.by_route[route]
