"""MetadataClient: a client's one conversation with the GCMs about topology (docs/protocol.md
section 8). No ZooKeeper: it talks to one seed GCM at a time (`cluster.seeds`), watches the queues
its owners follow, and hands every new topology to their callbacks.

One thread owns a DEALER socket to the current seed. It sends `metadata.watch` with every followed
queue and renews it at a third of the lease; the GCM pushes each change. It moves to the next seed
when one does not answer within ATTEMPT_TIMEOUT or its connection drops (ZeroMQ heartbeats notice
a silent one), and learns more seeds from the `gcms` of each answer. While no GCM answers it keeps
the last topology: ZooKeeper or the GCMs being down changes nothing in the cluster, so publishers
and subscribers go on as they are.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from roq.client.wake import WakePipe
from roq.config import Config
from roq.errors import (
    NoSeedsError,
    ProtocolError,
    QueueNotFoundError,
    RoqError,
    UnavailableError,
    UserError,
    error_from_code,
)
from roq.protocol import decode_reply, encode_request
from roq.protocol.metadata import WATCH, check_body, decode_push
from roq.security import secure_client

log = logging.getLogger(__name__)

ATTEMPT_TIMEOUT = 1.0  # s a seed has to answer before the next one is asked
HEARTBEAT_MS = 1000  # ZeroMQ pings on the seed connection: a silent GCM is left within ~3 s
RETRY_PAUSE = 0.2  # s between two rounds over every seed when none answers
# A GCM's cache follows ZooKeeper a few ms behind the leader's writes: a queue created just now may
# be unknown to the seed asked. Its watch stays, so the push that shows the queue is awaited this long
# before "does not exist" is believed.
NOT_FOUND_GRACE = 1.0

Listener = Callable[[dict[str, Any]], None]


def configured_seeds(config: Config) -> list[str]:
    seeds = [s.strip() for s in config.cluster.seeds.split(",") if s.strip()]
    if not seeds:
        raise NoSeedsError("no seeds: set cluster.seeds (or ROQ_SEEDS) to the GCMs' control endpoints, "
                            "tcp://host:port,...")
    return seeds


class MetadataClient:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.seeds = configured_seeds(config)
        self._lock = threading.Condition()
        self._bodies: dict[str, dict[str, Any]] = {}
        self._listeners: dict[str, list[Listener]] = {}
        self._gcm: str | None = None  # whose numbering the versions held are in
        self._refused: RoqError | None = None  # a seed's refusal of our watch (forbidden, limit_exceeded)
        self.leader: str | None = None
        self.endpoint: str | None = None  # the seed this client talks to now
        self.moves = 0  # seeds left for another (for tests)
        self._wake = WakePipe()
        self._closed = False
        self._context = zmq.Context()
        self._thread = threading.Thread(target=self._run, name="metadata", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        self._wake.wake()
        self._thread.join(timeout=5)
        self._wake.close()
        self._context.destroy(linger=0)

    # ------------------------------------------------------------ what owners call (any thread)

    def follow(self, queue: str, listener: Listener, timeout: float) -> dict[str, Any]:
        """Watch `queue`; `listener(body)` gets each later topology (on this client's thread). Returns
        the current one; QueueNotFoundError if the queue does not exist, UnavailableError if no
        seed answered within `timeout`."""
        with self._lock:
            self._listeners.setdefault(queue, []).append(listener)
            self._wake.wake()
            self._refused = None
            deadline = time.monotonic() + timeout
            answered = self._lock.wait_for(
                lambda: queue in self._bodies or self._closed or self._refused is not None, timeout)
            if answered and not self._bodies.get(queue, {"exists": True})["exists"]:
                self._lock.wait_for(lambda: self._bodies.get(queue, {}).get("exists") or self._closed,
                                    max(0.0, min(NOT_FOUND_GRACE, deadline - time.monotonic())))
            body, refused = self._bodies.get(queue), self._refused
        if body is None and refused is not None:
            self.unfollow(queue, listener)
            raise refused
        if not answered or body is None:
            self.unfollow(queue, listener)
            raise UnavailableError(f"no GCM of {', '.join(self.seeds)} answered within {timeout:.1f}s "
                                   "(cluster.seeds)")
        if not body["exists"]:
            self.unfollow(queue, listener)
            raise QueueNotFoundError(f"queue {queue!r} does not exist")
        return body

    def unfollow(self, queue: str, listener: Listener) -> None:
        with self._lock:
            listeners = self._listeners.get(queue, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._listeners.pop(queue, None)
                self._bodies.pop(queue, None)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        conversation: _SeedConnection | None = None
        seeds = itertools.count(random.randrange(len(self.seeds)))  # clients spread over the seeds
        while not self._closed:
            if conversation is None:
                conversation = _SeedConnection(self._context, self.config, self._next_seed(next(seeds)))
                self.endpoint = conversation.endpoint
            try:
                self._converse(conversation)
            except RoqError as exc:  # unavailable, malformed, or refused (told to whoever waits)
                if isinstance(exc, UserError) and not isinstance(exc, ProtocolError):
                    with self._lock:
                        self._refused = exc
                        self._lock.notify_all()
                log.info("metadata: leaving seed %s: %s", conversation.endpoint, exc)
                conversation.close()
                conversation, self.moves = None, self.moves + 1
                self._forget_numbering()
                if self._closed:
                    break
                time.sleep(RETRY_PAUSE)
        if conversation is not None:
            conversation.close()

    def _next_seed(self, turn: int) -> str:
        with self._lock:
            return self.seeds[turn % len(self.seeds)]

    def _forget_numbering(self) -> None:
        with self._lock:
            self._gcm = None

    def _converse(self, conv: _SeedConnection) -> None:
        """Watch the followed queues on this seed and take its pushes until it fails us."""
        renew_at = 0.0
        while not self._closed:
            with self._lock:
                queues = sorted(self._listeners)
                missing = any(q not in self._bodies for q in queues)
                versions = {q: b["version"] for q, b in self._bodies.items() if q in self._listeners}
                gcm = self._gcm
            if queues and (missing or time.monotonic() >= renew_at or queues != conv.watching):
                args: dict[str, Any] = {"queues": queues, "version": versions}
                if gcm:
                    args["gcm"] = gcm
                result = conv.request(WATCH, args, ATTEMPT_TIMEOUT, self._take_push, self._wake)
                conv.watching = queues
                renew_at = time.monotonic() + float(result["lease"]) / 3
                self._take_answers(result)
                continue
            conv.wait(self._take_push, self._wake, max(0.0, renew_at - time.monotonic()) if queues else 1.0)

    def _take_answers(self, result: dict[str, Any]) -> None:
        with self._lock:
            self._gcm = result["gcm"]
        for queue, body in result["queues"].items():
            if not body.get("unchanged"):
                self._take(check_body(body))

    def _take_push(self, body: dict[str, Any]) -> None:
        with self._lock:
            held = self._bodies.get(body["queue"])
            if body["gcm"] != self._gcm or (held is not None and held["version"] >= body["version"]):
                return  # another numbering (we moved), or no newer than what we hold
        self._take(body)

    def _take(self, body: dict[str, Any]) -> None:
        queue = body["queue"]
        with self._lock:
            if queue not in self._listeners:
                return
            self._bodies[queue] = body
            self.leader = body.get("leader") or self.leader
            for endpoint in body.get("gcms") or ():
                if isinstance(endpoint, str) and endpoint not in self.seeds:
                    self.seeds.append(endpoint)  # learnt: the next seeds to try
            listeners = list(self._listeners[queue])
            self._lock.notify_all()
        for listener in listeners:
            try:
                listener(body)
            except Exception:  # an owner's bug must not stop everyone's topology
                log.exception("metadata listener of queue %s failed", queue)


class _SeedConnection:
    """One DEALER to one GCM, with a monitor so a dropped connection is noticed at once."""

    def __init__(self, context: zmq.Context[Any], config: Config, endpoint: str) -> None:
        self.endpoint = endpoint
        self.watching: list[str] = []
        self._ids = itertools.count(1)
        self.sock = context.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
        secure_client(self.sock, config)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        self.sock.connect(endpoint)

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)

    def request(self, op: str, args: dict[str, Any], timeout: float, on_push: Listener, wake: WakePipe) -> Any:
        req_id = next(self._ids)
        self.sock.send(encode_request(req_id, op, args))
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            for frame in self._frames(remaining, wake):
                push = decode_push(frame)
                if push is not None:
                    on_push(push)
                    continue
                reply = decode_reply(frame)
                if reply.id != req_id:
                    continue
                if reply.ok:
                    return reply.result
                raise error_from_code(reply.code, reply.message, reply.leader)
        raise UnavailableError(f"no answer within {timeout:.1f}s")

    def wait(self, on_push: Listener, wake: WakePipe, timeout: float) -> None:
        """Take pushes for up to `timeout` seconds, or until woken."""
        for frame in self._frames(timeout, wake):
            push = decode_push(frame)
            if push is not None:
                on_push(push)

    def _frames(self, timeout: float, wake: WakePipe) -> list[bytes]:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        poller.register(wake.fd, zmq.POLLIN)
        ready = dict(poller.poll(int(timeout * 1000) + 1))
        if self.monitor in ready:
            event = recv_monitor_message(self.monitor)["event"]
            raise UnavailableError("connection dropped" if event == zmq.EVENT_DISCONNECTED else "refused")
        if wake.fd in ready:
            wake.drain()
        frames: list[bytes] = []
        while self.sock in ready and len(frames) < 1000:
            try:
                frames.append(self.sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        return frames
