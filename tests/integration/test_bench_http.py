"""A smoke run of bench/http.py: a real local cluster, a real roq-web and nats-server, tiny
counts. It measures nothing here; it checks that every path still runs and that every message
published reached its subscriber exactly once (counts, never timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.servers import BINARIES
from roq.tools.zkserver import ZooKeeperNotInstalledError, find_zookeeper
from tests.conftest import unavailable

# Counts, never timings: beside the other tests, one benchmark smoke run at a time (RabbitMQs share epmd).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("bench")]
ROOT = Path(__file__).resolve().parents[2]
SSE_MESSAGES, NATIVE_MESSAGES = 500, 1000
ROWS = {"http-single-1", "http-single-2", "http-lines-10", "roq-native-each", "sse-backlog", "sse-live",
        "nats-each", "roq-throughput", "roq-batch-throughput", "nats-throughput"}


@pytest.mark.timeout(120)
def test_http_gateway_bench_delivers_every_message(tmp_path):
    if not Path(BINARIES["nats"]).exists():
        unavailable("nats-server is not installed (make bench-servers)", "the HTTP gateway benchmark")
    try:
        find_zookeeper()
    except ZooKeeperNotInstalledError as exc:
        unavailable(str(exc), "the HTTP gateway benchmark")
    out = tmp_path / "http.json"
    done = subprocess.run([sys.executable, "-m", "bench.http", "--seconds", "0.3", "--clients", "1,2",
                           "--lines", "10", "--sse-messages", str(SSE_MESSAGES),
                           "--native-messages", str(NATIVE_MESSAGES), "--json", str(out)],
                          cwd=ROOT, capture_output=True, timeout=110)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["results"]}
    assert set(rows) == ROWS
    for row in rows.values():
        assert row["messages"] > 0 and row["lost"] == row["duplicates"] == row["errors"] == 0, row
        assert row["unexpected"] == 0, row
    for name in ("http-single-1", "http-single-2", "http-lines-10", "roq-native-each", "nats-each"):
        assert rows[name]["received"] == rows[name]["messages"], rows[name]  # every confirmed one, once
    assert rows["http-lines-10"]["messages"] % 10 == 0  # whole requests: all or none of their lines
    for name in ("sse-backlog", "sse-live"):
        row = rows[name]
        assert row["received"] == SSE_MESSAGES and row["ids"] == SSE_MESSAGES, row  # a resume token each
        assert row["bad_payloads"] == 0, row
    for name in ("roq-throughput", "roq-batch-throughput", "nats-throughput"):
        assert rows[name]["received"] == NATIVE_MESSAGES, rows[name]
    assert report["machine"]["uvicorn"]["http"] in ("h11", "httptools")
