"""The leader's side of `roq backup` and `roq restore`: the `backup.export` and `restore` requests
(docs/protocol.md section 2, docs/backup.md).

`export()` reads the cluster from ZooKeeper and answers the backup document (gcm/backup_document.py)
with no public keys: those are files on the operator's machine, which `roq backup` adds.

`restore()` checks the whole document first (`parse()`), then plans: a cluster with any queue or
permission entry is refused without `force` (UserError, nothing changed); with it, what exists is
kept as it is and only reported. Then it grants the missing permission entries (before the queues,
so their exchanges start with them) and creates the missing queues with their rules, through the
same fenced handlers as `keys.grant`, `queue.create` and `queue.rules`. The control loop serves one
request at a time, so one request works at most RESTORE_BUDGET and answers what is `remaining`;
the client sends the same document again with `force` until none is. A restore never deletes,
revokes or scales anything, so sending it again is safe.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from kazoo.client import KazooClient

from gcm.api import REQUEST_DEADLINE
from gcm.autoscaler import DEFAULT_RULES, Autoscaler
from gcm.backup_document import Backup, PublicKeys, QueueBackup, entries_text, parse, plural
from gcm.fence import RequestContext, current_request, serving
from gcm.permissions import PermissionManager
from gcm.queues import QueueManager, check_flag
from roq import __version__
from roq.errors import RoqError, UserError, error_from_code
from roq.paths import Paths
from roq.permissions import RIGHTS, PermissionTable, describe
from roq.state import queue_names, read_exchanges, read_queue, replica_count
from roq.storage_policy import policy_of

log = logging.getLogger(__name__)

# How long one `restore` request may work (from its arrival) before answering what remains: the
# control loop serves nothing else meanwhile, and the client's attempt lasts client.attempt_timeout.
RESTORE_BUDGET = 1.0


def read_permissions(client: KazooClient, paths: Paths) -> PermissionTable:
    """The permission table in ZooKeeper now (no znode: no entries)."""
    found = client.retry(client.exists, paths.permissions)
    raw = client.retry(client.get, paths.permissions)[0] if found else None
    try:
        return PermissionTable.from_znode(raw)
    except UserError as exc:
        raise UserError(f"the permission table at {paths.permissions} cannot be backed up: {exc}") from None


def rules_text(rules: dict[str, Any] | None) -> str:
    if not rules:
        return "none"
    return ", ".join(f"{k}={v}" for k, v in sorted(rules.items()) if DEFAULT_RULES.get(k) != v) or "the defaults"


def differences(settings: dict[str, Any], exchanges: int, queue: QueueBackup) -> list[str]:
    """How a queue that exists differs from its backup, in words."""
    found = []
    if exchanges != queue.exchanges:
        found.append(f"{plural(exchanges, 'exchange')} (backup: {queue.exchanges})")
    if replica_count(settings) != queue.replicas:
        found.append(f"replicas {replica_count(settings)} (backup: {queue.replicas})")
    now, then = settings.get("rules") or None, queue.rules
    if (now and dict(DEFAULT_RULES, **now)) != (then and dict(DEFAULT_RULES, **then)):
        found.append(f"rules {rules_text(now)} (backup: {rules_text(then)})")
    if policy_of(settings) != queue.policy:
        found.append(f"storage {policy_of(settings).describe()} (backup: {queue.policy.describe()})")
    return found


@contextmanager
def own_write(op: str, subject: str) -> Iterator[None]:
    """One change of a restore, fenced on its own: a fresh deadline and no request key (a restore
    is made safe to send again by keeping what exists, not by a key)."""
    with serving(RequestContext(time.monotonic() + REQUEST_DEADLINE, op, None, subject)):
        yield


class BackupService:
    def __init__(self, client: KazooClient, paths: Paths, zk_hosts: str, queues: QueueManager,
                 autoscaler: Autoscaler, permissions: PermissionManager) -> None:
        self.client = client
        self.paths = paths
        self.zk_hosts = zk_hosts
        self.queues = queues
        self.autoscaler = autoscaler
        self.permissions = permissions

    # ------------------------------------------------------------ backup.export

    def export(self) -> dict[str, Any]:
        """The backup document of the cluster now, without public keys; checked as a restore will."""
        queues = []
        for name in queue_names(self.client, self.paths):
            info = read_queue(self.client, self.paths, name)
            if info is None:  # deleted since the listing
                continue
            settings = dict(info.settings)
            queues.append(QueueBackup(name, len(read_exchanges(self.client, self.paths, name, live=False)),
                                      replica_count(settings), settings.get("rules") or None, settings))
        now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        backup = Backup(now, __version__, self.paths.root, self.zk_hosts, queues, PublicKeys(),
                        read_permissions(self.client, self.paths))
        document = backup.to_json()
        # What we answer must restore: the same checks as a restore, on the document itself.
        parse(json.loads(json.dumps(document)), "the backup being made")
        return document

    # ------------------------------------------------------------ restore

    def restore(self, document: Any, force: Any = False, dry_run: Any = False) -> dict[str, Any]:
        """Check `document`, plan, and (unless `dry_run`) apply what the budget allows; the plan and
        what this request did."""
        force, dry_run = check_flag("force", force), check_flag("dry_run", dry_run)
        backup = parse(document, "the restore document")
        request = current_request()
        until = (request.deadline - REQUEST_DEADLINE if request else time.monotonic()) + RESTORE_BUDGET
        answer = self._plan(backup, force)
        grant, create = answer.pop("grant"), answer.pop("create")
        answer.update(created=[], granted=[])

        def spent() -> bool:  # at least one change per request, so a restore always progresses
            return time.monotonic() > until and bool(answer["granted"] or answer["created"])
        if not dry_run:
            self._grant(grant, answer["granted"], spent)
            if len(answer["granted"]) == len(grant.entries):
                self._create(create, answer["created"], spent)
        answer["remaining"] = len(grant.entries) + len(create) - len(answer["granted"]) - len(answer["created"])
        return answer

    def _plan(self, backup: Backup, force: bool) -> dict[str, Any]:
        existing = queue_names(self.client, self.paths)
        entries = read_permissions(self.client, self.paths).entries
        if (existing or entries) and not force:
            shown = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
            raise UserError(f"the cluster under {self.paths.root} is not empty ({len(existing)} queues: "
                            f"{shown or 'none'}; {entries_text(len(entries))}); nothing was restored (force "
                            "creates only the missing queues and permission entries and keeps the others)")
        grant, kept_entries = PermissionTable(), []
        for name, entry in backup.permissions.entries.items():
            if name in entries:
                now = entries[name]
                kept_entries.append({"key": name, "difference": "" if now == entry else
                                     f"{describe(now, 'all')} (backup: {describe(entry, 'all')})"})
            else:
                grant = grant.with_entry(name, entry)
        create, kept = [], []
        for queue in backup.queues:
            info = read_queue(self.client, self.paths, queue.name) if queue.name in existing else None
            if info is not None:
                kept.append({"name": queue.name,
                             "differences": differences(info.settings, len(info.exchanges), queue)})
            else:
                create.append(queue)
        return {"root": self.paths.root, "grant": grant, "create": create, "kept": kept,
                "kept_entries": kept_entries}

    def _grant(self, grant: PermissionTable, granted: list[dict[str, Any]], spent: Callable[[], bool]) -> None:
        for name, entry in grant.entries.items():
            if spent():
                return
            rights: dict[str, Any] = {r: list(getattr(entry, r)) for r in RIGHTS if getattr(entry, r)}
            if entry.admin:
                rights["admin"] = True
            self._step(lambda: self.permissions.grant(name, **rights), "keys.grant", name,
                       f"restore stopped at the permissions of key {name} ({len(granted)} granted by this "
                       "request, no queue created)")
            granted.append({"key": name, "rights": describe(entry, "all")})

    def _create(self, create: list[QueueBackup], created: list[dict[str, Any]], spent: Callable[[], bool]) -> None:
        for queue in create:
            if spent():
                return
            # The policy as backed up, never the leader's defaults: a memory-only queue stays one.
            info = self._step(lambda: self.queues.create(queue.name, queue.exchanges, queue.replicas,
                                                         retention=queue.policy.retention,
                                                         retention_bytes=queue.policy.retention_bytes),
                              "queue.create", queue.name,
                              f"restore stopped at queue {queue.name} ({len(created)} created by this request)")
            if queue.rules:
                self._step(lambda: self.autoscaler.set_rules(queue.name, queue.rules, clear=True), "queue.rules",
                           queue.name, f"restore stopped after creating queue {queue.name} without its rules: set "
                           f"them with `roq queue rules {queue.name}` ({rules_text(queue.rules)})")
            created.append({"name": queue.name, "exchanges": queue.exchanges, "replicas": queue.replicas,
                            "placed": sum(1 for x in info["exchanges"] if x.get("host")),
                            "rules": rules_text(queue.rules), "storage": queue.policy.describe()})
            log.info("restored queue %s", queue.name)

    @staticmethod
    def _step(change: Callable[[], Any], op: str, subject: str, stopped: str) -> Any:
        """Run one change of the restore; a failure says how far it got (nothing after it ran)."""
        try:
            with own_write(op, subject):
                return change()
        except RoqError as exc:
            raise error_from_code(exc.code, f"{stopped}: {exc}; run it again with --force for the rest") from None
