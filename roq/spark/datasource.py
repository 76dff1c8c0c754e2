"""RoQ as a Spark data source (Python Data Source API, PySpark 4): `format("roq")`.

Options (roq.spark.options) follow Spark's Kafka source. Reading: an offset is, per exchange, its
incarnation and a stream position (plus `msgs`, the messages already read of the next frame), so
any range can be read again from retention (an ended incarnation still served is read to its end
before the exchange's later ones: roq.spark.chains); one partition per exchange and micro-batch, fetched
from the exchange's replay endpoint (no ZooKeeper on executors), one row per message. Writing:
each task publishes its rows with a `roq.client.Publisher` and returns only once all are
confirmed, so a batch commits only after its messages are; only appending exists. The options,
columns, offsets and guarantees: docs/spark.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from roq.spark.chains import Copies, at_time, earliest, offset, segments, step
from roq.spark.exchanges import QueueView, StreamEnd, fetch_deliveries, walk_messages
from roq.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    Position,
    Positions,
    SourceOptions,
    config_from,
    sink_options,
    source_options,
)

COLUMNS = (("topic", "string"), ("payload", "binary"), ("value", "binary"), ("publisher", "string"),
           ("sequence", "bigint"), ("exchange", "string"), ("timestamp", "timestamp"),
           ("headers", "array<struct<key:string,value:binary>>"))
log = logging.getLogger(__name__)
NAMES = tuple(name for name, _ in COLUMNS)
SCHEMA = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)


class RoqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "roq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RoqBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RoqStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("the roq sink only appends (published messages cannot be replaced): "
                              "use .mode('append')")
        return RoqWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # `overwrite` is the complete output mode: every micro-batch publishes all its rows, as Kafka's sink does.
        return RoqStreamWriter(self.options, schema)


def register(spark: Any) -> None:
    spark.dataSource.register(RoqDataSource)


# ---------------------------------------------------------------- offsets


def resolve(spec: Positions, ends: dict[str, StreamEnd], option: str, default: str,
            copies: Copies | None = None) -> dict[str, dict[str, Any]]:
    """The offset `spec` (startingOffsets, endingOffsets) means now, for each running exchange;
    `earliest` is in the oldest ended incarnation still served (`copies`), if any."""
    named = spec if isinstance(spec, dict) else {}
    unknown = sorted(set(named) - set(ends))
    if unknown:
        raise OptionError(f"{option} names {', '.join(unknown)}: not a running exchange of the queue "
                          f"(running: {', '.join(sorted(ends)) or 'none'})")
    fallback = spec if isinstance(spec, str) else default
    offsets = {}
    for xid, end in ends.items():
        want = named.get(xid, fallback)
        if want == EARLIEST:
            offsets[xid] = earliest(xid, end, copies or Copies())
        elif isinstance(want, Position):
            inc = want.inc or end.inc
            if inc == end.inc and (want.pos, want.msgs) > (end.pos, 0):
                raise OptionError(f"{option} {xid}: position {want.pos} is past the exchange's last frame {end.pos}")
            if inc != end.inc and option == "endingOffsets":
                raise OptionError(f"{option} {xid}: incarnation {inc} has ended (running: {end.inc})")
            offsets[xid] = offset(inc, want.pos, want.msgs, end.replay)
        else:
            offsets[xid] = offset(end.inc, end.pos, 0, end.replay)
    return offsets


def _start_of(first: dict[str, Any] | None, inc: str) -> tuple[int, int]:
    """Where reading `inc` starts after offset entry `first`: a restarted exchange (another
    incarnation) from its first retained frame."""
    if first and first.get("inc") == inc:
        return first.get("pos", 0), first.get("msgs", 0)
    return 0, 0


def split_budget(budget: int, backlog: dict[str, int]) -> dict[str, int]:
    """`budget` messages shared in proportion to each exchange's backlog of frames (as Kafka
    splits maxOffsetsPerTrigger over partitions by volume)."""
    total = sum(backlog.values())
    if not total:
        return {xid: 0 for xid in backlog}
    shares = {xid: budget * frames // total for xid, frames in backlog.items()}
    by_remainder = sorted(backlog, key=lambda xid: (-(budget * backlog[xid] % total), xid))
    for xid in by_remainder[:budget - sum(shares.values())]:
        shares[xid] += 1
    return shares


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class ExchangeRange(InputPartition):
    """Of one exchange incarnation: after (after, skip), up to and including (upto, take), where
    (pos, msgs) is "frames up to pos and the first msgs messages of frame pos+1"."""
    exchange: str
    replay: str
    incarnation: str
    after: int
    skip: int
    upto: int
    take: int
    topics: tuple[bytes, ...]
    fail_on_loss: bool
    connection: tuple[tuple[str, str], ...]  # executors build the configuration (keys) from it


def plan_ranges(start: dict[str, Any], end: dict[str, Any], opts: SourceOptions,
                lenient: frozenset[str] = frozenset()) -> list[ExchangeRange]:
    """One partition per exchange with something between `start` and `end`; `lenient`
    exchanges do not fail on frames that left the retention (read from earliest)."""
    parts = []
    for xid, last in sorted(end.items()):
        after, skip = _start_of(start.get(xid), last["inc"])
        upto, take = last["pos"], last.get("msgs", 0)
        if (upto, take) > (after, skip):
            parts.append(ExchangeRange(xid, last["replay"], last["inc"], after, skip, upto, take, opts.topics,
                                       opts.fail_on_loss and xid not in lenient,
                                       tuple(sorted(opts.connection.items()))))
    return parts


def plan_batch(start: dict[str, Any], end: dict[str, Any], opts: SourceOptions, copies: Copies,
               lenient: frozenset[str] = frozenset(), before: dict[str, int] | None = None) -> list[ExchangeRange]:
    """A batch read: per exchange, a partition per incarnation with something to read, the ended
    ones still served first (roq.spark.chains.segments)."""
    parts = []
    for xid, last in sorted(end.items()):
        fail = opts.fail_on_loss and xid not in lenient
        for seg in segments(xid, start.get(xid) or offset(last["inc"], 0, 0, last["replay"]), last, copies, fail,
                            before):
            parts.append(ExchangeRange(xid, seg.replay, seg.inc, seg.after, seg.skip, seg.upto, seg.take,
                                       opts.topics, fail, tuple(sorted(opts.connection.items()))))
    return parts


def read_range(part: ExchangeRange) -> Iterator[tuple[Any, ...]]:
    """The messages of one exchange range, fetched page by page from its retention."""
    last = part.upto + (1 if part.take else 0)
    for topic, delivery in fetch_deliveries(part.exchange, part.replay, part.incarnation, part.after, last,
                                            part.topics, dict(part.connection), part.fail_on_loss):
        first = part.skip if delivery.pos == part.after + 1 else 0
        stop = part.take if part.take and delivery.pos == last else None
        yield from _rows(topic, delivery, first, stop)


def _rows(topic: bytes, d: Any, first: int, stop: int | None) -> Iterator[tuple[Any, ...]]:
    sent = datetime.fromtimestamp(d.sent_ns / 1e9, tz=timezone.utc) if d.sent_ns else None
    headers = d.headers() or [None] * len(d.seqs)
    names = [t.decode("utf-8", "replace") for t in d.message_topics(topic)]  # each message's own topic
    for name, seq, payload, own in list(zip(names, d.seqs, d.payloads, headers))[first:stop]:
        yield (name, payload, payload, d.publisher, seq, d.exchange, sent, list(own.items()) if own else None)


def projection(schema: StructType) -> tuple[int, ...] | None:
    """Indexes of the schema's columns in a full row; None for the full row. A user's
    `.schema(...)` may name a subset of the columns, with their types."""
    if tuple(f.name for f in schema.fields) == NAMES:
        return None
    kinds = dict(COLUMNS)
    for f in schema.fields:
        name = f.name.lower()
        if name not in kinds:
            raise OptionError(f"the roq source has no column {f.name!r}; its columns are {SCHEMA}")
        if f.dataType.simpleString() != kinds[name]:
            raise OptionError(f"column {f.name} of the roq source is {kinds[name]}, not {f.dataType.simpleString()}")
    return tuple(NAMES.index(f.name.lower()) for f in schema.fields)


class _Reader:
    """What both readers share: the options, checked when the query is planned, and the columns."""

    def __init__(self, options: Any, schema: StructType, streaming: bool) -> None:
        self.opts = source_options(options, streaming)
        self.columns = projection(schema)
        self.queue = QueueView(self.opts.connection, self.opts.queue)

    def ends(self) -> dict[str, StreamEnd]:
        return self.queue.positions()

    def starts(self, ends: dict[str, StreamEnd], default: str,
               copies: Copies) -> tuple[dict[str, dict[str, Any]], dict[str, int] | None]:
        """The first offset: startingOffsets (`earliest`: in the oldest incarnation still served),
        or where startingTimestamp lies in the incarnations still served (one that did not say:
        from its oldest frame); with the latter, the last position before it per incarnation."""
        if self.opts.starting_at is None:
            return resolve(self.opts.starting, ends, "startingOffsets", default, copies), None
        before = self.queue.positions_at(self.opts.starting_at)
        return {xid: at_time(xid, end, copies, before) for xid, end in ends.items()}, before

    def copies_for_start(self, default: str) -> Copies:
        """Ended incarnations matter to a start only from earliest or a time: asked only then."""
        spec = self.opts.starting
        named = spec.values() if isinstance(spec, dict) else (spec,)
        if self.opts.starting_at is not None or EARLIEST in named or (isinstance(spec, dict) and default == EARLIEST):
            return self.queue.copies()
        return Copies()

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, ExchangeRange):
            return iter(())  # Spark's stand-in partition when there is nothing to read
        rows = read_range(partition)
        if self.columns is None:
            return rows
        return (tuple(row[i] for i in self.columns) for row in rows)


class RoqStreamReader(_Reader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Any, schema: StructType) -> None:
        super().__init__(options, schema, streaming=True)
        self.target: dict[str, Any] | None = None  # Trigger.AvailableNow: what was there when it started

    def initialOffset(self) -> dict[str, Any]:
        return self.starts(self.ends(), LATEST, self.copies_for_start(LATEST))[0]

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_offsets) if self.opts.max_offsets else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        latest = {xid: dict(entry) for xid, entry in (self.target or self._latest()).items()}
        if not start:
            return latest
        # Offsets in ended incarnations, exchanges new to the query: ended copies first (roq.spark.chains).
        moved = {xid for xid in latest if xid not in start or start[xid]["inc"] != latest[xid]["inc"]}
        if moved:
            copies = self.queue.copies()
            for xid in moved:
                entry = step(xid, start.get(xid), latest[xid], copies, self.opts.fail_on_loss)
                if entry is None:
                    del latest[xid]
                else:
                    latest[xid] = entry
        for xid, entry in start.items():
            # An exchange that did not answer keeps its offset: dropping it would re-read it from scratch.
            latest.setdefault(xid, dict(entry))
        if self.opts.max_frames:
            for xid, entry in latest.items():
                after, _ = _start_of(start.get(xid), entry["inc"])
                if entry["pos"] > after + self.opts.max_frames:
                    latest[xid] = offset(entry["inc"], after + self.opts.max_frames, 0, entry["replay"])
        if isinstance(limit, ReadMaxRows):
            latest = self._limit_messages(start, latest, limit.max_rows)
        return latest

    def _latest(self) -> dict[str, Any]:
        return {xid: offset(e.inc, e.pos, 0, e.replay) for xid, e in self.ends().items()}

    def _limit_messages(self, start: dict[str, Any], latest: dict[str, Any], budget: int) -> dict[str, Any]:
        """At most `budget` messages from `start`: the driver counts them in the exchanges' frames."""
        begin = {xid: _start_of(start.get(xid), entry["inc"]) for xid, entry in latest.items()}
        backlog = {xid: max(0, latest[xid]["pos"] - begin[xid][0]) for xid in latest}
        shares, carried = split_budget(budget, backlog), 0
        limited = dict(latest)
        for xid in sorted(latest):
            entry, (after, skip) = latest[xid], begin[xid]
            allowance = shares[xid] + carried
            if not backlog[xid]:
                continue
            if not allowance:
                limited[xid] = offset(entry["inc"], after, skip, entry["replay"])
                continue
            end = StreamEnd(entry["inc"], entry["pos"], 0, entry["replay"])
            pos, msgs, taken = walk_messages(xid, end, after, skip, entry["pos"], allowance, self.opts.topics,
                                             self.opts.connection)
            if (pos, msgs) != (entry["pos"], 0):  # stopped short: no longer a copy's end
                limited[xid] = offset(entry["inc"], pos, msgs, entry["replay"])
            carried = allowance - taken
        return limited

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ExchangeRange]:
        return plan_ranges(start, self._served_now(end), self.opts)

    def _served_now(self, end: dict[str, Any]) -> dict[str, Any]:
        """`end` with each incarnation's replay endpoint as it is now: a batch planned before an
        exchange restarted, or logged before the query was restarted from its checkpoint, names an
        endpoint that may be gone while the incarnation is served elsewhere (its copy)."""
        try:
            served = {e.inc: e.replay for e in self.ends().values()}
            if any(entry["inc"] not in served for entry in end.values()):
                served |= {c.inc: c.replay for chain in self.queue.copies().ended.values() for c in chain}
        except Exception as exc:  # noqa: BLE001 - the cluster not answering now: the logged endpoints
            log.warning("could not ask where the queue's incarnations are served now (%s)", exc)
            return end
        return {xid: {**entry, "replay": served.get(entry["inc"], entry["replay"])} for xid, entry in end.items()}

    def commit(self, end: dict[str, Any]) -> None:
        pass  # retention is time/size bounded on the exchanges; nothing to release

    def stop(self) -> None:
        self.queue.close()


