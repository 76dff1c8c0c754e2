"""A subscriber's way to its exchanges' retention (the `ReplayTransport` of roq/client/subscriber/streams.py).

One DEALER per exchange on its replay endpoint, created on first use by the subscriber's I/O
thread (which owns them all). A request waits for its own answer up to `client.fetch_timeout`:
older answers, left over from a request that timed out, are skipped by request id. An exchange
that answers `busy` (too many reply bytes it has not yet sent) or `pending` (the frames asked for
wait to be written to its store) is asked again after a short pause within the same deadline.
Anything else raises FetchFailed and the connection is dropped, so the next request starts on a
fresh one.

An ended incarnation is read from a stored copy instead (roq/client/subscriber/streams.py `end`): `copies(x)`
names the replay endpoints that may hold one (the replica of exchange x, and x's running
incarnation, which serves what its journal reloaded). The first that knows the incarnation
answers `ended_position` and serves that incarnation's later fetches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from roq import protocol
from roq.client.subscriber.streams import FetchFailed, NoCopy
from roq.config import Config
from roq.errors import ProtocolError
from roq.security import secure_client

MAX_REPLY = 1 << 30
BUSY_RETRY = 0.05  # pause before asking again an exchange that answered "busy" or "pending"
RETRIED = ("busy", "pending")  # refusals asked again within the request's deadline

Answer = protocol.Frames | protocol.StreamPosition | protocol.TimePosition


class ReplayClient:
    def __init__(self, config: Config, live: Callable[[], dict[str, dict[str, Any]]],
                 closed: Callable[[], bool], copies: Callable[[str], list[str]] | None = None) -> None:
        """`live()` gives the running exchanges (their `replay` endpoints); `closed()` ends waits;
        `copies(x)` the replay endpoints that may hold ended incarnations of exchange x."""
        self.config = config
        self._live = live
        self._closed = closed
        self._copies = copies or (lambda _xid: [])
        self._copy_of: dict[str, str] = {}  # ended incarnation → endpoint of the copy that answered
        self._context: zmq.Context | None = None
        self._fetchers: dict[str, zmq.Socket] = {}
        self._request_id = 0

    def bind(self, context: zmq.Context) -> None:
        """The I/O thread's context: sockets are made in the thread that uses them."""
        self._context = context

    def close(self) -> None:
        for xid in list(self._fetchers):
            self.drop(xid)

    def drop(self, xid: str) -> None:
        fetcher = self._fetchers.pop(xid, None)
        if fetcher is not None:
            fetcher.close(linger=0)

    def fetch(self, xid: str, incarnation: str, after: int, before: int,
              prefix: bytes) -> Iterator[protocol.Frames]:
        max_bytes = self.config.exchange.fetch_max_bytes
        where = self._copy_of.get(incarnation, xid)
        while after < before - 1 and not self._closed():
            page = self._ask(where, _fetch_request(incarnation, after, before, prefix, max_bytes))
            if not isinstance(page, protocol.Frames):
                raise FetchFailed(f"{xid} answered a fetch with {type(page).__name__}")
            yield page
            if page.done:
                return
            after = max(after + 1, page.scanned_to)

    def position(self, xid: str, prefixes: list[bytes]) -> protocol.StreamPosition:
        answer = self._ask(xid, lambda rid: protocol.encode_position_request(rid, prefixes))
        if not isinstance(answer, protocol.StreamPosition):
            raise FetchFailed(f"{xid} answered a position request with {type(answer).__name__}")
        return answer

    def position_at(self, xid: str, at: float, incarnation: str = "") -> protocol.TimePosition:
        """The first position of `xid`'s running stream (or of `incarnation`, one it stores) stored at
        or after Unix time `at` (section 5.6)."""
        answer = self._ask(xid, lambda rid: protocol.encode_position_at_request(rid, at, incarnation))
        if not isinstance(answer, protocol.TimePosition):
            raise FetchFailed(f"{xid} answered a position_at request with {type(answer).__name__}")
        return answer

    def ended_position(self, xid: str, incarnation: str, prefixes: list[bytes]) -> protocol.StreamPosition:
        unanswered = False
        for endpoint in self._copies(xid):
            try:
                answer = self._ask(endpoint, lambda rid: protocol.encode_position_request(rid, prefixes, incarnation))
            except NoCopy:
                continue
            except FetchFailed:
                unanswered = True
                continue
            if isinstance(answer, protocol.StreamPosition) and answer.incarnation == incarnation:
                self._copy_of[incarnation] = endpoint
                if len(self._copy_of) > 10_000:
                    del self._copy_of[next(iter(self._copy_of))]
                return answer
        if unanswered:
            raise FetchFailed(f"no stored copy of {incarnation} answered")
        raise NoCopy(f"no stored copy of {incarnation}")

    def report(self, xid: str, name: str, incarnation: str, pos: int) -> None:
        """Tell exchange `xid` how far durable subscriber `name` took its stream (consumer
        lag, protocol 5.5). Not answered, never waited for: dropped if it cannot leave now."""
        fetcher = self._fetcher(xid)
        if fetcher is not None:
            try:
                fetcher.send(protocol.encode_progress(name, incarnation, pos), zmq.NOBLOCK)
            except zmq.Again:
                pass

    def _ask(self, target: str, encode: Callable[[int], bytes]) -> Answer:
        """`target` is an exchange id (its running incarnation) or a copy's replay endpoint."""
        deadline = time.monotonic() + self.config.client.fetch_timeout
        while not self._closed():
            fetcher = self._fetcher(target)
            if fetcher is None:
                raise FetchFailed(f"{target} has no replay endpoint")
            self._request_id += 1
            request_id = self._request_id
            fetcher.send(encode(request_id))
            try:
                return self._await(fetcher, request_id, deadline)
            except protocol.ReplayRefused as refused:
                if refused.refusal == "unknown_incarnation" and _is_endpoint(target):
                    raise NoCopy(str(refused)) from None
                if refused.refusal not in RETRIED or time.monotonic() + BUSY_RETRY > deadline:
                    raise FetchFailed(str(refused)) from None
                # busy: the exchange holds too many unsent replies, let them go; pending: the frames
                # wait to be written to its store. Past the deadline the hole stays open, asked again later.
                time.sleep(BUSY_RETRY)
            except FetchFailed:
                self.drop(target)
                raise
        raise FetchFailed("subscriber closed")

    def _await(self, fetcher: zmq.Socket, request_id: int, deadline: float) -> Answer:
        while not self._closed():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not fetcher.poll(int(remaining * 1000)):
                raise FetchFailed("no answer in time")
            try:
                reply = fetcher.recv()
                answer = protocol.decode_replay_reply(reply, MAX_REPLY, _parts_after(fetcher))
            except protocol.ReplayRefused as refused:
                if refused.request_id == request_id:
                    raise
                continue
            except ProtocolError as exc:
                raise FetchFailed(f"bad answer: {exc}") from None
            if answer.request_id == request_id:
                return answer
        raise FetchFailed("subscriber closed")

    def _fetcher(self, xid: str) -> zmq.Socket | None:
        fetcher = self._fetchers.get(xid)
        if fetcher is None and self._context is not None:
            endpoint = xid if _is_endpoint(xid) else (self._live().get(xid) or {}).get("replay")
            if not endpoint:
                return None
            fetcher = self._context.socket(zmq.DEALER)
            fetcher.linger = 0
            secure_client(fetcher, self.config)
            fetcher.connect(endpoint)
            self._fetchers[xid] = fetcher
        return fetcher


def _parts_after(sock: zmq.Socket) -> list[zmq.Frame]:
    """The large payloads' parts after a `frames` answer (protocol section 5.1), not copied out of
    libzmq: the payloads' bytes are taken from them once, when the frame is decoded."""
    parts: list[zmq.Frame] = []
    while sock.getsockopt(zmq.RCVMORE):
        parts.append(sock.recv(copy=False))
    return parts


def _is_endpoint(key: str) -> bool:
    return "://" in key


def _fetch_request(incarnation: str, after: int, before: int, prefix: bytes,
                   max_bytes: int) -> Callable[[int], bytes]:
    def encode(request_id: int) -> bytes:
        return protocol.encode_fetch(request_id, incarnation, after, before, [prefix], max_bytes)
    return encode
