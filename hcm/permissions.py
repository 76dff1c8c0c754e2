"""The cluster's permission table as this host's exchanges and replicas need it.

A kazoo DataWatch on `<root>/permissions` (roq/paths.py) holds the latest table; the supervisor
writes it to each child as a JSON line (`{"permissions": ...}`, roq/permissions.py `to_message`)
right after the configuration line and again whenever it changes, so the exchanges never read
ZooKeeper themselves. The first table is read in the constructor, before any child is spawned.

The callback runs in kazoo's thread: it only records the table and wakes the tick, which writes.
A znode that does not parse (it is written by the leader alone, so this is a bug or a hand edit)
is logged as an error and ignored: the children keep the last good table, and with none yet they
get an empty table with `security.default_permissions` "none" — nothing widens what a key may do.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kazoo.client import KazooClient

from roq.errors import UserError
from roq.permissions import PermissionTable

log = logging.getLogger(__name__)


class PermissionsWatch:
    def __init__(self, client: KazooClient, path: str, default: str, wake: threading.Event) -> None:
        self.default = default
        self.table: PermissionTable | None = None
        self._wake = wake
        client.DataWatch(path, self._on_data)

    def _on_data(self, data: bytes | None, stat: Any, _event: Any = None) -> None:
        version = stat.mzxid if stat is not None else 0
        try:
            table = PermissionTable.from_znode(data, self.default, version)
        except UserError as exc:
            log.error("the permission table in ZooKeeper (version %d) is not valid, %s: %s", version,
                      "keeping the previous one" if self.table else "admitting no client key", exc)
            if self.table is not None:
                return
            table = PermissionTable(default="none", version=version)
        if table != self.table:
            self.table = table
            self._wake.set()
