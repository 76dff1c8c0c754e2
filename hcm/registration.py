"""The host's ephemeral registration, idempotent across reconnects.

If a node of the same name is held by another session (an HCM of this host
that was just killed, whose session has not expired yet), we do not steal it:
`try_register` returns False and the daemon retries on its next tick, so the
node appears at most one session timeout later.

The host's figures are written when they changed materially and otherwise once
every `heartbeat` seconds (hcm/heartbeat.py), not at every report: an idle host
writes next to nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from hcm.heartbeat import host_changed, write_due
from roq.paths import Paths
from roq.records import HostStats
from roq.zk import create_ephemeral, encode

log = logging.getLogger(__name__)


class HostRegistration:
    def __init__(self, client: KazooClient, paths: Paths, host: str, address: str, capacity: int,
                 heartbeat: float = 60.0) -> None:
        self.client = client
        self.paths = paths
        self.host = host
        self.heartbeat = heartbeat  # hcm.stats_heartbeat
        self.data: dict[str, Any] = {"address": address, "capacity": capacity, "pid": os.getpid(),
                                     "started": time.time(), "heartbeat": heartbeat}
        self.registered = False
        self._warned = False
        self.written: HostStats | None = None  # the figures the node holds
        self.written_at: float | None = None  # monotonic

    def try_register(self) -> bool:
        self.client.ensure_path(self.paths.host_assignments(self.host))
        try:
            create_ephemeral(self.client, self.paths.host(self.host), self.data)
        except NodeExistsError:
            if not self._warned:
                log.warning("host %s is still registered by an older session; waiting for it to expire",
                            self.host)
                self._warned = True
            return False
        if not self.registered:
            log.info("registered host %s (capacity %d)", self.host, self.data["capacity"])
        self.registered = True
        self._warned = False
        return True

    def report(self, stats: HostStats | Mapping[str, Any], now: float | None = None) -> bool:
        """Publish the host's figures in its registration (the HCM's own ephemeral node) if they
        changed materially or the heartbeat is due; True if written. `now`: time.monotonic().

        A map is read as a `HostStats` (keys it does not define are dropped)."""
        if not self.registered:
            return False
        now = time.monotonic() if now is None else now
        figures = stats if isinstance(stats, HostStats) else HostStats.from_dict(stats)
        if not write_due(self.written_at, now, host_changed(self.written, figures), self.heartbeat):
            return False
        self.data["stats"] = figures.to_dict()
        try:
            self.client.set(self.paths.host(self.host), encode(self.data))
        except NoNodeError:
            self.registered = False  # our session's node is gone; register again next tick
            return False
        self.written, self.written_at = figures, now
        return True

    def session_lost(self) -> None:
        self.registered = False

    def unregister(self) -> None:
        try:
            _, stat = self.client.get(self.paths.host(self.host))
            if stat.ephemeralOwner == self.client.client_id[0]:
                self.client.delete(self.paths.host(self.host))
        except Exception as exc:  # closing the session removes it anyway
            log.debug("unregister: %s", exc)
        self.registered = False
