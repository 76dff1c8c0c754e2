"""Admin: the control API client. Asks the seeds (`cluster.seeds`: any GCM; never ZooKeeper),
follows `not_leader` redirects to the leader, and retries through a leader change until
`client.request_timeout` runs out; then raises NoLeaderError or the server's
own error (QueueNotFoundError, InvalidNameError, ...).

Every attempt of one call that changes the cluster carries the same request key,
so the leader applies it once: a retry of a create the leader applied but whose
answer was lost gets that success, not `queue_exists` (gcm.fence). A GCM that
refuses the handshake (too many connections from this address, an unknown key)
fails the call at once with RefusedError instead of a timeout; a seed that is down costs one
refused connection, and the next one is asked."""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from roq.client.lifecycle import ClientLifecycle
from roq.client.metadata import configured_seeds
from roq.config import Config
from roq.errors import (
    GroupNotFoundError,
    NoLeaderError,
    NoSeedsError,
    NotLeaderError,
    RefusedError,
    RequestTimeoutError,
    UnavailableError,
    error_from_code,
)
from roq.permissions import check_pattern
from roq.protocol import decode_reply, encode_request
from roq.records import ExchangeStats, group_totals, queue_groups
from roq.security import HANDSHAKE_FAILED, load_keys, secure_client

log = logging.getLogger(__name__)

READ_ONLY = frozenset({"ping", "queue.list", "queue.describe", "cluster.status", "keys.list", "keys.show",
                       "queue.command", "backup.export"})
COMMAND_POLL = 0.1  # s between two looks at an admin command's results
# Every seed refusing connections this long: no GCM runs there, say so instead of waiting out
# client.request_timeout (a GCM that is merely slow still gets all of it).
SEEDS_REFUSED_FOR = 1.5


