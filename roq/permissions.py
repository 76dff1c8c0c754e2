"""Who may do what, per queue: the permission table (docs/security.md "Permissions").

A key is named by its certificate: `clients/<name>.key` and `admins/<name>.key` are keys `<name>`
(names are unique across both directories). The table maps names to entries:

    publish    queue-name patterns: the exchanges' `publishers` socket
    subscribe  patterns: `subscribers` and `replay` (an exchange's and a replica's)
    consume    patterns: `work` (consumer groups)
    admin      the control API's changes, as a key under `admins/` (which is admin whatever its entry)

A pattern is a queue name that may hold `*` (any run of characters, none included) and `?` (one
character): `orders.*`, `*`, `log-??`. Matching is fnmatch's, case-sensitive. A key without an
entry gets `security.default_permissions`: `all` (every right on every queue, what clusters did
before permissions existed) or `none`.

The table lives in ZooKeeper, one znode `<root>/permissions` of JSON (`to_znode`), written only by
the leader (gcm/permissions.py); absent means no entries. Everything that reads it — the znode, an
HCM's line to its exchanges, a backup — goes through `PermissionTable.from_json`, which refuses
(UserError naming the fault) anything that is not a valid table: a reader never acts on half of one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from roq.config import PERMISSION_DEFAULTS
from roq.errors import InvalidNameError, UserError
from roq.names import is_name

RIGHTS = ("publish", "subscribe", "consume")
# The right each server socket ("ZAP domain") of an exchange or replica needs.
SOCKET_RIGHTS = {"publishers": "publish", "subscribers": "subscribe", "replay": "subscribe", "work": "consume"}
FORMAT = 1  # of the znode and the HCM's line
MAX_PATTERNS = 64  # per right and key
MAX_KEYS = 4096  # entries in the table
MAX_TABLE_BYTES = 512 << 10  # the encoded table, well inside ZooKeeper's 1 MiB znode limit
# A queue name's characters plus the two wildcards, starting where a queue name may start (or with
# a wildcard): a pattern that could match no queue is a typo, refused.
_PATTERN = re.compile(r"[A-Za-z0-9*?][A-Za-z0-9_.*?-]{0,62}")


def check_pattern(pattern: object) -> str:
    if not isinstance(pattern, str) or not _PATTERN.fullmatch(pattern):
        raise InvalidNameError(f"invalid queue pattern {pattern!r}: use 1-63 letters, digits, '_', '.', '-' and the "
                               "wildcards '*' (any characters) and '?' (one character), starting with a letter, "
                               "digit or wildcard")
    return pattern


def check_key_name(name: object) -> str:
    """A key's name, as `roq keys generate` accepts it (its certificate's file name)."""
    if not is_name(name):
        raise InvalidNameError(f"invalid key name {name!r}: use 1-63 letters, digits, '_', '.', '-', "
                               "starting with a letter or digit (the name of clients/NAME.key or admins/NAME.key)")
    return name


def check_patterns(patterns: object, right: str) -> tuple[str, ...]:
    """A list of patterns, each checked; duplicates dropped, order kept."""
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)):
        raise UserError(f"{right} must be a list of queue patterns, got {patterns!r}")
    checked = tuple(dict.fromkeys(check_pattern(p) for p in patterns))
    if len(checked) > MAX_PATTERNS:
        raise UserError(f"{right}: at most {MAX_PATTERNS} patterns per key, got {len(checked)}")
    return checked


@dataclass(frozen=True)
class Entry:
    """One key's rights."""
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    admin: bool = False

    def patterns(self, right: str) -> tuple[str, ...]:
        return tuple(getattr(self, right))

    def allows(self, right: str, queue: str) -> bool:
        return self.admin or any(fnmatchcase(queue, p) for p in self.patterns(right))

    def uses(self, queue: str) -> bool:
        """Any right on `queue`: what it takes to see the queue on the control API."""
        return any(self.allows(right, queue) for right in RIGHTS)

    @classmethod
    def of(cls, patterns: Mapping[str, tuple[str, ...]], admin: bool) -> Entry:
        return cls(patterns["publish"], patterns["subscribe"], patterns["consume"], admin)

    def granted(self, more: Entry) -> Entry:
        """This entry with `more`'s patterns added (after its own) and its admin, if set."""
        return Entry.of({r: check_patterns(self.patterns(r) + more.patterns(r), r) for r in RIGHTS},
                        self.admin or more.admin)

    def without(self, less: Entry) -> Entry:
        """This entry without `less`'s patterns (each must be here, spelt the same) nor its admin."""
        for right in RIGHTS:
            missing = [p for p in less.patterns(right) if p not in self.patterns(right)]
            if missing:
                raise UserError(f"no {right} pattern {', '.join(map(repr, missing))} to revoke (its {right} "
                                f"patterns: {', '.join(self.patterns(right)) or 'none'}); patterns are revoked "
                                "as they were granted, not by the queues they match")
        return Entry.of({r: tuple(p for p in self.patterns(r) if p not in less.patterns(r)) for r in RIGHTS},
                        self.admin and not less.admin)

    @property
    def empty(self) -> bool:
        return not (self.admin or any(self.patterns(r) for r in RIGHTS))

    def to_json(self) -> dict[str, Any]:
        return {**{r: list(self.patterns(r)) for r in RIGHTS}, "admin": self.admin}

    @classmethod
    def from_json(cls, data: object, where: str = "entry") -> Entry:
        if not isinstance(data, Mapping):
            raise UserError(f"{where} must be an object")
        unknown = sorted(str(k) for k in data if k not in (*RIGHTS, "admin"))
        if unknown:
            raise UserError(f"{where} has unknown fields {', '.join(unknown)}")
        admin = data.get("admin", False)
        if not isinstance(admin, bool):
            raise UserError(f"{where}: admin must be true or false, got {admin!r}")
        try:
            return cls.of({r: check_patterns(data.get(r, []), r) for r in RIGHTS}, admin)
        except UserError as exc:
            raise type(exc)(f"{where}: {exc}") from None


