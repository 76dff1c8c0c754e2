"""The settings of ZooKeeper's clients and of the daemons: GCM, HCM and exchange.

Each field is declared with `setting()` (roq/config/declare.py): default, range, one-line description.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roq.config.declare import setting
from roq.protocol import MAX_PREFETCH

JOURNAL_MODES = ("off", "async", "fsync")
STORE_SYNC_MODES = ("interval", "confirm")  # exchange.store_sync: when the segment store is fsync'ed
MIN_JOURNAL_SEGMENT_BYTES = 64 << 10
TCP_PORT: dict[str, Any] = {"lo": 0, "hi": 65535, "note": "a TCP port, 0 = any free one"}
METRICS_PORT: dict[str, Any] = {"lo": -1, "hi": 65535, "note": "a TCP port, 0 = any free one, -1 = off"}


def _zk_root(value: str) -> str | None:
    if not value.startswith("/") or value.endswith("/") or "//" in value:
        return f"must be an absolute ZooKeeper path, got {value!r}"
    return None


def _credential(value: str) -> str | None:
    if value and not is_credential(value):
        return "must be user:password with a non-empty user, got an invalid value"
    return None


def _credentials(value: str) -> str | None:
    return next(filter(None, map(_credential, credential_list(value))), None)


def credential_list(value: str) -> list[str]:
    """The "user:password" entries of a comma-separated setting (zk.readers), blanks left out."""
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def is_credential(value: str) -> bool:
    user, colon, password = value.partition(":")
    return bool(user.strip()) and bool(colon) and bool(password) and "," not in value


def _not_blank(what: str) -> Callable[[str], str | None]:
    return lambda value: None if value.strip() else f"must name {what}"


def _host_name(value: str) -> str | None:
    if not value:
        return None
    from roq.names import check_host_name
    try:
        check_host_name(value)
    except Exception as exc:
        return f"must be a host name: {exc}"
    return None


def _zone(value: str) -> str | None:
    if len(value) > 64 or any(ch.isspace() or not ch.isprintable() for ch in value):
        return f"must be at most 64 printable characters without spaces, got {value!r}"
    return None


@dataclass(frozen=True)
class ZkConfig:
    """ZooKeeper, as every process reaches it."""
    hosts: str = setting("127.0.0.1:2181", "ZooKeeper servers, host:port,...", check=_not_blank("at least one server"),
                         rule="not empty")
    root: str = setting("/roq", "the znode under which the cluster keeps all its state", check=_zk_root,
                        rule="an absolute path")
    # Leader failover answers within about this plus half a second; the server clamps it to
    # [2, 20] ticks (our zoo.cfg has tickTime 500 ms or less); trade-off in docs/guarantees.md.
    session_timeout: float = setting(2.0, "how fast a dead GCM or HCM is noticed: a process paused or cut off "
                                     "longer loses its session", positive=True)
    connect_timeout: float = setting(15.0, "seconds to reach ZooKeeper at start before giving up", positive=True)
    auth: str = setting("", "digest credentials user:password of this process; the znodes it creates are then "
                        "its own (plus readers'): docs/security.md", check=_credential, rule="user:password or empty")
    readers: str = setting("", "user:password,... identities given read-only access (publishers, subscribers, "
                           "admins)", check=_credentials, rule="user:password,... or empty")


@dataclass(frozen=True)
class GcmConfig:
    """The Global Configuration Managers: the leader's control API, placement and rebalancing."""
    bind: str = setting("127.0.0.1", "interface the control API binds")
    advertise: str = setting("", "address clients dial; empty = the bind address")
    port: int = setting(0, "control API port", **TCP_PORT)
    tick: float = setting(1.0, "reconcile interval of the leader, seconds", positive=True)
    reassign_grace: float = setting(0.0, "seconds to wait after a host vanishes before moving its exchanges", lo=0)
    journal_reassign_grace: float = setting(
        30.0, "the same for a host whose exchanges keep a journal, or that holds an exchange or replica of a "
        "queue with a disk storage policy: restarted within it, it gets them back with their journals and "
        "segment stores", lo=0)
    storage_full_grace: float = setting(3.0, "seconds an exchange's journal disk may refuse writes before the "
                                        "exchange moves to a host with room (docs/guarantees.md)", lo=0)
    min_free_bytes: int = setting(64 << 20, "a host whose exchanges journal gets no new exchange while its data disk "
                                  "has less free", lo=0)
    metrics_port: int = setting(0, "Prometheus /metrics port (advertised in ZooKeeper)", **METRICS_PORT)
    # The metadata conversation (docs/protocol.md section 8): what one GCM gives the clients.
    metadata_lease: float = setting(30.0, "seconds a client's metadata.watch lasts unless renewed (clients renew "
                                    "at a third of it)", positive=True)
    metadata_max_queues: int = setting(64, "queues one metadata.watch may name", positive=True)
    metadata_max_watchers: int = setting(20_000, "client connections one GCM keeps watches for; more are refused "
                                         "(limit_exceeded) and go to another seed", positive=True)
    metadata_rate: float = setting(20.0, "metadata requests per second one client connection may make (as many "
                                   "at once)", positive=True)
    stats_queue: str = setting("roq-stats", "while this queue exists, the leader publishes the statistics stream "
                               "to it; empty = never")
    max_queues: int = setting(1_000, "queues at most; a create beyond is refused (bounds ZooKeeper state)",
                              positive=True)
    default_replicas: int = setting(1, "replicas of a queue created without them: 2 = each exchange copies its "
                                    "stream to a process on another host", choices=(1, 2))
    # A queue's storage policy when its create names none (roq/storage_policy.py); 0 and 0 = memory only.
    default_retention: float = setting(0.0, "seconds a queue created without --retention keeps frames on its "
                                       "exchanges' disks", lo=0, hi=100 * 365 * 86_400, note="0 = no age limit")
    default_retention_bytes: int = setting(0, "bytes of frames each exchange of such a queue keeps on disk (with "
                                           "default_retention 0 too: memory only)", lo=0, hi=1 << 60,
                                           note="0 = no size limit")
    rebalance: bool = setting(True, "move exchanges and replicas between live hosts to even the spread "
                              "(docs/elasticity.md)")
    rebalance_delay: float = setting(10.0, "quiet seconds after a host joins or a move, before the next moves", lo=0)
    rebalance_moves: int = setting(2, "slots moved per tick at most", lo=1, hi=64)
    rebalance_margin: float = setting(1.0, "slots above its fair share a host may carry before load alone moves "
                                      "one", lo=0)


