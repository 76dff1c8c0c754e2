"""`roq restore FILE`: a backup (roq/tools/backup.py, docs/backup.md) back into a cluster.

A restore validates the whole file first (`load()` in roq/tools/backup.py: format, version, every
field's type, every name, every rule with the leader's own checks) and looks at the cluster (`plan()`: a cluster with
a queue is refused without `force`); only then does it change anything. It writes the public keys
missing from the keys directory (`restore_keys()`: a key that is there already is never
overwritten, a different one is reported), then grants the permission entries
(`restore_permissions()`, before the queues, so their exchanges start with them) and creates the
queues (`restore_queues()`), both through the leader's control API: the leader places the exchanges
anew, and fencing and request keys apply as for `roq keys grant` and `roq queue create`. With
`force`, a queue or a key entry that exists is kept as it is (a queue's exchanges, replicas and rules
untouched) and what differs from the backup is reported: a restore never deletes, revokes or scales
anything, and can be run again to finish one that stopped half-way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import zmq.auth
from kazoo.client import KazooClient

from gcm.autoscaler import DEFAULT_RULES
from roq.client.admin import Admin
from roq.errors import RoqError, UserError, error_from_code
from roq.paths import Paths
from roq.permissions import PermissionTable, describe
from roq.state import queue_names, read_queue, replica_count
from roq.storage_policy import policy_of
from roq.tools.backup import (
    SERVER_KEY,
    Backup,
    Echo,
    PublicKeys,
    QueueBackup,
    entries_text,
    plural,
    read_permissions,
    write_new,
)

KEY_BANNER = """#   ****  Restored by roq restore on {when}  ****
#   ZeroMQ CURVE Public Certificate
#   Exchange securely, or use a secure mechanism to verify the contents
#   of this file after exchange. Store public certificates in your home
#   directory, in the .curve subdirectory.

