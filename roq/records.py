"""Typed statistics records: what the exchanges, the HCMs and the leader report.

Each record is a frozen dataclass whose field names are the keys on the wire:
the exchange's JSON lines to its HCM, the JSON in ZooKeeper
(`<root>/live/...` and `<root>/hosts/<host>`), the control API's msgpack
answer to `cluster.stats`, and the JSON records of the statistics stream.
docs/protocol.md describes those keys; this module is the one place that
spells them in code.

* `ExchangeStats`: one exchange's report (`stats` of its live znode), with a `GroupStats` per
  consumer group.
* `HostStats`: one HCM's figures (`stats` of its host znode).
* `QueueStats` (with one `ExchangeSummary` per exchange) and `ClusterStats`
  (with one `HostSummary` per host): the leader's aggregates.
* `ExchangeSample`, `HostSample`: the statistics stream's records.

`to_dict()` gives the wire map. `from_dict()` reads a map written by any
version, so it never fails: unknown keys are ignored, and a missing key, or
one holding the wrong type (or a number that is not finite), takes the
field's default. A reader of an older or newer writer sees zeros, never an
exception.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="Record")
TopPublishers = tuple[tuple[str, float], ...]  # (publisher id, msgs/s), heaviest first


@dataclass(frozen=True)
class Record:
    """The base of the records: the wire map, and a reader that tolerates any input."""

    # Fields left out of the wire map while None (keys that only some reports carry).
    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _encode(value) for f in fields(self)
                if (value := getattr(self, f.name)) is not None or f.name not in self.OMITTED_WHEN_NONE}

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:
        """The record in `data`; anything but a map gives the defaults."""
        if not isinstance(data, Mapping):
            return cls()
        hints = _hints(cls)
        values = {}
        for f in fields(cls):
            if f.name in data:
                value = _decode(hints[f.name], data[f.name])
                if value is not _INVALID:
                    values[f.name] = value
        return cls(**values)


# ---------------------------------------------------------------- exchanges

@dataclass(frozen=True)
class ConsumerLag(Record):
    """How far one durable subscriber is behind one exchange's stream (exchange/consumers.py), or,
    in a queue's aggregate, behind all of them (frames and messages summed, seconds the largest)."""

    name: str = ""
    frames: int = 0
    messages: int = 0
    seconds: float = 0.0  # how long the oldest frame it lacks has waited
    reported_ago: float = 0.0  # seconds since it last reported: a subscriber away keeps falling behind


@dataclass(frozen=True)
class GroupStats(Record):
    """One consumer group at one exchange (exchange/groups.py `Groups.stats`), or, in a queue's
    aggregate (`group_totals`), over the queue's running exchanges."""

    members: int = 0  # connected now (a member joins every exchange: the aggregate takes the most at one)
    ready: int = 0  # waiting for a member
    delayed: int = 0  # waiting for their not-before time
    in_flight: int = 0  # sent to a member, not acked yet
    acked: int = 0  # counters since the group was created on the exchange (its incarnation)
    delivered: int = 0  # redeliveries included
    redelivered: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    held_bytes: int = 0  # payload bytes of its ready, delayed and in-flight messages
    oldest_ready_s: float = 0.0  # the lag: how long the oldest ready message has waited
    topics: tuple[str, ...] = ()  # its prefixes

    @property
    def backlog(self) -> int:
        """Messages the group has not seen acked: ready, delayed and in flight."""
        return self.ready + self.delayed + self.in_flight


GROUP_SUMS = ("ready", "delayed", "in_flight", "acked", "delivered", "redelivered", "nacked", "dead_lettered",
              "held_bytes")


def group_totals(per_exchange: Iterable[Mapping[str, GroupStats]]) -> dict[str, GroupStats]:
    """Each group over the exchanges that run it: messages summed, members and lag the largest at
    one exchange (every member joins every running exchange of its queue), sorted by name."""
    totals: dict[str, dict[str, Any]] = {}
    for groups in per_exchange:
        for name, g in groups.items():
            total = totals.setdefault(name, {"members": 0, "oldest_ready_s": 0.0, "topics": g.topics,
                                             **dict.fromkeys(GROUP_SUMS, 0)})
            total["members"] = max(total["members"], g.members)
            total["oldest_ready_s"] = max(total["oldest_ready_s"], g.oldest_ready_s)
            for key in GROUP_SUMS:
                total[key] += getattr(g, key)
    return {name: GroupStats(**totals[name]) for name in sorted(totals)}


def queue_groups(description: Mapping[str, Any]) -> dict[str, GroupStats]:
    """The consumer groups of a queue description (`queue.describe`), over its running exchanges."""
    return group_totals(ExchangeStats.from_dict((x.get("live") or {}).get("stats")).groups
                        for x in description.get("exchanges") or ())


