"""Smoke run of the benchmark curves (bench/curves.py): it measures nothing here; it must keep working."""

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
CURVES = {"fanout", "fanin", "topics", "sizes", "connections", "latency"}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_curves_script_runs_every_curve_for_every_system(tmp_path):
    if not Path(BINARIES["nats"]).exists():
        unavailable(f"not installed: {BINARIES['nats']} (make bench-servers)", "the benchmark curves")
    try:
        find_zookeeper()  # RoQ's local clusters
    except ZooKeeperNotInstalledError as exc:
        unavailable(str(exc), "the benchmark curves")
    done = subprocess.run([sys.executable, "bench/compare.py", "--curves", "--smoke", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, timeout=280)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads((tmp_path / "curves.json").read_text())
    assert set(report["curves"]) == CURVES
    assert "--curves" in report["command"] and report["machine"]["load_after"]
    assert not [r for r in report["rounds"] if "error" in r]
    for name, curve in report["curves"].items():
        assert f"--only {name}" in curve["command"] and "--smoke" in curve["command"]
        results = {(r["system"], r["point"]): r for r in curve["results"]}
        # Every point for every system, RoQ with at least its batch API, beside raw ZeroMQ and NATS.
        assert {"zeromq", "nats", "roq"} <= set(curve["systems"])
        assert set(results) == {(s, p) for s in curve["systems"] for p in curve["points"]}, name
        for (system, point), row in results.items():
            assert row["rounds"] == 1 and not row["errors"], row
            assert row[curve["figure"]] is not None, row
            assert "vs_zeromq" in row and "vs_zeromq_range" in row
            if name != "connections":  # a broker's memory growth can be zero at a few connections
                assert row["vs_zeromq"] > 0, row
                assert row["msgs_per_s"] > 0 and row["p99_us"] > 0, row
            if system.startswith("roq") and name != "connections":
                assert row["lost"] == 0, row  # RoQ guarantees delivery
        baseline = [r for r in curve["results"] if r["system"] == "zeromq" and r["vs_zeromq"] is not None]
        assert all(r["vs_zeromq"] == 1.0 for r in baseline), baseline
        assert (tmp_path / curve["chart"]).read_bytes()[:8] == PNG
    assert "roq-batch" in set(report["curves"]["fanout"]["systems"])
    connections = {r["system"]: r for r in report["curves"]["connections"]["results"] if r["point"] == 8}
    for row in connections.values():
        assert row["rss_after_mb"] > 0 and row["cpu_after"] is not None, row
    topics = {r["point"] for r in report["rounds"] if r["curve"] == "topics" and r["system"] == "roq-batch"}
    assert max(topics) == 10_000  # publish_many split over more topics than a batch holds
