"""The HCM's conversation with its children over their pipes: lines to stdin, events from stdout.

To a child, one JSON line each, in this order right after it starts and again whenever what it
must hear changes: its configuration (through the pipe, not argv, which every local user can
read; the pipe then stays open, and its EOF tells the child that the HCM is gone), where its other
half is (hcm/peers.py), the permission table with CURVE on (`{"permissions": {"version": N,
"table": {...}}}`, followed in hcm/permissions.py), and for a primary its queue's admin commands
(`{"commands": [...], "purged": {...}}`, a `QueueCommands` per queue: hcm/commands.py), and its
queue's storage policy (`{"storage": {"retention", "retention_bytes"}}`, hcm/storage_policies.py).
Only the tick thread writes.

From a child, one event thread each: `ready` (its endpoints), `stats` (its report) and `command`
(`{"event": "command", "id", "result"}`: an admin command done, recorded in ZooKeeper by the tick,
which then stops handing it that command).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import IO, Any

from kazoo.client import KazooClient

from hcm.child import UNSENT, Child
from hcm.commands import QueueCommands
from hcm.permissions import PermissionsWatch
from hcm.storage_policies import StoragePolicies
from roq.config import Config
from roq.paths import Paths
from roq.permissions import to_message
from roq.records import ExchangeStats
from roq.storage_policy import storage_line

# What is published of an exchange's ready event, at live/<q>/<x>; it counts only if it names the
# first two (its endpoints).
READY_FIELDS = ("pub", "sub", "replay", "work", "incarnation", "pid", "replicas", "archived", "copy_digest")
# Of a replica, at replicas/<q>/<x>; it sends its ready event again when `stored` changes.
REPLICA_READY_FIELDS = ("repl", "replay", "incarnation", "pid", "stored")


class ChildChannel:
    """Lines to the children's stdin and events from their stdout. `wake` is set whenever there is
    something for the tick to do; without a client (unit tests) there is nothing to follow."""

    def __init__(self, client: KazooClient | None, paths: Paths, config: Config, wake: threading.Event) -> None:
        self.client = client
        self.paths = paths
        self.config = config
        self.wake = wake
        # With CURVE the children judge keys by the permission table, which they hear from us.
        self.permissions = PermissionsWatch(client, paths.permissions, config.security.default_permissions,
                                            wake) if config.security.curve and client is not None else None
        self.commands: dict[str, QueueCommands] = {}  # by queue, while a primary of it runs here
        self.storage = StoragePolicies(client, paths, wake)  # by queue, while a child of it runs here

    # ------------------------------------------------------------ admin commands

    def follow_queue(self, queue: str) -> None:
        """Follow `queue`'s admin commands (before its primary starts: its first line goes right
        after the configuration). Needs a client; without one, nothing is followed."""
        if queue not in self.commands and self.client is not None:
            self.commands[queue] = QueueCommands(self.client, self.paths, queue, self.wake,
                                                 self.config.exchange.publisher_ttl)
            self.commands[queue].refresh()

    def refresh_commands(self, served: set[str]) -> None:
        """Read the admin commands that changed of the `served` queues (a primary of each runs here);
        stop following any other."""
        for queue in list(self.commands):
            if queue in served:
                self.commands[queue].refresh()
            else:
                self.commands.pop(queue).stop()

    def record_commands(self, child: Child) -> None:
        """Record the commands the child reported done; what ZooKeeper refuses now waits for the next tick."""
        commands = self.commands.get(child.key[0])
        while child.command_reports and commands is not None:
            command_id, result = child.command_reports[0]
            if not commands.record(child.key[1], command_id, result):
                return
            child.command_reports.pop(0)

    # ------------------------------------------------------------ to the child

    def open(self, child: Child) -> None:
        """The first lines to a child just started: its configuration, then whatever it must hear."""
        child.peer_sent, child.permissions_sent, child.commands_sent = UNSENT, None, None
        child.storage_sent = None
        write_line(child, self.config.to_json().encode())
        self.send_changes(child)

    def send_changes(self, child: Child) -> None:
        """Tell a running child what changed since it last heard: its storage policy, its peer, the
        permissions, its commands."""
        if child.process is None:
            return
        self._send_storage(child)
        self._send_peer(child)
        self._send_permissions(child)
        self._send_commands(child)

    def _send_storage(self, child: Child) -> None:
        """Give a child (primary or replica) its queue's storage policy, if it changed since it last heard."""
        policy = self.storage.policy(child.key[0])
        if policy is not None and policy != child.storage_sent:
            child.storage_sent = policy
            write_line(child, json.dumps(storage_line(policy), separators=(",", ":")).encode())

    def _send_peer(self, child: Child) -> None:
        """Tell a replicated exchange where its other half is, if that changed since it last heard."""
        if child.peer_watch is None:
            return
        target = child.peer_watch.target
        if target != child.peer_sent:
            child.peer_sent = target
            write_line(child, json.dumps({child.peer_watch.line: target}).encode())

    def _send_permissions(self, child: Child) -> None:
        """Give a child the permission table, if it changed since the child last heard."""
        table = self.permissions.table if self.permissions is not None else None
        if table is not None and table is not child.permissions_sent:
            child.permissions_sent = table
            write_line(child, json.dumps(to_message(table), separators=(",", ":")).encode())

    def _send_commands(self, child: Child) -> None:
        """Give a primary child its queue's admin commands, if what it must hear changed."""
        commands = self.commands.get(child.key[0])
        if commands is None or child.is_replica:
            return
        line = commands.line(child.key[1])
        if line != child.commands_sent:
            child.commands_sent = line
            write_line(child, json.dumps(line, separators=(",", ":")).encode())

    # ------------------------------------------------------------ from the child

    def read_events(self, child: Child, stream: IO[bytes]) -> None:
        """Follow a child's stdout until it closes (run in a thread of its own): ready, stats and
        command events update `child`; anything that is not JSON is skipped."""
        fields = REPLICA_READY_FIELDS if child.is_replica else READY_FIELDS
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self._on_event(child, event, fields)

    def _on_event(self, child: Child, event: dict[str, Any], fields: tuple[str, ...]) -> None:
        if event.get("event") == "ready" and all(event.get(key) for key in fields[:2]):  # its endpoints
            child.reported = time.monotonic()
            ready = {key: event.get(key) for key in fields}
            # A published child's new ready event (a replica's `stored` changed) is written at once.
            child.stats_forced = child.stats_forced or (child.ready is not None and ready != child.ready)
            child.ready = ready
            self.wake.set()
        elif event.get("event") == "command" and isinstance(event.get("id"), str):
            child.command_reports.append((event["id"], event.get("result") or {}))
            child.stats_forced = True  # the report it sent just before shows what the command did
            self.wake.set()
        elif event.get("event") == "stats":
            # When it arrived: a frozen exchange stops reporting, and clients see its figures age.
            child.stats = replace(ExchangeStats.from_dict(event), at=round(time.time(), 3))
            child.reported = time.monotonic()


def write_line(child: Child, line: bytes) -> None:
    """One line to the child's stdin; a child that died meanwhile is reaped on the next tick."""
    assert child.process is not None and child.process.stdin is not None
    try:
        child.process.stdin.write(line + b"\n")
        child.process.stdin.flush()
    except (BrokenPipeError, ValueError):  # ValueError: its pipe is closed already
        pass