# Upper bounds (seconds) of an exchange's confirm-latency buckets: from a batch read to its ack sent.
CONFIRM_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True)
class ExchangeStats(Record):
    """One exchange's report: counters since its process (incarnation) started, rates over the
    interval since its previous report. The exchange writes everything but `at`, which its HCM
    sets when the report arrives (a frozen exchange stops reporting, and its `at` ages)."""

    OMITTED_WHEN_NONE = frozenset({"latency_p50_ms", "latency_p99_ms", "at", "store_oldest_time"})

    # Counters (exchange/stats.py Counters).
    msgs_in: int = 0
    bytes_in: int = 0
    msgs_out: int = 0
    bytes_out: int = 0
    frames_out: int = 0
    duplicates: int = 0
    rejected: int = 0
    malformed: int = 0
    fetches: int = 0
    fetched_frames: int = 0
    busy: int = 0
    refused_batches: int = 0
    refused_hellos: int = 0
    internal_errors: int = 0
    # Rates and the interval's figures.
    msgs_in_per_s: float = 0.0
    bytes_in_per_s: float = 0.0
    msgs_out_per_s: float = 0.0
    bytes_out_per_s: float = 0.0
    drops: int = 0  # rejected + malformed
    publishers: int = 0  # active in the last 10 s
    subscriptions: int = 0
    subscribers: int = 0
    top_publishers: TopPublishers = ()
    latency_p50_ms: float | None = None  # only when batches with new messages arrived
    latency_p99_ms: float | None = None
    # Security (roq/security.py Gatekeeper).
    refused_connections: int = 0
    refused_over_limit: int = 0
    refused_permission: int = 0
    permissions_version: int = 0  # which permission table new connections are judged by (its znode's mzxid)
    # Retention, publisher state and memory (exchange/main.py).
    retained_frames: int = 0
    retained_bytes: int = 0
    evicted_frames: int = 0
    known_publishers: int = 0
    expired_publishers: int = 0
    tracked_prefixes: int = 0
    replay_held_bytes: int = 0
    rss_bytes: int = 0
    # Durability (exchange/confirms.py, exchange/replication.py): acks waiting for the replica or
    # the journal, and how far the replica holds the stream (0: no replica); next_pos is the stream's.
    held_acks: int = 0
    replicated_to: int = 0
    next_pos: int = 0
    # A disk storage policy's state transfer to a new replica (exchange/replica_transfer.py): the
    # position the transfer fills up to (0: none under way, the replica holds what our store does)
    # and how far the replica holds it.
    transfer_end: int = 0
    transferred_to: int = 0
    # Why our replica says it cannot store our copy (its `broken` answer, protocol 6.2): acks wait meanwhile,
    # and the replica restarts itself after 30 s; "" while it stores.
    replica_error: str = ""
    # A start-up adoption of the groups an earlier incarnation left (exchange/group_adopt.py): groups
    # whose backlog has not all come from the replica yet, and seconds since its last page came.
    adopting_groups: int = 0
    adoption_stalled_s: float = 0.0
    # A replica's own (exchange/replica.py): copies (incarnations) held, frames copied into them, frames
    # refused on `repl` (no or a wrong copy secret, or not a daemon's key), seals refused (still running).
    copies: int = 0
    copied_frames: int = 0
    stored_bytes: int = 0  # its copies' segment stores on disk (exchange/replica_disk.py)
    transferring: int = 0  # copies whose state transfer is under way
    adopted: int = 0  # stores an earlier process of this replica wrote, served as stored incarnations
    refused_copies: int = 0
    refused_seals: int = 0
    # The journal's disk (exchange/storage.py): with exchange.journal = fsync, true while it refuses
    # writes (acks wait, publishers are held and told storage_full, the leader moves the exchange);
    # why ("ENOSPC: No space left on device", "" while it writes); failed write attempts; bytes not
    # yet written.
    storage_full: bool = False
    storage_error: str = ""
    journal_errors: int = 0
    journal_pending_bytes: int = 0
    # The queue's segment store on disk (exchange/disk_tail.py StoreFigures, docs/segment-store.md).
    store_state: str = ""  # "": none (memory only); "ok"; "full": refuses writes, broke, or too much waits
    store_bytes: int = 0  # segment and index files of every incarnation's store on this host
    store_segments: int = 0
    store_oldest_pos: int = 0  # this incarnation's oldest position on disk; 0: none on disk
    store_oldest_time: float | None = None  # Unix seconds the oldest frame on disk was stored (any incarnation)
    # Durable subscribers behind this stream, furthest first (exchange/consumers.py).
    consumers: tuple[ConsumerLag, ...] = ()
    # Consumer groups of this stream (exchange/groups.py Groups.stats), by name.
    groups: dict[str, GroupStats] = field(default_factory=dict)
    # Confirm latency since the process started (exchange/stats.py): per CONFIRM_BUCKETS bound, the acks
    # sent within it and above the previous bound, then those above the last; and their seconds summed.
    confirm_buckets: tuple[int, ...] = ()
    confirm_seconds_sum: float = 0.0
    # Set by the HCM: wall clock of arrival, seconds since the epoch.
    at: float | None = None