"""


@dataclass
class Plan:
    create: list[QueueBackup]
    keep: list[tuple[QueueBackup, list[str]]]  # queues that exist already, and how they differ
    grant: PermissionTable = field(default_factory=PermissionTable)  # entries the cluster lacks
    kept_entries: list[tuple[str, str]] = field(default_factory=list)  # (key, how it differs; "" if not)


def plan(client: KazooClient, paths: Paths, backup: Backup, force: bool) -> Plan:
    """What a restore will do; refuses (UserError, nothing changed) a cluster with queues or permission
    entries without `force`."""
    existing = queue_names(client, paths)
    entries = read_permissions(client, paths).entries
    if (existing or entries) and not force:
        shown = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
        raise UserError(f"the cluster under {paths.root} is not empty ({len(existing)} queues: {shown or 'none'}; "
                        f"{entries_text(len(entries))}); nothing was restored (--force creates only "
                        "the missing queues and permission entries and keeps the others)")
    result = Plan([], [])
    for name, entry in backup.permissions.entries.items():
        if name in entries:
            now = entries[name]
            result.kept_entries.append((name, "" if now == entry else f"{describe(now, 'all')} (backup: "
                                        f"{describe(entry, 'all')})"))
        else:
            result.grant = result.grant.with_entry(name, entry)
    for queue in backup.queues:
        if queue.name in existing:
            info = read_queue(client, paths, queue.name)
            if info is not None:
                result.keep.append((queue, differences(info.settings, len(info.exchanges), queue)))
                continue
        result.create.append(queue)
    return result


def differences(settings: dict[str, Any], exchanges: int, queue: QueueBackup) -> list[str]:
    """How a queue that exists differs from its backup, in words."""
    found = []
    if exchanges != queue.exchanges:
        found.append(f"{plural(exchanges, 'exchange')} (backup: {queue.exchanges})")
    if replica_count(settings) != queue.replicas:
        found.append(f"replicas {replica_count(settings)} (backup: {queue.replicas})")
    now, then = settings.get("rules") or None, queue.rules
    if (now and dict(DEFAULT_RULES, **now)) != (then and dict(DEFAULT_RULES, **then)):
        found.append(f"rules {_rules_text(now)} (backup: {_rules_text(then)})")
    if policy_of(settings) != queue.policy:
        found.append(f"storage {policy_of(settings).describe()} (backup: {queue.policy.describe()})")
    return found


def _rules_text(rules: dict[str, Any] | None) -> str:
    if not rules:
        return "none"
    return ", ".join(f"{k}={v}" for k, v in sorted(rules.items()) if DEFAULT_RULES.get(k) != v) or "the defaults"


@dataclass
class KeysReport:
    written: list[str] = field(default_factory=list)
    same: list[str] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)


def restore_keys(keys_dir: str, keys: PublicKeys) -> KeysReport:
    """Write each public key whose file is missing from `keys_dir` (mode 0644); never overwrite one.

    The server's public key counts as present when only `server.key_secret` is there (a daemon's
    directory), and as different when that pair's public half is not the backup's."""
    root = Path(keys_dir)
    report = KeysReport()
    try:
        for relative, key in keys.files():
            target = root / relative
            present = _present_key(root, relative)
            if present is None:
                target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                body = KEY_BANNER.format(when=datetime.now().isoformat(timespec="seconds"))
                body += f"metadata\ncurve\n    public-key = \"{key}\"\n"
                if write_new(target, body.encode(), 0o644, replace=False):
                    report.written.append(relative)
                    continue
                present = _present_key(root, relative)  # made meanwhile by someone else: compare
            (report.same if present == key else report.differ).append(relative)
    except OSError as exc:
        raise UserError(f"cannot write public keys into {root}: {exc.strerror or exc} "
                        f"(written so far: {', '.join(report.written) or 'none'})") from None
    return report


def _present_key(root: Path, relative: str) -> str | None:
    """The public key the keys directory holds for `relative` now, "" if unreadable, None if none."""
    candidates = [root / relative]
    if relative == SERVER_KEY:
        candidates.append(root / "server.key_secret")
    for path in candidates:
        if path.exists():
            try:
                return zmq.auth.load_certificate(str(path))[0].decode("ascii", errors="replace")
            except (OSError, ValueError):
                return ""
    return None


def restore_permissions(admin: Admin, todo: Plan, echo: Echo) -> int:
    """Grant each planned permission entry whole through the leader; returns how many. A failure
    stops the restore saying how far it got (run it again with --force for the rest)."""
    for name, diff in todo.kept_entries:
        echo(f"kept the permissions of key {name} as they are" + (f": {diff}" if diff else " (same as the backup)"))
    granted = 0
    for name, entry in todo.grant.entries.items():
        try:
            admin.grant(name, entry.publish, entry.subscribe, entry.consume, entry.admin)
        except RoqError as exc:
            raise error_from_code(exc.code, f"restore stopped at the permissions of key {name}, {granted} of "
                                  f"{len(todo.grant.entries)} entries granted and no queue created: {exc}; run it "
                                  "again with --force to restore the rest") from None
        granted += 1
        echo(f"granted key {name}: {describe(entry, 'all')}")
    return granted


def restore_queues(admin: Admin, todo: Plan, echo: Echo) -> int:
    """Create the planned queues through the leader, one by one, each with its rules; returns how many.

    A failure stops the restore with the same kind of error, saying how far it got: run it again
    with --force to create the rest (the ones made are kept)."""
    for queue, diffs in todo.keep:
        echo(f"kept queue {queue.name} as it is" + (f": {'; '.join(diffs)}" if diffs else " (same as the backup)"))
    created = 0
    for queue in todo.create:
        try:
            # The policy as backed up, never the leader's defaults: a memory-only queue stays one.
            info = admin.create_queue(queue.name, queue.exchanges, queue.replicas,
                                      retention=queue.policy.retention, retention_bytes=queue.policy.retention_bytes)
        except RoqError as exc:
            raise error_from_code(exc.code, f"restore stopped at queue {queue.name}, {created} of "
                                  f"{len(todo.create)} queues created: {exc}; run it again with --force to "
                                  "create the rest") from None
        created += 1
        if queue.rules:
            try:
                admin.queue_rules(queue.name, queue.rules, clear=True)
            except RoqError as exc:
                raise error_from_code(exc.code, f"restore stopped after creating queue {queue.name} without "
                                      f"its rules ({exc}): set them with `roq queue rules {queue.name}` "
                                      f"({_rules_text(queue.rules)}), then run it again with --force") from None
        placed = sum(1 for x in info["exchanges"] if x.get("host"))
        echo(f"created queue {queue.name}: {plural(queue.exchanges, 'exchange')} ({placed} placed), "
             f"replicas {queue.replicas}, "
             f"rules {_rules_text(queue.rules)}, storage {queue.policy.describe()}")
    return created
