"""The replica process: a second copy of one exchange's stream, on another host.

Binds `repl`, where its primary copies every frame it retains, and `replay`, where subscribers fetch
from the copies as from an exchange's retention. It keeps one copy per primary incarnation (at most
MAX_COPIES), sealed once a subscriber asks for an ended incarnation's position; only the primary
incarnation the cluster vouches for may copy (exchange/replica_trust.py). It also holds the
primary's consumer groups (exchange/replica_groups.py) and admin commands, which a restarted
exchange adopts (exchange/replica_adoption.py). Frames are range-checked and a copy must continue
what is held. With a disk storage policy each copy is also written to a segment store on this host
(exchange/replica_disk.py), served below the copy's memory tail; a store that cannot keep its
copy is answered `broken`, and ends the process for a restart (exchange/replica_health.py). Which
incarnations are sealed: exchange/replica_seals.py. The whole design: docs/replication.md.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq

from exchange.replay import ReplayServer, replay_socket
from exchange.replica_disk import ReplicaDisk
from exchange.replica_groups import Done, GroupFiles, HeldGroups
from exchange.replica_health import StoreHealth
from exchange.replica_seals import Seals
from exchange.replica_trust import PrimaryTrust, ProofFrame
from exchange.replication import max_copy_frame
from exchange.retention import Retention
from roq import protocol
from roq.config import Config
from roq.errors import ProtocolError
from roq.listen import listening
from roq.security import SERVER, Gatekeeper, load_keys, peer_role

log = logging.getLogger(__name__)

POLL_MS = 100
MAX_COPIES = 8  # incarnations kept; the oldest copy goes first
MAX_APPLIED = 256  # admin commands remembered per exchange (the newest)


class Replica:
    def __init__(self, context: zmq.Context, config: Config, xid: str, bind_host: str,
                 advertise_host: str, gatekeeper: Gatekeeper | None = None, store_root: Path | None = None) -> None:
        """`store_root`: where the copies' segment stores go when the queue's policy keeps frames on
        disk (None: memory only)."""
        self.config = config
        self.disk = ReplicaDisk(store_root, sync_before_answer=config.exchange.store_sync == "confirm")
        self.health = StoreHealth(self.disk)  # a store that cannot keep its copy: `broken`, then a restart
        self.gave_up = ""  # why run() ended this replica process for a restart (exit code STORAGE)
        self.xid = xid
        self.incarnation = f"{xid}~r.{int(time.time() * 1000) % 10**9}"
        self.copies: OrderedDict[str, Retention] = OrderedDict()  # primary incarnation → its copy
        self.groups = HeldGroups()  # what a restarted exchange adopts (exchange/replica_groups.py)
        self.pin_cap = config.exchange.retention_bytes + config.exchange.group_max_bytes
        self.applied: OrderedDict[str, None] = OrderedDict()  # admin commands our exchange applied, oldest first
        self.counters: dict[str, int] = {}
        self.trust = PrimaryTrust(xid, self.counters)  # which primary frames to take
        self.seals = Seals(self.copies, self.trust, self._count)  # which incarnations to take nothing more of
        self.sealed = self.seals.sealed
        self.curve = load_keys(config.security) is not None
        self.repl = context.socket(zmq.ROUTER)
        self.repl.linger = 0
        self.repl.setsockopt(zmq.MAXMSGSIZE, max_copy_frame(config))  # libzmq drops bigger ones unread
        replay = replay_socket(context)
        if gatekeeper is not None:
            gatekeeper.guard(self.repl, "replication")
            gatekeeper.guard(replay, "replay")
        repl_port = self.repl.bind_to_random_port(f"tcp://{bind_host}")
        replay_port = listening(replay).bind_to_random_port(f"tcp://{bind_host}")
        self.replay = ReplayServer(replay, config.exchange, self._count, archives=self.copies,
                                   on_ended=self.seals.seal_ended, store_of=self.disk.store_of)
        self.repl_endpoint = f"tcp://{advertise_host}:{repl_port}"
        self.replay_endpoint = f"tcp://{advertise_host}:{replay_port}"

    def close(self) -> None:
        self.disk.close()
        self.repl.close(linger=0)
        self.replay.sock.close(linger=0)

    # The names tests and the daemon's tick read (exchange/main.py), held in `groups`.
    @property
    def group_state(self) -> dict[str, list[protocol.GroupRecord]]:
        return self.groups.state

    @property
    def group_done(self) -> dict[str, Done]:
        return self.groups.done

    @property
    def group_files(self) -> GroupFiles:
        return self.groups.files

    def _count(self, name: str, amount: int) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    def run(self, should_stop: Callable[[], bool], on_tick: Callable[[], None]) -> None:
        """Serve until `should_stop`, or until a copy's store cannot keep it (`gave_up` says why)."""
        poller = zmq.Poller()
        poller.register(self.repl, zmq.POLLIN)
        poller.register(self.replay.sock, zmq.POLLIN)
        while not should_stop():
            self._take_news()
            for sock, _ in poller.poll(0 if self.groups.planning else POLL_MS):  # a plan: a step a turn
                self._guarded(self._drain_primary if sock is self.repl else self.replay.drain)
            self._guarded(lambda: self.groups.turn(self._answer))  # a step of an adoption plan, answered once done
            now = time.monotonic()
            for copy in self.copies.values():
                if copy.protect_from is not None and copy.bytes > self.pin_cap:
                    log.warning("a copy pinned for consumer groups outgrew %d bytes: unpinned", self.pin_cap)
                    copy.protect_from = None
                copy.trim(now)
            on_tick()
            self.gave_up = self.health.give_up(now, self.sealed) or ""
            if self.gave_up:
                log.error("%s: ending this replica process so that its HCM starts it again", self.gave_up)
                return

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except zmq.ContextTerminated:
            raise
        except Exception:  # a bug must not take the copies down
            self._count("internal_errors", 1)
            log.exception("unexpected error while handling a frame; going on")

    # ------------------------------------------------------------ from the primary

    def _drain_primary(self, budget: int = 64) -> None:
        held: list[tuple[bytes, bytes | None, str | None]] = []  # answers waiting for this turn's fsync
        for _ in range(budget):
            try:
                parts = self.repl.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            if len(parts) != 2:
                self._count("malformed", 1)
                continue
            if self.curve and peer_role(parts[1]) != SERVER:
                self._count("refused_copies", 1)  # only the cluster's daemons copy into a replica
                continue
            route, payload = parts[0].bytes, parts[1].bytes
            try:
                request = protocol.decode_replica_request(payload)
            except ProtocolError as err:
                self._count("malformed", 1)
                log.warning("refusing a replication frame: %s", err)
                continue
            if not self.proof_holds(route, request):
                continue
            reply = self.handle(route, request)
            if self.disk.sync_before_answer:
                held.append((route, reply, _writes_of(request)))
            else:
                self._answer(route, reply)
        self._answer_synced(held)

    def _answer_synced(self, held: Sequence[tuple[bytes, bytes | None, str | None]]) -> None:
        """`exchange.store_sync = confirm`: a turn's answers leave, in order, once the stores its
        copy pages and follows wrote are fsync'ed (one sync per store: a group commit), so what the
        primary confirms is on both disks; a page or follow whose store refused it is answered broken."""
        if not held:
            return
        refused = self.disk.sync_written() if self.disk.sync_before_answer else set()
        now = time.monotonic()
        for route, reply, copy_of in held:
            if copy_of is not None and copy_of in refused:
                reply = self.health.broken(copy_of, now)
            self._answer(route, reply)

    def _answer(self, route: bytes, reply: bytes | None) -> None:
        if reply is None:
            return
        try:
            self.repl.send_multipart([route, reply], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the primary is gone or not reading; it asks again

    # ------------------------------------------------------------ who may copy

    def learn_primary(self, primary: dict[str, Any] | None) -> None:
        """Our HCM's news of the primary's live znode (any thread): `{"incarnation", "copy_digest"}`
        while one runs, None while none does."""
        self.trust.learn(primary)

    def _take_news(self) -> None:
        held = [(route, self.handle(route, follow), follow.incarnation)  # follows that waited for their digest
                for route, follow in self.trust.take_news() if self.trust.proof_holds(route, follow)]
        self._answer_synced(held)

    def proof_holds(self, route: bytes, request: ProofFrame) -> bool:
        """Does the frame carry its incarnation's copy secret (exchange/replica_trust.py)?"""
        return self.trust.proof_holds(route, request)

    @property
    def digests(self) -> dict[str, str]:
        return self.trust.digests

    def handle(self, route: bytes, request: ProofFrame) -> bytes | None:
        """The answer to a primary's frame whose proof held (None: `groups` and `done` get none, a
        `mark` gets `marked` once the frames before it are held)."""
        if isinstance(request, protocol.Follow):
            return self._follow(route, request)
        if isinstance(request, protocol.Copy):
            return self._copy(route, request)
        if isinstance(request, protocol.Adopt):  # from the copies, or a store an earlier process of ours left
            return self.groups.answer(request, self.copies, tuple(self.applied), self.disk, route)
        if isinstance(request, protocol.Mark):
            return None if request.incarnation in self.sealed else self.groups.marked(request)
        if isinstance(request, protocol.Applied):
            return self._applied(request)
        if isinstance(request, protocol.Fill):
            return self._fill(request)
        if isinstance(request, protocol.GroupState):
            self._store_groups(request)  # the next one replaces it
        else:
            self.groups.keep_done(request.incarnation, request.done, self.disk.stores.get(request.incarnation))
        return None

    def _follow(self, route: bytes, follow: protocol.Follow) -> bytes:
        incarnation = follow.incarnation
        if incarnation in self.sealed or incarnation.rsplit(".", 1)[0] != self.xid:
            return protocol.encode_replica_reply(protocol.SEALED, incarnation)
        if incarnation not in self.copies:
            for older in [inc for inc in (*self.copies, *self.disk.adopted) if inc != incarnation]:
                self.seals.seal(older)  # that exchange restarted: its older incarnations ended
            self._new_copy(incarnation, 0)
            log.info("following %s", incarnation)
        copy = self.copies[incarnation]
        # What it holds is not all written (with `confirm`: fsync'ed, before the answer): it vouches for nothing.
        if not self.disk.accepts(incarnation) or not self.disk.flush(incarnation):
            return self.health.broken(incarnation, time.monotonic())
        self.health.took(incarnation)
        return protocol.encode_replica_reply(protocol.FOLLOWING, incarnation, copy.next_pos if len(copy) or
                                             copy.next_pos > 1 else 0)

    def _copy(self, route: bytes, request: protocol.Copy) -> bytes | None:
        incarnation = request.incarnation
        if incarnation in self.sealed:
            return protocol.encode_replica_reply(protocol.SEALED, incarnation)
        copy = self.copies.get(incarnation)
        if copy is None:  # not followed here (this replica restarted): the primary must say follow
            return protocol.encode_replica_reply(protocol.FOLLOWING, incarnation, 0)
        # Any connection may continue a copy (a DEALER that reconnected has a new routing id): the
        # positions must continue, which is what keeps a copy whole.
        if request.first_pos > copy.next_pos and request.jump:
            # The primary no longer holds what lies between: start where it starts.
            copy = self._new_copy(incarnation, request.first_pos)
        skip = copy.next_pos - request.first_pos
        if skip < 0:
            return protocol.encode_replica_reply(protocol.FOLLOWING, incarnation, copy.next_pos)
        if not self.disk.accepts(incarnation):
            self._count("refused_pages_storage_full", 1)
            return self.health.broken(incarnation, time.monotonic())
        now = time.monotonic()
        for topic, body, messages in request.frames[skip:]:
            topics = protocol.body_topics(body)
            self.disk.append(incarnation, copy.next_pos, topic, body, messages, topics)
            copy.add(topic, body, messages, now, topics)
        self._count("copied_frames", max(0, len(request.frames) - skip))
        if not self.disk.flush(incarnation):  # held in memory meanwhile; the store writes it once its disk takes it
            return self.health.broken(incarnation, time.monotonic())
        self.health.took(incarnation)
        return protocol.encode_replica_reply(protocol.COPIED, incarnation, copy.next_pos)

    def _fill(self, fill: protocol.Fill) -> bytes | None:
        """A page of the state transfer from the primary's disk (exchange/replica_disk.py)."""
        if fill.incarnation in self.sealed or fill.incarnation not in self.copies or (
                fill.ended and fill.ended.rsplit(".", 1)[0] != self.xid):
            return protocol.encode_filled(fill.incarnation, 0, fill.end_pos, fill.ended)
        held = self.disk.fill_ended(fill) if fill.ended else self.disk.fill(fill)
        if held is None:
            self._count("refused_pages_storage_full", 1)
            return None
        self._count("filled_frames", len(fill.frames))
        return protocol.encode_filled(fill.incarnation, held, fill.end_pos, fill.ended)

    def _store_groups(self, state: protocol.GroupState) -> None:
        """Keep an incarnation's group state (exchange/replica_groups.py) if its copy is followed here."""
        if state.incarnation in self.copies and state.incarnation not in self.sealed:
            self.groups.keep_state(state.incarnation, state.groups, self.copies, self.disk)

    def _applied(self, applied: protocol.Applied) -> bytes | None:
        """The primary applied an admin command: keep the state it left, the command's id, and for a
        purge drop what the purge dropped. A repeat (the answer was lost) changes nothing more."""
        incarnation = applied.incarnation
        copy = self.copies.get(incarnation)
        if copy is None or incarnation in self.sealed:
            return None  # not followed here: the primary follows again, then sends it again
        if applied.command_id not in self.applied:
            self._store_groups(protocol.GroupState(incarnation, applied.groups, applied.proof))
            if applied.purge_upto:
                self._purge(incarnation, applied.purge_upto)
            self.applied[applied.command_id] = None
            while len(self.applied) > MAX_APPLIED:
                self.applied.popitem(last=False)
            log.info("%s applied command %s: recorded", incarnation, applied.command_id)
        return protocol.encode_recorded(incarnation, applied.command_id)

    def _purge(self, incarnation: str, upto: int) -> None:
        """The running incarnation's copy serves nothing below `upto` any more (frames pinned for its
        groups stay for adoption); the copies of the exchange's earlier incarnations go."""
        frames, messages = self.copies[incarnation].purge(upto)
        self.disk.purge(incarnation, upto)  # adopted stores of other incarnations go too
        for older in [inc for inc in self.copies if inc != incarnation]:
            del self.copies[older]
            self.disk.drop(older)
            self.groups.forget(older)
            self.seals.add(older)
        log.info("purged the copy of %s below position %d (%d frames, %d messages), earlier copies dropped",
                 incarnation, upto, frames, messages)

    def _new_copy(self, incarnation: str, first_pos: int) -> Retention:
        ex = self.config.exchange
        copy = Retention(ex.retention_seconds, ex.retention_bytes, first_pos=max(first_pos, 1))
        self.copies[incarnation] = copy
        self.copies.move_to_end(incarnation)
        self.disk.open(incarnation, max(first_pos, 1))
        self.groups.reopened(incarnation, self.disk.stores.get(incarnation))
        while len(self.copies) > MAX_COPIES:
            dropped, _ = self.copies.popitem(last=False)
            self.disk.drop(dropped)
            self.groups.forget(dropped)
            self.seals.add(dropped)
        return copy

    # ------------------------------------------------------------ from subscribers

    def seal(self, incarnation: str) -> None:
        """Take nothing more of `incarnation` (exchange/replica_seals.py)."""
        self.seals.seal(incarnation)

    def report(self) -> dict[str, int | bool]:
        return {"copies": len(self.copies), "retained_frames": sum(c.served_frames for c in self.copies.values()),
                "retained_bytes": sum(c.bytes for c in self.copies.values()), **self.disk.report(), **self.counters}


def _writes_of(request: ProofFrame) -> str | None:
    """The copy whose store must be fsync'ed before the answer to `request` leaves (`confirm`):
    a page's, and a follow's (its `following N` vouches for what the store holds)."""
    return request.incarnation if isinstance(request, (protocol.Copy, protocol.Follow)) else None


def stored(replica: Replica) -> list[str]:
    """The ended incarnations of the replica's exchange served on its `replay` (the `stored` of its
    znode, protocol section 1), oldest first: stores adopted or transferred whole, then the copies
    in the order they were followed. The one the cluster lists as running is not ended."""
    names = dict.fromkeys([*replica.disk.adopted_oldest_first(), *replica.copies])
    return [incarnation for incarnation in names if incarnation != replica.trust.running]
