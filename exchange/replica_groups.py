"""A replica's copy of its primary's consumer groups, in memory and on its host's disk (protocol
section 7.6).

The replica holds each copied incarnation's newest group state (a `groups` frame) and the acks
since (`done` frames) in memory for an adoption (exchange/replica_adoption.py): `HeldGroups`, which
keeps and forgets the two together. With a disk storage policy it also writes them to a file
beside the copy's segment store, `<store dir>/groups.cur`,
so that an exchange and its replica dying together (both processes SIGKILLed, or both hosts
restarted with their disks) keep their groups: the restarted replica adopts the store
(exchange/replica_disk.py) and reads the file when the exchange's next incarnation asks.

The file has a group cursor file's framing (exchange/group_cursor.py: length u32 | CRC-32 u32 |
payload, little-endian); each payload is the protocol frame as the primary sent it (`groups` or
`done`, section 7.6) with its proof replaced by STORED_PROOF (the copy secret never goes to disk).
A `groups` record replaces what came before it, a `done` record adds to it. Reading stops at the
first torn, damaged or malformed record (each is checked as a frame from the wire is), so a crash
leaves a prefix of what was written. A state record is appended, or the file rewritten atomically
as that one record once it would grow past COMPACT_RATIO times the state. Records are written
before the frame is handled further (a killed process loses none: the page cache has them) and
synced on the stats tick, as the copy's store is. A record the disk refuses is left out whole;
the next state rewrites the file (until then a crash undoes those acks: delivered again).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from exchange.group_cursor import COMPACT_RATIO, COMPACT_SLACK_BYTES, framed, payloads
from exchange.journal_format import write_whole
from exchange.replica_adoption import Adoptions, needed_from
from exchange.replica_disk import ReplicaDisk
from exchange.retention import Retention
from exchange.segment_store import SegmentStore
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

FILE_NAME = "groups.cur"
# A file holds at most this much: acks come with no state to compact them when the state is too big
# to copy (group_sync.MAX_GROUP_STATE); past it they are left out (a crash then delivers them again)
# until a state rewrites the file.
MAX_FILE_BYTES = 64 << 20
STORED_PROOF = b"\0" * protocol.MIN_PROOF  # in place of the copy secret, which stays in memory

Done = dict[str, list[tuple[int, int, int]]]  # group → (pos, index, count) of messages that left it


class HeldGroups:
    """The consumer groups a replica holds of each primary incarnation: its newest state and the
    acks since, kept and forgotten together, written to the group file beside the copy's store
    (`store`: None without one), the pins they put on the copies, and the answers to `adopt` and
    `mark` made of them."""

    def __init__(self) -> None:
        self.state: dict[str, list[protocol.GroupRecord]] = {}
        self.done: dict[str, Done] = {}  # since that state
        self.files = GroupFiles()
        self.adoptions = Adoptions()

    def keep_state(self, incarnation: str, groups: list[protocol.GroupRecord], copies: Mapping[str, Retention],
                   disk: ReplicaDisk) -> None:
        """The incarnation's new state replaces what was held, acks included (the state has them),
        and its copy keeps the frames of its pending messages; the groups of the incarnations before
        it (adopted by it) go, and their copies' pins."""
        self.state[incarnation] = groups
        self.done.pop(incarnation, None)
        self.adoptions.over(incarnation)
        store = disk.stores.get(incarnation)
        if store is not None:
            self.files.state(store.directory, incarnation, groups)
        for older, stored in disk.adopted.items():  # an earlier process's: adopted by this one
            if older != incarnation:
                self.forget(older, stored)
        pins = [needed_from(g) for g in groups]
        # Frames on this host's disk stay there for adoption (exchange/replica_adoption.py), not in memory.
        copies[incarnation].protect_from = min(pins) if pins and disk.store_of(incarnation) is None else None
        for older in list(copies):
            if older == incarnation:
                break
            copies[older].protect_from = None
            self.forget(older)

    def keep_done(self, incarnation: str, done: Done, store: SegmentStore | None) -> None:
        """Acks since the state; before any state none are kept (the first state has them)."""
        if incarnation not in self.state:
            return
        held = self.done.setdefault(incarnation, {})
        for group, ranges in done.items():
            held.setdefault(group, []).extend(ranges)
        if store is not None:
            self.files.done(store.directory, incarnation, done)

    def reopened(self, incarnation: str, store: SegmentStore | None) -> None:
        """The incarnation's copy starts afresh (a new follow, a jump): its store's directory, group
        file included, was wiped; what is held is written again."""
        if store is None or incarnation not in self.state:
            return
        self.files.state(store.directory, incarnation, self.state[incarnation])
        if self.done.get(incarnation):
            self.files.done(store.directory, incarnation, self.done[incarnation])

    def forget(self, incarnation: str, store: SegmentStore | None = None) -> None:
        """The incarnation's groups go (adopted by its successor, or its copy dropped); with its
        store, the store's group file too."""
        self.state.pop(incarnation, None)
        self.done.pop(incarnation, None)
        if store is not None:
            self.files.forget(store.directory)

    def marked(self, mark: protocol.Mark) -> bytes | None:
        """`marked` once we hold every group frame the primary sent before the mark: frames come in
        order on one connection, so that is once we hold a state of its incarnation (a `done` that
        came before the first state is in that state, each later one is kept). Without one (this
        replica restarted, or the state went with a dropped copy) no answer: the primary's members
        keep their acks' credit until it said `follow` again and sent its state."""
        return protocol.encode_marked(mark.incarnation, mark.serial) if mark.incarnation in self.state else None

    def answer(self, adopt: protocol.Adopt, copies: dict[str, Retention], applied: tuple[str, ...],
               disk: ReplicaDisk, route: bytes = b"") -> bytes | None:
        """The answer to `adopt` (exchange/replica_adoption.py), from the copies or from a store an
        earlier process of this replica left (`disk.adopted`) with its group file; None for a paged
        adoption being worked out: `turn` answers it to `route` once it is."""
        stored = stored_groups(disk.adopted, copies, self.state, self.done)
        return self.adoptions.answer(adopt, stored | copies, self.state, self.done, applied, ServedStores(disk), route)

    @property
    def planning(self) -> bool:
        return self.adoptions.planning

    def turn(self, answer: Callable[[bytes, bytes | None], None]) -> None:
        """Once per loop turn: a step of an adoption plan being worked out; once it is, the ask that
        waits for it answered (`answer(route, reply)`)."""
        answered = self.adoptions.turn()
        if answered is not None:
            answer(*answered)


