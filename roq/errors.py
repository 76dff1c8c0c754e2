"""One root exception for RoQ, split by what the caller can do about it.

`UserError` subclasses are the caller's mistake (fix the input and retry);
`UnavailableError` subclasses are transient conditions of the cluster (retry
later); `FencedError` means this process lost leadership and must stop acting.
Every error that crosses the control API has a stable string `code`; every
process exits with a member of `Exit`, chosen by `Exit.for_error`.
"""

from __future__ import annotations

import enum


class RoqError(Exception):
    """Root of every error RoQ raises on purpose."""

    code = "internal"


class UserError(RoqError):
    """The request is wrong; retrying it unchanged will fail again."""

    code = "bad_request"


class ConfigError(UserError):
    code = "bad_config"


class InvalidNameError(UserError):
    code = "invalid_name"


class QueueNotFoundError(UserError):
    code = "queue_not_found"


class QueueExistsError(UserError):
    code = "queue_exists"


class GroupNotFoundError(UserError):
    """No running exchange of the queue has that consumer group."""

    code = "group_not_found"


class CommandNotFoundError(UserError):
    """No admin command of that id (docs/protocol.md section 2, `queue.command`)."""

    code = "command_not_found"


class PreconditionFailedError(UserError):
    """What the request asks depends on a state the queue is not in: `queue.delete` with `if_empty` of
    a queue that holds messages, with `if_unused` of one in use; `group.delete` of a group with members."""

    code = "precondition_failed"


class UnknownCommandError(UserError):
    code = "unknown_command"


class ProtocolError(UserError):
    """A frame could not be decoded or does not follow the protocol."""

    code = "malformed"


class MessageTooLargeError(UserError):
    code = "too_large"


class ForbiddenError(UserError):
    """The caller's credential does not allow the operation (e.g. a client key asking to create a queue)."""

    code = "forbidden"


class LimitExceededError(UserError):
    """A configured limit (queues, message size, connections) would be exceeded."""

    code = "limit_exceeded"


class RefusedError(UserError):
    """A server refused our connection in the handshake: too many connections from this address
    (security.max_connections_per_client) or a key it does not know. Client-side only."""

    code = "refused"


class UnavailableError(RoqError):
    """The cluster cannot serve the request right now; retry later."""

    code = "unavailable"


class ZooKeeperUnavailableError(UnavailableError):
    code = "zookeeper_unavailable"


class NoLeaderError(UnavailableError):
    code = "no_leader"


class NoSeedsError(UnavailableError):
    """A client was given no seed (`cluster.seeds`), or none of them has a GCM listening."""


class NotLeaderError(UnavailableError):
    """Sent by a backup GCM; `leader` holds the current leader's endpoint if known."""

    code = "not_leader"

    def __init__(self, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader


class NoCapacityError(UnavailableError):
    code = "no_capacity"


class RequestTimeoutError(UnavailableError):
    code = "timeout"


class BackpressureError(UnavailableError):
    """Too many unconfirmed messages for too long: the publisher refuses more."""

    code = "backpressure"
    queued = 0  # publish_many: how many leading payloads were queued before the refusal


class StorageFullError(BackpressureError):
    """Backpressure because the exchange cannot store what it takes: its journal's disk is full or
    failing (protocol 3.3 `move` reason `storage_full`). Confirms resume once it has room or the
    leader moved it to a host that has; nothing unconfirmed is lost meanwhile."""

    code = "storage_full"


class FencedError(RoqError):
    """A write was refused because another GCM was elected since ours."""

    code = "fenced"


ERRORS_BY_CODE: dict[str, type[RoqError]] = {
    cls.code: cls
    for cls in (
        RoqError, UserError, ConfigError, InvalidNameError, QueueNotFoundError,
        QueueExistsError, GroupNotFoundError, CommandNotFoundError, PreconditionFailedError, UnknownCommandError,
        ProtocolError, MessageTooLargeError, ForbiddenError,
        LimitExceededError, RefusedError,
        UnavailableError, ZooKeeperUnavailableError, NoLeaderError, NotLeaderError,
        NoCapacityError, RequestTimeoutError, BackpressureError, StorageFullError, FencedError,
    )
}


def error_from_code(code: str, message: str, leader: str | None = None) -> RoqError:
    """Rebuild the exception a server reported, for the client side."""
    cls = ERRORS_BY_CODE.get(code, RoqError)
    if cls is NotLeaderError:
        return NotLeaderError(message, leader)
    err = cls(message)
    err.code = code
    return err


class Exit(enum.IntEnum):
    """Exit codes of every RoQ process: the `roq` command, `roq-gcm`, `roq-hcm` and `roq-exchange`."""

    OK = 0
    USER_ERROR = 1  # bad input, unknown queue, ...
    # A bad configuration (unknown key, bad value, unreadable key file): the user's mistake, so the
    # same code from `roq` and from a daemon that refuses to start; an HCM counts it as a crash.
    CONFIG = 1
    USAGE = 2  # click's own code for bad flags
    UNAVAILABLE = 3  # ZooKeeper or the leader cannot be reached
    INTERNAL = 4  # a bug: an unexpected error stopped the command or the daemon
    REFUSED = 5  # a server refused the connection: connection limit or unknown key
    # An exchange whose incarnation had to end (its replica sealed it: the cluster saw it end): the
    # HCM starts a new incarnation at once and does not count it as a crash.
    ENDED = 6
    # An exchange whose journal's disk broke for good ended its incarnation to start a new one: not a
    # crash (an HCM restarts it without counting it towards hcm.max_restarts; exchange/storage.py).
    STORAGE = 7
    INTERRUPTED = 130

    @classmethod
    def for_error(cls, exc: BaseException) -> Exit:
        """The code a process exits with when `exc` ends it."""
        if isinstance(exc, RefusedError):
            return cls.REFUSED
        if isinstance(exc, ConfigError):
            return cls.CONFIG
        if isinstance(exc, UserError):
            return cls.USER_ERROR
        if isinstance(exc, UnavailableError):
            return cls.UNAVAILABLE
        if isinstance(exc, KeyboardInterrupt):
            return cls.INTERRUPTED
        return cls.INTERNAL
