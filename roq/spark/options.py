"""The `roq` source's and sink's options, checked on the driver before any task runs.

Names follow Spark's Kafka source where the idea is the same (`startingOffsets`,
`endingOffsets`, `maxOffsetsPerTrigger`, `failOnDataLoss`, the sink's `topic`).
Spark hands options over case-insensitively, so keys are compared lower-cased. An
option the source or the sink does not know is an error naming the known ones:
Spark's Kafka source ignores a misspelt option, and a query then silently reads
something else than meant.

`startingTimestamp` (epoch milliseconds, as Kafka's, or ISO 8601 with a zone) starts every
exchange at its first frame stored at or after that time instead (docs/spark.md).

Positions (`startingOffsets`, `endingOffsets`) are `earliest`, `latest` (any case),
or JSON naming exchanges of the queue, in the form the source's own offsets take
(docs/spark.md): `{"x1": {"inc": "x1.3fa2", "pos": 1200}, "x2": -2}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from roq.start_time import parse_start_time

EARLIEST, LATEST = "earliest", "latest"
KAFKA_CODES = {-2: EARLIEST, -1: LATEST}  # Kafka's JSON spells earliest -2 and latest -1

# lower-case key → the name users write (for messages and docs)
CONNECTION = {"seeds": "seeds", "config": "config", "queue": "queue"}
SOURCE = {**CONNECTION, "topics": "topics", "startingoffsets": "startingOffsets",
          "startingtimestamp": "startingTimestamp", "endingoffsets": "endingOffsets",
          "maxoffsetspertrigger": "maxOffsetsPerTrigger",
          "maxframespertrigger": "maxFramesPerTrigger", "failondataloss": "failOnDataLoss"}
SINK = {**CONNECTION, "topic": "topic", "confirmtimeout": "confirmTimeout",
        "checkpointlocation": "checkpointLocation"}  # Spark passes a stream's checkpointLocation to the sink


class OptionError(ValueError):
    """An option of the roq source or sink is missing, unknown or malformed."""


@dataclass(frozen=True)
class Position:
    """A position from the user: frames up to `pos` and the first `msgs` messages of frame pos+1
    are before it; `inc` None means the incarnation that runs when the query starts."""
    pos: int
    msgs: int = 0
    inc: str | None = None


# earliest, latest, or per exchange: earliest, latest or a Position
Positions = str | dict[str, str | Position]


@dataclass(frozen=True)
class SourceOptions:
    connection: dict[str, str]
    queue: str
    topics: tuple[bytes, ...] = ()
    starting: Positions = LATEST
    starting_at: float | None = None  # startingTimestamp as Unix seconds: replaces `starting`
    ending: Positions = LATEST
    max_offsets: int = 0  # messages per micro-batch; 0 = no bound
    max_frames: int = 0  # frames per exchange and micro-batch; 0 = no bound
    fail_on_loss: bool = True


@dataclass(frozen=True)
class SinkOptions:
    connection: dict[str, str]
    queue: str
    topic: str | None = None
    confirm_timeout: float = 60.0


def lower(options: Any) -> dict[str, str]:
    return {str(k).lower(): v for k, v in dict(options).items()}


def check_known(options: dict[str, str], known: dict[str, str], what: str) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise OptionError(f"the roq {what} has no option {', '.join(unknown)}; "
                          f"its options are {', '.join(sorted(known.values(), key=str.lower))}")


def required(options: dict[str, str], key: str) -> str:
    value = options.get(key)
    if not value:
        raise OptionError(f"the roq data source needs .option({key!r}, ...)")
    return value


def connection(options: dict[str, str]) -> dict[str, str]:
    """What a driver or an executor needs to build the RoQ configuration (see config_from)."""
    if not options.get("seeds") and not options.get("config"):
        raise OptionError("the roq data source needs .option('seeds', 'tcp://host:port,...') or "
                          ".option('config', '/path/to/roq.toml')")
    return {k: options[k] for k in ("seeds", "config") if options.get(k)}


def config_from(conn: dict[str, str]) -> Any:
    """The RoQ configuration: the `config` TOML file if given (keys, seeds), then the `seeds` option."""
    from roq.config import Config, load_config
    config = load_config(conn["config"], env={}) if conn.get("config") else Config()
    return config.replace(cluster={"seeds": conn["seeds"]}) if conn.get("seeds") else config


def source_options(raw: Any, streaming: bool) -> SourceOptions:
    options = lower(raw)
    check_known(options, SOURCE, "source")
    kind = "streaming" if streaming else "batch"
    if streaming and "endingoffsets" in options:
        raise OptionError("endingOffsets is for batch reads (spark.read) only: a stream has no end")
    if not streaming:
        for key in ("maxoffsetspertrigger", "maxframespertrigger"):
            if key in options:
                raise OptionError(f"{SOURCE[key]} bounds a micro-batch: it is for streaming reads only")
    starting = positions(options.get("startingoffsets", LATEST if streaming else EARLIEST), "startingOffsets")
    starting_at = _timestamp(options)
    ending = positions(options.get("endingoffsets", LATEST), "endingOffsets")
    if not streaming:
        _refuse(starting, LATEST, "startingOffsets", kind, "it would read nothing")
        _refuse(ending, EARLIEST, "endingOffsets", kind, "it would read nothing")
    return SourceOptions(
        connection=connection(options), queue=required(options, "queue"),
        topics=tuple(t.strip().encode() for t in options.get("topics", "").split(",") if t.strip()),
        starting=starting, starting_at=starting_at, ending=ending,
        max_offsets=_count(options, "maxoffsetspertrigger"), max_frames=_count(options, "maxframespertrigger"),
        fail_on_loss=_flag(options, "failondataloss", True))


def sink_options(raw: Any) -> SinkOptions:
    options = lower(raw)
    check_known(options, SINK, "sink")
    timeout = options.get("confirmtimeout", "60")
    try:
        confirm_timeout = float(timeout)
    except ValueError:
        confirm_timeout = 0
    if not confirm_timeout > 0:
        raise OptionError(f"confirmTimeout must be a number of seconds > 0, got {timeout!r}")
    return SinkOptions(connection=connection(options), queue=required(options, "queue"),
                       topic=options.get("topic") or None, confirm_timeout=confirm_timeout)


def positions(text: str, option: str) -> Positions:
    """`earliest`, `latest` (any case) or a JSON object of exchange → position."""
    word = str(text).strip().lower()
    if word in (EARLIEST, LATEST):
        return word
    try:
        parsed = json.loads(text)
    except ValueError:
        raise OptionError(f"{option} must be earliest, latest or a JSON object of positions per exchange "
                          f"(docs/spark.md), got {text!r}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"{option} JSON must be a non-empty object of exchange → position, got {text!r}")
    return {str(xid): _position(value, f"{option} {xid}") for xid, value in parsed.items()}


def _position(value: Any, where: str) -> str | Position:
    if isinstance(value, str) and value.strip().lower() in (EARLIEST, LATEST):
        return value.strip().lower()
    if isinstance(value, int) and not isinstance(value, bool) and value in KAFKA_CODES:
        return KAFKA_CODES[value]
    if not isinstance(value, dict):
        raise OptionError(f"{where}: a position is \"earliest\", \"latest\", -2, -1 or "
                          f"{{\"inc\": ..., \"pos\": ...}}, got {json.dumps(value)}")
    extra = sorted(set(value) - {"inc", "pos", "msgs", "replay", "ended"})  # as copied from a checkpoint
    if extra:
        raise OptionError(f"{where}: unknown field {', '.join(extra)} (fields: inc, pos, msgs)")
    pos, msgs, inc = value.get("pos"), value.get("msgs", 0), value.get("inc")
    for name, number in (("pos", pos), ("msgs", msgs)):
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise OptionError(f"{where}: {name} must be an integer >= 0, got {json.dumps(number)}")
    if inc is not None and (not isinstance(inc, str) or not inc):
        raise OptionError(f"{where}: inc must be the exchange's incarnation (a string), got {json.dumps(inc)}")
    return Position(pos, msgs, inc)


def _refuse(spec: Positions, word: str, option: str, kind: str, why: str) -> None:
    if spec == word or (isinstance(spec, dict) and word in spec.values()):
        raise OptionError(f"{option} {word} is not allowed for a {kind} read: {why}")


def _timestamp(options: dict[str, str]) -> float | None:
    """startingTimestamp as Unix seconds (None: not given); it names one time for every exchange,
    so it does not go with startingOffsets."""
    text = options.get("startingtimestamp")
    if text is None:
        return None
    if "startingoffsets" in options:
        raise OptionError("startingTimestamp and startingOffsets both say where to start: give one")
    try:
        return parse_start_time(str(text))
    except ValueError as exc:
        raise OptionError(f"startingTimestamp: {exc}") from None


def _count(options: dict[str, str], key: str) -> int:
    text = options.get(key)
    if text is None:
        return 0
    try:
        value = int(str(text).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(f"{SOURCE[key]} must be a whole number >= 1, got {text!r}")
    return value


def _flag(options: dict[str, str], key: str, default: bool) -> bool:
    text = str(options.get(key, default)).strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"{SOURCE[key]} must be true or false, got {options.get(key)!r}")
    return text == "true"