# ---------------------------------------------------------------- hosts


@dataclass(frozen=True)
class HostStats(Record):
    """One HCM's figures for its host, refreshed every `hcm.stats_interval`."""

    cpu_percent: float = 0.0  # since the previous report
    memory_percent: float = 0.0
    memory_used_bytes: int = 0
    load1: float = 0.0
    cpus: int = 0  # 0: unknown
    exchanges: int = 0  # exchange processes the HCM supervises
    # The file system of hcm.data_dir (journals): bytes free to an unprivileged writer, and in all
    # (0: unknown). The leader places no journaling exchange where too little is free.
    data_free_bytes: int = 0
    data_total_bytes: int = 0
    at: float = 0.0  # wall clock, seconds since the epoch


@dataclass(frozen=True)
class HostSummary(HostStats):
    """A host in the cluster aggregate: its figures and its registered capacity."""

    capacity: int = 0

    @classmethod
    def of(cls, stats: HostStats, capacity: int) -> HostSummary:
        return cls(**{**asdict(stats), "capacity": capacity})


# ---------------------------------------------------------------- the leader's aggregates


@dataclass(frozen=True)
class Load(Record):
    """The figures the leader sums over a queue's exchanges (each also an `ExchangeStats` field)."""

    msgs_in_per_s: float = 0.0
    msgs_out_per_s: float = 0.0
    bytes_in_per_s: float = 0.0
    bytes_out_per_s: float = 0.0
    publishers: int = 0
    subscriptions: int = 0
    drops: int = 0
    retained_bytes: int = 0
    store_bytes: int = 0


LOAD_FIELDS = tuple(f.name for f in fields(Load))


@dataclass(frozen=True)
class ExchangeSummary(Load):
    """One exchange of a queue in the aggregate; figures 0 while it does not run."""

    id: str = ""
    host: str | None = None  # None: not placed
    running: bool = False
    restarts: int = 0
    top_publishers: TopPublishers = ()
    latency_p50_ms: float | None = None  # None (null on the wire): no samples
    latency_p99_ms: float | None = None
    consumers: tuple[ConsumerLag, ...] = ()
    groups: dict[str, GroupStats] = field(default_factory=dict)  # its consumer groups (none while it does not run)
    store_state: str = ""  # its segment store, as in ExchangeStats
    store_segments: int = 0
    store_oldest_pos: int = 0
    store_oldest_time: float | None = None

    @classmethod
    def of(cls, xid: str, host: str | None, running: bool, restarts: int, stats: ExchangeStats) -> ExchangeSummary:
        return cls(id=xid, host=host, running=running, restarts=restarts, top_publishers=stats.top_publishers,
                   latency_p50_ms=stats.latency_p50_ms, latency_p99_ms=stats.latency_p99_ms,
                   store_state=stats.store_state, store_segments=stats.store_segments,
                   store_oldest_pos=stats.store_oldest_pos, store_oldest_time=stats.store_oldest_time,
                   consumers=stats.consumers if running else (), groups=stats.groups if running else {},
                   **{name: getattr(stats, name) for name in LOAD_FIELDS})


@dataclass(frozen=True)
class QueueStats(Load):
    """One queue: the `Load` figures summed over its exchanges, its rules and recent scaling events."""

    name: str = ""
    exchanges: int = 0
    running: int = 0
    replicas: int = 1  # processes per exchange: 2 when each exchange has a replica on another host
    by_exchange: tuple[ExchangeSummary, ...] = ()
    rules: dict[str, Any] | None = None  # None: no autoscaling rules set
    events: tuple[dict[str, Any], ...] = ()  # scaling and relocation events, oldest first
    subscribers: tuple[ConsumerLag, ...] = ()  # durable subscribers' lag over all exchanges, furthest first
    groups: dict[str, GroupStats] = field(default_factory=dict)  # consumer groups over its exchanges (group_totals)

    @classmethod
    def of(cls, name: str, exchanges: int, by_exchange: tuple[ExchangeSummary, ...], rules: dict[str, Any] | None,
           events: tuple[dict[str, Any], ...], replicas: int = 1) -> QueueStats:
        base = Load()
        totals = {key: sum((getattr(x, key) for x in by_exchange), start=getattr(base, key)) for key in LOAD_FIELDS}
        return cls(name=name, exchanges=exchanges, running=sum(1 for x in by_exchange if x.running),
                   replicas=replicas, by_exchange=by_exchange, rules=rules, events=events,
                   subscribers=_total_lag(by_exchange), groups=group_totals(x.groups for x in by_exchange), **totals)


