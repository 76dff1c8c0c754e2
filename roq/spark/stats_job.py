"""The statistics pipeline: the leader's statistics stream → windowed aggregates in Parquet.

Reads queue `gcm.stats_queue` (default roq-stats) with the `roq` data source,
and writes two Parquet datasets under OUTPUT:
* `exchanges/`: per window, queue, exchange and host. Mean and peak msgs/s
  in, mean msgs/s out and MB/s in, the p50 and p99 of publish latency, most
  publishers and subscriptions, drops, samples.
* `hosts/`: per window and host. Mean and peak CPU %, mean memory %.

Continuously (`roq pipeline stats`, or for `--duration` seconds) it is a
Structured Streaming job: a window is appended once the watermark (one
window past the newest record) has passed it, and a restart continues from
its checkpoint. `--once` is a batch job over what the exchanges retain now.
It replaces the aggregates, the newest window possibly partial. Do not point
it at the `--output` of a running continuous pipeline.

SIGTERM or SIGINT stops it cleanly: each query once its running micro-batch is
done (within STOP_GRACE), then the session, then exit 130 (`--duration`: exit 0);
while the session is still starting, at once. `roq pipeline
stats` runs it as a child process (roq/spark/pipeline.py says why). A failure
is one line on stderr. It also runs under spark-submit:

    spark-submit roq/spark/stats_job.py --seeds tcp://gcm1:7000 --output /data/roq-stats
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

PARENT_ENV = "ROQ_PIPELINE_PARENT"
SHUFFLE_PARTITIONS = 4  # fixed by a streaming query's first checkpoint: the value local[*] always had
RESTARTS = 3  # failed queries started again from their checkpoints in one run, before it fails
STOP_GRACE = 5.0  # seconds a running micro-batch may take to finish before its query is stopped anyway
QUERY_STOP_WAIT = 5.0  # seconds a query's stop() waits for its thread (Spark's default: forever)
AGGREGATES = ("exchanges", "hosts")  # the Parquet datasets under --output, one streaming query each
SPARK_TYPES = {float: "double", int: "long", str: "string", bool: "boolean"}


def record_schema() -> str:
    """The stream's records (roq.records ExchangeSample and HostSample) as one Spark DDL schema.

    Imported here, not at the top: under spark-submit the checkout joins sys.path only in `__main__`."""
    from roq.records import ExchangeSample, HostSample, column_types
    columns: dict[str, type] = {}
    for record in (ExchangeSample, HostSample):
        for name, kind in column_types(record).items():
            columns.setdefault(name, kind)
    return ", ".join(f"{name} {SPARK_TYPES[kind]}" for name, kind in columns.items())


def parse(frame: Any) -> Any:
    """Rows of the `roq` source → typed statistics records with an event time."""
    from pyspark.sql import functions as F
    return (frame.select(F.from_json(F.col("payload").cast("string"), record_schema()).alias("r"))
            .select("r.*").withColumn("time", F.col("ts").cast("timestamp")))


def aggregate(records: Any, window: int) -> dict[str, Any]:
    """Per window: exchanges (by queue, exchange, host) and hosts; flat columns for Parquet."""
    from pyspark.sql import functions as F
    span = F.window("time", f"{window} seconds").alias("w")
    exchanges = (records.where(F.col("kind") == "exchange").groupBy(span, "queue", "exchange", "host")
                 .agg(F.avg("msgs_in_per_s").alias("msgs_in_per_s"), F.max("msgs_in_per_s").alias("msgs_in_per_s_peak"),
                      F.avg("msgs_out_per_s").alias("msgs_out_per_s"),
                      (F.avg("bytes_in_per_s") / 1e6).alias("mb_in_per_s"),
                      F.percentile_approx("latency_p50_ms", 0.5).alias("latency_p50_ms"),
                      F.percentile_approx("latency_p99_ms", 0.99).alias("latency_p99_ms"),
                      F.max("publishers").alias("publishers"), F.max("subscriptions").alias("subscriptions"),
                      F.max("drops").alias("drops"), F.count(F.lit(1)).alias("samples")))
    hosts = (records.where(F.col("kind") == "host").groupBy(span, "host")
             .agg(F.avg("cpu_percent").alias("cpu_percent"), F.max("cpu_percent").alias("cpu_percent_peak"),
                  F.avg("memory_percent").alias("memory_percent"), F.count(F.lit(1)).alias("samples")))
    return {name: frame.select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                               *[c for c in frame.columns if c != "w"])
            for name, frame in (("exchanges", exchanges), ("hosts", hosts))}


def source(spark: Any, seeds: str, root: str, queue: str, streaming: bool) -> Any:
    reader = spark.readStream if streaming else spark.read
    return (reader.format("roq").option("seeds", seeds).option("queue", queue)
            .option("startingOffsets", "earliest").option("failOnDataLoss", "false").load())


def aggregate_retained(spark: Any, seeds: str, root: str, queue: str, output: str, window: int) -> None:
    """Batch: everything the stream's exchanges retain now, every window (the newest may be partial)."""
    for name, frame in aggregate(parse(source(spark, seeds, root, queue, False)), window).items():
        frame.write.mode("overwrite").parquet(str(Path(output) / name))


