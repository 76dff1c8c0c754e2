"""An exchange's parts, built once: its sockets and the state its collaborators share.

`Site` is what the process knows before anything is bound (its id, hosts, replicas, journal
directory, the archives loaded from it); `build_parts` binds the four sockets (behind the
gatekeeper, if any) and makes the parts from it. The forwarder and its collaborators
(exchange/forwarder.py) each take the few parts they use from the one `Parts` object.
A failure while binding leaves the caller to destroy the context (exchange/main.py does).
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from exchange.chains import PrefixChains
from exchange.commands import Commands
from exchange.confirms import ConfirmGate
from exchange.consumers import ConsumerProgress
from exchange.dead_letters import DeadLetters
from exchange.disk_tail import DiskTail
from exchange.group_feed import GroupFeed
from exchange.group_restore import GroupCursors
from exchange.group_spill import GroupSpill
from exchange.groups import Groups
from exchange.journal import Journal
from exchange.replay import LiveStream, ReplayServer, replay_socket
from exchange.replication import ReplicaLink
from exchange.retention import Retention
from exchange.sessions import PublisherSessions
from exchange.stats import ExchangeStats
from exchange.storage import JournalHealth
from exchange.work import WorkServer, work_socket
from roq.config import Config, ExchangeConfig
from roq.listen import listening
from roq.security import Gatekeeper


@dataclass(frozen=True)
class Site:
    """Where and how one exchange runs. `gatekeeper` (CURVE, connection limits) guards the sockets
    before they bind; `replicas` = 2 copies every frame to a replica (`cluster_config` is then
    required, for the link's security); `journal_dir` keeps the journal there; `archives` are
    earlier incarnations' streams (from the journal) served on the replay socket; `store_root` is
    where the queue's segment stores live, one per incarnation (None: frames stay in memory only;
    exchange/disk_tail.py)."""
    xid: str
    bind_host: str
    advertise_host: str
    gatekeeper: Gatekeeper | None = None
    replicas: int = 1
    cluster_config: Config | None = None
    journal_dir: str | None = None
    archives: dict[str, Retention] = field(default_factory=dict)
    store_root: str | None = None


@dataclass(frozen=True)
class Stream:
    """Who speaks in the frames this incarnation sends."""
    xid: str
    # A restarted exchange keeps its id but starts a new stream of positions.
    incarnation: str
    # Proves to our replica that copies come from this incarnation: only its digest is published.
    copy_secret: bytes

    @classmethod
    def new(cls, xid: str) -> Stream:
        return cls(xid, f"{xid}.{secrets.token_hex(4)}", secrets.token_bytes(32))


@dataclass(frozen=True)
class Endpoints:
    pub: str
    sub: str
    replay: str
    work: str


@dataclass
class Parts:
    config: ExchangeConfig
    site: Site
    stream: Stream
    endpoints: Endpoints
    stats: ExchangeStats
    retention: Retention
    chains: PrefixChains
    sessions: PublisherSessions
    gate: ConfirmGate
    consumers: ConsumerProgress
    commands: Commands
    groups: Groups
    feed: GroupFeed
    spill: GroupSpill  # a disk-retained queue's group backlogs wait in its segment store
    cursors: GroupCursors  # ... and their acks in cursor files, for a restart
    dead_letters: DeadLetters
    front: zmq.Socket  # ROUTER: publishers
    back: zmq.Socket  # XPUB: subscribers
    replay: ReplayServer
    work: WorkServer
    link: ReplicaLink | None
    journal: Journal | None
    storage: JournalHealth | None  # the journal's disk, with fsync: it holds the acks
    disk: DiskTail  # the frames beyond the memory tail, with a disk storage policy

    @property
    def archives(self) -> dict[str, Retention]:
        return self.site.archives

    @property
    def journal_root(self) -> Path | None:
        """The archives' directories."""
        return Path(self.site.journal_dir) if self.site.journal_dir is not None else None



