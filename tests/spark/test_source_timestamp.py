"""The `roq` source's startingTimestamp on a cluster of its own (exchanges with a memory tail of
200 KB): what was stored since a time is read from the disk and the memory tail alike, in a batch
and in a stream (tests/spark/test_source_sink.py has the source's other options)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import pytest

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.state import read_live
from tests.spark.test_source_sink import run_available_now, source
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_starting_timestamp_reads_what_was_stored_since_from_disk_and_memory(spark, config, zk, paths, procs):
    from tests.integration.conftest import start_cluster
    start_cluster(procs, zk, paths, "exchange.retention_bytes=200000")  # a memory tail of 200 KB
    small = config.replace(client={"max_batch_bytes": 20_000})
    with Admin(small) as admin:
        admin.create_queue("timed", exchanges=1, retention=3_600.0, retention_bytes=1 << 30)
    wait_until(lambda: read_live(zk, paths, "timed").get("x1"), timeout=20, message="x1 running")
    body = b"x" * 2_000
    with Publisher("timed", small) as pub:
        for i in range(100):
            pub.publish("t", i.to_bytes(4, "big") + body)
        pub.flush(60)
        since = time.time()
        wait_until(lambda: time.time() > since + 0.05, message="the clock to move past the first messages")
        for i in range(100, 600):
            pub.publish("t", i.to_bytes(4, "big") + body)  # 1 MB: five memory tails after the time
        pub.flush(60)
    numbers = "cast(conv(hex(substring(payload, 1, 4)), 16, 10) as int) as n"
    batch = source(spark, config, "timed", startingTimestamp=str(math.ceil(since * 1000))).load().selectExpr(numbers)
    assert sorted(r.n for r in batch.collect()) == list(range(100, 600))
    iso = datetime.fromtimestamp(since, UTC).isoformat().replace("+00:00", "Z")
    run_available_now(spark, source(spark, config, "timed", True, startingTimestamp=iso), "timed")
    got = spark.sql(f"select {numbers} from timed").collect()
    assert sorted(r.n for r in got) == list(range(100, 600))