def start_queries(spark: Any, seeds: str, root: str, queue: str, output: str, window: int) -> dict[str, Any]:
    """Streaming, one query per aggregate, by name: a window is appended once the watermark (one
    window past the newest record) passes it."""
    return {name: start_query(spark, seeds, root, queue, output, window, name) for name in AGGREGATES}


def start_query(spark: Any, seeds: str, root: str, queue: str, output: str, window: int, name: str) -> Any:
    """One aggregate's query; started again after a failure, it continues from its checkpoint."""
    records = parse(source(spark, seeds, root, queue, True)).withWatermark("time", f"{window} seconds")
    frame = aggregate(records, window)[name]
    return (frame.writeStream.format("parquet").outputMode("append")
            .option("path", str(Path(output) / name))
            .option("checkpointLocation", str(Path(output) / "_checkpoints" / name))
            .trigger(processingTime=f"{max(1, min(window, 5))} seconds")
            .queryName(f"roq_stats_{name}").start())


def run(seeds: str, root: str, queue: str, output: str, window: int, once: bool, duration: float,
        master: str | None, stop: threading.Event | None = None) -> None:
    """The job, then the session stopped in order. Setting `stop` (see stop_on_signals) ends it
    early and cleanly, then raises KeyboardInterrupt; a failed query raises RoqError."""
    from roq.spark.session import quiet, spark_session
    stop = stop or threading.Event()
    with abandoned_on_stop(stop):  # a start takes seconds, and there is nothing to finish yet
        # A few records per exchange and tick: Spark's 200 shuffle partitions would cost seconds a batch.
        spark = spark_session(master, "roq-stats-pipeline", log_level="ERROR",
                              conf={"spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
                                    "spark.sql.streaming.stopTimeout": str(int(QUERY_STOP_WAIT * 1000))})
    try:
        if once:
            cancel_when(stop, spark)
            aggregate_retained(spark, seeds, root, queue, output, window)
        elif not stop.is_set():
            queries = start_queries(spark, seeds, root, queue, output, window)
            follow(spark, queries, duration, stop,
                   restart=lambda name: start_query(spark, seeds, root, queue, output, window, name))
    except Exception:
        if not stop.is_set():
            raise
    finally:
        quiet(spark)
        spark.stop()
    if stop.is_set():
        raise KeyboardInterrupt


def follow(spark: Any, queries: dict[str, Any], duration: float, stop: threading.Event,
           restart: Callable[[str], Any] | None = None) -> None:
    """Until `duration` (0: forever) or `stop`; then each query stops between two micro-batches.
    A query that fails is started again (`restart(name)`), from its checkpoint, up to RESTARTS
    times in the run: the file sink commits each micro-batch once, so nothing is lost or doubled."""
    from roq.errors import RoqError
    from roq.spark.session import say
    deadline = time.monotonic() + duration if duration > 0 else None
    restarts = 0
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        failed = [name for name, q in queries.items() if not q.isActive]
        if failed and (restart is None or restarts + len(failed) > RESTARTS
                       or any(queries[name].exception() is None for name in failed)):
            break  # out of restarts, or stopped by someone else: stop the rest and say why
        for name in failed:
            restarts += 1
            say(f"roq: query {queries[name].name} failed ({first_line(queries[name].exception())}); "
                f"started again from its checkpoint ({restarts} of {RESTARTS})")
            queries[name] = restart(name)  # type: ignore[misc]
        stop.wait(0.5)
    stop_between_batches(spark, list(queries.values()))
    failed = [q for q in queries.values() if q.exception()]
    if failed:
        raise RoqError(f"{failed[0].name} failed: {first_line(failed[0].exception())}")