def build_parts(context: zmq.Context, config: ExchangeConfig, site: Site) -> Parts:
    """Bind the sockets and make the parts (ValueError: replicas without the cluster configuration)."""
    stream = Stream.new(site.xid)
    retention = Retention(config.retention_seconds, config.retention_bytes)
    link = _replica_link(context, site, retention, stream)
    journal, storage = _journal(config, site, stream)
    front, back = _publisher_socket(context, config), _subscriber_socket(context, config)
    replay, work = replay_socket(context), work_socket(context)
    gone_fds: deque[int] = deque()  # the work socket's dropped connections (exchange/work.py)
    gatekeeper = site.gatekeeper
    if gatekeeper is not None:
        for sock, domain in ((front, "publishers"), (back, "subscribers"), (replay, "replay")):
            gatekeeper.guard(sock, domain)
        gatekeeper.guard(work, "work", on_disconnect=gone_fds.append)
    endpoints = Endpoints(*(_bind(sock, site) for sock in (front, back, replay, work)))
    stats, chains = ExchangeStats(), PrefixChains(config.max_prefixes)
    count = _counter(stats)
    consumers = ConsumerProgress(stream.incarnation)  # durable subscribers' lag
    dead_letters = DeadLetters(f"dl-{stream.incarnation}")
    groups = Groups(config.max_groups, config.max_group_members, config.group_member_timeout, config.group_ttl,
                    on_dead=dead_letters.collect, max_prefetch=config.group_max_prefetch)
    # Members' acks wait for the replica (their credit is held meanwhile): exchange/group_sync.py.
    groups.hold_acks = link is not None
    groups.keep_done = link is not None  # without a replica nothing takes them: they must not pile up
    feed = GroupFeed(groups)
    work_server = WorkServer(work, groups, stream.xid, stream.incarnation, retention, count, feed.offer)
    work_server.gone = gone_fds
    disk = DiskTail(Path(site.store_root) if site.store_root is not None else None, stream.incarnation,
                    f"{Path(site.store_root).parent.name}/{site.xid}" if site.store_root is not None else site.xid)
    if link is not None:
        link.transfer.store_of = lambda: disk.store  # a new replica's state transfer reads it
        link.ended_stores = lambda: disk.archived  # and our earlier incarnations' stores, whole
    spill = GroupSpill(groups, feed, retention, disk, config.group_max_bytes)
    feed.before_live = spill.mark
    cursors = GroupCursors(groups, retention, disk, stream.incarnation, replicated=link is not None)
    groups.on_done = cursors.left
    spill.backlog = cursors.read_backlog  # a restored group reads its earlier incarnations' backlogs first
    if gatekeeper is None or not gatekeeper.needed:
        work_server.watch_connections()
    parts = Parts(
        config=config, site=site, stream=stream, endpoints=endpoints, stats=stats, retention=retention,
        chains=chains, gate=ConfirmGate(), consumers=consumers, commands=Commands(config.publisher_ttl),
        sessions=PublisherSessions(ttl=config.publisher_ttl, max_publishers=config.max_publishers,
                                   max_per_connection=config.max_publishers_per_connection),
        groups=groups, feed=feed, spill=spill, cursors=cursors, dead_letters=dead_letters, front=front, back=back,
        replay=ReplayServer(replay, config, count, LiveStream(retention, chains, stream.incarnation),
                            archives=site.archives, on_progress=consumers.report, store_of=disk.store_of),
        work=work_server, link=link, journal=journal, storage=storage, disk=disk)
    return parts


def _counter(stats: ExchangeStats) -> Callable[[str, int], None]:
    """Adds to one of the exchange's counters: the replay and work servers' way in."""
    def count(name: str, amount: int) -> None:
        totals = stats.totals
        setattr(totals, name, getattr(totals, name) + amount)
    return count


def _replica_link(context: zmq.Context, site: Site, retention: Retention, stream: Stream) -> ReplicaLink | None:
    if site.replicas < 2:
        return None
    if site.cluster_config is None:
        raise ValueError("replicas >= 2 needs the cluster configuration")
    return ReplicaLink(context, site.cluster_config, retention, stream.incarnation, stream.xid,
                       stream.copy_secret)


def _journal(config: ExchangeConfig, site: Site, stream: Stream) -> tuple[Journal | None, JournalHealth | None]:
    if site.journal_dir is None or config.journal == "off":
        return None, None
    journal = Journal(site.journal_dir, stream.incarnation, config.journal, config.journal_segment_bytes,
                      config.retention_seconds, config.retention_bytes)
    return journal, JournalHealth(journal, f"{Path(site.journal_dir).parent.name}/{site.xid}")


def _publisher_socket(context: zmq.Context, config: ExchangeConfig) -> zmq.Socket:
    front = context.socket(zmq.ROUTER)
    front.linger = 0
    front.rcvhwm = config.pub_hwm
    # libzmq drops oversize frames before they cost us anything.
    front.setsockopt(zmq.MAXMSGSIZE, config.max_batch_bytes + 4096)
    return front


def _subscriber_socket(context: zmq.Context, config: ExchangeConfig) -> zmq.Socket:
    back = context.socket(zmq.XPUB)
    back.linger = 0
    back.sndhwm = config.sub_hwm
    # Pass every (un)subscription up, duplicates included: prefixes are counted (chains.py).
    back.setsockopt(zmq.XPUB_VERBOSER, 1)
    return back


def _bind(sock: zmq.Socket, site: Site) -> str:
    port = listening(sock).bind_to_random_port(f"tcp://{site.bind_host}")
    return f"tcp://{site.advertise_host}:{port}"
