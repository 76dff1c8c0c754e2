"""The `roq` source and sink the way Spark's Kafka source is used, on the shared local session and
one real cluster for the module: maxOffsetsPerTrigger in messages, positions JSON, `value` and
`topic`, and the errors a user meets (unknown queue, nothing retained, missing columns, overwrite).
startingTimestamp needs exchanges of its own: tests/spark/test_source_timestamp.py."""

from __future__ import annotations

import json
import os
import signal

import pytest

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.state import read_live
from tests.integration.conftest import create
from tests.spark.conftest import shared_cluster_fixtures, sink
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
config, zk, paths, cluster = shared_cluster_fixtures()  # one cluster for the module; each test its own queues


def source(spark, config, queue: str, streaming: bool = False, **options: str):
    reader = (spark.readStream if streaming else spark.read).format("roq")
    reader = reader.option("seeds", config.cluster.seeds).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def one_frame_each(config, zk, queue: str, count: int) -> None:
    """`count` messages, one frame each: positions 1..count hold sequences 1..count."""
    with Publisher(queue, config) as pub:
        for i in range(1, count + 1):
            pub.publish("t", str(i).encode())
            pub.flush(10)


def run_available_now(spark, reader, name: str) -> list[int]:
    """Run a stream to a memory table until what was there at its start is read; the rows of each batch."""
    query = reader.load().writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    query.awaitTermination(90)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_max_offsets_per_trigger_counts_messages_even_inside_a_frame(spark, config, zk, paths, cluster):
    create(config, zk, paths, "bounded", 2)
    with Publisher("bounded", config, prefer="x1") as pub:
        pub.publish_many("bulk", [str(i).encode() for i in range(500)])  # frames of many messages
        pub.flush(30)
    with Publisher("bounded", config, prefer="x2") as pub:
        for i in range(200):
            pub.publish("single", str(i).encode())
        pub.flush(30)
    batches = run_available_now(spark, source(spark, config, "bounded", True, startingOffsets="Earliest",
                                              maxOffsetsPerTrigger="150"), "bounded")
    assert sum(batches) == 700 and max(batches) <= 150 and len(batches) >= 5, batches
    distinct = spark.sql("select count(distinct publisher, sequence) as n from bounded").first().n
    assert distinct == 700  # batches that ended inside a frame went on exactly where they stopped


def test_positions_json_reads_a_chosen_range_in_a_batch_and_a_stream(spark, config, zk, paths, cluster):
    create(config, zk, paths, "ranged", 1)
    one_frame_each(config, zk, "ranged", 10)
    frame = source(spark, config, "ranged", startingOffsets='{"x1": {"pos": 3}}',
                   endingOffsets=json.dumps({"x1": {"pos": 7}})).load()
    assert sorted(r.sequence for r in frame.collect()) == [4, 5, 6, 7]
    assert source(spark, config, "ranged", startingOffsets='{"x1": "earliest"}').load().count() == 10
    run_available_now(spark, source(spark, config, "ranged", True, startingOffsets='{"x1": {"pos": 8}}'), "ranged")
    assert sorted(r.sequence for r in spark.sql("select sequence from ranged").collect()) == [9, 10]
    with pytest.raises(Exception, match="startingOffsets names x7: not a running exchange of the queue"):
        source(spark, config, "ranged", startingOffsets='{"x7": -2}').load().count()


def test_rows_carry_value_and_topic_and_a_schema_may_pick_columns(spark, config, zk, paths, cluster):
    create(config, zk, paths, "valued", 1)
    with Publisher("valued", config) as pub:
        pub.publish("eu.orders", b"\x00\xffbytes")
        pub.flush(10)
    row = source(spark, config, "valued").load().first()
    assert (row.topic, row.value, row.payload) == ("eu.orders", bytearray(b"\x00\xffbytes"), row.value)
    picked = source(spark, config, "valued").schema("value binary, topic string").load()
    assert picked.columns == ["value", "topic"] and picked.first().topic == "eu.orders"


def test_headers_go_through_the_source_and_the_sink_as_kafka_has_them(spark, config, zk, paths, cluster):
    create(config, zk, paths, "headed", 1)
    with Publisher("headed", config) as pub:
        pub.publish("in", b"with", headers={"trace-id": "4bf9", "raw": b"\xff"})
        pub.publish("in", b"without")
        pub.flush(10)
    frame = source(spark, config, "headed").load().where("topic = 'in'")
    rows = {bytes(r.value): r.headers for r in frame.collect()}
    assert rows[b"without"] is None
    assert [(h.key, bytes(h.value)) for h in rows[b"with"]] == [("trace-id", b"4bf9"), ("raw", b"\xff")]
    # Kafka's way: select the headers, filter on them, write them back with the sink.
    picked = frame.where("exists(headers, h -> h.key = 'trace-id')").selectExpr(
        "value", "concat(headers, array(named_struct('key', 'hop', 'value', cast('spark' as binary)))) as headers")
    mapped = spark.createDataFrame([(b"mapped", {"m": "1"})], "value binary, headers map<string,string>")
    got: list[tuple[bytes, dict[str, bytes]]] = []
    with Subscriber("headed", config, ["out"], callback=lambda m: got.append((m.payload, dict(m.headers)))) \
            as sub:
        sub.wait_connected()
        sink(picked, config, "headed", topic="out").mode("append").save()
        sink(mapped, config, "headed", topic="out").mode("append").save()
        wait_until(lambda: len(got) == 2, timeout=20, message="the 2 rows")
    assert got == [(b"with", {"trace-id": b"4bf9", "raw": b"\xff", "hop": b"spark"}), (b"mapped", {"m": b"1"})]


