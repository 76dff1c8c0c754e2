"""Backups of a cluster's metadata: `roq backup FILE` and `roq restore FILE` (docs/backup.md).

A backup is one JSON file (FORMAT, VERSION) holding every queue — its name, its number of
exchanges, its replicas, its autoscaling rules and its settings znode as it was — the permission
table (`<root>/permissions`, roq/permissions.py; version 2 on, a version 1 file has none) and the
cluster's public keys: the public halves of `server.key`, `clients/*.key` and `admins/*.key` in the
keys directory. Never a secret key, never a ZooKeeper credential, never a message.

`take()` reads ZooKeeper itself (any reader identity will do, no leader is needed) and checks the
document it made the way a restore will, so a backup that was written can be restored. `write()`
replaces the file atomically (a temporary file in the same directory, fsynced, renamed), mode 0600.

A restore validates the whole file first (`load()`: format, version, every field's type, every
name, every rule with the leader's own checks), then changes the cluster: roq/tools/restore.py.

Tooling, not core: it validates with the leader's checks (gcm.queues, gcm.autoscaler), which the
core may not import (the import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import zmq.auth
from kazoo.client import KazooClient

from gcm.autoscaler import check_rules
from gcm.queues import check_exchange_count, check_replica_count
from roq import __version__
from roq.errors import UserError
from roq.names import check_queue_name, check_subscriber_name
from roq.paths import Paths
from roq.permissions import PermissionTable
from roq.state import queue_names, read_exchanges, read_queue, replica_count
from roq.storage_policy import StoragePolicy, check_retention, check_retention_bytes, policy_of

FORMAT = "roq-backup"
VERSION = 2  # 2: the permission table; version 1 files (without it) are still read
FIELDS = ("format", "version", "created_at", "roq_version", "cluster", "queues", "keys", "permissions")
FIELDS_BY_VERSION = {1: FIELDS[:-1], 2: FIELDS}
QUEUE_FIELDS = ("name", "exchanges", "replicas", "rules", "settings")
KEY_KINDS = ("clients", "admins")
SERVER_KEY = "server.key"
# Settings a restore does not carry over: the leader writes them itself when it creates the queue.
BOOKKEEPING = ("created", "next_exchange")
Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")

Echo = Callable[[str], None]



@dataclass(frozen=True)
class QueueBackup:
    name: str
    exchanges: int
    replicas: int
    rules: dict[str, Any] | None  # None: the queue has no rules (a fixed size)
    settings: dict[str, Any]  # its znode's data as it was, rules, replicas and storage policy included

    @property
    def policy(self) -> StoragePolicy:
        """Its storage policy (none in the settings: memory only, as a queue made before policies)."""
        return policy_of(self.settings)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "exchanges": self.exchanges, "replicas": self.replicas, "rules": self.rules,
                "settings": self.settings}


@dataclass(frozen=True)
class PublicKeys:
    server: str | None = None  # z85
    clients: dict[str, str] = field(default_factory=dict)  # name → z85 public key
    admins: dict[str, str] = field(default_factory=dict)

    def files(self) -> Iterator[tuple[str, str]]:
        """(path relative to the keys directory, z85 public key) of every key."""
        if self.server:
            yield SERVER_KEY, self.server
        for kind in KEY_KINDS:
            for name, key in sorted(getattr(self, kind).items()):
                yield f"{kind}/{name}.key", key

    def to_json(self) -> dict[str, Any]:
        return {"server": self.server, "clients": dict(sorted(self.clients.items())),
                "admins": dict(sorted(self.admins.items()))}


@dataclass(frozen=True)
class Backup:
    created_at: str
    roq_version: str
    root: str
    zk_hosts: str
    queues: list[QueueBackup]
    keys: PublicKeys
    permissions: PermissionTable = field(default_factory=PermissionTable)  # entries only: the default is configuration

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "created_at": self.created_at,
                "roq_version": self.roq_version, "cluster": {"root": self.root, "zk_hosts": self.zk_hosts},
                "queues": [q.to_json() for q in self.queues], "keys": self.keys.to_json(),
                "permissions": self.permissions.to_json()}

    def describe(self) -> str:
        keys = sum(1 for _ in self.keys.files())
        return (f"backup of {self.root} taken {self.created_at} (roq {self.roq_version}): "
                f"{plural(len(self.queues), 'queue')}, {entries_text(len(self.permissions.entries))}, "
                f"{plural(keys, 'public key')}")


# ---------------------------------------------------------------- backup


def take(client: KazooClient, paths: Paths, zk_hosts: str, keys_dir: str | None,
         warn: Echo = lambda _: None) -> Backup:
    """What the cluster under `paths.root` holds now, and the public keys of `keys_dir` (None: no keys)."""
    if not client.retry(client.exists, paths.queues):
        raise UserError(f"there is no RoQ cluster under {paths.root} at {zk_hosts} (no {paths.queues}; "
                        "check zk.root and zk.hosts)")
    queues = []
    for name in queue_names(client, paths):
        info = read_queue(client, paths, name)
        if info is None:  # deleted since the listing
            continue
        settings = dict(info.settings)
        queues.append(QueueBackup(name, len(read_exchanges(client, paths, name, live=False)),
                                  replica_count(settings), settings.get("rules") or None, settings))
    backup = Backup(datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
                    __version__, paths.root, zk_hosts, queues, read_public_keys(keys_dir, warn),
                    read_permissions(client, paths))
    # What we write must restore: the same checks as `load`, on the document itself.
    parse(json.loads(json.dumps(backup.to_json())), "the backup being written")
    return backup


def read_permissions(client: KazooClient, paths: Paths) -> PermissionTable:
    """The permission table in ZooKeeper now (no znode: no entries); a table that does not parse is
    a UserError: a backup that could not be restored must not be written."""
    found = client.retry(client.exists, paths.permissions)
    raw = client.retry(client.get, paths.permissions)[0] if found else None
    try:
        return PermissionTable.from_znode(raw)
    except UserError as exc:
        raise UserError(f"the permission table at {paths.permissions} cannot be backed up: {exc}") from None


def read_public_keys(keys_dir: str | None, warn: Echo = lambda _: None) -> PublicKeys:
    """The public halves only: `load_certificate`'s secret, should a `.key` file hold one, is dropped."""
    if not keys_dir:
        return PublicKeys()
    root = Path(keys_dir)
    if not root.is_dir():
        raise UserError(f"keys directory {root} is not a directory (security.keys_dir or --keys-dir)")
    server = None
    for candidate in (root / SERVER_KEY, root / "server.key_secret"):  # a daemon's dir may hold only the pair
        if candidate.exists():
            server = _public_of(candidate, warn)
            break
    found: dict[str, dict[str, str]] = {kind: {} for kind in KEY_KINDS}
    for kind in KEY_KINDS:
        folder = root / kind
        for cert in sorted(folder.glob("*.key")) if folder.is_dir() else []:
            try:
                name = check_subscriber_name(cert.stem)
            except UserError:
                warn(f"skipped {kind}/{cert.name}: its name cannot be restored (letters, digits, '_', '.', '-')")
                continue
            key = _public_of(cert, warn)
            if key is not None:
                found[kind][name] = key
    return PublicKeys(server, found["clients"], found["admins"])


