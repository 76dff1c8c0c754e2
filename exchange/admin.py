"""Admin commands at the exchange: a group reset or deleted, the queue purged.

The commands (exchange/commands.py) are applied by the loop between two reads, each once; at
start, after the groups are adopted and before any publisher or member is read, so a command
issued before this incarnation started applies to what it took over, never to what it is sent
afterwards. With a replica, a command is reported done once the replica recorded it with the
state it left (protocol section 7.6), sent again every RECORD_RETRY while it has not.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from typing import Any

from exchange.commands import Command
from exchange.durability import Durability
from exchange.group_sync import MAX_GROUP_STATE
from exchange.parts import Parts
from roq import protocol

log = logging.getLogger(__name__)

RECORD_RETRY = 1.0  # s before an admin command the replica has not recorded is sent to it again
MAX_PURGE_MARKS = 10_000  # publishers a purge's result names (the most recently seen): it goes to ZooKeeper


class AdminCommands:
    def __init__(self, parts: Parts, durability: Durability) -> None:
        self.commands = parts.commands
        self.groups = parts.groups
        self.retention = parts.retention
        self.sessions = parts.sessions
        self.archives = parts.archives
        self.journal_root = parts.journal_root
        self.disk = parts.disk
        self.link = parts.link
        self.incarnation, self.copy_secret = parts.stream.incarnation, parts.stream.copy_secret
        self._durability = durability  # its journal: purged too (None once switched off)
        # `on_command(id, result)` reports one done (to the HCM).
        self.on_command: Callable[[str, dict[str, Any]], None] = lambda command_id, result: None
        self._unrecorded: dict[str, dict[str, Any]] = {}  # applied, not yet recorded by the replica: results
        self._record_sent = 0.0  # when they were last sent to it

    def step(self, now: float) -> None:
        """Apply the commands that came, once each; report those done (with a replica: once it
        recorded them)."""
        for command in self.commands.take():
            result = self.apply(command)
            self.commands.mark_applied([command.id])
            log.info("admin command %s (%s%s) applied: %s", command.id, command.op,
                     f" {command.group}" if command.group else "", _shown_result(result))
            if self.link is None:
                self.on_command(command.id, result)
            else:
                self._unrecorded[command.id] = result
        if self._unrecorded:
            self._record(now)

    def _record(self, now: float) -> None:
        link = self.link
        assert link is not None
        for command_id in [c for c in self._unrecorded if c in link.recorded]:
            link.recorded.discard(command_id)
            self.on_command(command_id, self._unrecorded.pop(command_id))
        if self._unrecorded and now >= self._record_sent + RECORD_RETRY:
            self._record_sent = now
            for command_id, result in self._unrecorded.items():
                # The state as it is now: it holds the command's effect and everything since (an older
                # state would undo acks the replica holds).
                frame = protocol.encode_applied(self.incarnation, command_id,
                                                self.groups.records(self.retention.next_pos),
                                                result.get("upto", 0), self.copy_secret)
                if len(frame) > MAX_GROUP_STATE:  # as for any state copy: the last one stands
                    log.warning("the state after command %s is too big to copy to the replica", command_id)
                    link.recorded.add(command_id)
                else:
                    link.send_groups(frame)

    def apply(self, command: Command) -> dict[str, Any]:
        """One admin command on what this exchange holds; the result says what it did (the counts
        an admin sees)."""
        if command.op == "queue.purge":
            return self._purge()
        assert command.group is not None
        group = self.groups.groups.get(command.group)
        if group is None:
            return {"missing": True}
        if command.op == "group.reset":
            return {"dropped": self.groups.reset(command.group)}
        if group.members:
            return {"refused": f"{len(group.members)} members connected"}
        return {"deleted": True, "dropped": self.groups.delete(command.group)}

    def _purge(self) -> dict[str, Any]:
        """Drop what the queue holds here: the retained frames (at once, or once the replica has them),
        every group's ready and delayed messages, the journals and segment stores of earlier
        incarnations, this one's segments below the purge; mark the journal. The result names each
        publisher's highest sequence number here, so that no exchange takes its resends of purged
        messages (exchange/commands.py)."""
        upto = self.retention.next_pos
        frames, messages = self.retention.purge(upto)
        dropped = sum(self.groups.reset(name) or 0 for name in list(self.groups.groups))
        archives = len(set(self.archives) | set(self.disk.archived))
        self.disk.purge(upto)
        for incarnation in list(self.archives):
            del self.archives[incarnation]
            if self.journal_root is not None:
                shutil.rmtree(self.journal_root / incarnation, ignore_errors=True)
        journal = self._durability.journal
        if journal is not None:
            journal.purge(upto)
        recent = sorted(self.sessions.sessions.items(), key=lambda item: -item[1].seen)[:MAX_PURGE_MARKS]
        return {"upto": upto, "frames": frames, "messages": messages, "group_messages": dropped,
                "archives": archives, "publishers": {pub: session.last for pub, session in recent}}


def _shown_result(result: dict[str, Any]) -> dict[str, Any]:
    """A command's result for the log: the purge's publisher marks counted, not listed."""
    return {k: len(v) if k == "publishers" else v for k, v in result.items()}
