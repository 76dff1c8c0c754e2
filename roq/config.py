"""The one configuration object, built once: defaults → TOML file → environment → flags.

Every layer is validated against the same typed schema; an unknown key or a
badly typed value is a `ConfigError` before anything starts — never silently
dropped. The result is a frozen tree passed down explicitly.

Environment variables are `ROQ_<SECTION>_<KEY>` (e.g. `ROQ_ZK_HOSTS`,
`ROQ_ZK_SESSION_TIMEOUT`); `ROQ_CONFIG` names the TOML file. Flags are
`section.key=value` strings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from roq.errors import ConfigError
from roq.protocol import MAX_PREFETCH

ENV_PREFIX = "ROQ_"
ENV_CONFIG_FILE = "ROQ_CONFIG"
# What `roq subscribe --group --exec` tells each command about its message (roq/tools/work_cli.py,
# docs/cli.md): a command may run `roq` itself.
MESSAGE_ENV = ("ROQ_QUEUE", "ROQ_GROUP", "ROQ_EXCHANGE", "ROQ_TOPIC", "ROQ_TOPIC_HEX", "ROQ_KEY", "ROQ_KEY_HEX",
               "ROQ_PUBLISHER", "ROQ_SEQ", "ROQ_MESSAGE_ID", "ROQ_DELIVERIES", "ROQ_PRIORITY", "ROQ_HEADERS",
               "ROQ_HEADERS_ENCODING")
# ROQ_ variables that are not settings: the file above, Spark's log level (docs/spark.md), the
# pipeline driver's parent (roq/spark/stats_job.py) and the message variables above.
ENV_NOT_SETTINGS = frozenset({ENV_CONFIG_FILE, "ROQ_SPARK_LOG_LEVEL", "ROQ_PIPELINE_PARENT", *MESSAGE_ENV})
JOURNAL_MODES = ("off", "async", "fsync")
PERMISSION_DEFAULTS = ("all", "none")  # security.default_permissions (roq/permissions.py)
MIN_JOURNAL_SEGMENT_BYTES = 64 << 10
# What one message of an HTTP publish request costs the gateway beyond its bytes, as Python objects
# (a bytes object, its slots in the request's list and the publisher's log): measured 57, rounded up.
PUBLISH_MESSAGE_COST = 96


@dataclass(frozen=True)
class ZkConfig:
    hosts: str = "127.0.0.1:2181"
    root: str = "/roq"
    # Bounds how fast a dead GCM or HCM is noticed (leader failover answers within about this plus
    # half a second); a process paused or cut off longer than this loses its session (trade-off:
    # docs/guarantees.md "Failure detection"). The server clamps it to [2, 20] ticks: our zoo.cfg
    # has tickTime 500 ms or less.
    session_timeout: float = 2.0
    connect_timeout: float = 15.0
    # Digest credentials "user:password" this process authenticates with. When set, every znode
    # it creates is readable and writable by that identity only (plus `readers`): see docs/security.md.
    auth: str = ""
    readers: str = ""  # "user:password,..." identities given read-only access (publishers, subscribers, admins)


@dataclass(frozen=True)
class GcmConfig:
    bind: str = "127.0.0.1"
    advertise: str = ""  # address clients dial; empty = bind address
    port: int = 0  # 0 = a free port chosen at start
    tick: float = 1.0  # reconcile interval of the leader
    reassign_grace: float = 0.0  # wait this long after a host vanishes before moving its exchanges
    # ... or this long for a host whose exchanges keep a journal: a host restarted within it gets its
    # exchanges back with their journals (moved, their earlier incarnations stay on the old disk).
    journal_reassign_grace: float = 30.0
    # An exchange whose journal's disk refuses writes this long is moved to a host with room (and
    # a host whose exchanges journal gets no new exchange while its data disk has less free than
    # min_free_bytes): docs/guarantees.md "A full disk".
    storage_full_grace: float = 3.0
    min_free_bytes: int = 64 << 20
    metrics_port: int = 0  # Prometheus /metrics: 0 = a free port (advertised in ZooKeeper), -1 = off
    stats_queue: str = "roq-stats"  # while this queue exists, the leader publishes the statistics stream to it
    max_queues: int = 1_000  # queue.create beyond this is refused: bounds ZooKeeper state and placements
    # Exchanges of a queue created without `replicas`: 1 = no replica, 2 = a replica process on another host.
    default_replicas: int = 1
    # Rebalancing (docs/elasticity.md): the leader moves exchanges and replicas between live hosts to
    # even the spread after failover put them wherever there was room (a host back, a host joined).
    rebalance: bool = True
    rebalance_delay: float = 10.0  # quiet seconds after a host joins or a move, before the next moves
    rebalance_moves: int = 2  # slots moved per tick at most
    rebalance_margin: float = 1.0  # slots above its fair share a host may carry before load alone moves one


@dataclass(frozen=True)
class HcmConfig:
    host: str = ""  # empty = this machine's host name
    bind: str = "127.0.0.1"  # interface the exchanges bind
    advertise: str = ""  # address clients dial; empty = bind address
    capacity: int = 8  # exchanges this host may run
    tick: float = 0.5
    restart_backoff: float = 0.5  # first restart delay of a crashed exchange, doubled each time
    restart_backoff_max: float = 10.0
    stable_after: float = 10.0  # a child up this long has its backoff reset
    # An exchange that crashes more than max_restarts times within restart_window seconds is
    # marked failed and left alone for failed_cooloff seconds, or until its assignment changes.
    max_restarts: int = 5
    restart_window: float = 60.0
    failed_cooloff: float = 300.0
    ready_timeout: float = 15.0
    stop_grace: float = 5.0  # SIGTERM → SIGKILL delay
    # A ready child that sends no statistics report for this long (stopped, frozen, stuck) is killed
    # and started again like a crashed one: a frozen replica stalls its primary's confirms. 0 = never.
    hung_timeout: float = 5.0
    stats_interval: float = 1.0  # host CPU and memory reported to ZooKeeper
    # Statistics that did not change materially are written to ZooKeeper again after this long at
    # most (a liveness heartbeat; hcm/heartbeat.py): an idle cluster writes next to nothing.
    stats_heartbeat: float = 60.0
    metrics_port: int = 0  # Prometheus /metrics: 0 = a free port (advertised in ZooKeeper), -1 = off
    # The exchanges' files on this host (journals under <data_dir>/journal/<queue>/<xid>/<incarnation>/);
    # relative to the HCM's working directory, which its children inherit.
    data_dir: str = ".roq/data"
    # This host's failure domain (an EC2 availability zone, a rack): the leader puts a queue's
    # exchanges, and an exchange and its replica, in different zones when it can. "" = none.
    zone: str = ""


@dataclass(frozen=True)
class ExchangeConfig:
    max_message_bytes: int = 1 << 20
    max_batch_bytes: int = 16 << 20
    sub_hwm: int = 1_000  # frames queued per subscriber before XPUB drops for it (then fetched back)
    pub_hwm: int = 10_000
    stats_interval: float = 1.0
    # Frames kept for subscribers that come back or fell behind (whichever bound is hit first).
    retention_seconds: float = 60.0
    retention_bytes: int = 64 << 20
    fetch_max_bytes: int = 4 << 20  # per fetch reply; a subscriber pages through the rest
    beat_interval: float = 1.0  # heartbeat with the stream position, for subscribers whose tail was dropped
    # Per-publisher state (last sequence, connection) is forgotten after this long unseen: longer
    # than any publisher's client.replay_seconds, so nothing it may still resend looks new.
    publisher_ttl: float = 600.0
    max_publishers: int = 100_000  # publishers known at once; a hello beyond it is refused
    max_publishers_per_connection: int = 64
    max_prefixes: int = 10_000  # subscription prefixes whose chains are followed (least recently used go)
    replay_budget_bytes: int = 64 << 20  # fetch replies not yet sent, all connections together
    # What the exchange writes of its stream to disk: "off"; "async" (written, flushed by the OS);
    # "fsync" (a batch is confirmed once its frames are fsync'ed). Files: hcm.data_dir.
    journal: str = "off"
    journal_segment_bytes: int = 16 << 20  # one journal file's size before the next is started
    # Consumer groups (docs/work-queues.md): groups per exchange, members per group, how long a member
    # may stay silent (members ping every second) and a group without members is kept, and the payload
    # bytes all groups may hold before the exchange stops reading publishers (nothing is dropped).
    max_groups: int = 64
    max_group_members: int = 1_000
    # Unacked messages one member may hold, whatever its join asks (a larger prefetch is clamped).
    group_max_prefetch: int = 1_000
    group_member_timeout: float = 10.0
    group_ttl: float = 86_400.0
    group_max_bytes: int = 256 << 20


@dataclass(frozen=True)
class ClientConfig:
    request_timeout: float = 10.0  # control API round trip, leader lookup included
    attempt_timeout: float = 2.0  # one control request to one GCM: a dead or swamped GCM costs at most this
    max_unconfirmed: int = 50_000  # messages in flight before publish() blocks
    max_batch: int = 2_000  # messages per batch frame
    max_batch_bytes: int = 256 << 10  # bytes per batch frame; bounds what a slow subscriber can pin
    # A batch of one topic goes as two parts, its payloads as one block the exchange passes on without
    # packing each again (protocol 3.2). Off: one frame, for exchanges older than that form.
    payload_blocks: bool = True
    publish_timeout: float = 30.0  # how long publish() blocks under backpressure
    confirm_timeout: float = 5.0  # no confirm this long → move to another exchange
    # Confirmed messages kept for resending after a move: an exchange that dies may have
    # confirmed messages its subscribers never got. Must outlast failure detection.
    replay_seconds: float = 15.0
    replay_bytes: int = 64 << 20
    # Durable subscribers save their position under this directory, one file per queue and name.
    state_dir: str = ".roq/subscribers"
    position_save_interval: float = 1.0
    fetch_timeout: float = 3.0  # one retention fetch round trip before the exchange counts as unreachable
    receive_hwm: int = 100_000  # frames a subscriber's socket queues before the exchange holds (then drops) them
    # Consumer group members (Subscriber(group=...)): unacked messages held per exchange, and the
    # group's settings when the first member creates it.
    prefetch: int = 100
    ack_timeout: float = 30.0
    max_deliveries: int = 5


@dataclass(frozen=True)
class AutoscaleConfig:
    """How the leader applies each queue's rules (`roq queue rules`); the limits are per queue."""
    enabled: bool = True
    scale_out_after: float = 2.0  # a rule must keep firing this long
    scale_in_after: float = 15.0  # load must stay low this long
    cooldown: float = 5.0  # between two scaling actions of a queue
    relocate_after: float = 2.0  # an exchange overloaded this long sheds its heaviest publisher
    relocate_cooldown: float = 3.0  # between two relocations of a queue


