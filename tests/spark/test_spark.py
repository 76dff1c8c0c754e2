"""RoQ in Spark: the `roq` source and sink, and the statistics pipeline, on a real local session."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from tests.integration.conftest import create
from tests.spark.conftest import shared_cluster_fixtures, written_and_received
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
config, zk, paths, cluster = shared_cluster_fixtures()  # one cluster for the module; each test its own queues


def publish(config, zk, queue: str, first: int, count: int, prefer: str | None = None) -> str:
    with Publisher(queue, config, prefer=prefer) as pub:
        for i in range(first, first + count):
            pub.publish("t", str(i).encode())
        pub.flush(30)
        return pub.id


def read_to_parquet(spark, config, queue: str, out: Path) -> int:
    """One availableNow run of a query from `queue` into Parquet, checkpointed next to it."""
    query = (spark.readStream.format("roq").option("seeds", config.cluster.seeds)
             .option("queue", queue).option("startingOffsets", "earliest").load()
             .writeStream.format("parquet").option("path", str(out / "data"))
             .option("checkpointLocation", str(out / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return spark.read.parquet(str(out / "data")).count()


def test_the_stream_reads_exactly_what_was_published_and_resumes_from_its_checkpoint(
        spark, config, zk, paths, cluster, tmp_path):
    create(config, zk, paths, "rows", 2)
    ids = [publish(config, zk, "rows", 0, 1500, prefer=x) for x in ("x1", "x2")]
    assert read_to_parquet(spark, config, "rows", tmp_path) == 3000
    ids += [publish(config, zk, "rows", 1500, 1000, prefer="x1")]  # while the query is stopped
    assert read_to_parquet(spark, config, "rows", tmp_path) == 4000  # restarted from the checkpoint
    frame = spark.read.parquet(str(tmp_path / "data"))
    assert frame.select("publisher", "sequence").distinct().count() == 4000  # nothing twice
    row = frame.where("sequence = 1").orderBy("publisher").first()
    assert row.topic == "t" and row.publisher in ids and row.exchange in ("x1", "x2") and row.timestamp
    by_publisher = {r.publisher: r["count"] for r in frame.groupBy("publisher").count().collect()}
    assert sorted(by_publisher.values()) == [1000, 1500, 1500]


def test_the_sink_publishes_a_dataframe_with_confirms(spark, config, zk, paths, cluster):
    create(config, zk, paths, "sunk", 1)
    frame = spark.createDataFrame([("orders.eu", f"order-{i}") for i in range(500)], "topic string, payload string")
    got = written_and_received(frame.repartition(3), config, zk, "sunk", 500)
    assert sorted(got) == sorted(f"order-{i}".encode() for i in range(500))


def test_a_streaming_query_copies_one_queue_to_another(spark, config, zk, paths, cluster, tmp_path):
    create(config, zk, paths, "source", 1)
    create(config, zk, paths, "copy", 1)
    got: list[bytes] = []
    with Subscriber("copy", config, callback=lambda m: got.append(m.payload)) as sub:
        sub.wait_connected()
        publish(config, zk, "source", 0, 700)
        query = (spark.readStream.format("roq").option("seeds", config.cluster.seeds)
                 .option("queue", "source").option("startingOffsets", "earliest").load()
                 .select("topic", "payload").writeStream.format("roq").option("seeds", config.cluster.seeds)
                 .option("queue", "copy")
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        wait_until(lambda: len(got) >= 700, timeout=20, message="the copied messages")
    assert sorted(int(p) for p in got) == list(range(700))


def stats_record(kind: str, ts: float, **values: float) -> bytes:
    base = {"kind": kind, "ts": ts, "queue": "q1", "exchange": "x1", "host": "h1"}
    return json.dumps(dict(base, **values)).encode()


def test_the_statistics_job_aggregates_a_known_load(spark, config, zk, paths, cluster, tmp_path):
    from roq.spark.report import report
    from roq.spark.stats_job import aggregate_retained
    create(config, zk, paths, "known-stats", 1)
    t0 = (time.time() // 10) * 10 - 60  # the start of a 10 s window, a minute ago
    with Publisher("known-stats", config) as pub:
        for i, rate in enumerate((100, 200, 300)):  # window 1: mean 200, peak 300
            pub.publish("exchange", stats_record("exchange", t0 + 2 * i, msgs_in_per_s=rate, publishers=i + 1,
                                                 latency_p99_ms=1.0 + i))
        pub.publish("exchange", stats_record("exchange", t0 + 12, msgs_in_per_s=1000, publishers=5))  # window 2
        for cpu in (10, 30):
            pub.publish("host", stats_record("host", t0 + 1, cpu_percent=cpu, memory_percent=50))
        pub.flush(30)
    out = tmp_path / "pipeline"
    aggregate_retained(spark, config.cluster.seeds, config.zk.root, "known-stats", str(out), 10)
    rows = spark.read.parquet(str(out / "exchanges")).orderBy("window_start").collect()
    assert [(r.msgs_in_per_s, r.msgs_in_per_s_peak, r.publishers, r.samples) for r in rows] == \
        [(200.0, 300.0, 3, 3), (1000.0, 1000.0, 5, 1)]
    assert rows[0].queue == "q1" and rows[0].latency_p99_ms == 3.0
    assert (rows[0].window_end - rows[0].window_start).total_seconds() == 10
    host = spark.read.parquet(str(out / "hosts")).collect()
    assert [(h.host, h.cpu_percent, h.cpu_percent_peak) for h in host] == [("h1", 20.0, 30.0)]
    text = report(str(out), str(tmp_path / "report.png"))
    assert "queue q1: mean 600 msg/s in, peak 1,000 msg/s, p99 publish latency up to 3.00 ms" in text
    assert "drops 0" in text and "host h1: CPU mean 20% (peak 30%)" in text
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_the_streaming_statistics_job_appends_closed_windows(spark, config, zk, paths, cluster, tmp_path):
    from roq.spark.stats_job import start_queries
    create(config, zk, paths, "stream-stats", 1)
    t0 = (time.time() // 10) * 10 - 60
    with Publisher("stream-stats", config) as pub:
        for i, rate in enumerate((100, 200, 300)):
            pub.publish("exchange", stats_record("exchange", t0 + 2 * i, msgs_in_per_s=rate))
        pub.publish("exchange", stats_record("exchange", t0 + 35, msgs_in_per_s=50))  # moves the watermark on
        pub.flush(30)
    out = tmp_path / "pipeline"
    queries = list(start_queries(spark, config.cluster.seeds, config.zk.root, "stream-stats", str(out), 10).values())
    try:
        def closed_windows() -> list:
            for q in queries:
                assert q.exception() is None, q.exception()
            path = out / "exchanges"
            if not any(path.glob("*.parquet")):
                return []
            return spark.read.parquet(str(path)).orderBy("window_start").collect()
        rows = wait_until(closed_windows, timeout=90, message="the first window appended")
    finally:
        for q in queries:
            q.stop()
    assert (rows[0].msgs_in_per_s, rows[0].msgs_in_per_s_peak, rows[0].samples) == (200.0, 300.0, 3)
    assert all(r.window_start < rows[0].window_start.__class__.fromtimestamp(t0 + 30) for r in rows)  # open ones wait


def test_a_failed_pipeline_query_is_started_again_from_its_checkpoint(spark, tmp_path):
    import threading

    from pyspark.sql import functions as F

    from roq.spark.report import committed
    from roq.spark.stats_job import follow
    marker = tmp_path / "failed-once"

    @F.udf("long")
    def fail_once(value):  # no type hints: they would make it a pandas UDF
        # In Spark's Python worker: the first micro-batch with rows fails.
        if not marker.exists():
            marker.touch()
            raise RuntimeError("a micro-batch that fails once")
        return value

    started, files_before_restart = [], []

    def start(name: str):
        started.append(name)
        files_before_restart.append(len(committed(tmp_path / "out") or []))
        return (spark.readStream.format("rate").option("rowsPerSecond", 20).load()
                .select(fail_once("value").alias("value")).writeStream.format("parquet")
                .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(processingTime="1 second").queryName(f"restart_{name}").start())

    def committed_after_the_restart() -> bool:
        return len(started) == 2 and len(committed(tmp_path / "out") or []) > files_before_restart[1]

    stop = threading.Event()

    def stop_once_committed() -> None:
        try:
            wait_until(committed_after_the_restart, timeout=120, message="a micro-batch committed after the restart")
        finally:
            stop.set()
    watcher = threading.Thread(target=stop_once_committed)
    watcher.start()
    try:
        follow(spark, {"q": start("q")}, 150, stop, restart=start)  # raises if the restart did not happen
    finally:
        stop.set()
        watcher.join()
    assert marker.exists() and started == ["q", "q"] and committed_after_the_restart()
    assert spark.read.parquet(*committed(tmp_path / "out")).count() > 0
