"""A queue that a command creates for itself (`roq bench`, `roq pipeline stats`) and deletes on its
way out, Ctrl-C included: within a deadline, or with one line that says it is left and how to delete
it, so that the command ends rather than hangs on a cluster that does not answer."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from roq.config import Config

CLEANUP_WAIT = 10.0  # s to delete a queue on the way out (ZooKeeper connection, then the request)


def maybe_applied(exc: BaseException) -> bool:
    """Whether a create request that failed with `exc` may have been applied all the same: a Ctrl-C
    cut its answer off, or the answer did not come in time."""
    from roq.errors import RequestTimeoutError
    return isinstance(exc, (KeyboardInterrupt, RequestTimeoutError))


def delete_queue_within(config: Config, queue: str, wait: float = CLEANUP_WAIT) -> bool:
    """Delete `queue`, which this command created (or may have: see maybe_applied), giving up after
    about `wait` seconds or on a second Ctrl-C with one line on stderr that says so; True if this
    deleted it. A KeyboardInterrupt is raised again after that line."""
    from roq.client.admin import Admin
    from roq.errors import QueueNotFoundError, RoqError
    quick = config.replace(client={"request_timeout": wait / 2})
    try:
        with Admin(quick) as admin:
            admin.delete_queue(queue)
    except QueueNotFoundError:
        return False  # never created (the Ctrl-C came first), or deleted meanwhile: gone all the same
    except (RoqError, KeyboardInterrupt) as exc:
        why = "interrupted again" if isinstance(exc, KeyboardInterrupt) else str(exc)
        print(f"roq: queue {queue} was not deleted ({why}); delete it with `roq queue delete {queue}`",
              file=sys.stderr, flush=True)
        if isinstance(exc, KeyboardInterrupt):
            raise
        return False
    return True