@dataclass(frozen=True)
class SecurityConfig:
    """ZeroMQ CURVE on every socket, and limits per client (docs/security.md)."""
    curve: bool = False  # encrypt and authenticate the data path and the control API
    keys_dir: str = ""  # made by `roq keys generate`: server.key[_secret], clients/, admins/
    identity: str = ""  # this client's certificate in keys_dir, e.g. "clients/app"; empty = the server's
    # Per peer address and socket, at exchanges and GCMs; handshakes beyond it are refused. 0 = no limit.
    max_connections_per_client: int = 256
    # What a key without an entry in the permission table may do (roq keys grant): "all" (every
    # right on every queue, as before permissions existed) or "none". Set it alike on every daemon.
    default_permissions: str = "all"


@dataclass(frozen=True)
class WebConfig:
    """The web console and HTTP gateway, `roq web` / `roq-web` (docs/http.md)."""
    bind: str = "127.0.0.1"
    port: int = 8080  # 0 = a free port (printed at start)
    auth: bool = False  # require a token (web.tokens_file) for every API call
    tokens_file: str = ""  # lines "NAME ROLE SHA256", written by `roq web token add`
    tls_cert: str = ""  # PEM files: with both set, the gateway serves HTTPS
    tls_key: str = ""
    secure_cookies: bool = False  # mark the session cookie Secure (always, with TLS): behind a TLS proxy
    # With auth off, host names (comma-separated) a browser may use besides localhost and IP
    # addresses: any other Host header is refused, so a DNS-rebinding page cannot drive the gateway.
    hosts: str = ""
    sample_interval: float = 2.0  # cluster statistics sampled for the console's charts
    history_seconds: float = 600.0  # how far back the charts go
    publish_timeout: float = 10.0  # a publish is answered 503 when not confirmed in this time
    max_streams: int = 64  # open SSE subscriptions at once; more are answered 503
    # What one caller (its token's name with auth on, its address with it off) may hold at once;
    # beyond it 429. 0 = no per-caller bound (a proxy in front with auth off: all share its address).
    max_streams_per_client: int = 8
    max_publish_requests: int = 64  # publish requests in flight at once; more are answered 503
    max_publish_requests_per_client: int = 16
    max_body_bytes: int = 64 << 20  # one publish request's body, refused (413) once this much arrived
    max_request_messages: int = 50_000  # messages (lines) in one publish request, counted before any is cut
    # What the publish requests in flight may hold together: each body byte twice (the body, then its
    # messages) and PUBLISH_MESSAGE_COST per message; beyond it 503. Bounds the gateway's memory.
    publish_memory_bytes: int = 256 << 20
    max_publishers: int = 100  # queues with an open publisher at once (least recently used closed)
    idle_publisher_seconds: float = 300.0  # a queue's publisher unused this long is closed
    session_seconds: float = 43_200.0  # a console login lasts this long


