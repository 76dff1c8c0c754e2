"""RoQ as a Spark data source (Python Data Source API, PySpark 4): `format("roq")`.

Reading (`spark.readStream.format("roq")` or `spark.read.format("roq")`):
* An offset is, per exchange of the queue, its incarnation and a stream
  position: `{"x1": {"inc": "x1.3fa2", "pos": 1200}, ...}`. Positions number
  the frames each exchange sent (docs/protocol.md), and the frames stay in the
  exchange's retention, so any range of offsets can be read again. A query
  restarted from its checkpoint re-reads exactly the ranges Spark had not
  committed: nothing is lost and nothing is read twice, within the retention.
* One partition per exchange and micro-batch. An executor fetches its range
  from the exchange's replay endpoint (no ZooKeeper on executors). It yields
  one row per message: topic, payload, publisher, sequence, exchange,
  timestamp (the publisher's send time).
* An exchange keeps each (publisher, sequence) once. The same message can
  reach two exchanges only when its publisher moved and resent it; use
  `dropDuplicates(["publisher", "sequence"])` if that matters.
* Options: `zk` (required), `root` (/roq), `queue` (required), `topics`
  (comma-separated prefixes, default all), `startingOffsets` (`latest`, the
  default, or `earliest`), `maxFramesPerTrigger`, `failOnDataLoss` (true: a
  range that left the retention before it was read fails the query).

Writing (`df.write.format("roq")`, `df.writeStream.format("roq")`): every
task publishes its rows (`topic`, `payload` columns, string or binary) with a
`roq.client.Publisher` and returns only when all of them are confirmed. So a
batch, or a micro-batch, commits only after its messages are confirmed.
"""

from __future__ import annotations

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
from pyspark.sql.types import StructType

SCHEMA = "topic string, payload binary, publisher string, sequence long, exchange string, timestamp timestamp"
FETCH_TIMEOUT_MS = 10_000
PAGE_BYTES = 4 << 20


class RoqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "roq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RoqBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RoqStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return RoqWriter(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return RoqStreamWriter(self.options)


def register(spark: Any) -> None:
    spark.dataSource.register(RoqDataSource)


# ---------------------------------------------------------------- options


def _lower(options: Any) -> dict[str, str]:
    """Spark hands options over case-insensitively; a plain copy keeps that by lower-casing keys."""
    return {str(k).lower(): v for k, v in dict(options).items()}


def _required(options: dict[str, str], key: str) -> str:
    value = options.get(key)
    if not value:
        raise ValueError(f"the roq data source needs .option({key!r}, ...)")
    return value


def _config(options: dict[str, str]) -> Any:
    """From .option("config", TOML path) if given (keys, credentials), then .option("zk"/"root")."""
    from roq.config import Config, load_config
    if options.get("config"):
        config = load_config(options["config"], env={})
    else:
        _required(options, "zk")
        config = Config()
    overrides = {key: options[opt] for key, opt in (("hosts", "zk"), ("root", "root")) if options.get(opt)}
    return config.replace(zk=overrides) if overrides else config


def _topics(options: dict[str, str]) -> list[bytes]:
    return [t.strip().encode() for t in options.get("topics", "").split(",") if t.strip()]


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class ExchangeRange(InputPartition):
    """Frames after < pos <= upto of one exchange incarnation."""
    exchange: str
    replay: str
    incarnation: str
    after: int
    upto: int
    topics: tuple[bytes, ...]
    fail_on_loss: bool = True
    options: tuple[tuple[str, str], ...] = ()  # the source's options: executors build the config from them


def current_positions(options: dict[str, str]) -> dict[str, dict[str, Any]]:
    """{exchange: {inc, pos (last frame sent), oldest, replay}} for the running exchanges of the queue."""
    from roq.paths import Paths
    from roq.state import read_live
    from roq.zk import start_client, stop_client
    config = _config(options)
    client = start_client(config)
    try:
        live = read_live(client, Paths(config.zk.root), _required(options, "queue"))
    finally:
        stop_client(client)
    positions = {}
    for xid, data in live.items():
        if not data.get("replay"):
            continue
        answer = _ask_position(data["replay"], config)
        if answer is not None:
            inc, oldest, next_pos = answer
            positions[xid] = {"inc": inc, "pos": next_pos - 1, "oldest": oldest, "replay": data["replay"]}
    return positions


def _ask_position(endpoint: str, config: Any) -> tuple[str, int, int] | None:
    import zmq

    from roq import protocol
    from roq.security import secure_client
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    try:
        secure_client(sock, config)
        sock.connect(endpoint)
        sock.send(protocol.encode_position_request(1))
        if not sock.poll(FETCH_TIMEOUT_MS):
            return None
        try:
            answer = protocol.decode_replay_reply(sock.recv(), protocol.MAX_CONTROL_FRAME)
        except protocol.ProtocolError:
            return None
        if not isinstance(answer, protocol.StreamPosition):
            return None
        return answer.incarnation, answer.oldest, answer.next_pos
    finally:
        sock.close()


