"""The control API: a ZeroMQ ROUTER socket speaking msgpack requests (docs/protocol.md).

Every GCM serves it. A backup answers every operation but `ping` with a
`not_leader` error naming the leader's endpoint, so clients can follow. A
malformed frame, an unknown operation or a bad argument gets an error reply;
nothing a client sends can stop the loop. An unexpected exception in a
handler is logged and answered with `internal`, and the server keeps going.

With `security.curve` on, only clients holding a known key complete the
handshake (roq.security.Gatekeeper), and the operations that change the
cluster (ADMIN_OPS) are refused with `forbidden` unless the key is an admin's.
With CURVE off the API is open to whoever can reach it: local use only.

A request's time starts when it arrives, not when its turn comes: the loop takes every request
waiting on the socket before serving the next one and stamps each at receipt. A write that
waited longer than REQUEST_DEADLINE is refused (`unavailable`, nothing applied) instead of being
applied after its client gave up; the client retries with the same key (gcm.fence), which makes
a write that was applied unseen answer with success.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from gcm.fence import RequestContext, serving
from roq.config import Config
from roq.errors import (
    ForbiddenError,
    ProtocolError,
    RoqError,
    UnavailableError,
    UnknownCommandError,
    UserError,
    ZooKeeperUnavailableError,
)
from roq.protocol import decode_request, encode_error, encode_reply, request_id_of
from roq.security import ADMIN, Gatekeeper, peer_role

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Any]
POLL_MS = 200  # how often the loop looks at the stop flag
# A request's writes must leave within this of its arrival, below the client's per-attempt
# timeout (client.attempt_timeout), so what a client gave up on is seldom applied later.
REQUEST_DEADLINE = 1.5
MAX_PENDING = 1_000  # requests taken off the socket but not served yet; the rest wait in libzmq
# Operations that change the cluster: an admin key is needed when CURVE is on.
ADMIN_OPS = frozenset({"queue.create", "queue.delete", "queue.scale"})


def needs_admin(op: str, args: dict[str, Any]) -> bool:
    if op == "queue.rules":  # it only reads unless it is given rules or told to clear them
        return "rules" in args or "clear" in args
    return op in ADMIN_OPS


class ControlServer:
    def __init__(self, config: Config, bind_host: str, port: int, advertise_host: str,
                 route: Callable[[str], Handler]) -> None:
        """`route(op)` returns the handler for an operation or raises a RoqError."""
        self._route = route
        self._secured = config.security.curve
        self._context = zmq.Context()
        self.gatekeeper = Gatekeeper(self._context, config, "control-api")
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self._socket.setsockopt(zmq.MAXMSGSIZE, 2 << 20)  # oversize frames are dropped by libzmq
        self.gatekeeper.guard(self._socket, "control")
        if port:
            self._socket.bind(f"tcp://{bind_host}:{port}")
        else:
            port = self._socket.bind_to_random_port(f"tcp://{bind_host}")
        self.endpoint = f"tcp://{advertise_host}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="control-api", daemon=True)
        self.requests = 0
        self.errors = 0

    def start(self) -> None:
        self.gatekeeper.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.gatekeeper.stop()
        self._context.term()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        pending: deque[tuple[float, list[zmq.Frame]]] = deque()
        try:
            while not self._stop.is_set():
                self._take_waiting(pending)
                if pending:
                    self._handle_one(*pending.popleft())
                else:
                    poller.poll(POLL_MS)
        finally:
            self._socket.close(linger=0)

    def _take_waiting(self, pending: deque[tuple[float, list[zmq.Frame]]]) -> None:
        """Stamp every request waiting on the socket with its arrival, before serving the next."""
        while len(pending) < MAX_PENDING:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            pending.append((time.monotonic(), frames))

    def _handle_one(self, received_at: float, frames: list[zmq.Frame]) -> None:
        if len(frames) < 2:
            return  # no routing id or no payload: nobody to answer
        ident, payload = frames[0].bytes, frames[-1]
        self.requests += 1
        # With CURVE off there are no credentials to check: everyone may administer.
        role = peer_role(payload) if self._secured else ADMIN
        if len(frames) == 2:
            reply = self.dispatch(payload.bytes, role, received_at)
        else:  # a request is one frame: refused, echoing the id its first frame names so it can be matched
            self.errors += 1
            reply = encode_error(request_id_of(frames[1].bytes), ProtocolError(
                f"a request is one frame; this message had {len(frames) - 1}"))
        try:
            self._socket.send_multipart([ident, reply], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a reply: client not reading")

    def dispatch(self, payload: bytes, role: str | None, received_at: float | None = None) -> bytes:
        """Decode, authorise, route, run, encode. Always returns a reply frame."""
        req_id = None
        received_at = time.monotonic() if received_at is None else received_at
        try:
            request = decode_request(payload)
            req_id = request.id
            writes = needs_admin(request.op, request.args)
            if role != ADMIN and writes:
                raise ForbiddenError(f"{request.op} needs an admin key (security.identity under admins/)")
            handler = self._route(request.op)
            waited = time.monotonic() - received_at
            if writes and waited > REQUEST_DEADLINE:
                raise UnavailableError(f"the GCM was busy: this request waited {waited:.1f}s for its turn and "
                                       "was not applied; retry")
            name = request.args.get("name")
            context = RequestContext(received_at + REQUEST_DEADLINE, request.op, request.key,
                                     name if isinstance(name, str) else None)
            with serving(context):
                return encode_reply(req_id, handler(request.args))
        except ProtocolError as err:
            self.errors += 1
            return encode_error(req_id if req_id is not None else request_id_of(payload), err)
        except (UserError, UnavailableError) as err:
            self.errors += 1
            return encode_error(req_id, err)
        except RoqError as err:
            self.errors += 1
            log.warning("request failed: %s", err)
            return encode_error(req_id, err)
        except (KazooException, KazooTimeoutError) as err:
            self.errors += 1
            return encode_error(req_id, ZooKeeperUnavailableError(
                f"ZooKeeper is unavailable ({type(err).__name__}); retry when it has a quorum"))
        except Exception as err:  # keep serving whatever a handler does
            self.errors += 1
            log.exception("internal error while serving a request")
            return encode_error(req_id, RoqError(f"internal error: {type(err).__name__}: {err}"))


def unknown_op(op: str) -> Handler:
    raise UnknownCommandError(f"unknown operation {op!r}")