class ServedStores(Mapping[str, SegmentStore]):
    """The store serving each incarnation (`disk.store_of`) as it is at each read: an adoption plan
    worked out over turns must not read one a transfer replaced (closed, its files moved)."""

    def __init__(self, disk: ReplicaDisk) -> None:
        self.disk = disk

    def __getitem__(self, incarnation: str) -> SegmentStore:
        store = self.disk.store_of(incarnation)
        if store is None:
            raise KeyError(incarnation)
        return store

    def __iter__(self) -> Iterator[str]:
        return iter({**self.disk.adopted, **self.disk.stores})

    def __len__(self) -> int:
        return len({**self.disk.adopted, **self.disk.stores})


class GroupFiles:
    """The group files of the copies' stores: `state` and `done` as frames come, `sync` on the tick."""

    def __init__(self) -> None:
        self._sizes: dict[Path, tuple[int, int]] = {}  # file → (its size, its last state record's size)
        self._behind: set[Path] = set()  # a record refused: rewritten by the next state

    def state(self, directory: Path, incarnation: str, groups: list[protocol.GroupRecord]) -> None:
        """The incarnation's new group state: what the file said before is replaced."""
        path = directory / FILE_NAME
        record = framed(protocol.encode_groups(incarnation, groups, STORED_PROOF))
        size, _ = self._sizes.get(path, (0, 0))
        grown = size + len(record) > COMPACT_RATIO * len(record) + COMPACT_SLACK_BYTES
        if grown or path in self._behind or not path.exists():
            try:
                directory.mkdir(parents=True, exist_ok=True)  # the store creates it at its first write
                write_whole(path, record)
            except OSError as exc:
                self._refused(path, exc)
                return
            self._behind.discard(path)
            self._sizes[path] = (len(record), len(record))
        else:
            self._append(path, record, len(record))

    def done(self, directory: Path, incarnation: str, done: Done) -> None:
        """Messages that left the groups since the state."""
        path = directory / FILE_NAME
        if path in self._sizes and path not in self._behind:
            if not path.exists():  # wiped with its store: acks alone would make a file without a state
                self._behind.add(path)
                return
            self._append(path, framed(protocol.encode_done(incarnation, done, STORED_PROOF)))

    def forget(self, directory: Path) -> None:
        """The incarnation's groups were adopted by its successor (or its store went): no file."""
        path = directory / FILE_NAME
        self._sizes.pop(path, None)
        self._behind.discard(path)
        path.unlink(missing_ok=True)

    def sync(self) -> None:
        for path in list(self._sizes):
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:  # its store was deleted
                self._sizes.pop(path, None)
                continue
            try:
                os.fdatasync(fd)
            except OSError as exc:
                log.warning("group file %s: sync refused (%s)", path, exc)
            finally:
                os.close(fd)

    def _append(self, path: Path, record: bytes, state_size: int = 0) -> None:
        size, last_state = self._sizes.get(path, (0, 0))
        if size + len(record) > MAX_FILE_BYTES:
            self._refused(path, OSError(f"the file would pass {MAX_FILE_BYTES} bytes"))
            return
        try:
            with open(path, "ab") as out:
                out.write(record)
        except OSError as exc:
            try:
                os.truncate(path, size)  # no part of it may stay: later records would be cut with it
            except OSError:
                pass
            self._refused(path, exc)
            return
        self._sizes[path] = (size + len(record), state_size or last_state)

    def _refused(self, path: Path, exc: OSError) -> None:
        if path not in self._behind:
            log.warning("group file %s: a record refused (%s); rewritten with the next state", path, exc)
        self._behind.add(path)


