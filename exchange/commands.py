"""Admin commands an exchange applies: reset or delete a consumer group, purge the queue.

The GCM leader writes each command under `<root>/commands/<queue>/<id>` (gcm/commands.py); the HCM
of every exchange of the queue hands them to that exchange on its stdin, as one JSON line
`{"commands": [{"id", "op", "group", "at"}, ...], "purged": {publisher: seq}}` right after the
configuration, and again whenever they change (hcm/commands.py). It leaves out the commands this
exchange reported done. `purged` is what the queue's recent purges dropped of each publisher (the
highest sequence number an exchange had of it): a publisher's replay window resent after a
failover must not bring purged messages back, whichever exchange it reaches.

This module keeps what an exchange knows of them: the commands waiting to be applied, those this
exchange applied (this incarnation, or an earlier one as its replica says: protocol section 7.6),
and the purge marks with their expiry. The forwarder applies them (exchange/admin.py). An
entry of the line that does not parse is logged and skipped; nothing on the line can stop the
exchange, and a line from a thread other than the loop's only queues work for the loop.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from roq.names import is_name
from roq.protocol import MAX_GROUP_NAME, is_command_id

log = logging.getLogger(__name__)

OPS = ("group.reset", "group.delete", "queue.purge")
GROUP_OPS = ("group.reset", "group.delete")
MAX_REMEMBERED = 1024  # command ids kept as applied (the newest): far more than the leader keeps per queue
MAX_PURGED = 100_000  # publishers whose purge mark is kept


@dataclass(frozen=True)
class Command:
    id: str
    op: str
    group: str | None  # the group of a group.* command


def parse_commands(entries: Any) -> list[Command]:
    """The well-formed commands of a `commands` line, in order; the rest logged and skipped."""
    found = []
    for entry in entries if isinstance(entries, list) else ():
        command = _command(entry)
        if command is None:
            log.warning("ignored a malformed admin command from the HCM: %.200r", entry)
        else:
            found.append(command)
    return found


def _command(entry: Any) -> Command | None:
    if not isinstance(entry, dict) or not is_command_id(entry.get("id")) or entry.get("op") not in OPS:
        return None
    group = entry.get("group")
    if entry["op"] in GROUP_OPS and not (isinstance(group, str) and is_name(group) and len(group) <= MAX_GROUP_NAME):
        return None
    return Command(entry["id"], entry["op"], group if entry["op"] in GROUP_OPS else None)


def parse_purged(marks: Any) -> dict[str, int]:
    """{publisher: seq} of a `purged` map, entries of the wrong type left out."""
    if not isinstance(marks, dict):
        return {}
    return {pub: seq for pub, seq in marks.items() if isinstance(pub, str) and isinstance(seq, int)
            and not isinstance(seq, bool) and seq > 0}


class Commands:
    def __init__(self, purge_memory: float) -> None:
        """`purge_memory`: seconds a purge mark is kept (exchange.publisher_ttl: longer than any
        publisher's replay window)."""
        self.purge_memory = purge_memory
        self.applied: OrderedDict[str, None] = OrderedDict()
        self.heard = True  # no commands line is awaited (`await_first` says one is)
        self._await_until = 0.0
        self.purged: dict[str, int] = {}  # publisher → highest purged sequence number
        self._purged_until = 0.0
        self._lines: queue.SimpleQueue[tuple[list[Command], dict[str, int]]] = queue.SimpleQueue()
        self._waiting: dict[str, Command] = {}  # received, not applied yet, in order

    def await_first(self, timeout: float) -> None:
        """An HCM sends a commands line right after the configuration: until it came and its commands
        were applied, the exchange reads no publisher and no member (at most `timeout`: an HCM that
        sends none, of an older version, must not hold the exchange)."""
        self.heard = False
        self._await_until = time.monotonic() + timeout

    @property
    def ready(self) -> bool:
        if not self.heard and time.monotonic() > self._await_until:
            log.warning("no admin commands line from the HCM; going on without")
            self.heard = True
        return self.heard

    def deliver(self, message: dict[str, Any]) -> None:
        """A line from the HCM (the stdin thread): queued for the loop."""
        self._lines.put((parse_commands(message.get("commands")), parse_purged(message.get("purged"))))

    def take(self) -> list[Command]:
        """The commands to apply now, in order (the loop's thread); each is handed out once."""
        # The loop asks on every wake-up: empty() instead of get_nowait()'s queue.Empty, which cost
        # more than the rest of the call. One consumer: what empty() saw stays there.
        while not self._lines.empty():
            commands, purged = self._lines.get_nowait()
            self.heard = True
            self._learn_purged(purged)
            for command in commands:
                if command.id not in self.applied:
                    self._waiting.setdefault(command.id, command)
        if not self._waiting:
            return []
        ready, self._waiting = list(self._waiting.values()), {}
        return ready

    def mark_applied(self, ids: tuple[str, ...] | list[str]) -> None:
        """Applied here, or by an earlier incarnation (its replica said so): never again."""
        for command_id in ids:
            self.applied[command_id] = None
            self.applied.move_to_end(command_id)
            self._waiting.pop(command_id, None)
        while len(self.applied) > MAX_REMEMBERED:
            self.applied.popitem(last=False)

    def _learn_purged(self, marks: dict[str, int]) -> None:
        if not marks:
            return
        for pub, seq in marks.items():
            if seq > self.purged.get(pub, 0) and (pub in self.purged or len(self.purged) < MAX_PURGED):
                self.purged[pub] = seq
        self._purged_until = time.monotonic() + self.purge_memory

    def purged_through(self, publisher: str) -> int:
        """The highest sequence number of `publisher` a purge dropped (0: none, or long enough ago
        that no resend can reach back to it)."""
        if not self.purged:
            return 0
        if time.monotonic() > self._purged_until:
            self.purged = {}
            return 0
        return self.purged.get(publisher, 0)