def _public_of(cert: Path, warn: Echo) -> str | None:
    try:
        public, _secret = zmq.auth.load_certificate(str(cert))
    except (OSError, ValueError) as exc:
        warn(f"skipped unreadable certificate {cert}: {exc}")
        return None
    key = public.decode("ascii", errors="replace")
    if not is_z85_key(key):
        warn(f"skipped certificate {cert}: its public key is not a 40-character Z85 key")
        return None
    return key


def write(path: str | os.PathLike[str], backup: Backup) -> Path:
    """Replace `path` atomically with the backup, mode 0600 whatever the umask."""
    target = Path(path)
    data = (json.dumps(backup.to_json(), indent=2) + "\n").encode()
    try:
        write_new(target, data, 0o600, replace=True)
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


def write_new(target: Path, data: bytes, mode: int, replace: bool) -> bool:
    """Write `data` to a temporary file beside `target`, fsync it, then rename it over `target`
    (`replace`) or link it there only if `target` does not exist. False: it existed (not replaced)."""
    directory = target.absolute().parent
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(temp, target)
        else:
            try:
                os.link(temp, target)
            except FileExistsError:
                return False
            finally:
                os.unlink(temp)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


# ---------------------------------------------------------------- validation


def load(path: str | os.PathLike[str]) -> Backup:
    """The backup in `path`, checked whole; a UserError naming the file and the first fault."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not a RoQ backup: not valid JSON ({exc})") from None
    return parse(document, str(path))


def parse(document: Any, where: str) -> Backup:
    def bad(what: str) -> UserError:
        return UserError(f"{where}: {what}")

    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise bad(f"not a RoQ backup (no \"format\": \"{FORMAT}\")")
    version = document.get("version")
    if version not in FIELDS_BY_VERSION or isinstance(version, bool):
        newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
        raise bad(f"backup format version {version!r} "
                  + ("is newer than this roq reads" if newer else "is not one this roq reads")
                  + f" (it reads versions 1 to {VERSION})")
    _exact_fields(document, FIELDS_BY_VERSION[version], "the file", bad)
    created_at = _text(document["created_at"], "created_at", bad)
    try:
        datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except ValueError:
        raise bad(f"created_at {created_at!r} is not an ISO 8601 time") from None
    roq_version = _text(document["roq_version"], "roq_version", bad)
    cluster = document["cluster"]
    if not isinstance(cluster, dict):
        raise bad("cluster must be an object")
    _exact_fields(cluster, ("root", "zk_hosts"), "cluster", bad)
    root = _text(cluster["root"], "cluster.root", bad)
    if not root.startswith("/"):
        raise bad(f"cluster.root {root!r} is not a ZooKeeper path")
    zk_hosts = _text(cluster["zk_hosts"], "cluster.zk_hosts", bad)
    if not isinstance(document["queues"], list):
        raise bad("queues must be a list")
    queues: list[QueueBackup] = []
    seen: set[str] = set()
    for index, entry in enumerate(document["queues"]):
        queue = _queue(entry, f"queues[{index}]", bad)
        if queue.name in seen:
            raise bad(f"queue {queue.name!r} appears twice")
        seen.add(queue.name)
        queues.append(queue)
    permissions = PermissionTable()
    if "permissions" in document:
        try:
            permissions = PermissionTable.from_json(document["permissions"])
        except UserError as exc:
            raise bad(f"permissions: {exc}") from None
    return Backup(created_at, roq_version, root, zk_hosts, queues, _keys(document["keys"], bad), permissions)


def _queue(entry: Any, at: str, bad: Callable[[str], UserError]) -> QueueBackup:
    if not isinstance(entry, dict):
        raise bad(f"{at} must be an object")
    _exact_fields(entry, QUEUE_FIELDS, at, bad)
    try:
        name = check_queue_name(entry["name"])
    except UserError as exc:
        raise bad(f"{at}: {exc}") from None
    at = f"queue {name!r}"
    try:
        exchanges = check_exchange_count(entry["exchanges"])
        replicas = check_replica_count(entry["replicas"])
    except UserError as exc:
        raise bad(f"{at}: {exc}") from None
    rules = entry["rules"]
    if rules is not None:
        if not isinstance(rules, dict) or not rules:
            raise bad(f"{at}: rules must be null or a non-empty map of rule name to value")
        try:
            check_rules({}, rules)
        except UserError as exc:
            raise bad(f"{at}: {exc}") from None
    settings = entry["settings"]
    if not isinstance(settings, dict):
        raise bad(f"{at}: settings must be an object")
    # The settings as they were must say what the fields say: a hand edit of one of the two is caught.
    if replica_count(settings) != replicas:
        raise bad(f"{at}: replicas {replicas} disagrees with its settings ({settings.get('replicas')!r})")
    if (settings.get("rules") or None) != rules:
        raise bad(f"{at}: rules disagree with the rules in its settings")
    try:
        check_retention(settings.get("retention", 0))
        check_retention_bytes(settings.get("retention_bytes", 0))
    except UserError as exc:
        raise bad(f"{at}: settings: {exc}") from None
    return QueueBackup(name, exchanges, replicas, rules, settings)


def _keys(keys: Any, bad: Callable[[str], UserError]) -> PublicKeys:
    if not isinstance(keys, dict):
        raise bad("keys must be an object")
    _exact_fields(keys, ("server", *KEY_KINDS), "keys", bad)
    server = keys["server"]
    if server is not None and not is_z85_key(server):
        raise bad("keys.server must be null or a 40-character Z85 public key")
    found: dict[str, dict[str, str]] = {}
    for kind in KEY_KINDS:
        entries = keys[kind]
        if not isinstance(entries, dict):
            raise bad(f"keys.{kind} must be a map of name to public key")
        for name, key in entries.items():
            try:
                check_subscriber_name(name)
            except UserError as exc:
                raise bad(f"keys.{kind}: {exc}") from None
            if not is_z85_key(key):
                raise bad(f"keys.{kind}.{name} must be a 40-character Z85 public key")
        found[kind] = dict(entries)
    both = sorted(set(found["clients"]) & set(found["admins"]))
    if both:
        raise bad(f"keys name {', '.join(both)} both as a client and as an admin")
    return PublicKeys(server, found["clients"], found["admins"])


def _exact_fields(obj: dict[str, Any], expected: tuple[str, ...], at: str, bad: Callable[[str], UserError]) -> None:
    missing = [f for f in expected if f not in obj]
    if missing:
        raise bad(f"{at} lacks {', '.join(missing)}")
    unknown = sorted(str(f) for f in obj if f not in expected)
    if unknown:
        raise bad(f"{at} has unknown fields {', '.join(repr(f) for f in unknown)}")


def _text(value: Any, what: str, bad: Callable[[str], UserError]) -> str:
    if not isinstance(value, str) or not value or "\n" in value:
        raise bad(f"{what} must be a one-line string")
    return value


def plural(count: int, word: str, many: str = "") -> str:
    return f"{count} {word if count == 1 else many or word + 's'}"


def entries_text(count: int) -> str:
    return plural(count, "permission entry", "permission entries")


def is_z85_key(value: Any) -> bool:
    """A CURVE public key as pyzmq's certificates spell it: 40 Z85 characters (32 bytes)."""
    return isinstance(value, str) and len(value) == 40 and set(value) <= Z85
