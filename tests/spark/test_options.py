"""The `roq` source's and sink's options and offsets, without a session: names, positions JSON,
the share of maxOffsetsPerTrigger each exchange gets, the sink's columns."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from roq.spark.datasource import (  # noqa: E402
    plan_ranges,
    projection,
    resolve,
    row_headers,
    sink_columns,
    split_budget,
)
from roq.spark.exchanges import StreamEnd  # noqa: E402
from roq.spark.options import OptionError, Position, positions, sink_options, source_options  # noqa: E402

BASE = {"seeds": "tcp://127.0.0.1:7000", "queue": "q"}
TYPES = {"string": StringType(), "binary": BinaryType(), "int": IntegerType(), "bigint": LongType()}
ENDS = {"x1": StreamEnd("x1.a", 100, 41, "tcp://h:1"), "x2": StreamEnd("x2.b", 7, 1, "tcp://h:2")}


def test_kafka_names_and_the_older_ones_are_accepted_in_any_case() -> None:
    opts = source_options({**BASE, "StartingOffsets": "EARLIEST", "maxOffsetsPerTrigger": "300",
                           "maxFramesPerTrigger": "5", "failOnDataLoss": "False", "topics": "eu., us."}, True)
    assert (opts.starting, opts.max_offsets, opts.max_frames, opts.fail_on_loss) == ("earliest", 300, 5, False)
    assert opts.topics == (b"eu.", b"us.") and opts.connection == {"seeds": "tcp://127.0.0.1:7000"}
    batch = source_options(BASE, False)
    assert (batch.starting, batch.ending) == ("earliest", "latest")  # Kafka's batch defaults


@pytest.mark.parametrize("options, streaming, says", [
    ({"maxOfsetsPerTrigger": "3"}, True, "has no option maxofsetspertrigger; its options are config, endingOffsets"),
    ({"startingOffsets": "newest"}, True, "startingOffsets must be earliest, latest or a JSON object"),
    ({"maxOffsetsPerTrigger": "0"}, True, "maxOffsetsPerTrigger must be a whole number >= 1, got '0'"),
    ({"maxOffsetsPerTrigger": "lots"}, True, "maxOffsetsPerTrigger must be a whole number >= 1"),
    ({"failOnDataLoss": "maybe"}, True, "failOnDataLoss must be true or false"),
    ({"endingOffsets": "latest"}, True, "endingOffsets is for batch reads (spark.read) only"),
    ({"maxOffsetsPerTrigger": "10"}, False, "maxOffsetsPerTrigger bounds a micro-batch: it is for streaming"),
    ({"startingOffsets": "latest"}, False, "startingOffsets latest is not allowed for a batch read"),
    ({"endingOffsets": '{"x1": -2}'}, False, "endingOffsets earliest is not allowed for a batch read"),
    ({"startingOffsets": '{"x1": {"pos": -4}}'}, True, "startingOffsets x1: pos must be an integer >= 0, got -4"),
    ({"startingOffsets": '{"x1": {"pos": 3, "offset": 1}}'}, True, "x1: unknown field offset (fields: inc, pos, msgs)"),
    ({"startingOffsets": '{"x1": 17}'}, True, "a position is \"earliest\", \"latest\", -2, -1 or"),
    ({"startingOffsets": "[1, 2]"}, True, "JSON must be a non-empty object of exchange"),
    ({"queue": ""}, True, "needs .option('queue', ...)"),
    ({"startingTimestamp": "yesterday"}, True, "startingTimestamp: 'yesterday' is not a time: give ISO 8601"),
    ({"startingTimestamp": "2026-11-27T10:00:00"}, False, "has no time zone: add Z (UTC)"),
    ({"startingTimestamp": "1795773600000", "startingOffsets": "earliest"}, True,
     "startingTimestamp and startingOffsets both say where to start: give one"),
])
def test_a_bad_option_is_an_error_that_says_what_is_wrong(options, streaming, says) -> None:
    with pytest.raises(OptionError) as caught:
        source_options({**BASE, **options}, streaming)
    assert says in str(caught.value)


def test_starting_timestamp_is_epoch_milliseconds_or_iso_8601_in_any_case() -> None:
    kafka = source_options({**BASE, "startingtimestamp": "1795773600000"}, True)
    iso = source_options({**BASE, "StartingTimestamp": "2026-11-27T11:00:00+01:00"}, False)
    assert kafka.starting_at == iso.starting_at == 1795773600.0
    assert source_options(BASE, True).starting_at is None


def test_the_sink_knows_its_options_and_spark_s_checkpoint_location() -> None:
    opts = sink_options({**BASE, "topic": "orders", "confirmTimeout": "5", "checkpointLocation": "/c"})
    assert (opts.topic, opts.confirm_timeout) == ("orders", 5.0)
    with pytest.raises(OptionError, match="has no option topics; its options are checkpointLocation, config"):
        sink_options({**BASE, "topics": "a"})
    with pytest.raises(OptionError, match="needs .option\\('seeds', 'tcp://host:port,...'\\) or .option\\('config'"):
        sink_options({"queue": "q"})


def test_positions_json_takes_the_offsets_own_form_and_kafka_s_codes() -> None:
    parsed = positions('{"x1": {"inc": "x1.a", "pos": 60, "msgs": 2, "replay": "tcp://h:1"}, "x2": -2}', "o")
    assert parsed == {"x1": Position(60, 2, "x1.a"), "x2": "earliest"}
    offsets = resolve(parsed, ENDS, "startingOffsets", "latest")
    assert offsets == {"x1": {"inc": "x1.a", "pos": 60, "msgs": 2, "replay": "tcp://h:1"},
                       "x2": {"inc": "x2.b", "pos": 0, "replay": "tcp://h:2"}}
    # An exchange not named starts at the default; without inc, the running incarnation is meant.
    assert resolve({"x2": Position(3)}, ENDS, "startingOffsets", "latest")["x1"]["pos"] == 100
    assert resolve({"x2": Position(3)}, ENDS, "startingOffsets", "latest")["x2"]["inc"] == "x2.b"


def test_positions_that_cannot_be_read_are_refused_when_the_query_starts() -> None:
    with pytest.raises(OptionError, match="names x9: not a running exchange of the queue \\(running: x1, x2\\)"):
        resolve({"x9": Position(1)}, ENDS, "startingOffsets", "latest")
    with pytest.raises(OptionError, match="x2: position 8 is past the exchange's last frame 7"):
        resolve({"x2": Position(8)}, ENDS, "startingOffsets", "latest")
    with pytest.raises(OptionError, match="x1: incarnation x1.old has ended \\(running: x1.a\\)"):
        resolve({"x1": Position(5, 0, "x1.old")}, ENDS, "endingOffsets", "latest")


def test_a_range_may_start_and_end_inside_a_frame_and_a_new_incarnation_starts_at_zero() -> None:
    opts = source_options(BASE, True)
    start = {"x1": {"inc": "x1.a", "pos": 50, "msgs": 3}, "x2": {"inc": "x2.old", "pos": 90}}
    end = {"x1": {"inc": "x1.a", "pos": 60, "msgs": 1, "replay": "r1"}, "x2": {"inc": "x2.b", "pos": 7, "replay": "r2"}}
    x1, x2 = plan_ranges(start, end, opts)
    assert (x1.after, x1.skip, x1.upto, x1.take) == (50, 3, 60, 1)
    assert (x2.incarnation, x2.after, x2.skip, x2.upto) == ("x2.b", 0, 0, 7)
    assert plan_ranges(end, end, opts) == []


def test_max_offsets_per_trigger_is_shared_by_backlog_and_never_exceeded() -> None:
    assert split_budget(300, {"x1": 100, "x2": 50, "x3": 0}) == {"x1": 200, "x2": 100, "x3": 0}
    shares = split_budget(10, {"x1": 1, "x2": 1, "x3": 1})
    assert sum(shares.values()) == 10 and sorted(shares.values()) == [3, 3, 4]
    assert split_budget(5, {"x1": 0}) == {"x1": 0}


def schema(ddl: str) -> StructType:
    """"a string, b binary" without a JVM (StructType.fromDDL needs one)."""
    return StructType([StructField(name, TYPES[kind]) for name, kind in
                       (column.split() for column in ddl.split(","))])


def test_the_sink_takes_value_or_payload_and_topic_from_a_column_or_the_option() -> None:
    assert sink_columns(schema("topic string, value binary, payload binary"), None) == ("value", "topic", None)
    assert sink_columns(schema("topic string, payload string"), None) == ("payload", "topic", None)
    assert sink_columns(schema("value string"), "orders") == ("value", None, None)
    assert sink_columns(schema("topic string, value string"), "orders") == ("value", None, None)  # the option wins
    for ddl, topic in (("x string", None), ("value int, topic string", None), ("value binary", None)):
        with pytest.raises(OptionError) as caught:
            sink_columns(schema(ddl), topic)
        assert "needs a 'value' (or 'payload') column, binary or string, and a 'topic' string column or " \
               ".option('topic', ...); the DataFrame has: " + ddl in str(caught.value)


KAFKA_HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def test_the_sink_takes_headers_as_kafka_does_or_as_a_map() -> None:
    for kind in (KAFKA_HEADERS, MapType(StringType(), BinaryType()), MapType(StringType(), StringType())):
        frame = StructType([StructField("value", BinaryType()), StructField("Headers", kind)])
        assert sink_columns(frame, "t") == ("value", None, "Headers")
    wrong = StructType([StructField("value", BinaryType()), StructField("headers", StringType())])
    with pytest.raises(OptionError, match="'headers' column must be one of array<struct<key:string,value:binary>>"):
        sink_columns(wrong, "t")
    assert row_headers([{"key": "a", "value": bytearray(b"1")}, {"key": "b", "value": None}]) == {"a": b"1", "b": b""}
    assert row_headers({"a": "text"}) == {"a": b"text"} and row_headers(None) is None and row_headers([]) is None
    with pytest.raises(ValueError, match="header 'a' twice"):
        row_headers([{"key": "a", "value": b"1"}, {"key": "a", "value": b"2"}])


def test_a_schema_given_by_the_reader_picks_columns() -> None:
    assert projection(schema("value binary, sequence bigint")) == (2, 4)
    assert projection(StructType([StructField("headers", KAFKA_HEADERS)])) == (7,)
    with pytest.raises(OptionError, match="the roq source has no column 'offset'"):
        projection(schema("offset bigint"))
    with pytest.raises(OptionError, match="column value of the roq source is binary, not string"):
        projection(schema("value string"))
