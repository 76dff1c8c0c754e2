"""The HCM's part in admin commands: hand each exchange of a queue the queue's commands, and
record what each exchange did (docs/protocol.md section 2, exchange/commands.py).

The leader writes a command as `<root>/commands/<queue>/<id>` and touches `<root>/commands/<queue>`
in the same transaction (gcm/commands.py). A `QueueCommands` follows that znode with a kazoo
DataWatch (it may not exist yet, or go with its queue): kazoo's thread only records that it changed
and wakes the tick. The tick then reads what changed (`refresh`): each new command's data, and which
exchanges reported it done, the children `<id>/<xid>`; for a young purge their results too, which
name the publishers' sequence numbers the purge dropped (every exchange of the queue must keep a
publisher's resends of those out: a publisher moves to another exchange after a failure).

`line(xid)` is what an exchange hears: the commands it has not reported done, and the purge marks;
the supervisor writes it right after the configuration and again whenever it changes. `record`
writes an exchange's report as the persistent znode `<id>/<xid>` holding its result: an exchange
whose report is recorded never hears of that command again, whichever host its next incarnation
runs on. Every ZooKeeper error leaves the work to a later tick (the reads and writes are idempotent);
a command deleted meanwhile (pruned by the leader, or its queue deleted) is forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from roq.paths import Paths
from roq.protocol import is_command_id
from roq.zk import decode, encode

log = logging.getLogger(__name__)

PURGE_FOLLOW = 60.0  # s after a purge during which other exchanges' results (publisher marks) are read
REFRESH_RETRY = 1.0  # s between two reads while a young purge is not reported by every exchange


@dataclass
class KnownCommand:
    data: dict[str, Any]
    done: set[str] = field(default_factory=set)  # exchanges that reported it
    marks: dict[str, int] = field(default_factory=dict)  # a purge's: publisher → highest purged sequence

    @property
    def is_purge(self) -> bool:
        return self.data.get("op") == "queue.purge"

    def young(self, now: float) -> bool:
        return now - float(self.data.get("at") or 0.0) < PURGE_FOLLOW


class QueueCommands:
    def __init__(self, client: KazooClient, paths: Paths, queue: str, wake: threading.Event,
                 purge_memory: float) -> None:
        """`purge_memory`: how long a purge's marks are handed on (exchange.publisher_ttl)."""
        self.client = client
        self.paths = paths
        self.queue = queue
        self.purge_memory = purge_memory
        self.known: dict[str, KnownCommand] = {}
        self.stopped = False
        self._changed = True  # read at the first tick
        self._next_refresh = 0.0
        self._wake = wake
        client.DataWatch(paths.commands(queue), self._on_data)

    def _on_data(self, _data: bytes | None, _stat: Any, _event: Any = None) -> bool | None:
        if self.stopped:
            return False  # kazoo drops the watch
        self._changed = True
        self._wake.set()
        return None

    def stop(self) -> None:
        """The watch ends at its next event (kazoo has no other way to drop one)."""
        self.stopped = True

    # ------------------------------------------------------------ the tick's reads

    def refresh(self, now: float | None = None) -> None:
        """Read what changed: new commands, and the reports of young purges not yet reported by all."""
        wall = time.time() if now is None else now
        follow = [cid for cid, c in self.known.items()
                  if c.is_purge and c.young(wall) and not set(c.data.get("exchanges") or ()) <= c.done]
        if not self._changed and not (follow and time.monotonic() >= self._next_refresh):
            return
        try:
            if self._changed:
                self._changed = False
                self._read_commands()
            for command_id in follow:
                if command_id in self.known:
                    self._read_reports(command_id)
        except KazooException as exc:
            self._changed = True
            log.info("admin commands of %s not read (%s); next tick", self.queue, exc)
        self._next_refresh = time.monotonic() + REFRESH_RETRY

    def _read_commands(self) -> None:
        try:
            ids = self.client.get_children(self.paths.commands(self.queue))
        except NoNodeError:
            ids = []
        for gone in set(self.known) - set(ids):
            del self.known[gone]
        for command_id in sorted(set(ids) - set(self.known)):
            try:
                raw, _ = self.client.get(self.paths.command(self.queue, command_id))
            except NoNodeError:
                continue
            data = decode(raw)
            if is_command_id(data.get("id")):
                self.known[command_id] = KnownCommand(data)
                self._read_reports(command_id)

    def _read_reports(self, command_id: str) -> None:
        command = self.known[command_id]
        try:
            reported = self.client.get_children(self.paths.command(self.queue, command_id))
        except NoNodeError:
            del self.known[command_id]
            return
        for xid in set(reported) - command.done:
            if command.is_purge and command.young(time.time()):
                try:
                    raw, _ = self.client.get(self.paths.command_report(self.queue, command_id, xid))
                except NoNodeError:
                    continue
                self._learn_marks(command, decode(raw).get("publishers"))
            command.done.add(xid)

    @staticmethod
    def _learn_marks(command: KnownCommand, marks: Any) -> None:
        for pub, seq in (marks.items() if isinstance(marks, dict) else ()):
            if isinstance(pub, str) and isinstance(seq, int) and seq > command.marks.get(pub, 0):
                command.marks[pub] = seq

    # ------------------------------------------------------------ what an exchange hears

    def line(self, xid: str, now: float | None = None) -> dict[str, Any]:
        """`{"commands": [...], "purged": {...}}` for exchange `xid`: the commands issued to it that it
        has not reported done, oldest first, and the marks of the queue's recent purges."""
        wall = time.time() if now is None else now
        pending = sorted((c.data for c in self.known.values()
                          if xid in (c.data.get("exchanges") or ()) and xid not in c.done),
                         key=lambda d: (d.get("at") or 0, d["id"]))
        purged: dict[str, int] = {}
        for command in self.known.values():
            if command.is_purge and wall - float(command.data.get("at") or 0.0) < self.purge_memory:
                for pub, seq in command.marks.items():
                    purged[pub] = max(purged.get(pub, 0), seq)
        return {"commands": [{k: d.get(k) for k in ("id", "op", "group", "at")} for d in pending], "purged": purged}

    def record(self, xid: str, command_id: str, result: dict[str, Any]) -> bool:
        """Write exchange `xid`'s report of a command; False if ZooKeeper failed (try again later)."""
        path = self.paths.command_report(self.queue, command_id, xid)
        try:
            self.client.create(path, encode(result if isinstance(result, dict) else {}))
        except NodeExistsError:
            pass  # recorded already (by our previous try, or another host's HCM)
        except NoNodeError:
            pass  # the command is gone: nothing to record
        except KazooException as exc:
            log.warning("could not record %s/%s's report of command %s (%s); trying again", self.queue, xid,
                        command_id, exc)
            return False
        command = self.known.get(command_id)
        if command is not None:
            command.done.add(xid)
            if command.is_purge:
                self._learn_marks(command, result.get("publishers") if isinstance(result, dict) else None)
        return True