def read_range(part: ExchangeRange) -> Iterator[tuple[Any, ...]]:
    """The messages of one exchange range, fetched page by page from its retention."""
    import zmq

    from roq import protocol
    from roq.security import secure_client
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    if part.options:
        secure_client(sock, _config(dict(part.options)))
    sock.connect(part.replay)
    try:
        after, request_id = part.after, 0
        while after < part.upto:
            request_id += 1
            sock.send(protocol.encode_fetch(request_id, part.incarnation, after, part.upto + 1,
                                            list(part.topics), PAGE_BYTES))
            if not sock.poll(FETCH_TIMEOUT_MS):
                raise TimeoutError(f"exchange {part.exchange} did not answer a fetch in "
                                   f"{FETCH_TIMEOUT_MS / 1000:.0f}s")
            page = protocol.decode_replay_reply(sock.recv(), 1 << 30)
            if not isinstance(page, protocol.Frames) or page.request_id != request_id:
                continue
            if page.oldest > after + 1 and after > 0 and part.fail_on_loss:
                raise RuntimeError(f"exchange {part.exchange}: positions {after + 1}..{page.oldest - 1} left "
                                   "its retention before this query read them")
            for topic, body in page.frames:
                yield from _rows(topic, protocol.decode_delivery(body))
            after = part.upto if page.done else max(after + 1, page.scanned_to)
    finally:
        sock.close()


def _rows(topic: bytes, d: Any) -> Iterator[tuple[Any, ...]]:
    name = topic.decode("utf-8", "replace")
    sent = datetime.fromtimestamp(d.sent_ns / 1e9, tz=timezone.utc) if d.sent_ns else None
    for seq, payload in zip(d.seqs, d.payloads):
        yield (name, payload, d.publisher, seq, d.exchange, sent)


def plan_ranges(start: dict[str, Any], end: dict[str, Any], topics: list[bytes],
                fail_on_loss: bool = True, options: dict[str, str] | None = None) -> list[ExchangeRange]:
    parts = []
    frozen_options = tuple(sorted((options or {}).items()))
    for xid, last in sorted(end.items()):
        first = start.get(xid) or {}
        # A restarted exchange (new incarnation) is read from its first retained frame.
        after = first.get("pos", 0) if first.get("inc") == last["inc"] else 0
        if last["pos"] > after:
            parts.append(ExchangeRange(xid, last["replay"], last["inc"], after, last["pos"], tuple(topics),
                                       fail_on_loss, frozen_options))
    return parts


class RoqStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = _lower(options)
        self.topics = _topics(self.options)
        _required(self.options, "queue")
        self.max_frames = int(self.options.get("maxframespertrigger", "0") or 0)
        starting = self.options.get("startingoffsets", "latest")
        if starting not in ("latest", "earliest"):
            raise ValueError(f"startingOffsets must be latest or earliest, got {starting!r}")
        self.starting = starting
        self.fail_on_loss = self.options.get("failondataloss", "true").lower() != "false"

    def initialOffset(self) -> dict[str, Any]:
        positions = current_positions(self.options)
        if self.starting == "earliest":
            return {x: {"inc": p["inc"], "pos": p["oldest"] - 1, "replay": p["replay"]} for x, p in positions.items()}
        return {x: {"inc": p["inc"], "pos": p["pos"], "replay": p["replay"]} for x, p in positions.items()}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        latest = {x: {"inc": p["inc"], "pos": p["pos"], "replay": p["replay"]}
                  for x, p in current_positions(self.options).items()}
        if self.max_frames and start:
            for xid, offset in latest.items():
                before = start.get(xid) or {}
                if before.get("inc") == offset["inc"]:
                    offset["pos"] = min(offset["pos"], before.get("pos", 0) + self.max_frames)
        return latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ExchangeRange]:
        return plan_ranges(start, end, self.topics, self.fail_on_loss, self.options)

    def read(self, partition: ExchangeRange) -> Iterator[tuple[Any, ...]]:
        return read_range(partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # retention is time/size bounded on the exchanges; nothing to release


class RoqBatchReader(DataSourceReader):
    """`spark.read.format("roq")`: what the exchanges retain now."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = _lower(options)
        self.topics = _topics(self.options)

    def partitions(self) -> list[ExchangeRange]:
        positions = current_positions(self.options)
        start = {x: {"inc": p["inc"], "pos": p["oldest"] - 1} for x, p in positions.items()}
        # The oldest frames may leave the retention before the tasks run: that is not a loss here.
        return plan_ranges(start, positions, self.topics, fail_on_loss=False, options=self.options)

    def read(self, partition: ExchangeRange) -> Iterator[tuple[Any, ...]]:
        return read_range(partition)


# ---------------------------------------------------------------- writing


@dataclass
class Published(WriterCommitMessage):
    count: int


def publish_rows(options: dict[str, str], rows: Iterator[Any]) -> Published:
    """Publish every row and wait for the confirms; raising fails the task (Spark retries it)."""
    from roq.client.publisher import Publisher
    queue = _required(options, "queue")
    timeout = float(options.get("confirmtimeout", "60"))
    count = 0
    with Publisher(queue, _config(options)) as pub:
        for row in rows:
            topic, payload = row["topic"], row["payload"]
            if isinstance(payload, str):
                payload = payload.encode()
            pub.publish(topic, bytes(payload))
            count += 1
        pub.flush(timeout)
    return Published(count)


class _RowPublisher:
    """Both writers: each task publishes its rows and returns once they are confirmed, so the
    base classes' no-op commit and abort are right (published messages cannot be recalled;
    consumers drop repeats by (publisher, sequence))."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = _lower(options)
        _required(self.options, "queue")

    def write(self, iterator: Iterator[Any]) -> Published:
        return publish_rows(self.options, iterator)


class RoqWriter(_RowPublisher, DataSourceWriter):
    pass


class RoqStreamWriter(_RowPublisher, DataSourceStreamWriter):
    pass