@dataclass(frozen=True)
class PermissionTable:
    """Every key's entry, and what a key without one gets. `version` says which state of the znode
    this is (its mzxid: grows with every change; 0 = no znode)."""
    entries: Mapping[str, Entry] = field(default_factory=dict)
    default: str = "all"
    version: int = 0

    def entry(self, name: str) -> Entry | None:
        return self.entries.get(name)

    def allows(self, name: str, right: str, queue: str) -> bool:
        entry = self.entries.get(name)
        return self.default == "all" if entry is None else entry.allows(right, queue)

    def uses(self, name: str, queue: str) -> bool:
        entry = self.entries.get(name)
        return self.default == "all" if entry is None else entry.uses(queue)

    def is_admin(self, name: str) -> bool:
        entry = self.entries.get(name)
        return entry is not None and entry.admin

    def with_entry(self, name: str, entry: Entry | None) -> PermissionTable:
        """This table with `name`'s entry replaced (None: removed)."""
        entries = {n: e for n, e in self.entries.items() if n != name}
        if entry is not None:
            entries[check_key_name(name)] = entry
        if len(entries) > MAX_KEYS:
            raise UserError(f"the permission table holds at most {MAX_KEYS} keys: reset unused ones first")
        return replace(self, entries=dict(sorted(entries.items())))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "keys": {n: e.to_json() for n, e in sorted(self.entries.items())}}

    def to_znode(self) -> bytes:
        data = json.dumps(self.to_json(), separators=(",", ":")).encode()
        if len(data) > MAX_TABLE_BYTES:
            raise UserError(f"the permission table would take {len(data)} bytes, more than {MAX_TABLE_BYTES}: "
                            "use fewer patterns (one wildcard covers many queues)")
        return data

    @classmethod
    def from_json(cls, data: object, default: str = "all", version: int = 0) -> PermissionTable:
        """The table in `data` (the znode's JSON, decoded); UserError naming the first fault."""
        if default not in PERMISSION_DEFAULTS:
            raise UserError(f"default permissions must be all or none, got {default!r}")
        if not isinstance(data, Mapping) or data.get("format") != FORMAT or set(data) != {"format", "keys"}:
            raise UserError(f"not a permission table (expected {{\"format\": {FORMAT}, \"keys\": {{...}}}})")
        keys = data["keys"]
        if not isinstance(keys, Mapping) or len(keys) > MAX_KEYS:
            raise UserError(f"keys must be an object of at most {MAX_KEYS} key names")
        entries = {check_key_name(name): Entry.from_json(entry, f"key {name}") for name, entry in keys.items()}
        return cls(dict(sorted(entries.items())), default, version)

    @classmethod
    def from_znode(cls, raw: bytes | None, default: str = "all", version: int = 0) -> PermissionTable:
        """The table a znode's bytes hold (None: no znode, no entries)."""
        if raw is None or not raw.strip():
            return cls({}, default, version)
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than Python parses
            raise UserError(f"the permission table is not valid JSON: {exc}") from None
        return cls.from_json(data, default, version)


def to_message(table: PermissionTable) -> dict[str, Any]:
    """What an HCM writes to its exchanges and replicas: `{"permissions": {"version", "table"}}`."""
    return {"permissions": {"version": table.version, "table": table.to_json()}}


def from_message(body: object, default: str) -> PermissionTable:
    """The table in the `permissions` member of an HCM's line; UserError if it is not one."""
    version = body.get("version") if isinstance(body, Mapping) else None
    if not isinstance(body, Mapping) or not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise UserError("a permissions line needs an integer version >= 0 and a table")
    return PermissionTable.from_json(body.get("table"), default, version)


def requested(args: Mapping[str, Any]) -> Entry:
    """The rights a grant or revoke request names (missing rights: none)."""
    return Entry.from_json({k: args[k] for k in (*RIGHTS, "admin") if k in args}, "request")


def describe(entry: Entry | None, default: str) -> str:
    """One line for people: `publish orders.*; subscribe -; consume -` (admin first when set)."""
    if entry is None:
        return f"no entry: the default ({default}: {'every right on every queue' if default == 'all' else 'nothing'})"
    rights = [f"{r} {' '.join(entry.patterns(r)) or '-'}" for r in RIGHTS]
    return "; ".join((["admin"] if entry.admin else []) + rights)


def names(entries: Iterable[str]) -> str:
    return ", ".join(sorted(entries)) or "none"
