"""A disk-retained queue's consumer groups across restarts: their cursor files, kept and read back.

While the exchange runs, each group of a queue with a disk storage policy has a cursor file
(exchange/group_cursor.py) under `<store root>/groups/`: started when the group is first seen,
appended with what left the group (acked, dead-lettered) at each turn of the loop, its floor (the
lowest position the group still holds) and a sync on the stats tick. So what a crash can undo is
the acks of the last stats interval: those messages are delivered again (docs/guarantees.md).

Only without a replica (with one, the replica's adoption keeps the groups: exchange/group_sync.py).
A restarted exchange reads the cursor files before it reads any publisher or member (or, with a
storage policy that comes late, on the stats tick that applies it; no cursor file is written
before). The frames of a group's incarnation are in that incarnation's store (archived, read
only); each message of the group's topics at or above its floor that did not leave it is
forwarded again, in frames of the new stream (as the replica's adoption does, so subscribers
drop them as duplicates), offered to no group: a page per loop turn (`restore_step`), after the
exchange said ready, while publishers are held and members wait (exchange/forwarder.py), so each
group's frames follow each other with nothing between, and paused while the store's disk refuses
writes (the backlog waits on disk, not in memory). The groups are then spilled
(exchange/group_spill.py) from the first of those frames: each reads its own back from the new
store a read-ahead at a time, skipping the other groups' forwarded frames (`Group.spill_gap`),
then takes the new stream's frames. Each cursor file is rewritten (atomically) in the new
incarnation's positions once the frames forwarded are written and synced; until then it keeps
the earlier incarnation's, so a crash restores from it again. Delivery counts start again from 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exchange.chains import PrefixChains
from exchange.disk_tail import GROUPS_DIR, DiskTail
from exchange.group_cursor import CursorState, GroupCursor
from exchange.grouping import frames_of
from exchange.groups import Group, Groups
from exchange.retention import Retention
from exchange.store_hooks import fetch_below_memory
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

RESTORE_PAGE_BYTES = 4 << 20  # stored bodies read at once while forwarding a backlog again
Send = Callable[..., int]  # Fanout.send


@dataclass
class _Job:
    """A restored group's backlog being forwarded again."""
    group: Group
    state: CursorState
    store: Any  # its incarnation's SegmentStore (None: gone)
    after: int  # the last position of `store` scanned
    first: int = 0  # where its frames start in the new stream (0: not begun)
    forwarded: int = 0  # messages


