"""The settings of the clients, of security, of the web gateway, of the local cluster and of logging.

Each field is declared with `setting()` (roq/config/declare.py): default, range, one-line description.
"""

from __future__ import annotations

from dataclasses import dataclass

from roq.config.declare import setting
from roq.config.servers import TCP_PORT

PERMISSION_DEFAULTS = ("all", "none")  # security.default_permissions (roq/permissions.py)
# What one message of an HTTP publish request costs the gateway beyond its bytes, as Python objects
# (a bytes object, its slots in the request's list and the publisher's log): measured 57, rounded up.
PUBLISH_MESSAGE_COST = 96
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _log_level(value: str) -> str | None:
    if value.upper() not in LOG_LEVELS:
        return f"must be {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}, got {value!r}"
    return None


def _seeds(value: str) -> str | None:
    for seed in (s.strip() for s in value.split(",")):
        if seed and not (seed.startswith("tcp://") and seed.rpartition(":")[2].isdigit()):
            return f"must be tcp://host:port endpoints separated by commas, got {seed!r}"
    return None


@dataclass(frozen=True)
class ClientConfig:
    """Publishers, subscribers, group members and the admin client."""
    request_timeout: float = setting(10.0, "control API round trip, leader lookup included", positive=True)
    attempt_timeout: float = setting(2.0, "one control request to one GCM: a dead or swamped GCM costs at most "
                                     "this", positive=True)
    max_unconfirmed: int = setting(50_000, "messages in flight before publish() blocks", positive=True)
    max_batch: int = setting(2_000, "messages per batch frame", positive=True)
    max_batch_bytes: int = setting(256 << 10, "bytes per batch frame; bounds what a slow subscriber can pin",
                                   positive=True)
    # Off: one frame per batch (protocol 3.2's one-frame form).
    payload_blocks: bool = setting(True, "a batch without attributes goes as two parts, its payloads as one block "
                                   "the exchange passes on without packing each again")
    # Needs payload_blocks: the parts follow a batch's block (protocol 3.2.2).
    large_payload_bytes: int = setting(16 << 10, "a payload this big (or bigger) travels as a ZeroMQ part of its own "
                                       "that the exchange forwards without copying; 0: never", lo=0)
    # Prototypes for issue 34 item 5 (bench/prototypes_large.py measures each against today's
    # behaviour, which their defaults keep).
    zero_copy_send_bytes: int = setting(64 << 10, "a publisher's payload block or large payload part this big (or "
                                        "bigger) is handed to libzmq without a copy (pyzmq then keeps it until "
                                        "sent, at a cost per part); 0: always copy", lo=0)
    payload_views: bool = setting(False, "a subscriber hands each large payload (a part of its own) to the "
                                  "application as a read-only memoryview of the received ZeroMQ part, not "
                                  "copied into bytes")
    socket_buffer_bytes: int = setting(0, "SO_SNDBUF / SO_RCVBUF of a publisher's and a subscriber's data socket; "
                                       "0: the system's default", lo=0)
    # A prototype (issue 34, item 5): at a low rate a small batch need not wait for the acks in
    # flight. bench/prototypes.py measures it.
    eager_in_flight: int = setting(0, "a batch smaller than full goes while fewer than this many are in flight "
                                   "(and it holds at most client.eager_batch_messages)", lo=0, hi=4,
                                   note="0: only while none is")
    eager_batch_messages: int = setting(8, "the most messages a batch sent early under client.eager_in_flight holds",
                                        positive=True)
    # A prototype (issue 34, item 5): no thread hop for a lone batch. bench/prototypes.py measures it.
    caller_send: bool = setting(False, "publish() sends a batch from the application's thread when the "
                                "publisher's I/O thread is asleep and may send (roq/client/publisher/"
                                "socket_owner.py), instead of waking that thread to send it")
    publish_timeout: float = setting(30.0, "how long publish() blocks under backpressure", positive=True)
    confirm_timeout: float = setting(5.0, "no confirm this long: move to another exchange", positive=True)
    # An exchange that dies may have confirmed messages its subscribers never got: must outlast
    # failure detection.
    replay_seconds: float = setting(15.0, "how long confirmed messages are kept for resending after a move", lo=0)
    replay_bytes: int = setting(64 << 20, "bytes of confirmed messages kept so", positive=True)
    state_dir: str = setting(".roq/subscribers", "where durable subscribers save their position, one file per "
                             "queue and name")
    position_save_interval: float = setting(1.0, "seconds between saves of a durable position", positive=True)
    fetch_timeout: float = setting(3.0, "one retention fetch round trip before the exchange counts as unreachable",
                                   positive=True)
    receive_hwm: int = setting(100_000, "frames a subscriber's socket queues before the exchange holds (then "
                               "drops) them", positive=True)
    prefetch: int = setting(100, "a group member's unacked messages per exchange", positive=True)
    ack_timeout: float = setting(30.0, "seconds a member may hold a message unacked (set by the group's first "
                                 "member)", positive=True)
    max_deliveries: int = setting(5, "deliveries of a message before it is dead-lettered (set by the group's "
                                  "first member)", positive=True)


