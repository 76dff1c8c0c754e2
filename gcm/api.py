"""The control API: a ZeroMQ ROUTER socket speaking msgpack requests (docs/protocol.md).

Every GCM serves it. A backup answers every operation but `ping` with a
`not_leader` error naming the leader's endpoint, so clients can follow. A
malformed frame, an unknown operation or a bad argument gets an error reply;
nothing a client sends can stop the loop. An unexpected exception in a
handler is logged and answered with `internal`, and the server keeps going.

With `security.curve` on, only clients holding a known key complete the
handshake (roq.security.Gatekeeper), and the operations that change the
cluster (WRITE_OPS: admin commands that drop messages included, and `restore`) or read the
permissions (`keys.list`, `backup.export`; `keys.show` of another key) are refused with `forbidden`
unless the key is an admin's: under `admins/`, or granted `admin` in the permission table (gcm/permissions.py). A
client key reads only the queues it has a right on: `queue.describe` and
reading `queue.rules` of another queue are `forbidden` (whether or not it
exists), and `queue.list`, `cluster.status`, `cluster.stats` and `cluster.events`
leave such queues out. The server's key reads everything and changes nothing (it may
`backup.export`: a GCM host's cron job backs up with the daemons' configuration).
With CURVE off the API is open to whoever can reach it: local use only.

A request's time starts when it arrives, not when its turn comes: the loop takes every request
waiting on the socket before serving the next one and stamps each at receipt. A write that
waited longer than REQUEST_DEADLINE is refused (`unavailable`, nothing applied) instead of being
applied after its client gave up; the client retries with the same key (gcm.fence), which makes
a write that was applied unseen answer with success.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from gcm.fence import RequestContext, serving
from roq.client.wake import WakePipe
from roq.config import Config
from roq.errors import (
    ConfigError,
    ForbiddenError,
    ProtocolError,
    RoqError,
    UnavailableError,
    UnknownCommandError,
    UserError,
    ZooKeeperUnavailableError,
)
from roq.listen import listening
from roq.permissions import PermissionTable
from roq.protocol import decode_request, encode_error, encode_reply, request_id_of
from roq.security import ADMIN, CLIENT, SERVER, Gatekeeper, peer_identity

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Any]
POLL_MS = 200  # how often the loop looks at the stop flag
# A request's writes must leave within this of its arrival, below the client's per-attempt
# timeout (client.attempt_timeout), so what a client gave up on is seldom applied later.
REQUEST_DEADLINE = 1.5
MAX_PENDING = 1_000  # requests taken off the socket but not served yet; the rest wait in libzmq
# Operations that change the cluster: an admin key is needed when CURVE is on.
WRITE_OPS = frozenset({"queue.create", "queue.delete", "queue.scale", "queue.set", "queue.rebalance", "queue.purge",
                       "group.reset", "group.delete", "keys.grant", "keys.revoke", "keys.reset", "restore"})
ADMIN_READS = frozenset({"keys.list", "backup.export"})  # who may do what is for admins to read
# ... and for the server's own key too: a GCM host's cron job backs up with the daemons' configuration.
SERVER_READS = frozenset({"backup.export"})
QUEUE_READS = frozenset({"queue.describe", "queue.rules", "queue.command"})  # of queue `name`: a right on it is needed
Tables = Callable[[], PermissionTable]
METADATA_OPS = frozenset({"metadata.get", "metadata.watch"})  # every GCM answers them (section 8)
# The ROUTER identity of the connection whose request is being served (metadata.watch registers it).
PEER: contextvars.ContextVar[bytes] = contextvars.ContextVar("peer", default=b"")


def queues_named(op: str, args: dict[str, Any]) -> list[Any]:
    """The queues a metadata request reads (a client key needs a right on each)."""
    if op == "metadata.get":
        return [args.get("queue")]
    queues = args.get("queues")
    return list(queues) if op == "metadata.watch" and isinstance(queues, list) else []


def is_write(op: str, args: dict[str, Any]) -> bool:
    if op == "queue.rules":  # it only reads unless it is given rules or told to clear them
        return "rules" in args or "clear" in args
    return op in WRITE_OPS


def needs_admin(op: str, args: dict[str, Any]) -> bool:
    return is_write(op, args) or op in ADMIN_READS


def authorise(op: str, args: dict[str, Any], role: str | None, name: str, table: PermissionTable | None) -> bool:
    """Refuse (ForbiddenError) what the caller may not do; True if it is an admin (sees everything)."""
    if role == ADMIN or (role == CLIENT and table is not None and table.is_admin(name)):
        return True
    if role == SERVER and op in SERVER_READS:
        return True
    if needs_admin(op, args):
        raise ForbiddenError(f"{op} needs an admin key (security.identity under admins/, or granted admin)")
    if op == "keys.show" and args.get("name") != name:
        raise ForbiddenError("keys.show of another key needs an admin key; a key may show its own")
    if op in METADATA_OPS and role == CLIENT and table is not None:
        for named in queues_named(op, args):
            if isinstance(named, str) and not table.uses(name, named):
                raise ForbiddenError(f"key {name} has no right on queue {named!r} (roq keys show {name})")
    queue = args.get("name")
    if op in QUEUE_READS and role == CLIENT and table is not None and isinstance(queue, str) \
            and not table.uses(name, queue):
        raise ForbiddenError(f"key {name} has no right on queue {queue!r} (roq keys show {name})")
    return False


def visible(op: str, result: Any, role: str | None, name: str, table: PermissionTable | None) -> Any:
    """`result` with the queues a client key has no right on left out (listings only)."""
    if role != CLIENT or table is None:
        return result
    if op == "queue.list":
        return [q for q in result if table.uses(name, q["name"])]
    if op == "cluster.status":
        return dict(result, queues=[q for q in result["queues"] if table.uses(name, q)])
    if op == "cluster.stats":
        return dict(result, queues={q: v for q, v in result["queues"].items() if table.uses(name, q)})
    if op == "cluster.events":
        return dict(result, events=[e for e in result["events"] if not e.get("queue") or table.uses(name, e["queue"])])
    return result


class ControlServer:
    _permissions: Tables | None = None  # None: no per-queue checks (a server driven by unit tests)

    def __init__(self, config: Config, bind_host: str, port: int, advertise_host: str,
                 route: Callable[[str], Handler], permissions: Tables | None = None) -> None:
        """`route(op)` returns the handler for an operation or raises a RoqError; `permissions()`
        the permission table requests are judged by."""
        self._route = route
        self._permissions = permissions
        self._secured = config.security.curve
        self._context = zmq.Context()
        self.gatekeeper = Gatekeeper(self._context, config, "control-api")
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self._socket.setsockopt(zmq.MAXMSGSIZE, 2 << 20)  # oversize frames are dropped by libzmq
        self.gatekeeper.guard(self._socket, "control")
        listening(self._socket)
        if port:
            try:
                self._socket.bind(f"tcp://{bind_host}:{port}")
            except zmq.ZMQError as exc:
                self._context.destroy(linger=0)
                raise ConfigError(f"the control API cannot listen on {bind_host}:{port} ({exc.strerror}): "
                                  "another process holds the port, or gcm.bind names no address of this "
                                  "host; set gcm.port (or ROQ_SEEDS) to a free one") from None
        else:
            port = self._socket.bind_to_random_port(f"tcp://{bind_host}")
        self.endpoint = f"tcp://{advertise_host}:{port}"
        self._stop = threading.Event()
        self._outbox: deque[tuple[bytes, bytes]] = deque()  # pushes from other threads, sent by ours
        self._outbox_wake = WakePipe()
        os.set_blocking(self._outbox_wake.fd, False)  # drained on every turn of the loop, read or not
        self._thread = threading.Thread(target=self._serve, name="control-api", daemon=True)
        self.requests = 0
        self.errors = 0

    def start(self) -> None:
        self.gatekeeper.start()
        self._thread.start()

    def push(self, peer: bytes, frame: bytes) -> None:
        """Send `frame` to connection `peer` unasked (any thread); dropped if it does not read."""
        self._outbox.append((peer, frame))
        self._outbox_wake.wake()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._outbox_wake.close()
        self.gatekeeper.stop()
        self._context.term()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._outbox_wake.fd, zmq.POLLIN)
        pending: deque[tuple[float, list[zmq.Frame]]] = deque()
        try:
            while not self._stop.is_set():
                self._send_pushes()
                self._take_waiting(pending)
                if pending:
                    self._handle_one(*pending.popleft())
                else:
                    poller.poll(POLL_MS)
        finally:
            self._socket.close(linger=0)

    def _send_pushes(self) -> None:
        self._outbox_wake.drain()
        while self._outbox:
            peer, frame = self._outbox.popleft()
            try:
                self._socket.send_multipart([peer, frame], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # not reading, or gone: its renewal or the version gap repairs it

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
        role, name = peer_identity(payload) if self._secured else (ADMIN, "")
        if len(frames) == 2:
            token = PEER.set(ident)
            try:
                reply = self.dispatch(payload.bytes, role, received_at, name)
            finally:
                PEER.reset(token)
        else:  # a request is one frame: refused, echoing the id its first frame names so it can be matched
            self.errors += 1
            reply = encode_error(request_id_of(frames[1].bytes), ProtocolError(
                f"a request is one frame; this message had {len(frames) - 1}"))
        try:
            self._socket.send_multipart([ident, reply], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a reply: client not reading")

    def dispatch(self, payload: bytes, role: str | None, received_at: float | None = None, name: str = "") -> bytes:
        """Decode, authorise, route, run, encode. Always returns a reply frame. `role` and `name`:
        the caller's key, as the gatekeeper tagged it."""
        req_id = None
        received_at = time.monotonic() if received_at is None else received_at
        try:
            request = decode_request(payload)
            req_id = request.id
            writes = is_write(request.op, request.args)
            table = self._permissions() if self._permissions is not None else None
            admin = authorise(request.op, request.args, role, name, table)
            handler = self._route(request.op)
            waited = time.monotonic() - received_at
            if writes and waited > REQUEST_DEADLINE:
                raise UnavailableError(f"the GCM was busy: this request waited {waited:.1f}s for its turn and "
                                       "was not applied; retry")
            subject = request.args.get("name")
            context = RequestContext(received_at + REQUEST_DEADLINE, request.op, request.key,
                                     subject if isinstance(subject, str) else None)
            with serving(context):
                result = handler(request.args)
            return encode_reply(req_id, result if admin else visible(request.op, result, role, name, table))
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