def test_a_queue_with_nothing_retained_reads_as_an_empty_dataframe(spark, config, zk, paths, cluster):
    create(config, zk, paths, "quiet", 2)
    frame = source(spark, config, "quiet").load()
    assert frame.count() == 0 and frame.columns[:3] == ["topic", "payload", "value"]


def test_an_unknown_queue_fails_the_stream_at_once_and_the_batch_read(spark, config, zk, paths, cluster):
    query = (source(spark, config, "no-such-queue", True).load().writeStream.format("memory")
             .queryName("nothing").start())
    with pytest.raises(Exception) as caught:
        query.awaitTermination(60)  # returned False (no exception) before: it waited forever
    assert "queue 'no-such-queue' does not exist" in str(caught.value)
    with pytest.raises(Exception, match="queue 'no-such-queue' does not exist"):
        source(spark, config, "no-such-queue").load().count()


def test_an_option_the_source_does_not_know_is_an_error_naming_the_known_ones(spark, config, zk, paths, cluster):
    create(config, zk, paths, "typo", 1)
    with pytest.raises(Exception, match="no option maxofsetspertrigger; its options are .*maxOffsetsPerTrigger"):
        source(spark, config, "typo", True, maxOfsetsPerTrigger="10").load().writeStream.format("memory") \
            .queryName("typo").start().awaitTermination(30)


def test_the_sink_takes_value_and_a_default_topic_and_refuses_what_it_cannot_do(spark, config, zk, paths, cluster):
    create(config, zk, paths, "valuesink", 1)
    got: list[tuple[str, bytes]] = []
    with Subscriber("valuesink", config, callback=lambda m: got.append((m.topic, m.payload))) as sub:
        sub.wait_connected()
        frame = spark.createDataFrame([(f"v{i}".encode(),) for i in range(50)], "value binary")
        sink(frame, config, "valuesink", topic="kafka.style").mode("append").save()
        wait_until(lambda: len(got) >= 50, timeout=20, message="the 50 rows")
    assert sorted(got) == sorted(("kafka.style", f"v{i}".encode()) for i in range(50))
    wrong = spark.createDataFrame([("a", 1)], "name string, amount int")
    with pytest.raises(Exception, match="the roq sink needs a 'value' \\(or 'payload'\\) column, binary or string, "
                                        "and a 'topic' string column or .option\\('topic', ...\\); the DataFrame "
                                        "has: name string, amount int"):
        sink(wrong, config, "valuesink").mode("append").save()
    right = spark.createDataFrame([("t", "p")], "topic string, payload string")
    with pytest.raises(Exception, match="the roq sink only appends .*use .mode\\('append'\\)"):
        sink(right, config, "valuesink").mode("overwrite").save()
    with pytest.raises(Exception, match="queue 'nowhere' does not exist"):
        sink(right, config, "nowhere").mode("append").save()


def numbered(config, queue: str, first: int, count: int) -> None:
    with Publisher(queue, config) as pub:
        for i in range(first, first + count):
            pub.publish("t", i.to_bytes(4, "big"))
        pub.flush(30)


