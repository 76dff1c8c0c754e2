"""Admin commands on what the exchanges of a queue hold: reset or delete a consumer group, purge
the queue (docs/protocol.md section 2, docs/work-queues.md "Managing groups").

Groups and retained messages live in the exchanges' memory, so the leader writes the command in one
fenced transaction as `<root>/commands/<queue>/<id>`; each HCM hands it to its exchanges
(hcm/commands.py), each exchange applies it once (exchange/admin.py `AdminCommands.apply`) and its
HCM records the result as `<id>/<xid>`. A keyed request's command id is `k-<key>`, so a retry writes
nothing. Checked against the exchanges' latest statistics before writing, and again by each
exchange; the newest MAX_COMMANDS per queue are kept, none older than COMMAND_TTL. The whole
design: docs/leader.md "Admin commands".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from kazoo.client import KazooClient, TransactionRequest

from gcm.cache import ClusterCache
from gcm.fence import LeaderFence, current_request
from roq.errors import (
    CommandNotFoundError,
    GroupNotFoundError,
    PreconditionFailedError,
    QueueNotFoundError,
    UserError,
)
from roq.names import check_group_name, check_queue_name
from roq.paths import Paths
from roq.protocol import is_command_id
from roq.records import ExchangeStats, GroupStats
from roq.state import read_exchanges, read_live
from roq.zk import children, encode

log = logging.getLogger(__name__)

MAX_COMMANDS = 32  # per queue: the newest are kept
COMMAND_TTL = 3600.0  # s: an older command is dropped with the next one (an exchange down longer never applies it)
GROUP_OPS = ("group.reset", "group.delete")
HIDDEN_RESULT_KEYS = ("publishers",)  # a purge's per-publisher marks: for the exchanges, not for the answer


def command_paths(client: KazooClient, paths: Paths, queue: str) -> list[str]:
    """Every znode of the queue's commands, deepest first (what deleting them takes), read from ZooKeeper."""
    found = []
    for command_id in children(client, paths.commands(queue)):
        found += [paths.command_report(queue, command_id, xid) for xid in children(client, paths.command(queue,
                                                                                                         command_id))]
        found.append(paths.command(queue, command_id))
    if client.retry(client.exists, paths.commands(queue)):
        found.append(paths.commands(queue))
    return found


class CommandLog:
    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence, write_lock: threading.Lock,
                 cache: ClusterCache) -> None:
        self.client = client
        self.paths = paths
        self.fence = fence
        self.write_lock = write_lock
        self.cache = cache

    def issue(self, op: str, name: Any, group: Any = None) -> dict[str, Any]:
        """Write command `op` for queue `name` (and `group`), checked first; its status."""
        name = check_queue_name(name)
        group = check_group_name(group) if op in GROUP_OPS else None
        request = current_request()
        command_id = f"k-{request.key}" if request is not None and request.key else f"c-{uuid.uuid4().hex[:16]}"
        with self.write_lock:
            if self.fence.already_applied():
                return self.status(name, command_id)
            if not self.client.retry(self.client.exists, self.paths.queue(name)):
                raise QueueNotFoundError(f"queue {name!r} does not exist")
            exchanges = read_exchanges(self.client, self.paths, name, live=False)
            if group is not None:
                self._check_group(op, name, group)
            now = time.time()
            data = {"id": command_id, "op": op, "queue": name, "group": group, "at": now,
                    "exchanges": [x.id for x in exchanges]}
            doomed = self._expired(name, now)
            self.fence.ensure_path(self.paths.commands(name))

            def build(txn: TransactionRequest) -> None:
                for path in doomed:
                    txn.delete(path)
                txn.create(self.paths.command(name, command_id), encode(data))
                txn.set_data(self.paths.commands(name), encode({"latest": command_id, "at": now}))

            self.fence.write(build)
        log.info("admin command %s: %s of queue %s%s, to exchanges %s", command_id, op, name,
                 f" group {group}" if group else "", ", ".join(data["exchanges"]) or "none")
        return self.status(name, command_id)

    def status(self, name: Any, command_id: Any) -> dict[str, Any]:
        """A command and what each exchange reported: `results` by exchange, `pending` those that have
        not reported, `waiting` those of them that run now (it is done when none is waiting)."""
        name = check_queue_name(name)
        if not is_command_id(command_id):
            raise UserError(f"invalid command id {command_id!r}")
        data = self.cache.read_json(self.paths.command(name, command_id))
        if data is None:
            if self.cache.read_json(self.paths.queue(name)) is None:
                raise QueueNotFoundError(f"queue {name!r} does not exist")
            raise CommandNotFoundError(f"queue {name!r} has no command {command_id!r} (commands are kept for "
                                       f"{COMMAND_TTL / 3600:.0f} h, the newest {MAX_COMMANDS})")
        results = {}
        for xid in self.cache.children(self.paths.command(name, command_id)):
            result = self.cache.read_json(self.paths.command_report(name, command_id, xid)) or {}
            results[xid] = {k: v for k, v in result.items() if k not in HIDDEN_RESULT_KEYS}
        exchanges = [x for x in data.get("exchanges") or () if isinstance(x, str)]
        pending = [x for x in exchanges if x not in results]
        live = read_live(self.cache, self.paths, name)
        waiting = [x for x in pending if x in live]
        return {"id": command_id, "op": data.get("op"), "queue": name, "group": data.get("group"), "at": data.get("at"),
                "exchanges": exchanges, "results": results, "pending": pending, "waiting": waiting,
                "done": not waiting}

    def _check_group(self, op: str, name: str, group: str) -> None:
        """The group runs on a running exchange; one to delete has no member. From the latest statistics."""
        found = [g for g in self._groups(name) if group in g]
        if not found:
            raise GroupNotFoundError(f"queue {name!r} has no group {group!r} on its running exchanges")
        members = max(g[group].members for g in found)
        if op == "group.delete" and members:
            raise PreconditionFailedError(f"group {group!r} of queue {name!r} has {members} members connected: stop "
                                          "them first (they would join again at once and make it anew)")

    def _groups(self, name: str) -> list[dict[str, GroupStats]]:
        live = read_live(self.cache, self.paths, name)
        return [ExchangeStats.from_dict(data.get("stats")).groups for data in live.values()]

    def _expired(self, name: str, now: float) -> list[str]:
        """Znodes of the queue's commands to drop with the next one: older than COMMAND_TTL, or beyond
        the newest MAX_COMMANDS - 1; deepest first."""
        dated = []
        for command_id in children(self.client, self.paths.commands(name)):
            data = self.cache.read_json(self.paths.command(name, command_id)) or {}
            dated.append((float(data.get("at") or 0.0), command_id))
        dated.sort()
        doomed = [cid for i, (at, cid) in enumerate(dated) if now - at > COMMAND_TTL or i < len(dated) -
                  (MAX_COMMANDS - 1)]
        paths: list[str] = []
        for command_id in doomed:
            paths += [self.paths.command_report(name, command_id, xid)
                      for xid in children(self.client, self.paths.command(name, command_id))]
            paths.append(self.paths.command(name, command_id))
        return paths
