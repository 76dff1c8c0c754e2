"""A disk-retained queue's consumer groups across restarts: their cursor files, kept and read back.

While the exchange runs, each group of a queue with a disk storage policy has a cursor file
(exchange/group_cursor.py) under `<store root>/groups/`: started when the group is first seen,
appended with what left the group (acked, dead-lettered) at each turn of the loop, its floor (the
lowest position the group still holds) and a sync on the stats tick. So what a crash can undo is
the acks of the last stats interval: those messages are delivered again (docs/guarantees.md).

Only without a replica (with one, the replica's adoption keeps the groups: exchange/group_sync.py).
A restarted exchange reads the cursor files before it reads any publisher or member (or, with a
storage policy that comes late, on the stats tick that applies it; no cursor file is written
before). Each file found becomes a *backlog* of its group: its incarnation's store (archived, read
only), where the group's messages there start (its floor) and which left it. The file is renamed
`<hex name>.<n>.cur` (n: older backlogs lower) and stays that backlog's cursor: acks of its
messages are appended to it, and it is deleted once every message of it left the group. The group
starts a new cursor file in this incarnation's positions from the next position, and is spilled
from there (exchange/group_spill.py): it takes nothing live, reads its backlogs first, oldest
first, a read-ahead at a time from their stores (`read_backlog`), then the new stream's frames from
this store. So a restore forwards nothing and holds no publisher: the exchange stores and confirms
new publishes at once while the group reads its backlog from disk, in order, backlog before new.

A backlog's messages are handed to members with positions of their own: slot × RESTORED_BASE + the
position in their incarnation (slot: the backlog's number in this incarnation, from 1), so they
never collide with this stream's positions and members ack them as any other (protocol section 7).
A crash while a backlog is read leaves its file (what left meanwhile appended) and the group's
newer file: the next incarnation reads both as backlogs, in that order. Delivery counts start
again from 0.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exchange.disk_tail import GROUPS_DIR, DiskTail
from exchange.group_cursor import CursorState, GroupCursor
from exchange.groups import Group, Groups
from exchange.journal_format import fsync_directory
from exchange.retention import Retention
from exchange.store_hooks import fetch_below_memory
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

RESTORED_BASE = 1 << 48  # a backlog's messages carry slot * RESTORED_BASE + their position there
MAX_SLOTS = (1 << 62) // RESTORED_BASE  # positions stay well inside the protocol's signed 64 bits
FILE_NAME = re.compile(r"^([0-9a-f]*)(?:\.([0-9]{1,9}))?\.cur$")  # <hex name>[.<backlog n>].cur


@dataclass
class Backlog:
    """A restored group's messages of an earlier incarnation, read from that incarnation's store."""
    slot: int
    path: Path
    cursor: GroupCursor  # its file, open for appends
    store: Any  # its incarnation's SegmentStore (None: its frames are gone)
    after: int  # the last position of `store` read
    done: list[tuple[int, int, int]] = field(default_factory=list)  # left the group since the last turn

    @property
    def base(self) -> int:
        return self.slot * RESTORED_BASE

    @property
    def read_all(self) -> bool:
        return self.store is None or self.after + 1 >= self.store.end_pos


class GroupCursors:
    def __init__(self, groups: Groups, retention: Retention, disk: DiskTail, incarnation: str,
                 replicated: bool = False) -> None:
        self.groups, self.retention, self.disk, self.incarnation = groups, retention, disk, incarnation
        self.replicated = replicated  # the replica's adoption keeps the groups (exchange/group_sync.py)
        self.cursors: dict[str, GroupCursor] = {}
        self._done: dict[str, list[tuple[int, int, int]]] = {}  # left each group since the last turn
        self.restored = False  # the cursor files earlier incarnations left were read: new ones may be written
        self._wanted = False  # restore as soon as the queue keeps frames on disk
        self.backlogs: dict[str, list[Backlog]] = {}  # each restored group's, oldest first
        self._slots: dict[int, Backlog] = {}  # by slot: where an ack of a backlog's message goes
        self._next_slot = 1
        self._stuck: set[str] = set()  # groups whose earlier file could not be renamed: it must stand
        self._failed: set[str] = set()  # groups whose cursor file the disk refused (logged once)

    @property
    def root(self) -> Path | None:
        return self.disk.root / GROUPS_DIR if self.disk.root is not None else None

    @property
    def enabled(self) -> bool:
        return self.disk.store is not None and self.disk.policy.on_disk and not self.replicated

    def left(self, group: Group, pos: int, idx: int, count: int) -> None:
        """Groups.on_done: written at the next turn (a backlog's message to its own file)."""
        if not self.enabled:
            return
        backlog = self._slots.get(pos // RESTORED_BASE) if pos >= RESTORED_BASE else None
        if backlog is not None:
            backlog.done.append((pos - backlog.base, idx, count))
        elif pos < RESTORED_BASE:
            self._done.setdefault(group.name, []).append((pos, idx, count))

    # ------------------------------------------------------------ while running

    def turn(self) -> None:
        """Each turn of the loop: cursors for new groups, the ranges that left, files of groups gone.
        No file is written before the earlier incarnations' were restored (a storage policy that
        came late: the restore runs first, here or on the stats tick)."""
        if not self.enabled or self.root is None:
            if self.cursors or self.backlogs:  # the queue was made memory only: its groups no longer outlive it
                self._forget(list(self.cursors) + list(self.backlogs))
            return
        self._restore_if_due()
        if not self.restored:
            return
        for name, group in self.groups.groups.items():
            if name not in self.cursors and name not in self._stuck:
                self._start(group)
        for name, ranges in self._done.items():
            cursor = self.cursors.get(name)
            if cursor is not None:
                cursor.done(ranges)
        self._done = {}
        for backlogs in self.backlogs.values():
            for backlog in backlogs:
                backlog.cursor.done(backlog.done)
                backlog.done = []
        self._forget([n for n in set(self.cursors) | set(self.backlogs) if n not in self.groups.groups])

    def _forget(self, names: list[str]) -> None:
        for name in names:
            cursor = self.cursors.pop(name, None)
            if cursor is not None:
                cursor.close()
                self._path(name).unlink(missing_ok=True)
            for backlog in self.backlogs.pop(name, []):
                self._drop_backlog(backlog)

    def tick(self) -> None:
        """On the stats tick: each group's floor (and each backlog's), the files synced, the
        backlogs wholly gone from their groups deleted (first a restore that a storage policy
        applied just now allows, before any frame is offered under it)."""
        if not self.enabled:
            return
        self._restore_if_due()
        for name, cursor in self.cursors.items():
            group = self.groups.groups.get(name)
            if group is not None:
                cursor.floor(lowest_held(group, self.retention.next_pos))
            cursor.sync()
        for name in list(self.backlogs):
            group = self.groups.groups.get(name)
            if group is not None:
                self._backlog_floors(group)

    def _backlog_floors(self, group: Group) -> None:
        """Each backlog's floor; one whose messages all left the group goes with its file."""
        if not group.spilled_from:  # reset (Groups.reset): what it had not read yet goes too
            for backlog in self.backlogs[group.name]:
                backlog.after = backlog.store.end_pos if backlog.store is not None else backlog.after
        lowest: dict[int, int] = {}
        for unit in held_units(group):
            if unit.pos >= RESTORED_BASE:
                slot = unit.pos // RESTORED_BASE
                lowest[slot] = min(lowest.get(slot, unit.pos), unit.pos)
        keep = []
        for backlog in self.backlogs[group.name]:
            if backlog.read_all and backlog.slot not in lowest and group.name in self.cursors:  # its newer file
                self._drop_backlog(backlog)
                continue
            keep.append(backlog)
            backlog.cursor.floor(lowest.get(backlog.slot, backlog.base + backlog.after + 1) - backlog.base)
            backlog.cursor.sync()
        if keep:
            self.backlogs[group.name] = keep
        else:
            del self.backlogs[group.name]

    def _drop_backlog(self, backlog: Backlog) -> None:
        backlog.cursor.close()
        backlog.path.unlink(missing_ok=True)
        self._slots.pop(backlog.slot, None)

    def close(self) -> None:
        for cursor in self.cursors.values():
            cursor.close()
        for backlog in self._slots.values():
            backlog.cursor.close()

    def _start(self, group: Group) -> None:
        first = lowest_held(group, self.retention.next_pos)
        self._open(group, first)

    def _open(self, group: Group, first: int) -> bool:
        """The group's cursor file written anew from `first` in this incarnation's positions; False
        (logged once, tried again next turn) if the disk refused it: the old file, if any, stands."""
        cursor = GroupCursor(self._path(group.name))
        s = group.settings
        try:
            cursor.recover()
            cursor.compact(CursorState(s.prefixes, round(s.ack_timeout * 1000), s.max_deliveries, s.dead_letter,
                                       first_pos=first, incarnation=self.incarnation, floor=first))
        except OSError as exc:
            cursor.close()
            if group.name not in self._failed:
                log.error("consumer group %s: its cursor file cannot be written (%s); tried again", group.name, exc)
                self._failed.add(group.name)
            return False
        self._failed.discard(group.name)
        self.cursors[group.name] = cursor
        return True

    def _path(self, name: str, backlog: int = 0) -> Path:
        assert self.root is not None
        return self.root / (name.encode().hex() + (f".{backlog}" if backlog else "") + ".cur")

    # ------------------------------------------------------------ at start

    def restore(self) -> None:
        """Restore now if the queue keeps frames on disk, else as soon as a storage policy says so
        (on the stats tick that applies it: `tick`)."""
        self._wanted = True
        self._restore_if_due()

    def _restore_if_due(self) -> None:
        if not self.restored and self._wanted and self.enabled:
            self._begin_restore()

    def _begin_restore(self) -> None:
        """Read the cursor files and make each a backlog of its group (fast: nothing is read from
        the stores yet, nothing forwarded)."""
        self.restored = True
        root = self.root
        if root is None or not root.is_dir():
            return
        files: dict[str, list[tuple[int, Path]]] = {}
        for path in sorted(root.glob("*.cur")):
            match = FILE_NAME.match(path.name)
            name = group_name(path) if match is None else _name(match.group(1))
            if match is None or name is None:
                log.warning("cursor file %s is not a group's (a name that is not hex); dropped", path)
                path.unlink(missing_ok=True)
                continue
            # The group's current file (no number) is the newest backlog.
            files.setdefault(name, []).append((int(match.group(2) or MAX_SLOTS), path))
        for name, paths in files.items():
            self._restore_group(name, [path for _, path in sorted(paths)])

    def _restore_group(self, name: str, paths: list[Path]) -> None:
        found: list[tuple[Path, GroupCursor, CursorState]] = []
        for path in paths:
            cursor = GroupCursor(path)
            state = cursor.recover()
            if cursor.cut:
                log.warning("cursor file %s: a torn or damaged tail of %d bytes cut", path, cursor.cut)
            if not state.first_pos:
                log.warning("cursor file %s is not a group's (unreadable); dropped", path)
                cursor.close()
                path.unlink(missing_ok=True)
                continue
            found.append((path, cursor, state))
        if not found:
            return
        newest = found[-1][2]
        # A group whose members joined before a late storage policy is that group: its backlog too.
        group = self.groups.adopt(protocol.GroupRecord(name, newest.prefixes, newest.ack_timeout_ms,
                                                       newest.max_deliveries, newest.dead_letter, 0, []))
        group.spilled_from = self.retention.next_pos  # new frames wait on disk until its backlogs are read
        backlogs = []
        for n, (path, cursor, state) in enumerate(found, 1):
            if path != self._path(name, n):
                try:
                    os.replace(path, self._path(name, n))  # numbered, oldest first: the current name is free
                    fsync_directory(path.parent)
                except OSError as exc:
                    log.error("consumer group %s: cursor file %s cannot be renamed (%s); its new messages "
                              "are not kept across a restart until the next one", name, path, exc)
                    self._stuck.add(name)
                    cursor.close()
                    continue
            backlogs.append(self._backlog(name, n, cursor, state))
        self.backlogs[name] = backlogs
        if name not in self._stuck:
            self._start(group)  # its new file at once (else on a turn): the group outlives another crash

    def _backlog(self, name: str, n: int, cursor: GroupCursor, state: CursorState) -> Backlog:
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        assert slot < MAX_SLOTS, "one backlog per cursor file found at start"
        cursor.path = self._path(name, n)
        store = self.disk.archived.get(state.incarnation)
        if store is None:  # its frames aged out, or it had none left: nothing to read
            log.info("consumer group %s: no stored frames of %s left", name, state.incarnation)
        backlog = self._slots[slot] = Backlog(slot, cursor.path, cursor, store, state.floor - 1)
        return backlog

    # ------------------------------------------------------------ reading a backlog (GroupSpill)

    def read_backlog(self, group: Group, max_bytes: int) -> bool:
        """A page of the group's oldest backlog not read yet, offered to it alone; False when it
        has none left to read (the new stream's frames come next)."""
        for backlog in self.backlogs.get(group.name, ()):
            if backlog.store is not None and self.disk.archived.get(backlog.cursor.state.incarnation) \
                    is not backlog.store:  # purged, or its retention deleted it all: gone with its messages
                log.warning("consumer group %s: the stored frames of %s are gone (purged or aged out); "
                            "its backlog there with them", group.name, backlog.cursor.state.incarnation)
                backlog.store = None
            store = backlog.store
            if store is None or backlog.read_all:
                continue
            state = backlog.cursor.state
            page = fetch_below_memory(store, backlog.after, store.end_pos, list(state.prefixes),
                                      max_bytes)
            for topic, body in page.frames:
                self._offer(group, backlog, topic, body)
            backlog.after = max(page.scanned_to, backlog.after + 1)
            return True
        return False

    def _offer(self, group: Group, backlog: Backlog, topic: bytes, body: bytes) -> None:
        """The frame's messages that did not leave the group, as runs."""
        try:
            d = protocol.decode_delivery(body)
        except ProtocolError:
            log.exception("consumer group %s: a stored frame does not decode; passed over", group.name)
            return
        state = backlog.cursor.state
        attrs = [tuple(a) for a in d.attrs] if d.attrs else None
        payloads = [protocol.as_bytes(p) for p in d.payloads]
        start = None
        for i in range(len(d.seqs) + 1):
            keep = i < len(d.seqs) and not state.is_done(d.pos, i)
            if keep and start is None:
                start = i
            elif not keep and start is not None:
                self.groups.offer(backlog.base + d.pos, topic, d.publisher, d.sent_ns, d.seqs, payloads, attrs,
                                  only=group, start=start, end=i, topics=d.topics)
                start = None


def _name(hex_name: str) -> str | None:
    try:
        return bytes.fromhex(hex_name).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def group_name(path: Path) -> str | None:
    """The group a cursor file is of (its name is the group's in hex), or None."""
    match = FILE_NAME.match(path.name)
    return _name(match.group(1)) if match is not None else None


def held_units(group: Group) -> list[Any]:
    return group.waiting() + [u for flying in group.in_flight.values() for u in flying]


def lowest_held(group: Group, next_pos: int) -> int:
    """The lowest position of this stream whose messages the group may still hand out (`next_pos`:
    none held); a restored backlog's messages are its own file's."""
    lowest = min((u.pos for u in held_units(group) if u.pos < RESTORED_BASE), default=next_pos)
    return min(lowest, group.spilled_from) if group.spilled_from else lowest