@dataclass(frozen=True)
class HcmConfig:
    """The Host Configuration Manager of each host, supervising its exchanges."""
    host: str = setting("", "this host's name in the cluster; empty = the machine's host name", check=_host_name,
                        rule="a host name or empty")
    bind: str = setting("127.0.0.1", "interface the exchanges bind")
    advertise: str = setting("", "address clients dial; empty = the bind address")
    capacity: int = setting(8, "exchanges this host may run", positive=True)
    tick: float = setting(0.5, "supervision interval, seconds", positive=True)
    restart_backoff: float = setting(0.5, "first restart delay of a crashed exchange, doubled each time",
                                     positive=True)
    restart_backoff_max: float = setting(10.0, "longest restart delay (>= restart_backoff)")
    stable_after: float = setting(10.0, "a child up this long has its backoff reset")
    # Flapping: more than max_restarts crashes within restart_window marks an exchange failed, left
    # alone for failed_cooloff or until its assignment changes.
    max_restarts: int = setting(5, "crashes within restart_window before an exchange is marked failed",
                                positive=True)
    restart_window: float = setting(60.0, "seconds over which crashes are counted", positive=True)
    failed_cooloff: float = setting(300.0, "seconds a failed exchange is left alone (>= restart_window)")
    ready_timeout: float = setting(15.0, "seconds a started exchange has to report ready", positive=True)
    stop_grace: float = setting(5.0, "SIGTERM to SIGKILL delay, seconds", positive=True)
    # A frozen replica stalls its primary's confirms: hence a kill, like a crash.
    hung_timeout: float = setting(5.0, "a ready child silent this long (stopped, frozen, stuck) is killed and "
                                  "started again (>= 3 x exchange.stats_interval)", lo=0, note="0 = never")
    stats_interval: float = setting(1.0, "seconds between the host's CPU and memory reports to ZooKeeper",
                                    positive=True)
    stats_heartbeat: float = setting(60.0, "unchanged statistics are written again after this long at most (a "
                                     "liveness heartbeat; hcm/heartbeat.py)", positive=True)
    metrics_port: int = setting(0, "Prometheus /metrics port (advertised in ZooKeeper)", **METRICS_PORT)
    # Relative to the HCM's working directory, which its children inherit.
    data_dir: str = setting(".roq/data", "the exchanges' files on this host "
                            "(journals under <data_dir>/journal/<queue>/<xid>/<incarnation>/)",
                            check=_not_blank("a directory"), rule="not empty")
    zone: str = setting("", "this host's failure domain (availability zone, rack): a queue's exchanges, and an "
                        "exchange and its replica, go to different zones when they can", check=_zone,
                        rule="<= 64 printable characters, no spaces")


