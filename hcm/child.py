"""One supervised exchange process: the record the HCM's collaborators share.

The supervisor (hcm/supervisor.py) starts and stops its process, the restart policy
(hcm/restarts.py) judges its exits, the channel (hcm/channel.py) talks to it over its pipes, the
peer watch (hcm/peers.py) follows its other half, and the endpoints (hcm/endpoints.py) publish it;
each keeps its own fields here.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

from hcm.peers import PeerWatch
from roq.paths import is_replica_slot
from roq.permissions import PermissionTable
from roq.records import ExchangeStats
from roq.storage_policy import StoragePolicy

Key = tuple[str, str]  # (queue, slot): an exchange id ("x1") or a replica slot ("x1~r")
UNSENT = object()  # no peer line written to this process yet (None is a line: "the peer is gone")


@dataclass
class Child:
    key: Key
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready: dict[str, Any] | None = None
    stats: ExchangeStats | None = None  # the latest report, None until the first
    reported: float = 0.0  # monotonic: when the latest report (or the ready event) arrived
    published: bool = False
    written_at: float | None = None  # monotonic: when the znode was last written (hcm/heartbeat.py)
    written_stats: ExchangeStats | None = None  # the report it holds
    written_silent: bool = False  # whether it says the child stopped reporting
    failures: int = 0
    next_start: float = 0.0
    stop_deadline: float | None = None
    restarts: int = 0
    crashes: tuple[float, ...] = ()  # when it crashed, within the last restart_window
    failed_until: float | None = None  # crashed too often: left alone until then
    peer_watch: PeerWatch | None = None  # a replicated exchange's other half (its replica, or its primary)
    peer_sent: Any = UNSENT  # the peer target last written to this process
    permissions_sent: PermissionTable | None = None  # the permission table last written to it
    commands_sent: dict[str, Any] | None = None  # the admin commands line last written to it
    storage_sent: StoragePolicy | None = None  # the storage policy last written to it (hcm/storage_policies.py)
    command_reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # from its events, to record
    stats_forced: bool = False  # it reported a command done: its figures changed, write them at once

    @property
    def is_replica(self) -> bool:
        return is_replica_slot(self.key[1])
