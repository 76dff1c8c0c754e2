"""The `roq` source, sink and statistics pipeline on a Spark standalone cluster, not local[*]:
a master and two workers started from the PySpark distribution (bin/spark-class), bound to
127.0.0.1, executors in processes of their own. One cluster for the module; the driver is this
test process (its session stopped before the pipeline's driver takes the cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from roq.tools.ports import free_port
from roq.tools.zkserver import stop_process_group
from tests.conftest import unavailable
from tests.integration.conftest import create
from tests.spark.conftest import written_and_received
from tests.spark.test_pipeline_cli import no_traces, roq
from tests.spark.test_spark import publish, read_to_parquet
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WORKERS = 2
WORKER_CORES, WORKER_MEMORY = 2, "1g"  # per worker: room for this driver's executors and then the pipeline's
EXECUTOR = {"spark.executor.cores": "1", "spark.executor.memory": "512m", "spark.cores.max": "2"}


class Standalone:
    """A Spark standalone master and its workers, each a JVM in a process group of its own."""

    def __init__(self, workdir: Path) -> None:
        import pyspark
        self.home = Path(pyspark.__file__).parent
        self.workdir = workdir
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = dict(os.environ, SPARK_HOME=str(self.home), SPARK_LOCAL_IP="127.0.0.1",
                        SPARK_DAEMON_MEMORY="256m", SPARK_LOG_DIR=str(workdir), PYSPARK_PYTHON=sys.executable)

    def start(self) -> None:
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        for i in range(WORKERS):
            self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                        "--webui-port", str(free_port()), "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                        "--work-dir", str(self.workdir / f"work-{i}"))
        wait_until(lambda: self.state().get("aliveworkers") == WORKERS, timeout=90, interval=0.2,
                   message=f"{WORKERS} Spark workers registered ({self.workdir})")

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        with (self.workdir / f"{name}.log").open("ab") as log:
            self.procs.append(subprocess.Popen([str(self.home / "bin" / "spark-class"), main_class, *args],
                                               env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as answer:
            return json.load(answer)

    def executors(self) -> list[list[psutil.Process]]:
        """Per worker, its executor JVMs: processes under the worker, never this one."""
        return [[child for child in psutil.Process(worker.pid).children(recursive=True)
                 if "CoarseGrainedExecutorBackend" in _cmdline(child)] for worker in self.procs[1:]]

    def stop(self) -> None:
        for proc in reversed(self.procs):  # workers (and their executors) first, then the master
            stop_process_group(proc.pid)
            proc.wait()


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone meanwhile, or a zombie not reaped yet
        return ""


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory, spark_sessions) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path_factory.mktemp("spark-standalone"))
    if not (cluster.home / "bin" / "spark-class").exists():
        unavailable(f"no bin/spark-class in {cluster.home}", "the standalone Spark tests")
    try:
        cluster.start()
        yield cluster
    finally:
        if spark_sessions.master == cluster.url:
            spark_sessions.close()
        cluster.stop()


@pytest.fixture
def spark(standalone: Standalone, spark_sessions) -> Any:
    return spark_sessions.get(standalone.url, {
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4", **EXECUTOR})


def test_the_source_reads_exactly_once_on_executors_across_a_checkpoint_restart(
        standalone, spark, config, zk, paths, cluster, tmp_path):
    create(config, zk, paths, "wide", 2)
    for x in ("x1", "x2"):
        publish(config, zk, "wide", 0, 600, prefer=x)
    assert read_to_parquet(spark, config, "wide", tmp_path) == 1200
    publish(config, zk, "wide", 600, 400, prefer="x1")  # while the query is stopped
    assert read_to_parquet(spark, config, "wide", tmp_path) == 1600  # restarted from its checkpoint
    assert spark.read.parquet(str(tmp_path / "data")).select("publisher", "sequence").distinct().count() == 1600
    per_worker = standalone.executors()
    assert [len(executors) for executors in per_worker] == [1, 1]  # spark.cores.max 2, one core each
    assert os.getpid() not in {e.pid for executors in per_worker for e in executors}


def test_the_sink_publishes_from_executors(standalone, spark, config, zk, paths, cluster):
    create(config, zk, paths, "fanin", 1)
    frame = spark.createDataFrame([("t", f"m{i}") for i in range(300)], "topic string, value string")
    got = written_and_received(frame.repartition(4), config, zk, "fanin", 300)
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(300))


def test_roq_pipeline_stats_runs_on_the_cluster(standalone, spark_sessions, config, zk, paths, cluster, procs,
                                                 tmp_path):
    from roq.spark.report import load
    spark_sessions.close()  # this test's driver gives its executors back: the pipeline's driver gets them
    out = tmp_path / "pipeline"
    args = roq("--config", str(procs.config_path), "pipeline", "stats", "--master", standalone.url, "--window", "2",
               "--output", str(out))
    started = time.monotonic()
    # Files, not pipes: nobody reads the pipeline's output while the test polls its windows.
    with open(tmp_path / "stderr", "w+") as err, subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True,
            env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")) as proc:
        try:
            def committed_windows() -> bool:
                assert proc.poll() is None, (tmp_path / "stderr").read_text()[-6000:]
                windows = load(out / "exchanges")  # only what a query committed
                return windows is not None and "roq-stats" in set(windows["queue"])
            wait_until(committed_windows, timeout=180, message="a window of roq-stats committed")
            first_window_s = time.monotonic() - started
            proc.send_signal(signal.SIGTERM)  # as Ctrl-C: the queries stop between micro-batches
            proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stderr = (tmp_path / "stderr").read_text()
    assert proc.returncode == 130, stderr
    no_traces(stderr)
    windows = load(out / "exchanges")  # what the queries committed, the last one's stop included
    assert "roq-stats" in set(windows["queue"]) and (windows["samples"] >= 1).all()
    # The master lists the application as completed once it has noticed the driver go.
    apps = wait_until(lambda: [a for a in standalone.state()["completedapps"] if a["name"] == "roq-stats-pipeline"],
                      timeout=30, message="the pipeline among the master's completed applications")
    assert apps[0]["cores"] >= 1
    record_figures("statistics pipeline on standalone Spark", first_window_s=round(first_window_s, 1),
                   windows=len(windows))