def to_parquet(spark, config, queue: str, out, **options: str):
    """One availableNow run of a stream from `queue` into Parquet, checkpointed next to it; the query."""
    query = (source(spark, config, queue, True, **options).load().writeStream.format("parquet")
             .option("path", str(out / "data")).option("checkpointLocation", str(out / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    except Exception:  # noqa: BLE001 - a query that failed: its exception() says why
        pass
    assert not query.isActive, "the query ended"
    return query


def killed(zk, paths, queue: str) -> tuple[str, dict]:
    """SIGKILL the queue's x1; its ended incarnation and the new one's live data, once its HCM restarted it."""
    live = read_live(zk, paths, queue)["x1"]
    os.kill(live["pid"], signal.SIGKILL)
    wait_until(lambda: read_live(zk, paths, queue).get("x1", {}).get("incarnation") not in (None, live["incarnation"]),
               timeout=30, message="a new incarnation")
    after = read_live(zk, paths, queue)["x1"]
    if after["host"] != live["host"]:
        pytest.skip("the leader moved the exchange to the other host: its store stayed behind")
    return live["incarnation"], after


def test_a_stream_loses_nothing_when_an_exchange_restarts_and_earliest_reads_the_ended_incarnation(
        spark, config, zk, paths, cluster, tmp_path):
    """A disk-retained queue: the stream's offset is in the killed incarnation, whose rest its
    successor serves from the store (`archived`): read once, before the new incarnation's frames."""
    from tests.integration.test_disk_retention import stored_all
    with Admin(config) as admin:
        admin.create_queue("restarts", exchanges=1, retention=3_600.0, retention_bytes=1 << 30)
    wait_until(lambda: read_live(zk, paths, "restarts").get("x1"), timeout=20, message="x1 running")
    numbered(config, "restarts", 0, 300)
    query = to_parquet(spark, config, "restarts", tmp_path, startingOffsets="earliest", maxOffsetsPerTrigger="120")
    assert query.exception() is None, query.exception()
    numbered(config, "restarts", 300, 200)  # while the query is stopped; the publisher gone before the kill
    wait_until(lambda: stored_all(zk, paths, "restarts", 500), timeout=30, message="the store to write 500")
    ended, live = killed(zk, paths, "restarts")
    assert ended in live.get("archived", []), "the killed incarnation's store is served"
    numbered(config, "restarts", 500, 300)  # to the new incarnation
    query = to_parquet(spark, config, "restarts", tmp_path, maxOffsetsPerTrigger="120")  # from its checkpoint
    assert query.exception() is None, query.exception()
    rows = spark.read.parquet(str(tmp_path / "data"))
    numbers = "cast(conv(hex(payload), 16, 10) as int) as n"
    got = sorted(r.n for r in rows.selectExpr(numbers).collect())
    assert got == list(range(800)), f"every message once, got {len(got)} rows ({len(set(got))} distinct)"
    assert rows.select("publisher", "sequence").distinct().count() == 800
    assert sorted(r.n for r in source(spark, config, "restarts").load().selectExpr(numbers).collect()) == \
        list(range(800)), "a batch from earliest reads the ended incarnation too"


def test_an_ended_incarnation_served_nowhere_fails_the_stream_or_is_skipped(spark, config, zk, paths, cluster,
                                                                             tmp_path):
    """A memory-only queue without a journal: nothing serves the killed incarnation, so whatever it
    held after the stream's offset (the source cannot tell whether it held anything) is gone."""
    create(config, zk, paths, "forgetful", 1)
    numbered(config, "forgetful", 0, 10)
    assert to_parquet(spark, config, "forgetful", tmp_path, startingOffsets="earliest").exception() is None
    ended, _ = killed(zk, paths, "forgetful")
    numbered(config, "forgetful", 10, 7)
    failed = to_parquet(spark, config, "forgetful", tmp_path)
    assert failed.exception() is not None and f"exchange x1: incarnation {ended} has ended and no copy of it is " \
        "served any more" in str(failed.exception())
    assert to_parquet(spark, config, "forgetful", tmp_path, failOnDataLoss="false").exception() is None
    assert spark.read.parquet(str(tmp_path / "data")).count() == 17  # logged and skipped: the new incarnation read


def test_a_running_stream_reads_across_an_exchange_restart_every_message_once(
        spark, config, zk, paths, cluster, tmp_path):
    """The same without stopping the query: its offset is in the killed incarnation, part of it
    read, when the exchange restarts. A micro-batch whose task was fetching from the killed process
    fails the query (a 10 s fetch time-out, docs/spark.md); restarted from its checkpoint, it reads
    the rest from the copy. Either way: every message once."""
    from tests.integration.test_disk_retention import stored_all
    with Admin(config) as admin:
        admin.create_queue("crossing", exchanges=1, retention=3_600.0, retention_bytes=1 << 30)
    wait_until(lambda: read_live(zk, paths, "crossing").get("x1"), timeout=20, message="x1 running")
    query = (source(spark, config, "crossing", True, startingOffsets="earliest", maxOffsetsPerTrigger="40").load()
             .writeStream.format("parquet").option("path", str(tmp_path / "data"))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="200 milliseconds")
             .start())
    try:
        numbered(config, "crossing", 0, 100)
        wait_until(lambda: query.exception() is not None or query.lastProgress and query.lastProgress["numInputRows"],
                   timeout=60, message="a first micro-batch")
        numbered(config, "crossing", 100, 300)
        wait_until(lambda: stored_all(zk, paths, "crossing", 400), timeout=30, message="the store to write 400")
        killed(zk, paths, "crossing")
        numbered(config, "crossing", 400, 300)
        wait_until(lambda: query.exception() is not None or spark.read.parquet(str(tmp_path / "data")).count() >= 700,
                   timeout=120, message="700 rows, or the query failed")
    finally:
        query.stop()
    if query.exception() is not None:
        assert "did not answer a fetch" in str(query.exception()), query.exception()
    assert to_parquet(spark, config, "crossing", tmp_path).exception() is None  # from its checkpoint
    got = sorted(r.n for r in spark.read.parquet(str(tmp_path / "data"))
                 .selectExpr("cast(conv(hex(payload), 16, 10) as int) as n").collect())
    assert got == list(range(700)), f"every message once, got {len(got)} rows ({len(set(got))} distinct)"