@dataclass(frozen=True)
class AutoscaleConfig:
    """How the leader applies each queue's rules (`roq queue rules`); the limits are per queue."""
    enabled: bool = setting(True, "apply the queues' autoscaling rules")
    scale_out_after: float = setting(2.0, "seconds a rule must keep firing before a scale-out", positive=True)
    scale_in_after: float = setting(15.0, "seconds load must stay low before a scale-in", positive=True)
    cooldown: float = setting(5.0, "seconds between two scaling actions of a queue", positive=True)
    relocate_after: float = setting(2.0, "seconds an exchange is overloaded before it sheds its heaviest publisher",
                                    positive=True)
    relocate_cooldown: float = setting(3.0, "seconds between two relocations of a queue", positive=True)


@dataclass(frozen=True)
class SecurityConfig:
    """ZeroMQ CURVE on every socket, and limits per client (docs/security.md)."""
    curve: bool = setting(False, "encrypt and authenticate the data path and the control API (needs keys_dir)")
    keys_dir: str = setting("", "made by `roq keys generate`: server.key[_secret], clients/, admins/")
    identity: str = setting("", "this client's certificate in keys_dir, e.g. clients/app; empty = the server's")
    max_connections_per_client: int = setting(256, "handshakes per peer address and socket, at exchanges and "
                                              "GCMs; more are refused", lo=0, note="0 = no limit")
    # Set it alike on every daemon.
    default_permissions: str = setting("all", "what a key without an entry in the permission table may do: all "
                                       "(every right on every queue) or none", choices=PERMISSION_DEFAULTS)


@dataclass(frozen=True)
class WebConfig:
    """The web console and HTTP gateway, `roq web` / `roq-web` (docs/http.md)."""
    bind: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8080, "port to listen on (printed at start)", **TCP_PORT)
    auth: bool = setting(False, "require a token (tokens_file) for every API call")
    tokens_file: str = setting("", "lines NAME ROLE SHA256, written by `roq web token add`")
    tls_cert: str = setting("", "PEM certificate: with tls_key, the gateway serves HTTPS")
    tls_key: str = setting("", "PEM private key of tls_cert")
    secure_cookies: bool = setting(False, "mark the session cookie Secure (always so with TLS): behind a TLS proxy")
    # So a DNS-rebinding page cannot drive the gateway.
    hosts: str = setting("", "with auth off, host names (comma-separated) a browser may use besides localhost and "
                         "IP addresses; any other Host header is refused")
    sample_interval: float = setting(2.0, "seconds between samples of the cluster statistics for the charts",
                                     positive=True)
    history_seconds: float = setting(600.0, "how far back the charts go", positive=True)
    publish_timeout: float = setting(10.0, "a publish not confirmed in this time is answered 503", positive=True)
    max_streams: int = setting(64, "open SSE subscriptions at once; more are answered 503", positive=True)
    # A caller is its token's name with auth on, its address with it off (behind a proxy with auth
    # off all callers share its address: 0 then).
    max_streams_per_client: int = setting(8, "SSE subscriptions one caller may hold; beyond it 429", lo=0,
                                          note="0 = no per-caller limit")
    max_publish_requests: int = setting(64, "publish requests in flight at once; more are answered 503",
                                        positive=True)
    max_publish_requests_per_client: int = setting(16, "publish requests one caller may have in flight; beyond "
                                                   "it 429", lo=0, note="0 = no per-caller limit")
    max_body_bytes: int = setting(64 << 20, "one publish request's body, refused (413) once this much arrived",
                                  positive=True)
    max_request_messages: int = setting(50_000, "messages (lines) in one publish request, counted before any is "
                                        "cut", positive=True)
    # Each body byte counts twice (the body, then its messages), plus PUBLISH_MESSAGE_COST a message.
    publish_memory_bytes: int = setting(256 << 20, "what the publish requests in flight may hold together; beyond "
                                        "it 503 (>= 2 x max_body_bytes + 96 x max_request_messages)", positive=True)
    max_publishers: int = setting(100, "queues with an open publisher at once (least recently used closed)",
                                  positive=True)
    idle_publisher_seconds: float = setting(300.0, "a queue's publisher unused this long is closed", positive=True)
    session_seconds: float = setting(43_200.0, "how long a console login lasts", positive=True)


@dataclass(frozen=True)
class ClusterConfig:
    """Where clients find the cluster (`seeds`), and `roq cluster up`: the whole cluster on this machine."""
    seeds: str = setting("", "GCM control endpoints clients bootstrap from, tcp://host:port,... (env ROQ_SEEDS); "
                         "any one answering is enough, the rest are learnt", check=_seeds,
                         rule="tcp://host:port,... or empty")
    run_dir: str = setting(".roq/cluster", "where the local cluster keeps its settings, logs and data")
    gcms: int = setting(2, "GCMs started", positive=True)
    hcms: int = setting(2, "HCMs started", positive=True)
    zk_port: int = setting(0, "ZooKeeper's client port", **TCP_PORT)


@dataclass(frozen=True)
class LogConfig:
    """Logging of the daemons."""
    level: str = setting("INFO", "log level (any case)", check=_log_level, rule="DEBUG, INFO, WARNING or ERROR")
