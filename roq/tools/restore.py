"""`roq restore FILE`: a backup (roq/tools/backup.py, docs/backup.md) back into a cluster, through
the leader's `restore` request (docs/protocol.md section 2): no ZooKeeper session.

The file is checked whole first (`load()`), then the leader is asked for a dry run (`plan()`: it
checks the document again and refuses a cluster with a queue or a permission entry without
`force`, changing nothing). Only then does anything change: the public keys missing from the keys
directory are written (`restore_keys()`: a key that is there already is never overwritten, a
different one is reported), and the leader grants the permission entries and creates the queues
(`apply()`), one budgeted request after another until none remains. With `force`, a queue or an
entry that exists is kept as it is and what differs from the backup is reported: a restore never
deletes, revokes or scales anything, and can be run again to finish one that stopped half-way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import zmq.auth

from roq.client.admin import Admin
from roq.errors import UserError
from roq.tools.backup import SERVER_KEY, Backup, PublicKeys, plural, write_new

Echo = Callable[[str], None]

KEY_BANNER = """#   ****  Restored by roq restore on {when}  ****
#   ZeroMQ CURVE Public Certificate
#   Exchange securely, or use a secure mechanism to verify the contents
#   of this file after exchange. Store public certificates in your home
#   directory, in the .curve subdirectory.

"""


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


def plan(admin: Admin, backup: Backup, force: bool) -> dict[str, Any]:
    """The leader's dry run: what a restore will keep (`kept`, `kept_entries`) and how much it will
    do (`remaining`); refused (nothing changed) on a cluster with queues or entries without `force`."""
    return admin.call("restore", document=backup.to_json(), force=force, dry_run=True)


def apply(admin: Admin, backup: Backup, echo: Echo) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Have the leader grant and create what is missing, one request at a time until nothing
    remains (`force`: the dry run has refused a cluster that was not empty). (granted, created)."""
    granted: list[dict[str, Any]] = []
    created: list[dict[str, Any]] = []
    while True:
        step = admin.call("restore", document=backup.to_json(), force=True)
        for entry in step["granted"]:
            echo(f"granted key {entry['key']}: {entry['rights']}")
        for queue in step["created"]:
            echo(f"created queue {queue['name']}: {plural(queue['exchanges'], 'exchange')} ({queue['placed']} "
                 f"placed), replicas {queue['replicas']}, rules {queue['rules']}, storage {queue['storage']}")
        granted += step["granted"]
        created += step["created"]
        if not step["remaining"]:
            return granted, created
        if not step["granted"] and not step["created"]:
            # a leader does at least one change per request: one that did none is not making progress
            raise UserError(f"the leader restored nothing in one request ({step['remaining']} to go); "
                            "run it again with --force for the rest")


def report_kept(todo: dict[str, Any], echo: Echo) -> None:
    """What the dry run found already there, in words."""
    for entry in todo["kept_entries"]:
        diff = entry["difference"]
        echo(f"kept the permissions of key {entry['key']} as they are" + (f": {diff}" if diff else
                                                                         " (same as the backup)"))
    for queue in todo["kept"]:
        diffs = queue["differences"]
        echo(f"kept queue {queue['name']} as it is" + (f": {'; '.join(diffs)}" if diffs else " (same as the backup)"))

