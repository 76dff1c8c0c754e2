"""`roq pipeline` as a user runs it: a process, its exit code and what it prints on stderr.

Ctrl-C is SIGINT to the `roq` process's group, as a terminal sends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from roq.client.admin import Admin
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MISSING_EXTRA = ("roq: error: the Spark pipeline needs the spark extra ({module} is missing): "
                 "pip install -e '.[spark]' from the RoQ checkout (or: bash scripts/setup.sh dev,spark)")


def roq(*args: str, block: str = "") -> list[str]:
    """The `roq` command line, run by an interpreter where importing `block` fails."""
    code = f"import sys; sys.modules[{block!r}] = None; " if block else "import sys; "
    return [sys.executable, "-c", code + "sys.argv[0] = 'roq'; from roq.cli import main; main()", *args]


def no_traces(stderr: str) -> None:
    bad = [line for line in stderr.splitlines() if "Traceback" in line or "Exception" in line
           or line.lstrip().startswith("at ")]
    assert not bad, stderr[-6000:]


@pytest.mark.parametrize("command, module", [
    (("pipeline", "stats", "--once"), "pyspark"),
    (("pipeline", "report"), "matplotlib"),
])
def test_without_the_spark_extra_the_pipeline_says_how_to_install_it(tmp_path, command, module):
    done = subprocess.run(roq(*command, block=module), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == MISSING_EXTRA.format(module=module)


def start_pipeline(procs, output: Path, *extra: str) -> subprocess.Popen[str]:
    args = roq("--config", str(procs.config_path), "pipeline", "stats", "--window", "2", "--output", str(output),
               *extra)
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def queues(config, zk) -> list[str]:
    with Admin(config) as admin:
        return [q["name"] for q in admin.list_queues()]


def test_ctrl_c_stops_the_streaming_pipeline_cleanly_with_130(cluster, procs, tmp_path, config, zk):
    out = tmp_path / "pipeline"
    assert config.gcm.stats_queue not in queues(config, zk)
    proc = start_pipeline(procs, out)
    try:
        # Started: its two queries have written their checkpoints' metadata.
        wait_until(lambda: all((out / "_checkpoints" / name / "metadata").exists() for name in ("exchanges", "hosts"))
                   or proc.poll() is not None, timeout=90, interval=0.2, message="the pipeline's queries")
        assert proc.poll() is None, proc.communicate()[1]
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert stderr.rstrip().endswith("interrupted")
    no_traces(stderr)
    # The queue it created is gone, and with it the leader's statistics stream.
    assert f"deleted queue {config.gcm.stats_queue}" in stderr
    assert config.gcm.stats_queue not in queues(config, zk)
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]


def finish(proc: subprocess.Popen[str], timeout: float) -> str:
    """Wait for `proc` (in a session of its own) and return its stderr; its whole group is killed
    if it outlives `timeout`, so no JVM is left behind."""
    try:
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return stderr


def test_a_duration_ends_the_pipeline_with_0_and_no_stack_traces(cluster, procs, tmp_path, config, zk):
    with Admin(config) as admin:  # made by an operator who wants the stream kept: the pipeline leaves it
        admin.create_queue(config.gcm.stats_queue)
    proc = start_pipeline(procs, tmp_path / "pipeline", "--duration", "4")
    stderr = finish(proc, 120)
    assert proc.returncode == 0, stderr
    assert f"aggregates in {tmp_path / 'pipeline'}/exchanges" in stderr
    no_traces(stderr)
    assert "created queue" not in stderr and "deleted queue" not in stderr
    assert config.gcm.stats_queue in queues(config, zk)