@dataclass(frozen=True)
class ExchangeConfig:
    """Each exchange process: sizes, buffers, retention, journal and consumer groups."""
    max_message_bytes: int = setting(1 << 20, "largest message accepted", positive=True)
    max_batch_bytes: int = setting(16 << 20, "largest batch frame accepted (>= max_message_bytes)")
    sub_hwm: int = setting(1_000, "frames queued per subscriber before XPUB drops for it (then fetched back)",
                           positive=True)
    pub_hwm: int = setting(10_000, "frames queued from publishers (ZeroMQ high-water mark)")
    stats_interval: float = setting(1.0, "seconds between statistics reports", positive=True)
    # Retention: for subscribers that come back or fell behind, whichever bound is hit first.
    retention_seconds: float = setting(60.0, "how long frames are kept for subscribers that come back or fell "
                                       "behind", lo=0, note="0 keeps nothing")
    retention_bytes: int = setting(64 << 20, "bytes of frames kept so", positive=True)
    fetch_max_bytes: int = setting(4 << 20, "bytes per fetch reply; a subscriber pages through the rest",
                                   positive=True)
    beat_interval: float = setting(1.0, "heartbeat with the stream position, for subscribers whose tail was "
                                   "dropped", positive=True)
    # Longer than any publisher's client.replay_seconds, so nothing it may still resend looks new.
    publisher_ttl: float = setting(600.0, "seconds a publisher's state (last sequence) is kept unseen "
                                   "(> client.replay_seconds)", positive=True)
    max_publishers: int = setting(100_000, "publishers known at once; a hello beyond is refused", positive=True)
    max_publishers_per_connection: int = setting(64, "publishers one connection may carry", positive=True)
    # A prototype (issue 34, item 5): the deliveries of a drain leave together with its acks, so
    # libzmq's I/O thread is woken once for both rather than once for each. bench/prototypes.py.
    send_held_frames: int = setting(0, "frames whose deliveries a publisher drain holds and sends together with "
                                    "their acks", lo=0, hi=256, note="0 sends each delivery at once")
    max_prefixes: int = setting(10_000, "subscription prefixes whose chains are followed (least recently used go)",
                                positive=True)
    replay_budget_bytes: int = setting(64 << 20, "fetch replies not yet sent, all connections together "
                                       "(>= 2 x fetch_max_bytes)", positive=True)
    journal: str = setting("off", "what is written to disk (hcm.data_dir): off; async (flushed by the OS); fsync "
                           "(a batch is confirmed once fsync'ed)", choices=JOURNAL_MODES)
    journal_segment_bytes: int = setting(16 << 20, "one journal file's size before the next is started",
                                         lo=MIN_JOURNAL_SEGMENT_BYTES, note="64 KiB")
    store_sync: str = setting("interval", "when a queue's segment store (a disk storage policy) is fsync'ed: "
                              "interval (every stats_interval; acks do not wait); confirm (a batch is confirmed "
                              "once the store fsync'ed it: one sync per loop turn covers that turn's batches; "
                              "with replicas 2 the replica's store too, before it answers the copy)",
                              choices=STORE_SYNC_MODES)
    # Consumer groups: docs/work-queues.md.
    max_groups: int = setting(64, "consumer groups per exchange", positive=True)
    max_group_members: int = setting(1_000, "members per group", positive=True)
    group_max_prefetch: int = setting(1_000, "unacked messages one member may hold, whatever its join asks (a "
                                      "larger prefetch is clamped)", positive=True, hi=MAX_PREFETCH,
                                      note="the most a join may ask")
    group_member_timeout: float = setting(10.0, "seconds a member may stay silent (members ping every second)",
                                          positive=True)
    group_ttl: float = setting(86_400.0, "seconds a group without members is kept", positive=True)
    group_max_bytes: int = setting(256 << 20, "payload bytes all groups may hold before the exchange stops "
                                   "reading publishers (nothing is dropped)", positive=True)

