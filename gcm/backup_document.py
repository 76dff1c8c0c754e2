"""The backup document (docs/backup.md): its model and its checks, shared by the leader, which
makes one (`backup.export`) and applies one (`restore`, gcm/backups.py), and by `roq backup` /
`roq restore`, which write and read it as a file (roq/tools/backup.py).

A backup is one JSON object (FORMAT, VERSION) holding every queue — its name, its number of
exchanges, its replicas, its autoscaling rules and its settings znode as it was — the permission
table (version 2 on, a version 1 document has none) and the cluster's public keys. Never a secret
key, never a ZooKeeper credential, never a message.

`parse()` checks a whole document (format, version, every field's type, every name, every rule with
the leader's own checks, and the sizes below) before anything uses it: a bad one is a UserError
naming the first fault, and nothing has changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gcm.autoscaler import check_rules
from gcm.queues import check_exchange_count, check_replica_count
from roq.errors import UserError
from roq.names import check_queue_name, check_subscriber_name
from roq.permissions import PermissionTable
from roq.state import replica_count
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

# Limits on a document, so a hostile one costs the leader little: it is checked whole before use.
MAX_DOCUMENT_BYTES = 1 << 20  # a backup file, or a restore request's document, at most (below the API's 2 MiB frames)
MAX_QUEUES = 10_000  # queues in one document (gcm.max_queues is far below)
MAX_KEYS = 10_000  # public keys, and permission entries, in one document
MAX_SETTINGS = 64  # fields of one queue's settings




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



# ---------------------------------------------------------------- validation


def parse(document: Any, where: str) -> Backup:
    def bad(what: str) -> UserError:
        return UserError(f"{where}: {what}")

    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise bad(f"not a RoQ backup (no \"format\": \"{FORMAT}\")")
    version = document.get("version")
    # int first: a list or map is unhashable, and `in` would raise TypeError, not refuse it
    if isinstance(version, bool) or not isinstance(version, int) or version not in FIELDS_BY_VERSION:
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
    if len(document["queues"]) > MAX_QUEUES:
        raise bad(f"{len(document['queues'])} queues: a backup holds at most {MAX_QUEUES}")
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
        entries = document["permissions"].get("keys") if isinstance(document["permissions"], dict) else None
        if isinstance(entries, dict) and len(entries) > MAX_KEYS:
            raise bad(f"permissions: {len(entries)} entries: a backup holds at most {MAX_KEYS}")
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
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise bad(f"{at}: settings must be an object")
    if len(settings) > MAX_SETTINGS:
        raise bad(f"{at}: settings hold {len(settings)} fields, at most {MAX_SETTINGS}")
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
        if len(entries) > MAX_KEYS:
            raise bad(f"keys.{kind}: {len(entries)} keys, at most {MAX_KEYS}")
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