def stop_between_batches(spark: Any, queries: list[Any], grace: float = STOP_GRACE) -> None:
    """Stop each query once its running micro-batch is done (within `grace` seconds): a batch
    interrupted halfway is redone after a restart, and Spark logs it with Java stack traces."""
    from roq.spark.session import quiet
    deadline = time.monotonic() + grace
    for query in queries:
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.1)  # Spark tells no event for the end of a micro-batch: poll its status
        quiet(spark)
        query.stop()


def cancel_when(stop: threading.Event, spark: Any) -> None:
    """A batch job cannot be stopped between micro-batches: cancel its Spark jobs once `stop` is set
    (from a thread of its own, so the py4j call never re-enters the main thread's)."""
    from roq.spark.session import quiet

    def cancel() -> None:
        stop.wait()
        try:
            quiet(spark)
            spark.sparkContext.cancelAllJobs()
        except Exception:  # the session stopped meanwhile: nothing left to cancel
            pass
    threading.Thread(target=cancel, name="roq-pipeline-cancel", daemon=True).start()


@contextmanager
def abandoned_on_stop(stop: threading.Event) -> Iterator[None]:
    """In the block, SIGTERM and SIGINT also raise KeyboardInterrupt, as does a `stop` set before it:
    the driver then ends at once, and its JVM with it (the JVM leaves once this process has; `roq`
    kills what is left of the driver's process group)."""
    if stop.is_set():
        raise KeyboardInterrupt
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(*_: object) -> None:
        stop.set()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM (the `roq` command's Ctrl-C, forwarded) and SIGINT set `stop`; so does the end of
    the process named by ROQ_PIPELINE_PARENT (the `roq` command, should it die abruptly)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if parent:
        def watch() -> None:
            while not stop.wait(1.0):
                if os.getppid() != parent:
                    stop.set()
        threading.Thread(target=watch, name="roq-pipeline-parent", daemon=True).start()


def first_line(exc: Any) -> str:
    """What went wrong, in one line: a Java error's root cause, else the message's first line."""
    text = str(getattr(exc, "desc", None) or exc).strip()
    try:
        cause = getattr(exc, "java_exception", None)  # py4j's "An error occurred while calling o205.parquet"
        while cause is not None and cause.getCause() is not None:
            cause = cause.getCause()
        text = cause.toString() if cause is not None else text
    except Exception:  # the JVM is gone: keep Python's text
        pass
    return text.splitlines()[0] if text else type(exc).__name__


@click.command()
@click.option("--seeds", required=True, help="the cluster's GCM endpoints, tcp://host:port,... (cluster.seeds)")
@click.option("--root", default="/roq", show_default=True)
@click.option("--queue", default="roq-stats", show_default=True)
@click.option("--output", required=True, type=click.Path(file_okay=False))
@click.option("--window", type=click.IntRange(1, 86400), default=10, show_default=True, help="seconds")
@click.option("--once", is_flag=True, help="aggregate what is retained now, then stop")
@click.option("--duration", type=float, default=0, help="stop after this many seconds (0 = run until Ctrl-C)")
@click.option("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
def main(seeds: str, root: str, queue: str, output: str, window: int, once: bool, duration: float,
         master: str | None) -> None:
    """Run the statistics pipeline (also under spark-submit). Exit codes as `roq`'s: 0 done,
    130 stopped by SIGINT/SIGTERM, else one line on stderr."""
    from roq.errors import Exit, RoqError
    from roq.spark.session import gate_stderr
    gate = gate_stderr()  # what Spark prints once we stop it on purpose stays off the terminal
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        run(seeds, root, queue, output, window, once, duration, master or _default_master(), stop)
    except KeyboardInterrupt:
        gate.close()  # what an abandoned start prints on its way out stays off the terminal too
        sys.exit(Exit.INTERRUPTED)
    except RoqError as exc:
        gate.say(f"roq: error: {exc}")
        sys.exit(Exit.for_error(exc))
    except Exception as exc:  # Spark's own errors: their first line, not pages of Java frames
        gate.say(f"roq: error: the statistics pipeline failed: {first_line(exc)}")
        sys.exit(Exit.INTERNAL)


def _default_master() -> str | None:
    from pyspark import SparkConf
    return None if SparkConf().contains("spark.master") else "local[*]"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # spark-submit from a checkout
    main()