def load(directory: Path) -> tuple[list[protocol.GroupRecord], Done] | None:
    """The group state and the acks since that a store's group file holds, or None (no file, or no
    whole state record in it)."""
    try:
        data = (directory / FILE_NAME).read_bytes()
    except OSError:
        return None
    groups: list[protocol.GroupRecord] | None = None
    done: Done = {}
    for payload, _ in payloads(data):
        try:
            frame = protocol.decode_replica_request(payload)
        except ProtocolError:
            break
        if isinstance(frame, protocol.GroupState):
            groups, done = frame.groups, {}
        elif isinstance(frame, protocol.GroupsDone):
            for name, ranges in frame.done.items() if groups is not None else ():  # none before a state
                done.setdefault(name, []).extend(ranges)
        else:
            break
    return (groups, done) if groups is not None else None


def stored_groups(adopted: Mapping[str, SegmentStore], copies: Mapping[str, Retention],
                  group_state: dict[str, list[protocol.GroupRecord]],
                  group_done: dict[str, Done]) -> OrderedDict[str, Retention]:
    """The incarnations whose groups only a store an earlier process of this replica left knows
    (their files read into `group_state` and `group_done` once), the oldest state first, each as
    an empty copy ending where its store ends: their frames are all on disk."""
    stored: OrderedDict[str, Retention] = OrderedDict()
    for incarnation, store in sorted(adopted.items(), key=lambda item: _modified(item[1].directory)):
        if incarnation in copies:
            continue
        if incarnation not in group_state:
            found = load(store.directory)
            if found is not None:
                group_state[incarnation], group_done[incarnation] = found
        if incarnation in group_state:
            stored[incarnation] = Retention(0, 0, first_pos=max(store.end_pos, 1))  # nothing in memory
    return stored


def _modified(directory: Path) -> float:
    """When a store's group file was last written (0: none)."""
    try:
        return (directory / FILE_NAME).stat().st_mtime
    except OSError:
        return 0.0