class GroupCursors:
    def __init__(self, groups: Groups, retention: Retention, disk: DiskTail, incarnation: str,
                 replicated: bool = False) -> None:
        self.groups, self.retention, self.disk, self.incarnation = groups, retention, disk, incarnation
        self.replicated = replicated  # the replica's adoption keeps the groups (exchange/group_sync.py)
        self.cursors: dict[str, GroupCursor] = {}
        self._done: dict[str, list[tuple[int, int, int]]] = {}  # left each group since the last turn
        self.restored = False  # the cursor files earlier incarnations left were read: new ones may be written
        self._restore_with: tuple[Send, PrefixChains] | None = None
        # Restored groups whose files still say the earlier incarnation's positions, until the frames
        # forwarded for them are written and synced: (group, its frames [first, end), all forwarded below last).
        self._moving: dict[str, tuple[Group, int, int, int]] = {}
        self._restoring = False
        self._jobs: list[_Job] = []  # the groups whose backlogs are still to forward, the current first
        self._restored: list[tuple[Group, int, int]] = []  # each group's own forwarded frames: [first, end)
        self._failed: set[str] = set()  # groups whose cursor file the disk refused (logged once)

    @property
    def root(self) -> Path | None:
        return self.disk.root / GROUPS_DIR if self.disk.root is not None else None

    @property
    def enabled(self) -> bool:
        return self.disk.store is not None and self.disk.policy.on_disk and not self.replicated

    def left(self, group: Group, pos: int, idx: int, count: int) -> None:
        """Groups.on_done: written at the next turn."""
        if self.enabled:
            self._done.setdefault(group.name, []).append((pos, idx, count))

    # ------------------------------------------------------------ while running

    def turn(self) -> None:
        """Each turn of the loop: cursors for new groups, the ranges that left, files of groups gone.
        No file is written before the earlier incarnations' were restored (a storage policy that
        came late: the restore runs first, here or on the stats tick)."""
        if not self.enabled or self.root is None:
            if self.cursors:  # the queue was made memory only: its groups no longer outlive the exchange
                self._forget(list(self.cursors))
            return
        self._restore_if_due()
        if not self.restored:
            return
        self._move_restored()
        for name, group in self.groups.groups.items():
            if name not in self.cursors and name not in self._moving:
                self._start(group)
        for name, ranges in self._done.items():
            cursor = self.cursors.get(name)
            if cursor is not None:
                cursor.done(ranges)
        self._done = {name: ranges for name, ranges in self._done.items() if name in self._moving}
        self._forget([n for n in self.cursors if n not in self.groups.groups])

    def _forget(self, names: list[str]) -> None:
        for name in names:
            self.cursors.pop(name).close()
            self._path(name).unlink(missing_ok=True)

    def tick(self) -> None:
        """On the stats tick: each group's floor, and the files synced (first a restore that a
        storage policy applied just now allows, before any frame is offered under it)."""
        if not self.enabled:
            return
        self._restore_if_due()
        for name, cursor in self.cursors.items():
            group = self.groups.groups.get(name)
            if group is not None:
                cursor.floor(lowest_held(group, self.retention.next_pos))
            cursor.sync()

    def close(self) -> None:
        for cursor in self.cursors.values():
            cursor.close()

    def _start(self, group: Group) -> None:
        first = lowest_held(group, self.retention.next_pos)
        self._open(group, first, (0, 0))

    def _open(self, group: Group, first: int, gap: tuple[int, int]) -> bool:
        """The group's cursor file written anew from `first` in this incarnation's positions; False
        (logged once, tried again next turn) if the disk refused it: the old file, if any, stands."""
        cursor = GroupCursor(self._path(group.name))
        s = group.settings
        try:
            cursor.recover()
            cursor.compact(CursorState(s.prefixes, round(s.ack_timeout * 1000), s.max_deliveries, s.dead_letter,
                                       first_pos=first, incarnation=self.incarnation, floor=first, gap=gap))
        except OSError as exc:
            cursor.close()
            if group.name not in self._failed:
                log.error("consumer group %s: its cursor file cannot be written (%s); tried again", group.name, exc)
                self._failed.add(group.name)
            return False
        self._failed.discard(group.name)
        self.cursors[group.name] = cursor
        return True

    def _path(self, name: str) -> Path:
        assert self.root is not None
        return self.root / (name.encode().hex() + ".cur")

    # ------------------------------------------------------------ at start

    def restore_when_stored(self, send: Send, chains: PrefixChains) -> None:
        """Begin the restore now if the queue keeps frames on disk, else as soon as a storage
        policy says so; the loop then calls `restore_step` while `restoring`."""
        self._restore_with = (send, chains)
        self._restore_if_due()

    @property
    def restoring(self) -> bool:
        """Backlogs are being forwarded again: publishers are held and members wait (exchange/forwarder.py),
        so the frames forwarded for each group follow each other with nothing between."""
        return self._restoring

    def _restore_if_due(self) -> None:
        if not self.restored and not self._restoring and self._restore_with is not None and self.enabled:
            self._begin_restore()

    def restore(self, send: Send, chains: PrefixChains) -> None:
        """The whole restore at once (see the module's docstring), or as far as the disk takes it."""
        if self._restore_with is None:
            self._restore_with = (send, chains)
        self._restore_if_due()
        while self._restoring and not self.disk.full:
            self.restore_step()

    def _begin_restore(self) -> None:
        """Read the cursor files and adopt their groups (fast: nothing is forwarded yet)."""
        self._restoring = True
        root = self.root
        if root is None or not root.is_dir():
            return
        for path in sorted(root.glob("*.cur")):
            cursor = GroupCursor(path)
            state = cursor.recover()
            cursor.close()
            if cursor.cut:
                log.warning("cursor file %s: a torn or damaged tail of %d bytes cut", path, cursor.cut)
            name = group_name(path)
            if not state.first_pos or name is None:
                log.warning("cursor file %s is not a group's (unreadable, or a name that is not hex); dropped", path)
                path.unlink(missing_ok=True)
                continue
            # A group whose members joined before a late storage policy is that group: its backlog too.
            group = self.groups.adopt(protocol.GroupRecord(name, state.prefixes, state.ack_timeout_ms,
                                                           state.max_deliveries, state.dead_letter, 0, []))
            self._moving[name] = (group, 0, 0, 0)  # its file stands until the forwarded frames are durable
            store = self.disk.archived.get(state.incarnation)
            if store is None:  # its frames aged out, or it had none left: the group goes on, empty
                log.info("consumer group %s: no stored frames of %s left", name, state.incarnation)
            self._jobs.append(_Job(group, state, store, state.floor - 1))

    def restore_step(self, max_bytes: int = RESTORE_PAGE_BYTES) -> None:
        """One page of the current group's backlog forwarded again (a loop turn's share: the exchange
        stays ready and answers its HCM however long the backlog); the end of the restore at the last."""
        if self.disk.full:  # its disk refuses writes or is behind: the backlog waits on disk, not in memory
            return
        if not self._jobs:
            self._end_restore()
            return
        job = self._jobs[0]
        if not job.first:
            job.first = self.retention.next_pos
        store = job.store
        if store is not None and job.after + 1 < store.end_pos:
            assert self._restore_with is not None
            send, chains = self._restore_with
            page = fetch_below_memory(store, job.after, store.end_pos, list(job.state.prefixes), max_bytes)
            for topic, body in page.frames:
                job.forwarded += self._frame_again(topic, body, job.state, send, chains)
            self.disk.flush(time.monotonic())
            if page.scanned_to > job.after:
                job.after = page.scanned_to
                if job.after + 1 < store.end_pos:
                    return
        self._jobs.pop(0)
        self._restored.append((job.group, job.first, self.retention.next_pos))
        log.info("consumer group %s restored from its cursor: %d pending messages", job.group.name, job.forwarded)

    def _end_restore(self) -> None:
        last = self.retention.next_pos
        for group, first, end in self._restored:  # the frames after a group's own were forwarded for the others
            if end > first:
                group.spilled_from = min(group.spilled_from, first) if group.spilled_from else first
                group.spill_gap = (end, last)
            self._moving[group.name] = (group, first, end, last)
        self._restored = []
        self._restoring, self.restored = False, True
        self._move_restored()

    def _move_restored(self) -> None:
        """The restored groups' cursor files rewritten in this incarnation's positions, once every
        frame forwarded for them is written and synced. Until then (a disk that refuses writes:
        the exchange says storage_full and holds its publishers) the files keep the earlier
        incarnation's positions, so a crash restores from them again; what left the groups
        meanwhile waits in `_done`, appended after the move."""
        if not self._moving:
            return
        last = max(last for _, _, _, last in self._moving.values())
        if self.disk.durable_before(self.retention.next_pos) < last:
            self.disk.sync(time.monotonic())
            if self.disk.durable_before(self.retention.next_pos) < last:
                return
        for name, (group, first, end, last) in list(self._moving.items()):
            if self.groups.groups.get(name) is not group:  # deleted meanwhile: it must not come back
                del self._moving[name]
                self._path(name).unlink(missing_ok=True)
            elif self._open(group, first, (end, last) if last > end else (0, 0)):
                del self._moving[name]

    @staticmethod
    def _frame_again(topic: bytes, body: bytes, state: CursorState, send: Send, chains: PrefixChains) -> int:
        try:
            d = protocol.decode_delivery(body)
        except ProtocolError:
            log.exception("a stored frame does not decode; passed over")
            return 0
        topics = d.message_topics(topic)
        keep = [i for i in range(len(d.seqs))
                if topics[i].startswith(state.prefixes) and not state.is_done(d.pos, i)]
        if not keep:
            return 0
        attrs_of = {a[0]: a for a in d.attrs or ()}
        attrs = [[n, *attrs_of[i][1:]] for n, i in enumerate(keep) if i in attrs_of]
        for frame in frames_of(chains, [d.seqs[i] for i in keep], [topics[i] for i in keep],
                               [protocol.as_bytes(d.payloads[i]) for i in keep], attrs):
            send(frame.topic, d.publisher, d.sent_ns, frame.seqs, frame.payloads, sum(map(len, frame.payloads)),
                 frame.attrs, offer=False, topics=frame.topics)
        return len(keep)


def group_name(path: Path) -> str | None:
    """The group a cursor file is of (its name is the group's in hex), or None."""
    try:
        return bytes.fromhex(path.stem).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def lowest_held(group: Group, next_pos: int) -> int:
    """The lowest position whose messages the group may still hand out (`next_pos`: none held)."""
    units = group.waiting() + [u for flying in group.in_flight.values() for u in flying]
    lowest = min((u.pos for u in units), default=next_pos)
    return min(lowest, group.spilled_from) if group.spilled_from else lowest
