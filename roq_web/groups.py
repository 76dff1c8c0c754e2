"""Consumer groups over HTTP (docs/http.md "Consumer groups and purges"), for the API and the console.

Reads come from the leader's aggregate that the sampler holds (`cluster.stats`, roq_web/history.py), as
`roq stats` shows it, so a page polled by many browsers costs the leader nothing more: a queue's
groups summed over its running exchanges (members and lag: the largest at one exchange,
roq.records.group_totals), and one group's figures on each exchange.

Admin commands (queue purge, group reset and delete) are applied by the exchanges themselves
(gcm/commands.py); the gateway waits a while for every running exchange's result. `command_status_code`
says what the status it got means over HTTP: 200 when every running exchange reported, 202 when some
have not yet (they apply it as soon as they can; the status's `id` is followed at
`GET /api/queues/{q}/commands/{id}`), and PreconditionFailedError (409) when an exchange refused it: a
group that gained a member between the leader's check and its delete.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roq.errors import GroupNotFoundError, PreconditionFailedError
from roq.records import GroupStats


def group_rows(queue_stats: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The queue's groups, by name: `name` and roq.records.GroupStats's figures."""
    groups = queue_stats.get("groups") or {}
    return [{"name": name, **GroupStats.from_dict(groups[name]).to_dict()} for name in sorted(groups)]


def group_detail(queue: str, queue_stats: Mapping[str, Any], group: str) -> dict[str, Any]:
    """One group over the queue's running exchanges, and on each of them (`by_exchange`)."""
    total = (queue_stats.get("groups") or {}).get(group)
    if total is None:
        raise GroupNotFoundError(f"queue {queue!r} has no group {group!r} on its running exchanges")
    by_exchange = {x["id"]: GroupStats.from_dict(x["groups"][group]).to_dict()
                   for x in queue_stats.get("by_exchange") or () if group in (x.get("groups") or {})}
    return {"queue": queue, "name": group, **GroupStats.from_dict(total).to_dict(), "by_exchange": by_exchange}


def command_status_code(status: Mapping[str, Any]) -> int:
    """200: every running exchange applied the command; 202: some have not reported yet.
    PreconditionFailedError when one refused it (what the others did stays done)."""
    refused = [f"{xid} ({result['refused']})" for xid, result in sorted(status["results"].items())
               if result.get("refused")]
    if refused:
        raise PreconditionFailedError(f"refused by {', '.join(refused)} (command {status['id']}, {status['op']})")
    return 200 if status["done"] else 202
