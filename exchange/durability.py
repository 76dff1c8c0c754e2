"""Durability: the replica link and the journal's error policy, and the acks they release.

With replicas = 2 every retained frame is also copied to the exchange's replica on another host
(exchange/replication.py), and with `exchange.journal = fsync` written and fsync'ed to the
journal (exchange/journal.py); an ack then waits in the confirm gate (exchange/confirms.py) until
everything the stream held when it was earned is durable. A journal whose disk refuses writes
holds the acks and the publishers, and tells them why, until it writes again or the leader moves
the exchange (exchange/storage.py); it never ends the loop. With `exchange.journal = async` a
failing disk only switches the journal off for this incarnation (its acks never waited for it).
With `exchange.store_sync = confirm` acks also wait until the queue's segment store (a disk
storage policy) has written and fsync'ed their frames: one sync per loop turn, in the loop.
"""

from __future__ import annotations

import logging

import zmq

from exchange.fanout import Fanout
from exchange.ingest import PublisherIngest
from exchange.parts import Parts
from roq import protocol
from roq.client.wake import WakePipe

log = logging.getLogger(__name__)

REPLY_BUDGET = 256  # replica replies handled per wake-up


class Durability:
    def __init__(self, parts: Parts) -> None:
        self.config = parts.config
        self.retention = parts.retention
        self.gate = parts.gate
        self.stats = parts.stats
        self.link = parts.link
        self.journal = parts.journal
        self.storage = parts.storage
        self.disk = parts.disk  # the segment store's disk full is the journal's backpressure too
        self._disk_was_full = False
        self.fsync = self.journal is not None and self.config.journal == "fsync"
        self.store_sync = self.config.store_sync == "confirm"  # acks wait for the segment store's fsync
        self.gated = self.link is not None or self.fsync or self.store_sync  # acks wait for what is durable
        self.replica_target: str | None = None  # set from the stdin thread; the loop connects
        self.journal_failed = False  # broken for good and not moved in time: this incarnation must end
        self.storage_error = ""  # why the journal's disk refused its last write ("" while it takes them)
        self.journal_wake = WakePipe()  # the journal's sync thread says a sync ended
        self._fanout: Fanout | None = None
        self._ingest: PublisherIngest | None = None

    def attach(self, fanout: Fanout, ingest: PublisherIngest) -> None:
        """The fan-out (to stop journaling into a broken journal) and the publishers (to release
        acks to, and to move off a full disk)."""
        self._fanout, self._ingest = fanout, ingest

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        if self.journal is not None:
            self.journal.close()
        self.disk.close()
        self.journal_wake.close()

    @property
    def sealed(self) -> bool:
        """Our replica refused to copy more of this incarnation: we must not confirm anything."""
        return self.link is not None and self.link.sealed

    @property
    def storage_full(self) -> bool:
        """The fsync'ed journal, or the segment store, cannot write: nothing more is taken until it can."""
        return (self.storage is not None and self.config.journal == "fsync" and self.storage.full) or self.disk.full

    @property
    def holds_publishers(self) -> bool:
        """The replica lags too far, or the journal's disk refuses writes: read no batches."""
        return (self.link is not None and self.link.blocked) or self.storage_full

    def leaving_reason(self) -> str:
        """What publishers are told when this incarnation stops."""
        if self.sealed:
            return "exchange cut off from its replica"
        if self.journal_failed and self.storage is not None:
            return self.storage.reason
        return "exchange shutting down"

    def durable_pos(self) -> int:
        """Every position below this is durable: held by the replica, and fsync'ed if we journal so."""
        durable = self.retention.next_pos
        if self.link is not None:
            durable = min(durable, self.link.held)
        if self.journal is not None and self.config.journal == "fsync":
            durable = min(durable, self.journal.committed_pos)
        if self.store_sync:
            durable = self.disk.durable_before(durable)
        return durable

    def follow_replica(self, poller: zmq.Poller, link_sock: zmq.Socket | None) -> zmq.Socket | None:
        """Point the link where the HCM last said our replica is; returns the socket polled for it."""
        link = self.link
        if link is None or self.replica_target == link.endpoint:
            return link_sock
        if link_sock is not None:
            poller.unregister(link_sock)
        link.point_to(self.replica_target)
        if link.sock is not None:
            poller.register(link.sock, zmq.POLLIN)
        return link.sock

    def drain_replica(self, sock: zmq.Socket, budget: int = REPLY_BUDGET) -> None:
        assert self.link is not None
        for _ in range(budget):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.link.on_reply(frame)

    def make_durable(self, now: float) -> None:
        """Journal and copy what was forwarded, then release the acks that became durable."""
        if self.journal is not None:
            self._commit_journal(now)
        if self.disk.store is not None:
            self._write_store(now)
        if self.link is not None:
            self.link.pump(now)
            if self.journal is not None and self.config.journal == "fsync":
                # A new replica starts at our oldest frame: what is not yet on disk must still be there.
                self.retention.protect_from = min(self.link.held, self.journal.committed_pos)
        if self.gated and len(self.gate) and not self.sealed:
            assert self._ingest is not None
            ingest = self._ingest
            subscribers = ingest.subscriber_count
            for ack in self.gate.release(self.durable_pos()):
                ingest.reply(ack.route, protocol.encode_ack(ack.seq, subscribers))
                self.stats.note_confirm(now - ack.received)

    def _commit_journal(self, now: float) -> None:
        """A disk that refuses writes (full, failing) never stops forwarding nor the process. With
        fsync it is backpressure (exchange/storage.py): acks wait, publishers are held and told
        `storage_full`, writes are retried until they go through. With async the journal is dropped
        for this incarnation (its acks never waited for it), logged."""
        assert self.journal is not None and self.storage is not None
        change = self.storage.commit(now, self.journal_wake.wake)  # fsync: in a thread, the loop goes on
        self.storage_error = self.storage.error_text
        if self.config.journal != "fsync":
            if self.storage.full:
                log.error("journal write failed: %s; journal switched off for this incarnation", self.storage_error)
                self.journal.close()  # what it cannot write is logged there
                self.journal = self.storage = None
                if self._fanout is not None:
                    self._fanout.journal = None
            return
        if change is True:
            assert self._ingest is not None
            moved = self._ingest.ask_to_move(self.storage.reason)
            log.warning("%d publishers told to move: %s", moved, self.storage.reason)
        if self.storage.must_restart(now):
            self.journal_failed = True  # ends the loop: the process exits with Exit.STORAGE

    def _write_store(self, now: float) -> None:
        """The segment store's writes of this turn; a disk that refuses them holds the publishers
        (`holds_publishers`), who are told why once, as for the journal."""
        if self.store_sync and len(self.gate):
            self.disk.sync(now)  # one fdatasync for every batch of this turn, before their acks
        else:
            self.disk.flush(now)
        full = self.disk.full
        if full:
            self.storage_error = self.disk.error_text
        elif self._disk_was_full and not (self.storage is not None and self.storage.full):
            self.storage_error = ""
        if full and not self._disk_was_full and self._ingest is not None:
            moved = self._ingest.ask_to_move(self.disk.reason)
            log.warning("%d publishers told to move: %s", moved, self.disk.reason)
        self._disk_was_full = full

    def trim_journal(self) -> None:
        """Drop what the retention evicted (what the disk refuses to delete is logged there)."""
        if self.journal is not None:
            self.journal.trim(self.retention.oldest)
