"""The leader's permission operations (`keys.grant`, `keys.revoke`, `keys.reset`, `keys.list`,
`keys.show`), and the table every GCM judges control requests by.

The table is one znode, `<root>/permissions` (roq/permissions.py has its format). A change reads it
from ZooKeeper itself under the leader's write lock, applies the request to it, and writes it back
in one fenced transaction that also checks the znode's version: a deposed leader changes nothing,
and a table changed meanwhile by anyone is refused (`unavailable`, retried by the client with the
same request key) rather than overwritten. A request that changes nothing writes nothing. A bad
pattern or name is refused before anything is read; a retry of an applied change (same request
key, gcm.fence) is answered with the table as it is.

Every GCM, leader or not, follows the znode with a DataWatch (`table()`): the control API asks it
whether a key may see a queue (gcm/api.py). The leader also takes the table it just wrote, so its
own next request sees its change; the watch moves it on only to newer versions (the znode's mzxid
grows with every change), so a late notification never brings back an older table. A znode that
does not parse leaves the last good table in place, logged as an error.

`enforced` in the answers says whether this leader runs with `security.curve`: without it there are
no identities and the table, though kept, decides nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from gcm.fence import LeaderFence
from roq.config import SecurityConfig
from roq.errors import UnavailableError, UserError
from roq.paths import Paths
from roq.permissions import Entry, PermissionTable, check_key_name, requested
from roq.security import load_keys

log = logging.getLogger(__name__)


class PermissionManager:
    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence, write_lock: threading.Lock,
                 security: SecurityConfig) -> None:
        self.client = client
        self.paths = paths
        self.fence = fence
        self.write_lock = write_lock
        self.security = security
        self.default = security.default_permissions
        self._table = PermissionTable(default=self.default)
        self._table_lock = threading.Lock()
        client.DataWatch(paths.permissions, self._on_data)

    # ------------------------------------------------------------ the table in force

    def table(self) -> PermissionTable:
        return self._table

    def _on_data(self, data: bytes | None, stat: Any, _event: Any = None) -> None:
        version = stat.mzxid if stat is not None else 0
        try:
            self._take(PermissionTable.from_znode(data, self.default, version), from_watch=True)
        except UserError as exc:
            log.error("the permission table in ZooKeeper (version %d) is not valid, keeping the previous one: %s",
                      version, exc)

    def _take(self, table: PermissionTable, from_watch: bool = False) -> None:
        with self._table_lock:
            # A deleted znode (version 0) is news only from the watch; otherwise only newer tables are.
            if table.version > self._table.version or (from_watch and table.version == 0):
                self._table = table

    # ------------------------------------------------------------ reads

    def list(self) -> dict[str, Any]:
        table = self._read()[0]
        keys = [{"name": name, **entry.to_json(), "certificate": self._certificate(name)}
                for name, entry in table.entries.items()]
        return {**self._about(table), "keys": keys}

    def show(self, name: Any) -> dict[str, Any]:
        name = check_key_name(name)
        table = self._read()[0]
        entry = table.entry(name)
        certificate = self._certificate(name)
        admin = (certificate or "").startswith("admins/") or table.is_admin(name)
        return {**self._about(table), "name": name, "entry": entry.to_json() if entry else None,
                "certificate": certificate, "admin": admin}

    # ------------------------------------------------------------ writes

    def grant(self, name: Any, **rights: Any) -> dict[str, Any]:
        """Add the patterns (and admin) named to NAME's entry, made if missing (even with nothing)."""
        name, more = check_key_name(name), requested(rights)
        return self._change(name, lambda entry: (entry or Entry()).granted(more))

    def revoke(self, name: Any, **args: Any) -> dict[str, Any]:
        """Take the patterns (and admin) named from NAME's entry; with none named, or `all`, every
        right: the entry stays, empty, so the key gets nothing whatever the default."""
        every = args.pop("all", False)
        name, less = check_key_name(name), requested(args)
        if not isinstance(every, bool):
            raise UserError(f"all must be true or false, got {every!r}")
        if every or less.empty:
            return self._change(name, lambda _entry: Entry())

        def take(entry: Entry | None) -> Entry:
            if entry is None:
                raise UserError(f"key {name} has no entry (it gets the default, {self.default}): there is no pattern "
                                "to revoke; revoking without patterns takes every right from it")
            return entry.without(less)
        return self._change(name, take)

    def reset(self, name: Any) -> dict[str, Any]:
        """Remove NAME's entry: the key gets the default again."""
        return self._change(check_key_name(name), lambda _entry: None)

    # ------------------------------------------------------------ helpers

    def _change(self, name: str, change: Callable[[Entry | None], Entry | None]) -> dict[str, Any]:
        """Apply `change` to NAME's entry (None: no entry) and write the table if that changed it.
        The answer's `changed` says whether this request wrote (a retry of an applied one did not)."""
        changed = False
        with self.write_lock:
            table, stat = self._read()
            if not self.fence.already_applied():
                before = table.entry(name)
                after = change(before)
                if after != before:
                    table, changed = self._write(table.with_entry(name, after), stat), True
                    log.info("permissions of key %s: %s", name, after.to_json() if after else "entry removed")
        entry = table.entry(name)
        return {**self._about(table), "name": name, "entry": entry.to_json() if entry else None,
                "certificate": self._certificate(name), "changed": changed}

    def _read(self) -> tuple[PermissionTable, Any]:
        """The table in ZooKeeper now, and its znode's stat (None: no znode)."""
        try:
            raw, stat = self.client.retry(self.client.get, self.paths.permissions)
        except NoNodeError:
            return PermissionTable(default=self.default), None
        return PermissionTable.from_znode(raw, self.default, stat.mzxid), stat

    def _write(self, table: PermissionTable, stat: Any) -> PermissionTable:
        data = table.to_znode()

        def build(txn: TransactionRequest) -> None:
            if stat is None:
                txn.create(self.paths.permissions, data)
            else:
                txn.set_data(self.paths.permissions, data, version=stat.version)

        try:
            self.fence.write(build)
        except (BadVersionError, NodeExistsError):
            raise UnavailableError("the permission table changed meanwhile; nothing was written, retry") from None
        written, _ = self._read()
        self._take(written)
        return written

    def _about(self, table: PermissionTable) -> dict[str, Any]:
        return {"default": self.default, "enforced": self.security.curve, "version": table.version}

    def _certificate(self, name: str) -> str | None:
        """Where the leader finds NAME's certificate ("clients/NAME"), None without one (or CURVE)."""
        keys = load_keys(self.security) if self.security.curve else None
        return keys.certificate_of(name) if keys is not None else None