def _total_lag(by_exchange: tuple[ExchangeSummary, ...]) -> tuple[ConsumerLag, ...]:
    """Each durable subscriber's lag summed over the exchanges that know it."""
    total: dict[str, ConsumerLag] = {}
    for lag in (lag for x in by_exchange for lag in x.consumers):
        seen = total.get(lag.name)
        total[lag.name] = lag if seen is None else ConsumerLag(
            lag.name, seen.frames + lag.frames, seen.messages + lag.messages, max(seen.seconds, lag.seconds),
            max(seen.reported_ago, lag.reported_ago))
    return tuple(sorted(total.values(), key=lambda lag: (-lag.messages, lag.name)))


@dataclass(frozen=True)
class ClusterStats(Record):
    """The leader's answer to `cluster.stats`, rebuilt every tick."""

    queues: dict[str, QueueStats] = field(default_factory=dict)
    hosts: dict[str, HostSummary] = field(default_factory=dict)
    time: float = 0.0  # wall clock of the tick that built it


# ---------------------------------------------------------------- the statistics stream


@dataclass(frozen=True)
class ExchangeSample(Record):
    """Topic "exchange" of the statistics stream: one running exchange at one leader tick."""

    kind: str = "exchange"
    ts: float = 0.0
    queue: str = ""
    exchange: str = ""
    host: str | None = None
    msgs_in_per_s: float = 0.0
    msgs_out_per_s: float = 0.0
    bytes_in_per_s: float = 0.0
    bytes_out_per_s: float = 0.0
    publishers: int = 0
    subscriptions: int = 0
    drops: int = 0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None


@dataclass(frozen=True)
class HostSample(Record):
    """Topic "host" of the statistics stream: one host at one leader tick."""

    kind: str = "host"
    ts: float = 0.0
    host: str = ""
    cpu_percent: float = 0.0
    memory_percent: float = 0.0
    exchanges: int = 0


def column_types(record: type[Record]) -> dict[str, type]:
    """Field name → its scalar type (int, float, str or bool; optional ones unwrapped), in field order."""
    result = {}
    for name, hint in _hints(record).items():
        hint = _optional_of(hint) or hint
        if hint in (int, float, str, bool):
            result[name] = hint
    return result


# ---------------------------------------------------------------- encoding and decoding

_INVALID = object()  # a value of the wrong type: the field keeps its default
_HINTS: dict[type, dict[str, Any]] = {}  # record → field name → its type, resolved once


def _hints(record: type[Record]) -> dict[str, Any]:
    hints = _HINTS.get(record)
    if hints is None:
        resolved = typing.get_type_hints(record)
        hints = _HINTS[record] = {f.name: resolved[f.name] for f in fields(record)}
    return hints


def _optional_of(hint: Any) -> Any:
    """X for `X | None`, else None."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else Any
    return None


def _encode(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_encode(item) for item in value]
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    return value


def _decode(hint: Any, value: Any) -> Any:
    """`value` as `hint`, or _INVALID."""
    inner = _optional_of(hint)
    if inner is not None:
        return None if value is None else _decode(inner, value)
    if hint is Any:
        return value
    if hint is bool:
        return value if isinstance(value, bool) else _INVALID
    if isinstance(value, bool):  # a bool is an int in Python, never a figure here
        return _INVALID
    if hint is int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) else _INVALID
    if hint is float:
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else _INVALID
    if hint is str:
        return value if isinstance(value, str) else _INVALID
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value) if isinstance(value, Mapping) else _INVALID
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return _INVALID
        if len(args) == 2 and args[1] is Ellipsis:  # homogeneous: bad items are dropped
            return tuple(item for item in (_decode(args[0], v) for v in value) if item is not _INVALID)
        items = tuple(_decode(arg, v) for arg, v in zip(args, value))
        return items if len(value) == len(args) and _INVALID not in items else _INVALID
    if origin is dict:
        if not isinstance(value, Mapping):
            return _INVALID
        decoded = {key: _decode(args[1], item) for key, item in value.items() if isinstance(key, str)}
        return {key: item for key, item in decoded.items() if item is not _INVALID}
    raise TypeError(f"no decoder for {hint!r}")  # a field of a type this module does not handle
