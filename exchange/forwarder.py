"""The forwarding loop: publishers' ROUTER socket in, subscribers' XPUB socket out.

The loop polls the exchange's sockets and hands each to the part that serves it: publishers to
exchange/ingest.py (batches checked, forwarded, acked), subscriptions and the stream's frames to
exchange/fanout.py, fetches to exchange/replay.py, consumer group members to exchange/work.py,
the replica's replies and the journal to exchange/durability.py (acks wait there until what they
cover is durable). Between two reads it turns the groups (exchange/group_sync.py keeps them across
incarnations through the replica; exchange/dead_letters.py publishes what they gave up on),
applies admin commands (exchange/admin.py), trims retention and sends beats. The parts are built
once (exchange/parts.py); `report()` is the statistics the exchange sends to its HCM.

A journal's earlier incarnations are loaded at start and served on the replay socket, so
positions saved before a restart stay valid. A full disk never ends the loop; a replica that
sealed this incarnation, or a journal broken for good and not moved in time, does (it must
confirm nothing more). Nothing a peer sends can end the loop: decoders range-check every field,
and an unexpected error while handling one frame is logged, counted (`internal_errors`) and the
loop goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import zmq

from exchange.admin import AdminCommands
from exchange.durability import Durability
from exchange.fanout import Fanout
from exchange.group_sync import GroupSync
from exchange.ingest import PublisherIngest
from exchange.journal import Journal
from exchange.parts import Parts, Site, build_parts
from exchange.sessions import PRUNE_INTERVAL
from exchange.stats import rss_bytes
from exchange.storage import JournalHealth
from roq import records
from roq.config import ExchangeConfig

log = logging.getLogger(__name__)

POLL_MS = 100
GROUP_TICK = 0.05  # how often delayed messages, ack timeouts and silent members are checked (s)
GROUP_POLL_MS = 50


class Forwarder:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        # The parts main.py, the tests and the fuzz targets reach, by their names.
        self.config = parts.config
        self.xid, self.incarnation = parts.stream.xid, parts.stream.incarnation
        self.copy_secret = parts.stream.copy_secret
        self.stats, self.retention, self.sessions, self.chains = parts.stats, parts.retention, parts.sessions, \
            parts.chains
        self.gate, self.consumers, self.commands, self.groups = parts.gate, parts.consumers, parts.commands, \
            parts.groups
        self.front, self.back, self.replay, self.work = parts.front, parts.back, parts.replay, parts.work
        self.link, self.archives = parts.link, parts.archives
        endpoints = parts.endpoints
        self.pub_endpoint, self.sub_endpoint = endpoints.pub, endpoints.sub
        self.replay_endpoint, self.work_endpoint = endpoints.replay, endpoints.work
        self.fanout = Fanout(parts)
        self.durability = Durability(parts)
        self.ingest = PublisherIngest(parts, self.fanout, gated=self.durability.gated)
        self.durability.attach(self.fanout, self.ingest)
        self.group_sync = GroupSync(parts, self.fanout)
        self.admin = AdminCommands(parts, self.durability)
        self._next_group_tick = 0.0

    @classmethod
    def open(cls, context: zmq.Context, config: ExchangeConfig, site: Site) -> Forwarder:
        """Bind the sockets of an exchange at `site` and make its parts (exchange/parts.py)."""
        return cls(build_parts(context, config, site))

    def close(self) -> None:
        for sock in (self.front, self.back, self.replay.sock):
            sock.close(linger=0)
        self.work.close()
        self.durability.close()
        self.parts.cursors.close()

    def restore_groups(self) -> None:
        """Before reading anyone: the groups an earlier incarnation's cursor files describe, with a
        disk policy and no replica (with one, the replica's adoption stands: exchange/group_sync.py);
        a policy that comes later restores them when it is applied, before any file is written.
        Nothing is forwarded again: each group reads its backlog from the earlier store, and
        publishers are not held meanwhile (exchange/group_restore.py)."""
        self.parts.cursors.restore()

    # ------------------------------------------------------------ what main.py and the HCM see

    @property
    def sealed(self) -> bool:
        """Our replica refused to copy more of this incarnation: we must not confirm anything."""
        return self.durability.sealed

    @property
    def journal_failed(self) -> bool:
        return self.durability.journal_failed

    @property
    def journal(self) -> Journal | None:
        return self.durability.journal

    @property
    def storage(self) -> JournalHealth | None:
        return self.durability.storage

    @property
    def replica_target(self) -> str | None:
        return self.durability.replica_target

    @replica_target.setter
    def replica_target(self, endpoint: str | None) -> None:
        """Where the HCM says our replica is (from the stdin thread; the loop connects)."""
        self.durability.replica_target = endpoint

    @property
    def on_command(self) -> Callable[[str, dict[str, Any]], None]:
        return self.admin.on_command

    @on_command.setter
    def on_command(self, callback: Callable[[str, dict[str, Any]], None]) -> None:
        """`callback(id, result)` reports an admin command done."""
        self.admin.on_command = callback

    def durable_pos(self) -> int:
        return self.durability.durable_pos()

    def handle_publisher(self, ident: bytes, payload: bytes, block: Any = None, parts: Sequence[Any] = ()) -> None:
        """One publisher message, answered."""
        self.ingest.handle(ident, payload, block, parts)

    def ask_publishers_to_move(self, reason: str | None = None) -> int:
        """Tell every connected publisher to go to another exchange (before shutdown); the reason
        says why this incarnation stops, unless given."""
        return self.ingest.ask_to_move(reason if reason is not None else self.durability.leaving_reason())

    def report(self) -> records.ExchangeStats:
        """The statistics the exchange reports to its HCM every `exchange.stats_interval`."""
        retention, durability = self.retention, self.durability
        journal, link, gatekeeper = durability.journal, self.link, self.parts.site.gatekeeper
        stats = replace(self.stats.snapshot(), retained_frames=retention.served_frames, retained_bytes=retention.bytes,
                        evicted_frames=retention.evicted, known_publishers=len(self.sessions.sessions),
                        expired_publishers=self.sessions.expired, tracked_prefixes=len(self.chains.last),
                        replay_held_bytes=self.replay.held, rss_bytes=rss_bytes(), held_acks=len(self.gate),
                        replicated_to=link.held if link is not None else 0, next_pos=retention.next_pos,
                        transfer_end=link.transfer.end if link is not None else 0,
                        transferred_to=link.transfer.acked if link is not None else 0,
                        replica_error=link.broken if link is not None else "",
                        adopting_groups=self.group_sync.adoption.waiting_groups,
                        adoption_stalled_s=round(self.group_sync.adoption.stalled_for(time.monotonic()), 1),
                        consumers=self.consumers.lags(retention), groups=self.groups.stats(),
                        storage_full=durability.storage_full, storage_error=durability.storage_error,
                        journal_errors=journal.errors if journal is not None else 0,
                        journal_pending_bytes=journal.pending_bytes if journal is not None else 0,
                        **self.parts.disk.figures())
        if gatekeeper is None:
            return stats
        return replace(stats, refused_connections=gatekeeper.refused, refused_over_limit=gatekeeper.refused_limit,
                       refused_permission=gatekeeper.refused_permission,
                       permissions_version=gatekeeper.permissions_version)

    # ------------------------------------------------------------ the loop

    def run(self, should_stop: Callable[[], bool], on_tick: Callable[[], None], until_sealed: bool = True) -> None:
        """Forward until `should_stop()`, or (`until_sealed`) until this incarnation is sealed or its
        journal failed: it must confirm nothing more."""
        durability, group_sync, work = self.durability, self.group_sync, self.work
        poller = zmq.Poller()
        # What serves each socket; anything else polled is the replica link's socket.
        handlers: dict[Any, Callable[[], None]] = {
            self.front: self.ingest.drain, self.back: self.fanout.drain_subscriptions,
            self.replay.sock: self.replay.drain, work.sock: work.drain, durability.journal_wake.fd:
            durability.journal_wake.drain}  # make_durable below releases what a sync covered
        if work.monitor is not None:
            handlers[work.monitor] = work.drain_monitor
        for sock in handlers:
            poller.register(sock, zmq.POLLIN)
        link_sock: zmq.Socket | None = None
        reading = {self.front: True, work.sock: True}
        next_beat = next_housekeeping = self._next_group_tick = 0.0
        while not should_stop() and not (until_sealed and (durability.sealed or durability.journal_failed)):
            link_sock = durability.follow_replica(poller, link_sock)
            if group_sync.adopting:
                group_sync.adoption_step()
            else:
                self.admin.step(time.monotonic())
            members = not group_sync.adopting and self.commands.ready
            for sock, wanted in ((self.front, not self._publishers_held()), (work.sock, members)):
                if reading[sock] != wanted:
                    reading[sock] = wanted
                    poller.modify(sock, zmq.POLLIN if wanted else 0)
            for sock, _ in poller.poll(GROUP_POLL_MS if self.groups else POLL_MS):
                self._serve(handlers, sock)
            now = time.monotonic()
            self._groups_turn(now)
            durability.make_durable(now)
            self.retention.trim(now)
            if now >= next_housekeeping:
                next_housekeeping = now + PRUNE_INTERVAL
                self._housekeeping(now)
            if now >= next_beat:
                next_beat = now + self.config.beat_interval
                self.fanout.beat()
            on_tick()

    def _serve(self, handlers: dict[Any, Callable[[], None]], sock: Any) -> None:
        try:
            handler = handlers.get(sock)
            if handler is not None:
                handler()
            else:
                self.durability.drain_replica(sock)
        except zmq.ContextTerminated:
            raise
        except Exception:  # a bug must not take the exchange (and its retention) down
            self.stats.totals.internal_errors += 1
            log.exception("unexpected error while handling a frame; going on")

    def _publishers_held(self) -> bool:
        """Read no batches while the replica lags too far, while the journal's disk refuses writes,
        while the groups hold too much, while we adopt our predecessor's groups, and until the admin
        commands came."""
        return self.durability.holds_publishers or self.group_sync.adopting or not self.commands.ready \
            or (self.groups.held_bytes > self.config.group_max_bytes and not self.parts.spill.enabled)

    def _groups_turn(self, now: float) -> None:
        """Dispatch to the members, time out what they hold, publish dead letters, copy the groups
        to the replica."""
        if self.work.gone:
            self.work.forget_gone()
        if self.groups:
            if now >= self._next_group_tick:
                self._next_group_tick = now + GROUP_TICK
                self.groups.tick()
                self._shed_idle_groups()
            self.parts.dead_letters.publish(self.fanout.send)
            self.parts.spill.turn()  # read-ahead from the store for the groups that have room
            if self.link is not None:
                self.group_sync.settle_acks()  # before the pump: credit freed now is filled in this turn
            self.work.pump()
        self.parts.cursors.turn()  # what left the groups, to their cursor files (a disk policy)
        if self.link is not None and not self.group_sync.adopting:
            self.group_sync.replicate(now)  # also once when the last group went: it must not come back

    def _shed_idle_groups(self) -> None:
        """Over exchange.group_max_bytes, groups without members go first: an abandoned group must
        not hold the publishers."""
        if self.groups.held_bytes > self.config.group_max_bytes and not self.parts.spill.enabled:
            for name in self.groups.shed_idle(self.config.group_max_bytes):
                log.warning("consumer group %s dropped with its messages: it had no member and the groups "
                            "held more than exchange.group_max_bytes", name)

    def _housekeeping(self, now: float) -> None:
        self.sessions.prune(now)
        self.stats.forget_idle(now, self.config.publisher_ttl)
        if len(self.gate.confirmed) > len(self.sessions.sessions):
            self.gate.forget(set(self.gate.confirmed) - set(self.sessions.sessions))
        self.durability.trim_journal()
        for incarnation, archive in list(self.archives.items()):
            archive.trim(now)
            if not len(archive):
                del self.archives[incarnation]