class RoqBatchReader(_Reader, DataSourceReader):
    """`spark.read.format("roq")`: from startingOffsets (earliest) to endingOffsets (latest)."""

    def __init__(self, options: Any, schema: StructType) -> None:
        super().__init__(options, schema, streaming=False)

    def partitions(self) -> list[ExchangeRange]:
        try:
            ends = self.ends()
            copies = self.queue.copies()
            start, before = self.starts(ends, EARLIEST, copies)
        finally:
            self.queue.close()  # a batch asks once
        end = resolve(self.opts.ending, ends, "endingOffsets", LATEST)
        # The oldest frames may leave the retention before the tasks run: not a loss when reading from earliest.
        starting = self.opts.starting if self.opts.starting_at is None else LATEST  # a time is no "earliest"
        from_earliest = frozenset(x for x in ends if (starting.get(x, EARLIEST) if isinstance(starting, dict)
                                                      else starting) == EARLIEST)
        return plan_batch(start, end, self.opts, copies, from_earliest, before)


# ---------------------------------------------------------------- writing


@dataclass
class Published(WriterCommitMessage):
    count: int


HEADER_KINDS = ("array<struct<key:string,value:binary>>", "array<struct<key:string,value:string>>",
                "map<string,binary>", "map<string,string>")


def sink_columns(schema: StructType, topic_option: str | None) -> tuple[str, str | None, str | None]:
    """The value column (`value`, else `payload`), the topic column (None: the `topic` option,
    which wins over a column, as in Kafka's sink) and the headers column (None: none); an error
    naming what is needed."""
    kinds = {f.name.lower(): (f.name, f.dataType.simpleString()) for f in schema.fields}
    value = next((kinds[name] for name in ("value", "payload") if name in kinds), None)
    topic = kinds.get("topic")
    if value is None or value[1] not in ("binary", "string") or not (
            topic_option or (topic is not None and topic[1] == "string")):
        has = ", ".join(f"{name} {kind}" for name, kind in kinds.values())
        raise OptionError("the roq sink needs a 'value' (or 'payload') column, binary or string, and a "
                          f"'topic' string column or .option('topic', ...); the DataFrame has: {has}")
    headers = kinds.get("headers")
    if headers is not None and headers[1] not in HEADER_KINDS:
        raise OptionError(f"the roq sink's 'headers' column must be one of {', '.join(HEADER_KINDS)} (Kafka's "
                          f"type first), not {headers[1]}")
    return value[0], None if topic_option else topic[0], headers[0] if headers else None  # type: ignore[index]


