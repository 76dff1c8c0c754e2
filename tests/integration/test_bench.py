"""Smoke runs of the benchmark tools (they measure nothing here; they must keep working)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.servers import BINARIES
from tests.conftest import unavailable

# Counts, never timings: beside the other tests, one benchmark smoke run at a time (RabbitMQs share epmd).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("bench")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["single", "batch"])
def test_roq_bench_measures_a_running_cluster(config, cluster, tmp_path, mode):
    out = tmp_path / "bench.json"
    env = dict(os.environ, ROQ_SEEDS=config.cluster.seeds, ROQ_ZK_HOSTS=config.zk.hosts, ROQ_ZK_ROOT=config.zk.root)
    flags = ["--batch"] if mode == "batch" else []
    done = subprocess.run([sys.executable, "-m", "roq.cli", "bench", "-n", "3000", "-s", "2", *flags,
                           "--json", str(out)], env=env, capture_output=True, timeout=100)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(out.read_text())
    assert result["system"] == ("roq-batch" if mode == "batch" else "roq") and result["subscribers"] == 2
    assert result["sent"] == result["confirmed"] == 3000
    assert result["received"] == 6000 and result["lost"] == 0  # fan-out: each subscriber got all
    assert result["msgs_per_s"] > 0 and 0 < result["p50_us"] <= result["p99_us"] <= result["p999_us"]
    assert "deliveries" in done.stderr.decode()  # the progress bar
    assert "at full rate (no --rate)" in done.stderr.decode() and "--rate 10000" in done.stderr.decode()


@pytest.mark.timeout(120)
def test_a_paced_roq_bench_that_keeps_up_has_no_note_on_its_latency(config, cluster, tmp_path):
    env = dict(os.environ, ROQ_SEEDS=config.cluster.seeds, ROQ_ZK_HOSTS=config.zk.hosts, ROQ_ZK_ROOT=config.zk.root)
    done = subprocess.run([sys.executable, "-m", "roq.cli", "bench", "-n", "1000", "--rate", "1000", "--json", "-"],
                          env=env, capture_output=True, timeout=100)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert result["rate"] == 1000 and result["lost"] == 0
    stderr = done.stderr.decode()
    if result["msgs_per_s"] >= 900:  # it kept up (a machine busy enough to fall behind gets the other note)
        assert "note:" not in stderr, stderr
    else:
        assert "below --rate 1,000" in stderr, stderr


def test_roq_bench_refuses_bad_input_clearly(config, cluster):
    env = dict(os.environ, ROQ_SEEDS=config.cluster.seeds, ROQ_ZK_HOSTS=config.zk.hosts, ROQ_ZK_ROOT=config.zk.root)
    done = subprocess.run([sys.executable, "-m", "roq.cli", "bench", "--size", "4"], env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 2 and b"--size" in done.stderr


@pytest.mark.timeout(300)
def test_comparison_script_runs_every_system(tmp_path):
    missing = [path for path in BINARIES.values() if not Path(path).exists()]
    if missing:
        unavailable(f"not installed: {missing} (make bench-servers)", "the benchmark comparison")
    done = subprocess.run([sys.executable, "bench/compare.py", "--smoke", "--sizes", "100", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, timeout=280)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads((tmp_path / "compare.json").read_text())
    rows = {r["system"]: r for r in report["results"]}
    assert set(rows) == {"zeromq", "zeromq-batch", "python-hop", "roq", "roq-batch", "roq-batch-oneframe",
                         "roq-replicated", "roq-replicated-batch", "roq-journal-fsync", "roq-journal-fsync-batch",
                         "nats", "redis", "rabbitmq"}
    for row in rows.values():
        assert row["msgs_per_s"] > 0 and row["p99_us"] > 0 and row["lost"] == 0, row
    assert rows["zeromq"]["vs_zeromq"] == 1.0
    targets = report["targets"]
    assert {"roq_batch_vs_raw_zeromq", "roq_vs_raw_zeromq", "roq_batch_vs_nats", "roq_p99_us_at_rate",
            "python_hop_p99_us_at_rate"} <= set(targets)
    # Zero-copy forwarding: two-part batches against one-frame ones at 100 B, and the tail against NATS's.
    assert targets["roq_batch_vs_oneframe_100"]["goal"] == 1.0 and targets["roq_batch_vs_oneframe_100"]["ratio"] > 0
    assert targets["roq_p99_over_nats"]["goal"] == 1.2 and targets["roq_batch_p99_over_nats"]["ratio"] > 0
    # The cost of durability, like against like: replication has goals, the journal none.
    for durable, plain in (("roq_replicated", "roq"), ("roq_replicated_batch", "roq_batch"),
                           ("roq_journal_fsync", "roq"), ("roq_journal_fsync_batch", "roq_batch")):
        assert targets[f"{durable}_vs_{plain}"]["ratio"] > 0 and targets[f"{durable}_vs_nats"]["ratio"] > 0
        over = targets[f"{durable}_p50_us_over_{plain}"]
        assert over["rate"] == report["settings"]["rate"] and over["rounds"] == 1
        assert ("goal" in over) == durable.startswith("roq_replicated")
    assert targets["roq_replicated_batch_vs_roq_batch"]["goal"] == 0.6
    assert targets["roq_replicated_batch_vs_nats"]["goal"] == 3.0
    stalls = report["machine"]["stalls"]  # how steady the CPUs were, measured before the runs
    assert stalls["cpus"] >= 1 and stalls["lost_percent"] >= 0 and stalls["worst_us"] >= 0
    assert report["machine"]["fsync"]["p50_us"] > 0  # the disk under the journals, measured first
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_work_queue_comparison_runs_every_system(tmp_path):
    missing = [path for path in BINARIES.values() if not Path(path).exists()]
    if missing:
        unavailable(f"not installed: {missing} (make bench-servers)", "the work-queue comparison")
    done = subprocess.run([sys.executable, "bench/compare.py", "--workqueue", "--smoke", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, timeout=280)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads((tmp_path / "workqueue.json").read_text())
    rows = {r["system"]: r for r in report["results"]}
    assert set(rows) == {"roq-workqueue", "roq-workqueue-batch", "rabbitmq-workqueue", "nats-queue-group"}
    for row in rows.values():
        assert row["msgs_per_s"] > 0 and row["lost"] == 0 and row["duplicates"] == 0, row
    assert rows["roq-workqueue"]["acks"] and not rows["nats-queue-group"]["acks"]
    assert report["ratios"]["roq_vs_rabbitmq"] > 0 and report["ratios"]["roq_vs_nats"] > 0
    assert all(len(r["per_worker"]) == 4 for r in report["rounds"])


@pytest.mark.timeout(240)
def test_latency_stages_script_runs(tmp_path):
    """bench/stages.py (where the latency goes): every stage of every system has percentiles, RoQ's split into
    the publisher's hand-over and the delivery."""
    done = subprocess.run([sys.executable, "bench/stages.py", "--smoke", "--out", str(tmp_path)],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, timeout=220)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads((tmp_path / "stages.json").read_text())
    results = {r["system"]: r for r in report["results"]}
    assert set(results) == {"zeromq", "python-hop", "exchange", "roq"}
    assert set(results["roq"]) >= {"publisher", "delivery", "total"}
    for result in results.values():
        assert result["total"]["p50_us"] > 0 and result["total"]["p99_us"] >= result["total"]["p50_us"], result