@dataclass(frozen=True)
class ClusterConfig:
    run_dir: str = ".roq/cluster"
    gcms: int = 2
    hcms: int = 2
    zk_port: int = 0  # 0 = a free port


@dataclass(frozen=True)
class LogConfig:
    level: str = "INFO"


@dataclass(frozen=True)
class Config:
    zk: ZkConfig = field(default_factory=ZkConfig)
    gcm: GcmConfig = field(default_factory=GcmConfig)
    hcm: HcmConfig = field(default_factory=HcmConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    web: WebConfig = field(default_factory=WebConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_toml(self) -> str:
        lines = []
        for section, values in self.to_dict().items():
            lines.append(f"[{section}]")
            for key, value in values.items():
                lines.append(f"{key} = {json.dumps(value)}")
            lines.append("")
        return "\n".join(lines)

    def redacted(self) -> Config:
        """A copy fit to print: ZooKeeper passwords replaced by ***."""
        def hide(credentials: str) -> str:
            return ",".join(f"{c.partition(':')[0]}:***" for c in credential_list(credentials))
        return dataclasses.replace(self, zk=dataclasses.replace(self.zk, auth=hide(self.zk.auth),
                                                                 readers=hide(self.zk.readers)))

    def replace(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some keys changed, validated like any other layer."""
        return _apply(self, {s: dict(v) for s, v in sections.items()}, "override")

    @property
    def host_name(self) -> str:
        return self.hcm.host or socket.gethostname()


_SECTIONS = {f.name: f.type for f in fields(Config)}


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Iterable[str] = (),
    base: Config | None = None,
) -> Config:
    """Build and validate the configuration from every layer, in order, over `base` (the defaults
    unless given: `roq cluster up` passes the settings the previous `up` was started with)."""
    env = os.environ if env is None else env
    config = base or Config()
    path = path or env.get(ENV_CONFIG_FILE)
    if path:
        config = _apply(config, _read_file(Path(path)), f"file {path}")
    config = _apply(config, _from_env(env), "environment")
    config = _apply(config, _from_flags(flags), "flags")
    return config


def config_from_json(text: str) -> Config:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"configuration JSON is invalid: {exc}") from None
    return _apply(Config(), data, "JSON")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"configuration file {path} is invalid: {exc}") from None


def _from_env(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    layer: dict[str, dict[str, str]] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        section, _, key = name[len(ENV_PREFIX):].lower().partition("_")
        if section not in _SECTIONS or not key:
            raise ConfigError(f"unknown configuration variable {name}")
        layer.setdefault(section, {})[key] = value
    return layer


def _from_flags(flags: Iterable[str]) -> dict[str, dict[str, str]]:
    layer: dict[str, dict[str, str]] = {}
    for flag in flags:
        dotted, eq, value = flag.partition("=")
        section, dot, key = dotted.partition(".")
        if not eq or not dot:
            raise ConfigError(f"bad setting {flag!r}: expected section.key=value")
        layer.setdefault(section, {})[key] = value
    return layer


def _apply(config: Config, layer: Mapping[str, Any], origin: str) -> Config:
    if not isinstance(layer, Mapping):
        raise ConfigError(f"{origin}: expected a table of sections")
    changes = {}
    for section, values in layer.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{origin}: unknown section {section!r}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{origin}: section {section!r} must be a table")
        current = getattr(config, section)
        types = {f.name: f.type for f in fields(current)}
        updates = {}
        for key, value in values.items():
            if key not in types:
                raise ConfigError(f"{origin}: unknown key {section}.{key}")
            updates[key] = _coerce(value, types[key], f"{origin}: {section}.{key}")
        changes[section] = dataclasses.replace(current, **updates)
    result = dataclasses.replace(config, **changes)
    _validate(result)
    return result


def _coerce(value: Any, type_name: Any, where: str) -> Any:
    kind = {"str": str, "int": int, "float": float, "bool": bool}[str(type_name)]
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            if kind is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(text)
            return kind(text)
        except ValueError:
            pass
    raise ConfigError(f"{where} must be {kind.__name__}, got {value!r}")


def _validate(c: Config) -> None:
    def positive(where: str, value: float) -> None:
        if value <= 0:
            raise ConfigError(f"{where} must be positive, got {value}")

    if not c.zk.hosts.strip():
        raise ConfigError("zk.hosts must name at least one server")
    if not c.zk.root.startswith("/") or c.zk.root.endswith("/") or "//" in c.zk.root:
        raise ConfigError(f"zk.root must be an absolute ZooKeeper path, got {c.zk.root!r}")
    for where, value in (
        ("zk.session_timeout", c.zk.session_timeout), ("zk.connect_timeout", c.zk.connect_timeout),
        ("gcm.tick", c.gcm.tick), ("hcm.tick", c.hcm.tick), ("hcm.capacity", c.hcm.capacity),
        ("hcm.restart_backoff", c.hcm.restart_backoff), ("hcm.ready_timeout", c.hcm.ready_timeout),
        ("hcm.stop_grace", c.hcm.stop_grace), ("exchange.max_message_bytes", c.exchange.max_message_bytes),
        ("exchange.sub_hwm", c.exchange.sub_hwm), ("exchange.stats_interval", c.exchange.stats_interval),
        ("exchange.retention_bytes", c.exchange.retention_bytes),
        ("exchange.fetch_max_bytes", c.exchange.fetch_max_bytes),
        ("exchange.beat_interval", c.exchange.beat_interval),
        ("exchange.publisher_ttl", c.exchange.publisher_ttl), ("exchange.max_publishers", c.exchange.max_publishers),
        ("exchange.max_publishers_per_connection", c.exchange.max_publishers_per_connection),
        ("exchange.max_prefixes", c.exchange.max_prefixes),
        ("exchange.replay_budget_bytes", c.exchange.replay_budget_bytes),
        ("exchange.max_groups", c.exchange.max_groups), ("exchange.max_group_members", c.exchange.max_group_members),
        ("exchange.group_max_prefetch", c.exchange.group_max_prefetch),
        ("exchange.group_member_timeout", c.exchange.group_member_timeout),
        ("exchange.group_ttl", c.exchange.group_ttl), ("exchange.group_max_bytes", c.exchange.group_max_bytes),
        ("client.prefetch", c.client.prefetch), ("client.ack_timeout", c.client.ack_timeout),
        ("client.max_deliveries", c.client.max_deliveries),
        ("client.position_save_interval", c.client.position_save_interval),
        ("client.fetch_timeout", c.client.fetch_timeout), ("client.receive_hwm", c.client.receive_hwm),
        ("hcm.stats_interval", c.hcm.stats_interval), ("hcm.stats_heartbeat", c.hcm.stats_heartbeat),
        ("autoscale.scale_out_after", c.autoscale.scale_out_after),
        ("autoscale.scale_in_after", c.autoscale.scale_in_after), ("autoscale.cooldown", c.autoscale.cooldown),
        ("autoscale.relocate_after", c.autoscale.relocate_after),
        ("autoscale.relocate_cooldown", c.autoscale.relocate_cooldown),
        ("client.request_timeout", c.client.request_timeout), ("client.attempt_timeout", c.client.attempt_timeout),
        ("client.max_unconfirmed", c.client.max_unconfirmed),
        ("client.max_batch", c.client.max_batch), ("client.max_batch_bytes", c.client.max_batch_bytes),
        ("client.publish_timeout", c.client.publish_timeout),
        ("client.confirm_timeout", c.client.confirm_timeout), ("client.replay_bytes", c.client.replay_bytes),
        ("cluster.gcms", c.cluster.gcms), ("cluster.hcms", c.cluster.hcms),
        ("web.sample_interval", c.web.sample_interval), ("web.history_seconds", c.web.history_seconds),
        ("web.publish_timeout", c.web.publish_timeout), ("web.max_streams", c.web.max_streams),
        ("web.max_publishers", c.web.max_publishers),
        ("web.idle_publisher_seconds", c.web.idle_publisher_seconds),
        ("web.session_seconds", c.web.session_seconds),
        ("web.max_publish_requests", c.web.max_publish_requests), ("web.max_body_bytes", c.web.max_body_bytes),
        ("web.max_request_messages", c.web.max_request_messages),
        ("web.publish_memory_bytes", c.web.publish_memory_bytes),
    ):
        positive(where, value)
    if c.hcm.restart_backoff_max < c.hcm.restart_backoff:
        raise ConfigError("hcm.restart_backoff_max must be >= hcm.restart_backoff")
    for where, value in (("hcm.max_restarts", c.hcm.max_restarts), ("hcm.restart_window", c.hcm.restart_window)):
        positive(where, value)
    if c.hcm.hung_timeout < 0 or 0 < c.hcm.hung_timeout < 3 * c.exchange.stats_interval:
        raise ConfigError("hcm.hung_timeout must be 0 (never) or at least 3 x exchange.stats_interval: an "
                          "exchange reports once per interval, and a healthy one must not look hung")
    if c.hcm.failed_cooloff < c.hcm.restart_window:
        raise ConfigError("hcm.failed_cooloff must be >= hcm.restart_window: a shorter cool-off would "
                          "restart a flapping exchange more often than hcm.max_restarts allows")
    if c.exchange.publisher_ttl <= c.client.replay_seconds:
        raise ConfigError("exchange.publisher_ttl must be longer than client.replay_seconds: a publisher "
                          "forgotten sooner could resend messages the exchange no longer knows it had")
    if c.exchange.replay_budget_bytes < 2 * c.exchange.fetch_max_bytes:
        raise ConfigError("exchange.replay_budget_bytes must be at least 2 x exchange.fetch_max_bytes")
    if c.exchange.max_batch_bytes < c.exchange.max_message_bytes:
        raise ConfigError("exchange.max_batch_bytes must be >= exchange.max_message_bytes")
    if c.exchange.group_max_prefetch > MAX_PREFETCH:
        raise ConfigError(f"exchange.group_max_prefetch must be at most {MAX_PREFETCH} (the most a join may ask), "
                          f"got {c.exchange.group_max_prefetch}")
    for where, port in (("gcm.port", c.gcm.port), ("cluster.zk_port", c.cluster.zk_port), ("web.port", c.web.port)):
        if not 0 <= port <= 65535:
            raise ConfigError(f"{where} must be a TCP port (0 = any free one), got {port}")
    for where, port in (("gcm.metrics_port", c.gcm.metrics_port), ("hcm.metrics_port", c.hcm.metrics_port)):
        if not -1 <= port <= 65535:
            raise ConfigError(f"{where} must be a TCP port (0 = any free one, -1 = off), got {port}")
    if c.client.replay_seconds < 0:
        raise ConfigError("client.replay_seconds must be >= 0")
    if c.exchange.retention_seconds < 0:
        raise ConfigError("exchange.retention_seconds must be >= 0 (0 keeps nothing)")
    if c.gcm.reassign_grace < 0 or c.gcm.journal_reassign_grace < 0:
        raise ConfigError("gcm.reassign_grace and gcm.journal_reassign_grace must be >= 0")
    if c.gcm.storage_full_grace < 0 or c.gcm.min_free_bytes < 0:
        raise ConfigError("gcm.storage_full_grace and gcm.min_free_bytes must be >= 0")
    if c.log.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log.level must be DEBUG, INFO, WARNING or ERROR, got {c.log.level!r}")
    if c.gcm.max_queues < 1:
        raise ConfigError(f"gcm.max_queues must be positive, got {c.gcm.max_queues}")
    if c.gcm.rebalance_delay < 0 or c.gcm.rebalance_margin < 0:
        raise ConfigError("gcm.rebalance_delay and gcm.rebalance_margin must be >= 0")
    if not 1 <= c.gcm.rebalance_moves <= 64:
        raise ConfigError(f"gcm.rebalance_moves must be from 1 to 64, got {c.gcm.rebalance_moves}")
    if len(c.hcm.zone) > 64 or any(ch.isspace() or not ch.isprintable() for ch in c.hcm.zone):
        raise ConfigError(f"hcm.zone must be at most 64 printable characters without spaces, got {c.hcm.zone!r}")
    if c.gcm.default_replicas not in (1, 2):
        raise ConfigError(f"gcm.default_replicas must be 1 or 2, got {c.gcm.default_replicas}")
    if c.exchange.journal not in JOURNAL_MODES:
        raise ConfigError(f"exchange.journal must be {', '.join(JOURNAL_MODES[:-1])} or {JOURNAL_MODES[-1]}, "
                          f"got {c.exchange.journal!r}")
    if c.exchange.journal_segment_bytes < MIN_JOURNAL_SEGMENT_BYTES:
        raise ConfigError(f"exchange.journal_segment_bytes must be at least {MIN_JOURNAL_SEGMENT_BYTES} "
                          f"(64 KiB), got {c.exchange.journal_segment_bytes}")
    if not c.hcm.data_dir.strip():
        raise ConfigError("hcm.data_dir must name a directory")
    if c.security.max_connections_per_client < 0:
        raise ConfigError("security.max_connections_per_client must be >= 0 (0 = no limit)")
    if c.security.default_permissions not in PERMISSION_DEFAULTS:
        raise ConfigError(f"security.default_permissions must be all or none, got {c.security.default_permissions!r}")
    if c.security.curve and not c.security.keys_dir:
        raise ConfigError("security.curve needs security.keys_dir (make one with `roq keys generate DIR`)")
    if bool(c.web.tls_cert) != bool(c.web.tls_key):
        raise ConfigError("web.tls_cert and web.tls_key go together: give both (HTTPS) or neither")
    _check_web_limits(c)
    if c.web.auth and not c.web.tokens_file:
        raise ConfigError("web.auth needs web.tokens_file "
                          "(make one with `roq web token add NAME --role admin --file F`)")
    credentials: list[tuple[str, str]] = [("zk.auth", c.zk.auth)]
    credentials += [("zk.readers", r) for r in credential_list(c.zk.readers)]
    for where, credential in credentials:
        if credential and not _is_credential(credential):
            raise ConfigError(f"{where} must be user:password with a non-empty user, got an invalid value")
    if c.zk.readers and not c.zk.auth:
        raise ConfigError("zk.readers needs zk.auth: read-only identities only mean something on protected znodes")
    if c.hcm.host:
        from roq.names import check_host_name
        try:
            check_host_name(c.hcm.host)
        except Exception as exc:
            raise ConfigError(f"hcm.host: {exc}") from None


def _check_web_limits(c: Config) -> None:
    for where, value in (("web.max_streams_per_client", c.web.max_streams_per_client),
                         ("web.max_publish_requests_per_client", c.web.max_publish_requests_per_client)):
        if value < 0:
            raise ConfigError(f"{where} must be >= 0 (0 = no per-caller limit), got {value}")
    largest = 2 * c.web.max_body_bytes + c.web.max_request_messages * PUBLISH_MESSAGE_COST
    if c.web.publish_memory_bytes < largest:
        raise ConfigError(f"web.publish_memory_bytes ({c.web.publish_memory_bytes}) must be at least {largest}: "
                          "2 x web.max_body_bytes + web.max_request_messages x "
                          f"{PUBLISH_MESSAGE_COST}, what the largest request costs")


def credential_list(value: str) -> list[str]:
    """The "user:password" entries of a comma-separated setting (zk.readers), blanks left out."""
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def _is_credential(value: str) -> bool:
    user, colon, password = value.partition(":")
    return bool(user.strip()) and bool(colon) and bool(password) and "," not in value