def row_headers(value: Any) -> dict[str, bytes] | None:
    """A row's headers as publish() takes them, from Kafka's array of (key, value) or a map; a key
    given twice is refused (a message has one value per key)."""
    if not value:
        return None
    pairs = value.items() if isinstance(value, dict) else ((h["key"], h["value"]) for h in value)
    headers: dict[str, bytes] = {}
    for key, raw in pairs:
        if key in headers:
            raise ValueError(f"the roq sink cannot publish header {key!r} twice in one row")
        headers[key] = b"" if raw is None else raw.encode() if isinstance(raw, str) else bytes(raw)
    return headers


def publish_rows(options: Any, value_column: str, topic_column: str | None, rows: Iterator[Any],
                 headers_column: str | None = None) -> Published:
    """Publish every row and wait for the confirms; raising fails the task (Spark retries it)."""
    from roq.client.publisher import Publisher
    count = 0
    with Publisher(options.queue, config_from(options.connection)) as pub:
        for row in rows:
            topic = row[topic_column] if topic_column else options.topic
            payload = row[value_column]
            if topic is None or payload is None:
                null = topic_column if topic is None else value_column
                raise ValueError(f"the roq sink cannot publish a row whose {null} is null")
            headers = row_headers(row[headers_column]) if headers_column else None
            pub.publish(topic, payload.encode() if isinstance(payload, str) else bytes(payload), headers=headers)
            count += 1
        pub.flush(options.confirm_timeout)
    return Published(count)


class _RowPublisher:
    """Both writers: each task publishes its rows and returns once they are confirmed, so the
    base classes' no-op commit and abort are right (published messages cannot be recalled;
    consumers drop repeats by (publisher, sequence))."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.opts = sink_options(options)
        self.value_column, self.topic_column, self.headers_column = sink_columns(schema, self.opts.topic)
        queue = QueueView(self.opts.connection, self.opts.queue)
        try:
            queue.check()  # on the driver, before any task
        finally:
            queue.close()

    def write(self, iterator: Iterator[Any]) -> Published:
        return publish_rows(self.opts, self.value_column, self.topic_column, iterator, self.headers_column)


class RoqWriter(_RowPublisher, DataSourceWriter):
    pass


class RoqStreamWriter(_RowPublisher, DataSourceStreamWriter):
    pass