class Admin(ClientLifecycle):
    def __init__(self, config: Config) -> None:
        self.config = config
        load_keys(config.security)  # a missing or unreadable key fails here, not at the first connect
        self.seeds = configured_seeds(config)
        self._turn = itertools.count()
        self._context = zmq.Context()
        self._ids = itertools.count(1)
        self._last_leader: str | None = None

    def _shut_down(self) -> None:
        self._context.destroy(linger=0)

    # ------------------------------------------------------------ operations

    def create_queue(self, name: str, exchanges: int | None = None, replicas: int | None = None,
                     exist_ok: bool = False, retention: float | None = None,
                     retention_bytes: int | None = None) -> dict[str, Any]:
        """Create queue `name` with `exchanges` (None: 1); `replicas` 2 gives each exchange a replica on
        another host, None leaves it to the leader's gcm.default_replicas. `retention` (seconds) and
        `retention_bytes` are its storage policy (roq/storage_policy.py; None: the leader's
        gcm.default_retention and gcm.default_retention_bytes). With `exist_ok` a queue of that name
        is success, if it has the settings given (those left None are not compared; a queue with
        autoscaling rules is not held to a number of exchanges); if not, QueueExistsError says what
        differs."""
        args: dict[str, Any] = {"name": name}
        optional = {"exchanges": exchanges, "replicas": replicas, "retention": retention,
                    "retention_bytes": retention_bytes}
        args.update({key: value for key, value in optional.items() if value is not None})
        if exist_ok:
            args["exist_ok"] = True
        return self.call("queue.create", **args)

    def set_queue(self, name: str, retention: float | None = None,
                  retention_bytes: int | None = None) -> dict[str, Any]:
        """Change queue `name`'s storage policy (the values given; at least one); returns its
        description. Its running exchanges take the new policy without a restart."""
        args: dict[str, Any] = {"name": name}
        if retention is not None:
            args["retention"] = retention
        if retention_bytes is not None:
            args["retention_bytes"] = retention_bytes
        return self.call("queue.set", **args)

    def delete_queue(self, name: str, if_empty: bool = False, if_unused: bool = False) -> dict[str, Any]:
        """Delete queue `name`; `if_empty`: only if it holds no message (retained, or in a group's
        backlog), `if_unused`: only if no publisher, subscriber or group member uses it, as its
        exchanges' latest statistics say (PreconditionFailedError otherwise: nothing deleted)."""
        args: dict[str, Any] = {"name": name}
        if if_empty:
            args["if_empty"] = True
        if if_unused:
            args["if_unused"] = True
        return self.call("queue.delete", **args)

    # ------------------------------------------------------------ consumer groups and purges

    def list_groups(self, name: str) -> dict[str, dict[str, Any]]:
        """The queue's consumer groups over its running exchanges (roq.records.GroupStats as maps)."""
        return {group: figures.to_dict() for group, figures in queue_groups(self.describe_queue(name)).items()}

    def describe_group(self, name: str, group: str) -> dict[str, Any]:
        """One group: its figures over the queue's running exchanges, and each exchange's (`by_exchange`)."""
        info = self.describe_queue(name)
        by_exchange = {x["id"]: ExchangeStats.from_dict((x.get("live") or {}).get("stats")).groups.get(group)
                       for x in info["exchanges"]}
        found = {xid: figures for xid, figures in by_exchange.items() if figures is not None}
        if not found:
            raise GroupNotFoundError(f"queue {name!r} has no group {group!r} on its running exchanges")
        total = group_totals([{group: figures} for figures in found.values()])[group]
        return {"queue": name, "name": group, **total.to_dict(),
                "by_exchange": {xid: figures.to_dict() for xid, figures in found.items()}}

    def purge_queue(self, name: str, wait: float = 10.0) -> dict[str, Any]:
        """Drop what queue `name` holds: retained messages and every group's ready and delayed ones
        (docs/work-queues.md "Managing groups"). Waits up to `wait` seconds for every running
        exchange's result; the command's status (`done` false if some did not answer in time)."""
        return self.wait_command(name, self.call("queue.purge", name=name), wait)

    def reset_group(self, name: str, group: str, wait: float = 10.0) -> dict[str, Any]:
        """Drop the ready and delayed messages of `group` on queue `name` (its members stay)."""
        return self.wait_command(name, self.call("group.reset", name=name, group=group), wait)

    def delete_group(self, name: str, group: str, wait: float = 10.0) -> dict[str, Any]:
        """Delete `group` of queue `name`, with its messages; refused while it has members."""
        return self.wait_command(name, self.call("group.delete", name=name, group=group), wait)

    def command_status(self, name: str, command_id: str) -> dict[str, Any]:
        return self.call("queue.command", name=name, id=command_id)

    def wait_command(self, name: str, status: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Poll an admin command's status until every running exchange reported, or `timeout`."""
        deadline = time.monotonic() + timeout
        while not status["done"] and time.monotonic() < deadline:
            time.sleep(COMMAND_POLL)  # the exchanges' results arrive through ZooKeeper: polled through the leader
            status = self.command_status(name, status["id"])
        return status

    def scale_queue(self, name: str, exchanges: int) -> dict[str, Any]:
        return self.call("queue.scale", name=name, exchanges=exchanges)

    def rebalance(self, name: str | None = None) -> dict[str, Any]:
        """Even the spread of queue `name`'s exchanges (None: every queue's) now: `{"moves": [{queue,
        exchange, replica, from, to}], "waiting": why nothing may move yet, or None}`."""
        args: dict[str, Any] = {} if name is None else {"name": name}
        return self.call("queue.rebalance", **args)

    def list_queues(self) -> list[dict[str, Any]]:
        return self.call("queue.list")

    def describe_queue(self, name: str) -> dict[str, Any]:
        return self.call("queue.describe", name=name)

    def status(self) -> dict[str, Any]:
        return self.call("cluster.status")

    def wait_running(self, name: str, count: int, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until `count` exchanges of queue `name` run; returns its description."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.describe_queue(name)
            if sum(1 for x in info["exchanges"] if x.get("live")) >= count:
                return info
            if time.monotonic() > deadline:
                raise RequestTimeoutError(f"the exchanges of queue {name!r} were not running after {timeout:.0f}s")
            time.sleep(0.1)  # polling ZooKeeper's view through the leader

    def queue_rules(self, name: str, rules: dict[str, Any] | None = None, clear: bool = False) -> dict[str, Any]:
        """The queue's autoscaling rules, after applying `rules` (and `clear`ing first) if given."""
        args: dict[str, Any] = {"name": name}
        if rules is not None:
            args["rules"] = rules
        if clear:
            args["clear"] = True
        return self.call("queue.rules", **args)

    def cluster_stats(self) -> dict[str, Any]:
        """The leader's aggregates: per queue (with per-exchange rows and scaling events) and per host."""
        return self.call("cluster.stats")

    def cluster_events(self, after: int = 0) -> dict[str, Any]:
        """The cluster's recent events numbered above `after` (gcm/events.py): {"events", "last"}."""
        return self.call("cluster.events", after=after)

    def grant(self, name: str, publish: Sequence[str] = (), subscribe: Sequence[str] = (),
              consume: Sequence[str] = (), admin: bool = False) -> dict[str, Any]:
        """Add queue patterns (and admin) to key NAME's permissions; returns its entry after."""
        return self.call("keys.grant", name=name, **_rights(publish, subscribe, consume, admin))

    def revoke(self, name: str, publish: Sequence[str] = (), subscribe: Sequence[str] = (),
               consume: Sequence[str] = (), admin: bool = False, everything: bool = False) -> dict[str, Any]:
        """Take patterns (and admin) from key NAME; none named, or `everything`: every right (the
        entry stays, empty: the key gets nothing, whatever the default)."""
        args = _rights(publish, subscribe, consume, admin)
        if everything:
            args["all"] = True
        return self.call("keys.revoke", name=name, **args)

    def reset_permissions(self, name: str) -> dict[str, Any]:
        """Remove key NAME's entry: it gets security.default_permissions again."""
        return self.call("keys.reset", name=name)

    def permissions(self) -> dict[str, Any]:
        """Every key's entry, with the default and whether the leader enforces them (admin only)."""
        return self.call("keys.list")

    def key_permissions(self, name: str) -> dict[str, Any]:
        """Key NAME's entry (None: the default applies), certificate and admin (admin, or NAME's own)."""
        return self.call("keys.show", name=name)

    # ------------------------------------------------------------ transport

    def call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        deadline = time.monotonic() + (timeout or self.config.client.request_timeout)
        key = None if op in READ_ONLY else uuid.uuid4().hex  # one per call, the same for its retries
        endpoint: str | None = None
        last_error: Exception = NoLeaderError("no GCM leader is elected (are the GCMs running?)")
        unanswered = False  # an attempt may have been applied without our hearing of it
        started, refused = time.monotonic(), set[str]()  # seeds where nothing listens
        while time.monotonic() < deadline:
            if refused >= set(self.seeds) and time.monotonic() - started >= SEEDS_REFUSED_FOR:
                raise NoSeedsError(f"no GCM leader: no GCM listens at {', '.join(self.seeds)}: nothing listens there "
                                   "(cluster.seeds, ROQ_SEEDS)")
            endpoint = endpoint or self._last_leader or self._next_seed()
            try:
                result = self.request(endpoint, op, args,
                                      min(self.config.client.attempt_timeout, deadline - time.monotonic()), key)
                self._last_leader = endpoint
                return result
            except NotLeaderError as err:  # a backup names the leader; none elected yet: ask again soon
                last_error, endpoint = err, err.leader if err.leader != endpoint else None
                self._last_leader = None
                if endpoint is None:
                    time.sleep(0.1)
            except UnavailableError as err:  # down, timed out, suspended: another GCM
                if isinstance(err, _NothingListens):
                    refused.add(endpoint)
                unanswered = unanswered or isinstance(err, RequestTimeoutError)
                last_error, endpoint, self._last_leader = err, None, None
                time.sleep(0.1)
        if unanswered and op not in READ_ONLY:
            raise RequestTimeoutError(f"{last_error}; an earlier attempt got no answer, so the outcome "
                                      "is unknown: it may still be applied (check before retrying)")
        raise last_error

    def _next_seed(self) -> str:
        return self.seeds[next(self._turn) % len(self.seeds)]

    def request(self, endpoint: str, op: str, args: dict[str, Any], timeout: float,
                key: str | None = None) -> Any:
        """One round trip to one GCM; a fresh socket each time so a lost reply can't confuse the next.

        `key`: the request key of the call this attempt belongs to (None: none, as old clients)."""
        req_id = next(self._ids)
        sock = self._context.socket(zmq.DEALER)
        sock.linger = 0
        # libzmq retries a refused handshake forever in silence: its monitor is the only witness.
        # A dead GCM refuses the TCP connection, and libzmq retries in silence: CONNECT_RETRIED says so
        # at once, instead of after the attempt's time-out (the leader's znode may still name it).
        monitor = sock.get_monitor_socket(HANDSHAKE_FAILED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECTED)
        connected = False  # once connected, the request may have been delivered: no quick way out
        try:
            secure_client(sock, self.config)
            sock.connect(endpoint)
            sock.send(encode_request(req_id, op, args, key))
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            deadline = time.monotonic() + max(timeout, 0.05)
            while (remaining := deadline - time.monotonic()) > 0:
                ready = dict(poller.poll(int(remaining * 1000) + 1))
                if monitor in ready:
                    event = recv_monitor_message(monitor)
                    if event["event"] == zmq.EVENT_CONNECTED:
                        connected = True
                        continue
                    if event["event"] == zmq.EVENT_CONNECT_RETRIED:
                        if not connected:
                            raise _NothingListens(f"GCM {endpoint} refuses connections (not running)")
                        continue
                    raise refusal(endpoint, event)
                if sock not in ready:
                    continue
                reply = decode_reply(sock.recv())
                if reply.id != req_id:
                    continue
                if reply.ok:
                    return reply.result
                raise error_from_code(reply.code, reply.message, reply.leader)
            raise RequestTimeoutError(f"no answer from GCM {endpoint} within {timeout:.1f}s")
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)


class _NothingListens(UnavailableError):
    """The GCM's address refused the TCP connection: no GCM runs there."""


def _rights(publish: Sequence[str], subscribe: Sequence[str], consume: Sequence[str], admin: bool) -> dict[str, Any]:
    """The rights of a grant or revoke request, only those given; a bad pattern is refused here."""
    named: dict[str, Any] = {k: [check_pattern(p) for p in v] for k, v in (
        ("publish", publish), ("subscribe", subscribe), ("consume", consume)) if v}
    if admin:
        named["admin"] = True
    return named


def refusal(endpoint: str, event: Mapping[str, Any]) -> RefusedError:
    """The error for a failed handshake, saying what the GCM may hold against us."""
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return RefusedError(
            f"the GCM at {endpoint} refused the connection (status {event['value']}): more connections from "
            "this address than its security.max_connections_per_client allows, or a key it does not know "
            "(security.identity)")
    return RefusedError(f"the handshake with the GCM at {endpoint} failed: its security settings differ from "
                        "this client's (security.curve, the cluster's server.key)")
