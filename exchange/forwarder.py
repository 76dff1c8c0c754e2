"""The forwarding loop: publishers' ROUTER socket in, subscribers' XPUB socket out.

A publisher first says `hello` (proving it owns its id) on its connection; its batches are then
checked against what this exchange holds of it (exchange/sessions.py): a batch must continue
where the last one ended, or it is refused with `resend` and changes nothing, so an ack never
covers a message that was not forwarded. Messages are validated one by one (oversize payloads
and bad topics are rejected one by one and counted), grouped into runs of one topic, and sent as
[topic, body] so that libzmq filters by topic prefix. Then the publisher gets a cumulative ack.

Every frame sent to subscribers gets the next position of this incarnation's stream, carries
the chains of the subscribed prefixes it matches (exchange/chains.py), and is kept in the
retention buffer. Slow subscribers: XPUB keeps at most `exchange.sub_hwm` frames per subscriber
and drops beyond that for that subscriber only; the subscriber sees the broken chain and
fetches the missing frames from retention through the replay socket (exchange/replay.py), as
does a subscriber that reconnects. A subscription to a sync marker topic is answered with the
next position, so a subscriber knows from where on its subscription is live.

With replicas = 2 every retained frame is also copied to the exchange's replica on another host
(exchange/replication.py), and with `exchange.journal = fsync` written and fsync'ed to the
journal (exchange/journal.py); an ack then waits in the confirm gate (exchange/confirms.py) until
everything the stream held when it was earned is durable. A journal's earlier incarnations are
loaded at start and served on the replay socket, so positions saved before a restart stay valid.
A journal whose disk refuses writes holds the acks and the publishers, and tells them why, until
it writes again or the leader moves the exchange (exchange/storage.py); it never ends the loop.

Admin commands (exchange/commands.py: a group reset or deleted, the queue purged) are applied by
the loop between two reads, each once; at start, after the groups are adopted and before any
publisher or member is read, so a command issued before this incarnation started applies to what
it took over, never to what it is sent afterwards. With a replica, a command is reported done once
the replica recorded it with the state it left (protocol section 7.6).

Nothing a peer sends can end the loop: decoders range-check every field, and an unexpected
error while handling one frame is logged, counted (`internal_errors`) and the loop goes on.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from exchange.chains import PrefixChains
from exchange.commands import Command, Commands
from exchange.confirms import ConfirmGate
from exchange.consumers import ConsumerProgress
from exchange.groups import Group, Groups, Member, Unit
from exchange.journal import Journal
from exchange.replay import ReplayServer, replay_socket
from exchange.replication import ReplicaLink
from exchange.retention import Retention
from exchange.sessions import PRUNE_INTERVAL, PublisherSessions
from exchange.stats import ExchangeStats
from exchange.storage import JournalHealth
from exchange.work import WorkServer, work_socket
from roq import protocol
from roq.client.wake import WakePipe
from roq.config import Config, ExchangeConfig
from roq.errors import ProtocolError
from roq.names import MAX_TOPIC_BYTES
from roq.security import Gatekeeper

log = logging.getLogger(__name__)

POLL_MS = 100
GROUP_TICK = 0.05  # how often delayed messages, ack timeouts and silent members are checked (s)
GROUP_POLL_MS = 50
ADOPT_TIMEOUT = 3.0  # s a replicated exchange waits at start for the groups its predecessor left
GROUP_SYNC = 0.1  # s between two copies of the groups' state to the replica ...
GROUP_SYNC_BYTES_PER_S = 20e6  # ... or longer for a big one
MAX_GROUP_STATE = 16 << 20  # a bigger state is not copied (the last copy stands)
MAX_SUBSCRIBERS = 100_000  # sync markers remembered (the subscriber count)
RECORD_RETRY = 1.0  # s before an admin command the replica has not recorded is sent to it again
MAX_PURGE_MARKS = 10_000  # publishers a purge's result names (the most recently seen): it goes to ZooKeeper
# Plain ints: or-ing pyzmq's enum flags costs microseconds on the per-frame path.
_MORE, _NOBLOCK, _MORE_NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK), int(zmq.SNDMORE | zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
ZERO_COPY_BYTES = 64 << 10  # frames this big are sent without copying (smaller: the copy is cheaper)


class Forwarder:
    def __init__(self, context: zmq.Context, config: ExchangeConfig, exchange_id: str,
                 bind_host: str, advertise_host: str, gatekeeper: Gatekeeper | None = None,
                 replicas: int = 1, cluster_config: Config | None = None,
                 journal_dir: str | None = None, archives: dict[str, Retention] | None = None) -> None:
        """`gatekeeper` (CURVE, connection limits) guards the three sockets before they bind.
        `replicas` = 2 copies every frame to a replica (`cluster_config` is then required, for the
        link's security); `journal_dir` keeps the journal there; `archives` are earlier
        incarnations' streams (from the journal) served on the replay socket."""
        self.config = config
        self.exchange_id = exchange_id
        # A restarted exchange keeps its id but starts a new stream of positions.
        self.incarnation = f"{exchange_id}.{secrets.token_hex(4)}"
        # Proves to our replica that copies come from this incarnation: only its digest is published.
        self.copy_secret = secrets.token_bytes(32)
        self.stats = ExchangeStats()
        self.retention = Retention(config.retention_seconds, config.retention_bytes)
        self.gate = ConfirmGate()
        self.consumers = ConsumerProgress(self.incarnation)  # durable subscribers' lag
        self.link: ReplicaLink | None = None
        if replicas >= 2:
            if cluster_config is None:
                raise ValueError("replicas >= 2 needs the cluster configuration")
            self.link = ReplicaLink(context, cluster_config, self.retention, self.incarnation, exchange_id,
                                    self.copy_secret)
        self.replica_target: str | None = None  # set from the stdin thread; the loop connects
        self.journal: Journal | None = None
        self.storage: JournalHealth | None = None  # the journal's disk, with fsync: it holds the acks
        if journal_dir is not None and config.journal != "off":
            self.journal = Journal(journal_dir, self.incarnation, config.journal, config.journal_segment_bytes,
                                   config.retention_seconds, config.retention_bytes)
            self.storage = JournalHealth(self.journal, f"{Path(journal_dir).parent.name}/{exchange_id}")
        self.gated = self.link is not None or (self.journal is not None and config.journal == "fsync")
        self.journal_failed = False  # broken for good and not moved in time: this incarnation must end
        self.storage_error = ""  # why the journal's disk refused its last write ("" while it takes them)
        self.journal_wake = WakePipe()  # the journal's sync thread says a sync ended
        self.archives: dict[str, Retention] = archives if archives is not None else {}
        self.journal_root = Path(journal_dir) if journal_dir is not None else None  # the archives' directories
        self.sessions = PublisherSessions(ttl=config.publisher_ttl, max_publishers=config.max_publishers,
                                          max_per_connection=config.max_publishers_per_connection)
        self.chains = PrefixChains(config.max_prefixes)
        # Sync markers subscribed, counted: one per RoQ subscriber (a reconnecting subscriber's new
        # subscription may arrive before its old connection's unsubscription).
        self.subscribers: dict[bytes, int] = {}
        self._acks: dict[bytes, tuple[int, float]] = {}  # connection → (ack due, batch received) this drain
        self.front = context.socket(zmq.ROUTER)
        self.front.linger = 0
        self.front.rcvhwm = config.pub_hwm
        # libzmq drops oversize frames before they cost us anything.
        self.front.setsockopt(zmq.MAXMSGSIZE, config.max_batch_bytes + 4096)
        self.back = context.socket(zmq.XPUB)
        self.back.linger = 0
        self.back.sndhwm = config.sub_hwm
        # Pass every (un)subscription up, duplicates included: prefixes are counted (chains.py).
        self.back.setsockopt(zmq.XPUB_VERBOSER, 1)
        replay = replay_socket(context)
        work = work_socket(context)
        gone_fds: deque[int] = deque()  # the work socket's dropped connections (exchange/work.py)
        if gatekeeper is not None:
            for sock, domain in ((self.front, "publishers"), (self.back, "subscribers"), (replay, "replay")):
                gatekeeper.guard(sock, domain)
            gatekeeper.guard(work, "work", on_disconnect=gone_fds.append)
        pub_port = self.front.bind_to_random_port(f"tcp://{bind_host}")
        sub_port = self.back.bind_to_random_port(f"tcp://{bind_host}")
        replay_port = replay.bind_to_random_port(f"tcp://{bind_host}")
        work_port = work.bind_to_random_port(f"tcp://{bind_host}")
        self.replay = ReplayServer(replay, self.retention, self.chains, self.incarnation, config.fetch_max_bytes,
                                   config.replay_budget_bytes, 2 * config.fetch_max_bytes, self._count,
                                   archives=self.archives, on_progress=self.consumers.report)
        self.pub_endpoint = f"tcp://{advertise_host}:{pub_port}"
        self.sub_endpoint = f"tcp://{advertise_host}:{sub_port}"
        self.replay_endpoint = f"tcp://{advertise_host}:{replay_port}"
        self.work_endpoint = f"tcp://{advertise_host}:{work_port}"
        # Consumer groups (exchange/groups.py): dead letters are published by this exchange itself,
        # under a publisher id of this incarnation's own.
        self.groups = Groups(config.max_groups, config.max_group_members, config.group_member_timeout,
                             config.group_ttl, on_dead=self._dead_letter, max_prefetch=config.group_max_prefetch)
        self.work = WorkServer(work, self.groups, exchange_id, self.incarnation, self.retention, self._count,
                               self._offer)
        # With a replica, first adopt the groups an earlier incarnation of this exchange left there.
        self.adopting = self.link is not None
        self._adopt_asked = False
        self._adopt_deadline = time.monotonic() + ADOPT_TIMEOUT
        self.adopted_high: dict[str, int] = {}  # publisher → highest seq of the adopted incarnation
        self._adopted_until = 0.0
        self._groups_sent: tuple[float, Any, int] = (0.0, None, 0)  # when, what, how big
        # Members' acks waiting for the replica (their credit is held meanwhile, Groups.hold_acks): those
        # in frames sent before a mark, by its serial; and those in no frame yet (their `done` could
        # not go), which the next state sent covers.
        self.groups.hold_acks = self.link is not None
        self._acks_marked: deque[tuple[int, list[tuple[Member, int]]]] = deque()
        self._acks_unsent: list[tuple[Member, int]] = []
        self._marks_follow = 0  # the link's `follows` the marks above were sent under
        self._state_groups: set[str] = set()  # the groups of the last state copied
        self._state_too_big = False  # the last state was not copied (MAX_GROUP_STATE): acks cannot wait
        self.work.gone = gone_fds
        if gatekeeper is None or not gatekeeper.needed:
            self.work.watch_connections()
        self._dead: list[tuple[Group, Unit, str, int]] = []  # (group, unit, reason, when in ms)
        self.dead_publisher = f"dl-{self.incarnation}"
        self._dead_seq = 0
        # Admin commands (exchange/commands.py): `on_command(id, result)` reports one done (to the HCM).
        self.commands = Commands(config.publisher_ttl)
        self.on_command: Callable[[str, dict[str, Any]], None] = lambda command_id, result: None
        self._unrecorded: dict[str, dict[str, Any]] = {}  # applied, not yet recorded by the replica: results
        self._record_sent = 0.0  # when they were last sent to it

    def close(self) -> None:
        for sock in (self.front, self.back, self.replay.sock):
            sock.close(linger=0)
        self.work.close()
        if self.link is not None:
            self.link.close()
        if self.journal is not None:
            self.journal.close()
        self.journal_wake.close()

    @property
    def sealed(self) -> bool:
        """Our replica refused to copy more of this incarnation: we must not confirm anything."""
        return self.link is not None and self.link.sealed

    def durable_pos(self) -> int:
        """Every position below this is durable: held by the replica, and fsync'ed if we journal so."""
        durable = self.retention.next_pos
        if self.link is not None:
            durable = min(durable, self.link.held)
        if self.journal is not None and self.config.journal == "fsync":
            durable = min(durable, self.journal.committed_pos)
        return durable

    def _count(self, name: str, amount: int) -> None:
        totals = self.stats.totals
        setattr(totals, name, getattr(totals, name) + amount)

    def run(self, should_stop: Callable[[], bool], on_tick: Callable[[], None], until_sealed: bool = True) -> None:
        """Forward until `should_stop()`, or (`until_sealed`) until this incarnation is sealed or its
        journal failed: it must confirm nothing more."""
        poller = zmq.Poller()
        for sock in (self.front, self.back, self.replay.sock, self.work.sock):
            poller.register(sock, zmq.POLLIN)
        if self.work.monitor is not None:
            poller.register(self.work.monitor, zmq.POLLIN)
        poller.register(self.journal_wake.fd, zmq.POLLIN)
        link_sock: zmq.Socket | None = None
        reading = {self.front: True, self.work.sock: True}
        next_beat = next_housekeeping = next_group_tick = 0.0
        while not should_stop() and not (until_sealed and (self.sealed or self.journal_failed)):
            link = self.link
            if link is not None and self.replica_target != link.endpoint:
                if link_sock is not None:
                    poller.unregister(link_sock)
                link.point_to(self.replica_target)
                link_sock = link.sock
                if link_sock is not None:
                    poller.register(link_sock, zmq.POLLIN)
            if self.adopting:
                self._adoption_step()
            else:
                self._command_step(time.monotonic())
            members = not self.adopting and self.commands.ready
            for sock, wanted in ((self.front, not self._publishers_held()), (self.work.sock, members)):
                if reading[sock] != wanted:
                    reading[sock] = wanted
                    poller.modify(sock, zmq.POLLIN if wanted else 0)
            for sock, _ in poller.poll(GROUP_POLL_MS if self.groups else POLL_MS):
                try:
                    if sock is self.front:
                        self._drain_publishers()
                    elif sock is self.back:
                        self._drain_subscriptions()
                    elif sock is self.replay.sock:
                        self.replay.drain()
                    elif sock is self.work.sock:
                        self.work.drain()
                    elif sock is self.work.monitor:
                        self.work.drain_monitor()
                    elif sock == self.journal_wake.fd:
                        self.journal_wake.drain()  # _make_durable below releases what the sync covered
                    else:
                        self._drain_replica(sock)  # the link's socket
                except zmq.ContextTerminated:
                    raise
                except Exception:  # a bug must not take the exchange (and its retention) down
                    self.stats.totals.internal_errors += 1
                    log.exception("unexpected error while handling a frame; going on")
            now = time.monotonic()
            if self.work.gone:
                self.work.forget_gone()
            if self.groups:
                if now >= next_group_tick:
                    next_group_tick = now + GROUP_TICK
                    self.groups.tick()
                    self._shed_idle_groups()
                self._publish_dead_letters()
                if self.link is not None:
                    self._settle_acks()  # before the pump: credit freed now is filled in this turn
                self.work.pump()
            if self.link is not None and not self.adopting:
                self._replicate_groups(now)  # also once when the last group went: it must not come back
            self._make_durable(now)
            self.retention.trim(now)
            if now >= next_housekeeping:
                next_housekeeping = now + PRUNE_INTERVAL
                self._housekeeping(now)
            if now >= next_beat:
                next_beat = now + self.config.beat_interval
                self._beat()
            on_tick()

    def _publishers_held(self) -> bool:
        """Read no batches while the replica lags too far, while the journal's disk refuses writes,
        while the groups hold too much, and while we adopt our predecessor's groups."""
        return (self.link is not None and self.link.blocked) or self.adopting or self.storage_full \
            or self.groups.held_bytes > self.config.group_max_bytes or not self.commands.ready

    @property
    def storage_full(self) -> bool:
        """The fsync'ed journal cannot write: nothing can be confirmed until it can."""
        return self.storage is not None and self.config.journal == "fsync" and self.storage.full

    def _shed_idle_groups(self) -> None:
        """Over exchange.group_max_bytes, groups without members go first: an abandoned group must
        not hold the publishers."""
        if self.groups.held_bytes > self.config.group_max_bytes:
            for name in self.groups.shed_idle(self.config.group_max_bytes):
                log.warning("consumer group %s dropped with its messages: it had no member and the groups "
                            "held more than exchange.group_max_bytes", name)

    # ------------------------------------------------------------ consumer groups across incarnations

    def _adoption_step(self) -> None:
        """At start, with a replica: ask it for the groups our previous incarnation left, and take
        them before reading publishers or members (their resends must meet the adopted groups)."""
        link = self.link
        assert link is not None
        if link.adoption is not None:
            adoption, link.adoption = link.adoption, None
            self.adopting = False
            self._adopt(adoption)
        elif link.following and not self._adopt_asked:
            self._adopt_asked = link.ask_adoption()
        elif time.monotonic() > self._adopt_deadline:
            self.adopting = False
            log.warning("no answer from the replica about earlier consumer groups in %.0fs; starting without",
                        ADOPT_TIMEOUT)

    def _adopt(self, adoption: protocol.Adoption) -> None:
        """Take the groups of `adoption.ended`: their pending messages are forwarded again, in our
        stream (so our replica holds them too), and offered to their group only, with their delivery
        counts. A publisher's resends up to its highest sequence number there are not new to groups."""
        self.commands.mark_applied(adoption.applied)  # an earlier incarnation's: not again
        if not adoption.ended:
            return
        self.adopted_high = adoption.high
        self._adopted_until = time.monotonic() + self.config.publisher_ttl
        frames = {pos: (topic, body) for pos, topic, body in adoption.frames}
        adopted = 0
        for record in adoption.groups:
            group = self.groups.adopt(record)
            pending: dict[int, list[tuple[int, int, int]]] = {}
            for pos, idx, count, deliveries in record.pending:
                pending.setdefault(pos, []).append((idx, count, deliveries))
            for pos in sorted(frames):
                topic, body = frames[pos]
                if pos >= record.upto and not group.matches(topic):
                    continue
                runs = pending.get(pos) if pos < record.upto else [(0, 1 << 62, 0)]
                if runs:
                    adopted += self._forward_again(group, topic, body, runs)
        log.info("adopted %d consumer groups of %s: %d pending messages", len(adoption.groups), adoption.ended,
                 adopted)
        self._groups_sent = (0.0, None, 0)  # our own state to the replica at once

    def _forward_again(self, group: Group, topic: bytes, body: bytes, runs: list[tuple[int, int, int]]) -> int:
        try:
            d = protocol.decode_delivery(body)
        except ProtocolError:
            return 0
        count = 0
        for idx, length, deliveries in runs:
            end = min(len(d.seqs), idx + length)
            if idx >= end:
                continue
            seqs, payloads = d.seqs[idx:end], d.payloads[idx:end]
            attrs = [[a[0] - idx, *a[1:]] for a in d.attrs or () if idx <= a[0] < end]
            pos = self._send(topic, d.publisher, d.sent_ns, seqs, payloads, sum(map(len, payloads)), attrs, offer=False)
            self.groups.offer(pos, topic, d.publisher, d.sent_ns, seqs, payloads,
                              [tuple(a) for a in attrs] or None, only=group, deliveries=deliveries)
            count += end - idx
        return count

    def _replicate_groups(self, now: float) -> None:
        """Copy the members' acks to the replica as they come, and the groups' state when it changed,
        at most every GROUP_SYNC (longer for a big state), so a restarted exchange adopts them
        (protocol section 7.6); then mark, so that the acks' credit comes back once the replica
        holds them."""
        link = self.link
        assert link is not None
        if link.follows != self._marks_follow:  # a new follow: marks sent before it may go unanswered,
            self._marks_follow = link.follows  # and the state sent to it covers their acks
            for _, acks in self._acks_marked:
                self._acks_unsent += acks
            self._acks_marked.clear()
        done = self.groups.take_done()
        acks = self.groups.take_settling()
        covered: list[tuple[Member, int]] = []  # acks in a frame handed to the link this turn
        if done:  # at once: an ack copied is an ack a failover keeps
            if link.following and link.send_groups(protocol.encode_done(self.incarnation, done, self.copy_secret)):
                covered = acks
            else:
                self._acks_unsent += acks
                self._want_group_state()  # it carries them
        state = self._copy_group_state(now)
        if state and self._acks_unsent:
            covered += self._acks_unsent
            self._acks_unsent = []
        if covered:
            serial = link.mark()
            if serial is not None:
                self._acks_marked.append((serial, covered))
            else:
                self._acks_unsent += covered
                self._want_group_state()

    def _want_group_state(self) -> None:
        """Copy the groups' state again when it is next due, changed or not."""
        last, _, size = self._groups_sent
        self._groups_sent = (last, None, size)

    def _copy_group_state(self, now: float) -> bool | None:
        """Send the groups' state if it changed and is due, at once if a group came or went (a new
        group's acks must not reach the replica before the group does: it would adopt nothing of it).
        True: sent; False: not sent; None: too big to copy (the last copy stands)."""
        assert self.link is not None
        last, signature, size = self._groups_sent
        fresh = (self.link.follows, self.groups.signature())
        regrouped = self.groups.groups.keys() != self._state_groups
        if fresh == signature or (now < last + max(GROUP_SYNC, size / GROUP_SYNC_BYTES_PER_S) and not regrouped):
            return False
        frame = protocol.encode_groups(self.incarnation, self.groups.records(self.retention.next_pos),
                                       self.copy_secret)
        if len(frame) > MAX_GROUP_STATE:
            if size <= MAX_GROUP_STATE:
                log.warning("consumer group state of %d bytes is too big to copy to the replica: the last "
                            "copy stands (a failover delivers again what was acked since)", len(frame))
            self._groups_sent = (now, fresh, len(frame))
            self._state_groups, self._state_too_big = set(self.groups.groups), True
            return None
        if self.link.send_groups(frame):
            self._groups_sent = (now, fresh, len(frame))
            self._state_groups, self._state_too_big = set(self.groups.groups), False
            return True
        return False

    def _settle_acks(self) -> None:
        """Free the credit of the acks the replica holds now (it answered their mark); or of all of
        them while we have no replica, or a state too big to copy: nothing can hold them then (a
        next replica, or a smaller state, carries them)."""
        link = self.link
        assert link is not None
        if link.endpoint is None or self._state_too_big:
            self.groups.hold_acks = False
            self.groups.settled(self.groups.take_settling() + self._acks_unsent +
                                [a for _, acks in self._acks_marked for a in acks])
            self._acks_unsent = []
            self._acks_marked.clear()
            return
        self.groups.hold_acks = True
        while self._acks_marked and self._acks_marked[0][0] <= link.marked:
            self.groups.settled(self._acks_marked.popleft()[1])

    # ------------------------------------------------------------ admin commands

    def _command_step(self, now: float) -> None:
        """Apply the commands that came, once each; report those done (with a replica: once it
        recorded them, sending again every RECORD_RETRY while it has not)."""
        for command in self.commands.take():
            result = self.apply_command(command)
            self.commands.mark_applied([command.id])
            log.info("admin command %s (%s%s) applied: %s", command.id, command.op,
                     f" {command.group}" if command.group else "", _shown_result(result))
            if self.link is None:
                self.on_command(command.id, result)
            else:
                self._unrecorded[command.id] = result
        if self._unrecorded:
            self._record_commands(now)

    def _record_commands(self, now: float) -> None:
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

    def apply_command(self, command: Command) -> dict[str, Any]:
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
        every group's ready and delayed messages, the journals of earlier incarnations; mark the
        journal. The result names each publisher's highest sequence number here, so that no exchange
        takes its resends of purged messages (exchange/commands.py)."""
        upto = self.retention.next_pos
        frames, messages = self.retention.purge(upto)
        dropped = sum(self.groups.reset(name) or 0 for name in list(self.groups.groups))
        archives = len(self.archives)
        for incarnation in list(self.archives):
            del self.archives[incarnation]
            if self.journal_root is not None:
                shutil.rmtree(self.journal_root / incarnation, ignore_errors=True)
        if self.journal is not None:
            self.journal.purge(upto)
        recent = sorted(self.sessions.sessions.items(), key=lambda item: -item[1].seen)[:MAX_PURGE_MARKS]
        return {"upto": upto, "frames": frames, "messages": messages, "group_messages": dropped,
                "archives": archives, "publishers": {pub: session.last for pub, session in recent}}

    def _offer(self, pos: int, topic: bytes, pub: str, sent_ns: int, seqs: list[int], payloads: list[bytes],
               attrs: list[tuple[Any, ...]] | None, only: Group | None = None) -> None:
        """A frame to the groups, without the messages an adopted group already had."""
        start = 0
        if self.adopted_high:
            if time.monotonic() > self._adopted_until:
                self.adopted_high = {}  # no publisher resends that late
            elif pub in self.adopted_high:
                start = bisect_right(seqs, self.adopted_high[pub])
        self.groups.offer(pos, topic, pub, sent_ns, seqs, payloads, attrs, only=only, start=start)

    def _make_durable(self, now: float) -> None:
        """Journal and copy what was forwarded, then release the acks that became durable."""
        if self.journal is not None:
            self._commit_journal(now)
        if self.link is not None:
            self.link.pump(now)
            if self.journal is not None and self.config.journal == "fsync":
                # A new replica starts at our oldest frame: what is not yet on disk must still be there.
                self.retention.protect_from = min(self.link.held, self.journal.committed_pos)
        if self.gated and len(self.gate) and not self.sealed:
            subscribers = self.subscriber_count
            for ack in self.gate.release(self.durable_pos()):
                self._reply(ack.route, protocol.encode_ack(ack.seq, subscribers))
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
            return
        if change is True:
            moved = self.ask_publishers_to_move(self.storage.reason)
            log.warning("%d publishers told to move: %s", moved, self.storage.reason)
        if self.storage.must_restart(now):
            self.journal_failed = True  # ends the loop: the process exits with Exit.STORAGE

    def _housekeeping(self, now: float) -> None:
        self.sessions.prune(now)
        self.stats.forget_idle(now, self.config.publisher_ttl)
        if len(self.gate.confirmed) > len(self.sessions.sessions):
            self.gate.forget(set(self.gate.confirmed) - set(self.sessions.sessions))
        if self.journal is not None:
            self.journal.trim(self.retention.oldest)  # what the disk refuses to delete is logged there
        for incarnation, archive in list(self.archives.items()):
            archive.trim(now)
            if not len(archive):
                del self.archives[incarnation]

    def _drain_replica(self, sock: zmq.Socket, budget: int = 256) -> None:
        assert self.link is not None
        for _ in range(budget):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.link.on_reply(frame)

    def _beat(self) -> None:
        body = protocol.encode_sync(self.exchange_id, self.incarnation, self.retention.next_pos, protocol.BEAT)
        try:
            self.back.send_multipart([protocol.BEAT_TOPIC, body], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    @property
    def subscriber_count(self) -> int:
        return len(self.subscribers)

    def _drain_publishers(self, budget: int = 256) -> None:
        """Handle queued publisher frames, a bounded number per wake-up."""
        front = self.front
        try:
            self._drain_publisher_frames(front, budget)
        finally:
            if self._acks:
                self._send_acks()

    def _drain_publisher_frames(self, front: zmq.Socket, budget: int) -> None:
        for _ in range(budget):
            try:
                ident = front.recv(_NOBLOCK)
            except zmq.Again:
                return
            frame, block, extra = self._rest_of_message(front)
            if frame is None or extra:
                self.stats.totals.malformed += 1
                self._reply(ident, protocol.encode_publisher_error(
                    protocol.MALFORMED, "expected one frame per message, or two for a batch of one topic"))
                continue
            try:
                self._handle_publisher(ident, frame, block)
            except Exception:  # never end the exchange on one frame
                self.stats.totals.internal_errors += 1
                log.exception("unexpected error while handling a publisher frame; going on")

    @staticmethod
    def _rest_of_message(sock: zmq.Socket) -> tuple[bytes | None, Any, bool]:
        """The parts after the routing id: the frame, a two-part batch's payload block (not copied
        out of libzmq's message: it is spliced into the delivery as it is) and whether more parts
        followed (refused)."""
        more = sock.getsockopt
        if not more(_RCVMORE):
            return None, None, False
        frame = sock.recv()
        if not more(_RCVMORE):
            return frame, None, False
        block = sock.recv(copy=False).buffer
        extra = False
        while more(_RCVMORE):
            sock.recv()
            extra = True
        return frame, block, extra

    def _drain_subscriptions(self) -> None:
        while True:
            try:
                event = self.back.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, topic = event[:1], event[1:]
            if topic[:1] == b"\x00":  # our own marker topics, not a user's subscription
                if topic.startswith(protocol.SYNC_PREFIX):
                    self._on_marker(kind, topic)
            elif kind == b"\x01":
                self.stats.subscriptions += 1
                self.chains.subscribe(topic, self.retention.next_pos)
            elif kind == b"\x00":
                self.stats.subscriptions = max(0, self.stats.subscriptions - 1)
                self.chains.unsubscribe(topic)

    def _on_marker(self, kind: bytes, marker: bytes) -> None:
        subscribers = self.subscribers
        if kind == b"\x00":
            left = subscribers.get(marker, 0) - 1
            if left > 0:
                subscribers[marker] = left
            else:
                subscribers.pop(marker, None)
            self.stats.subscribers = len(subscribers)
            return
        if kind != b"\x01":
            return
        if marker in subscribers or len(subscribers) < MAX_SUBSCRIBERS:
            subscribers[marker] = subscribers.get(marker, 0) + 1
            self.stats.subscribers = len(subscribers)
        # The subscriber's subscriptions arrived together with (before) its marker, so they are
        # active now: every frame from the next position on reaches it live.
        body = protocol.encode_sync(self.exchange_id, self.incarnation, self.retention.next_pos)
        try:
            self.back.send_multipart([marker, body], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the subscriber falls back to its sync timeout

    def handle_publisher(self, ident: bytes, payload: bytes, block: Any = None) -> None:
        """One publisher message, answered (the drain holds acks back to send one per connection)."""
        self._handle_publisher(ident, payload, block)
        self._send_acks()

    def _handle_publisher(self, ident: bytes, payload: bytes, block: Any = None) -> None:
        try:
            frame = protocol.decode_publisher_frame(payload, self.config.max_batch_bytes, block)
        except protocol.RefusedBatch as err:
            self.stats.totals.malformed += 1
            self._reply(ident, protocol.encode_resend(self.sessions.refusal_point(ident, err.publisher),
                                                      protocol.MALFORMED, f"{err} (sequence numbers from "
                                                      f"{err.first_seq} refused)"))
            return
        except ProtocolError as err:
            self.stats.totals.malformed += 1
            self._reply(ident, protocol.encode_publisher_error(err.code, str(err)))
            return
        if isinstance(frame, protocol.Batch):
            self._forward(ident, frame)
        elif isinstance(frame, protocol.Hello):
            last, refusal = self.sessions.hello(ident, frame)
            if refusal:
                self.stats.totals.refused_hellos += 1
                self._reply(ident, protocol.encode_publisher_error("refused", refusal))
                return
            self.stats.publishers[frame.publisher] = time.monotonic()
            if self.gated:  # a welcome counts as an ack: name only what is durable
                last = self.gate.welcome_seq(frame.publisher, frame.from_seq - 1)
            self._reply(ident, protocol.encode_welcome(self.exchange_id, last, self.subscriber_count))
        elif self.sessions.bye(ident, frame.publisher):  # only the owner's bye counts
            self.stats.publishers.pop(frame.publisher, None)

    def _forward(self, ident: bytes, batch: protocol.Batch) -> None:
        pub = batch.publisher
        now = time.monotonic()
        verdict = self.sessions.batch(ident, batch, now)
        if verdict.refused:
            self.stats.totals.refused_batches += 1
            self._reply(ident, protocol.encode_resend(verdict.resend, verdict.code, verdict.message))
            return
        self.stats.publishers[pub] = now
        count = batch.count
        skip = verdict.skip
        purged = self.commands.purged_through(pub)
        if purged >= batch.first_seq + skip:  # resent after a purge dropped them: never again
            skip = min(count, purged - batch.first_seq + 1)
        totals = self.stats.totals
        totals.duplicates += skip
        if skip < count:
            block = None
            if batch.payloads is not None:  # one topic, its payloads as one block
                payloads = batch.payloads[skip:] if skip else batch.payloads
                topics = [batch.topic]
                block = None if skip else batch.block  # resent duplicates: pack the rest again
            else:
                topics, payloads = batch.flat[2 * skip::2], batch.flat[2 * skip + 1::2]
            size = _one_valid_topic(topics, payloads, self.config.max_message_bytes)
            if size >= 0:
                # The common case, checked with C-level calls instead of a loop per message.
                first = batch.first_seq + skip
                self._send(topics[0], pub, batch.sent_ns, list(range(first, first + len(payloads))), payloads, size,
                           block=block)
            else:
                self._forward_one_by_one(ident, batch, skip)
            totals.msgs_in += count - skip
            by_publisher = self.stats.interval_by_publisher
            by_publisher[pub] = by_publisher.get(pub, 0) + count - skip
            if batch.sent_ns:  # 0: the publisher does not say when it sent
                self.stats.note_latency(time.time_ns() - batch.sent_ns)
        last = self.sessions.advance(pub, batch.first_seq + count - 1)
        if self.gated:
            self.gate.hold(self.retention.next_pos, ident, pub, last, now)
        else:
            # Acks are cumulative: one per connection per drain, sent once the drain's deliveries went.
            self._acks[ident] = (last, now)

    def _forward_one_by_one(self, ident: bytes, batch: protocol.Batch, skip: int) -> None:
        """Mixed topics or a bad message: check each, reject the bad ones, send runs of one topic."""
        pub, flat, totals = batch.publisher, batch.messages(), self.stats.totals
        count = len(flat) // 2
        run_topic: Any = None
        seqs: list[int] = []
        payloads: list[bytes] = []
        attrs: list[list[Any]] = []  # [index in the run, priority, not_before_ms, key(, headers)]
        run_size = 0
        max_size = self.config.max_message_bytes
        for i in range(skip, count):
            topic, payload = flat[2 * i], flat[2 * i + 1]
            seq = batch.first_seq + i
            attributes = None
            headers_size = 0
            if isinstance(topic, list):  # [topic, priority, not_before_ms, key(, headers)]
                try:
                    attributes = protocol.message_attributes(topic)
                    if attributes[4]:
                        headers_size = protocol.headers_size(attributes[4])
                except ProtocolError as err:
                    totals.rejected += 1
                    self._reply(ident, protocol.encode_reject(seq, protocol.MALFORMED, str(err)))
                    continue
                topic = attributes[0]
            problem = _check_message(topic, payload, max_size, headers_size)
            if problem:
                totals.rejected += 1
                self._reply(ident, protocol.encode_reject(seq, problem[0], problem[1]))
                continue
            if topic != run_topic and seqs:
                self._send(run_topic, pub, batch.sent_ns, seqs, payloads, run_size, attrs)
                seqs, payloads, attrs, run_size = [], [], [], 0
            run_topic = topic
            if attributes is not None and attributes[1:] != (0, 0, b"", None):
                attrs.append([len(seqs), *attributes[1:4]] if attributes[4] is None
                             else [len(seqs), *attributes[1:]])
            seqs.append(seq)
            payloads.append(payload)
            run_size += len(payload)
        if seqs:
            self._send(run_topic, pub, batch.sent_ns, seqs, payloads, run_size, attrs)

    def _send(self, topic: bytes, pub: str, sent_ns: int, seqs: list[int], payloads: list[bytes], size: int,
              attrs: list[list[Any]] | None = None, offer: bool = True, block: Any = None) -> int:
        """Number, retain and publish one frame of accepted messages (and offer it to the groups);
        `size` is the payloads' total. `attrs`: [index, priority, not_before_ms, key] of messages
        published with attributes. `block`: the payloads as the publisher encoded them (a two-part
        batch), spliced into the frame as they are. Returns the frame's position."""
        pos = self.retention.next_pos
        links = self.chains.links(topic, pos)
        if block is not None:
            body = protocol.encode_delivery_spliced(self.exchange_id, self.incarnation, pos, links, pub, sent_ns,
                                                    seqs, block)
        else:
            body = protocol.encode_delivery(self.exchange_id, self.incarnation, pos, links, pub, sent_ns, seqs,
                                            payloads, attrs)
        self.retention.add(topic, body, len(seqs))
        if self.groups and offer:
            self._offer(pos, topic, pub, sent_ns, seqs, payloads, [tuple(a) for a in attrs] if attrs else None)
        if self.journal is not None:
            self.journal.append(pos, topic, body, len(seqs))
        self.back.send(topic, _MORE)  # two sends: send_multipart costs more than the send itself
        # A big frame goes to libzmq without a copy: retention keeps the bytes alive anyway.
        self.back.send(body, copy=len(body) < ZERO_COPY_BYTES)
        totals = self.stats.totals
        totals.msgs_out += len(seqs)
        totals.bytes_in += size  # every accepted payload is sent once, here
        totals.bytes_out += size
        totals.frames_out += 1
        return pos

    def _dead_letter(self, group: Group, unit: Unit, reason: str) -> None:
        # Published after the groups' turn, not in the middle of it; the time is when it was given up on.
        self._dead.append((group, unit, reason, time.time_ns() // 1_000_000))

    def _publish_dead_letters(self) -> None:
        """Messages a group gave up on, as new messages of this exchange on the group's dead-letter
        topic: the same payloads, priority, key and headers, in a stream any subscriber or group can
        read, each with RoQ's headers saying where it came from (protocol section 7.4)."""
        dead, self._dead = self._dead, []
        for group, unit, reason, at_ms in dead:
            first = self._dead_seq + 1
            self._dead_seq += unit.count
            payloads = unit.payloads[unit.idx:unit.idx + unit.count]
            common = {**(unit.headers or {}), "roq-topic": unit.topic, "roq-publisher": unit.publisher.encode(),
                      "roq-reason": reason.encode(), "roq-deliveries": b"%d" % unit.deliveries,
                      "roq-group": group.name.encode(), "roq-time": b"%d" % at_ms}
            attrs = [[i, unit.priority, 0, unit.key, {**common, "roq-seq": b"%d" % seq}]
                     for i, seq in enumerate(unit.seqs[unit.idx:unit.idx + unit.count])]
            self._send(group.settings.dead_letter, self.dead_publisher, unit.sent_ns,
                       list(range(first, first + unit.count)), payloads, unit.size, attrs)

    def _send_acks(self) -> None:
        acks, self._acks = self._acks, {}
        now = time.monotonic()
        for ident, (seq, received) in acks.items():
            self._send_ack(ident, seq, received, now)

    def _send_ack(self, ident: bytes, seq: int, received: float, now: float) -> None:
        self._send_reply(ident, protocol.encode_ack(seq, self.subscriber_count))
        self.stats.note_confirm(now - received)

    def _reply(self, ident: bytes, frame: bytes) -> None:
        """Replies leave in the order of the frames they answer: an ack still held for this
        connection goes first."""
        if ident in self._acks:
            self._send_ack(ident, *self._acks.pop(ident), time.monotonic())
        self._send_reply(ident, frame)

    def _send_reply(self, ident: bytes, frame: bytes) -> None:
        try:
            self.front.send(ident, _MORE_NOBLOCK)  # once the first part went, the rest goes too
            self.front.send(frame, _NOBLOCK)
        except zmq.ZMQError:
            pass  # the publisher is gone or not reading; acks are cumulative anyway

    def ask_publishers_to_move(self, reason: str) -> int:
        """Tell every connected publisher to go to another exchange (before shutdown)."""
        routes = self.sessions.routes()
        for ident in routes:
            self._reply(ident, protocol.encode_move(reason))
        return len(routes)


def _shown_result(result: dict[str, Any]) -> dict[str, Any]:
    """A command's result for the log: the purge's publisher marks counted, not listed."""
    return {k: len(v) if k == "publishers" else v for k, v in result.items()}


def _one_valid_topic(topics: list[Any], payloads: list[Any], max_size: int) -> int:
    """The payloads' total size if every message has the same valid topic and a bytes payload
    within the size limit, else -1."""
    topic = topics[0]
    if _check_message(topic, b"", max_size) is not None or topics.count(topic) != len(topics) \
            or set(map(type, payloads)) != {bytes}:
        return -1
    size = sum(map(len, payloads))
    # A total within the limit means every payload is: the max is only needed for big batches.
    return size if size <= max_size or max(map(len, payloads)) <= max_size else -1


def _check_message(topic: Any, payload: Any, max_size: int, headers_size: int = 0) -> tuple[str, str] | None:
    """Why one message is refused (code, text), None if it is not; its headers count against the
    size limit with its payload."""
    if not isinstance(topic, bytes) or not 0 < len(topic) <= MAX_TOPIC_BYTES or topic[:1] == b"\x00":
        return ("invalid_name", f"topic must be 1-{MAX_TOPIC_BYTES} bytes, not starting with NUL")
    if not isinstance(payload, bytes):
        return ("malformed", "payload must be bytes (msgpack bin)")
    if len(payload) + headers_size > max_size:
        with_headers = f" and {headers_size} bytes of headers" if headers_size else ""
        return ("too_large", f"payload of {len(payload)} bytes{with_headers} exceeds "
                             f"exchange.max_message_bytes={max_size}")
    return None
