"""Ctrl-C during `roq pipeline stats`'s start-up, as a terminal sends it (SIGINT to `roq`'s process
group): exit 130 within seconds, "interrupted" last, no stack traces, the statistics queue it created
deleted and nothing of the driver left (its JVM and Python workers are in the driver's own group).
Also when `roq` was started with SIGINT ignored, as a non-interactive shell starts a background job:
it used to wait for its driver forever. (Ctrl-C once the queries run: test_pipeline_cli.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.integration.test_cli_polish import _group_alive
from tests.integration.test_ctrl_c import IGNORING_SIGINT, assert_interrupted, press_ctrl_c
from tests.spark.test_pipeline_cli import no_traces, queues, roq
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ENDS_WITHIN = 20.0  # s from Ctrl-C to exit: an abandoned Spark start, the queue's deletion, a busy machine


def driver_group(pid: int, word: str) -> int | None:
    """The process group of the driver (roq.spark.stats_job), once `word` is in a command line under `pid`."""
    try:
        tree = psutil.Process(pid).children(recursive=True)
        if not any(word in " ".join(p.cmdline()) for p in tree):
            return None
        return next(os.getpgid(p.pid) for p in tree if "roq.spark.stats_job" in " ".join(p.cmdline()))
    except (psutil.Error, OSError, StopIteration):
        return None


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_while_the_pipeline_starts_ends_it_cleanly(cluster, procs, tmp_path, config, zk, paths, inherited):
    launcher = [sys.executable, "-c", IGNORING_SIGINT] if inherited == "ignored" else [sys.executable]
    took: dict[str, float] = {}
    for moment, shows in (("queue created", None), ("driver starting", "roq.spark.stats_job"),
                          ("spark starting", "SparkSubmit")):
        assert config.gcm.stats_queue not in queues(config, zk)
        args = roq("--config", str(procs.config_path), "pipeline", "stats", "--window", "2", "--output",
                   str(tmp_path / moment.replace(" ", "-")))
        proc = subprocess.Popen([*launcher, *args[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        group = None
        try:
            if shows is None:
                wait_until(lambda: zk.exists(paths.queue(config.gcm.stats_queue)), timeout=60, interval=0.005,
                           message="the statistics queue")
            else:
                group = wait_until(lambda: driver_group(proc.pid, shows), timeout=120, interval=0.005,
                                   message=f"the pipeline's {shows}")
        finally:
            stderr, took[moment] = press_ctrl_c(proc, ENDS_WITHIN)
            if group is not None and _group_alive(group):
                os.killpg(group, signal.SIGKILL)
        assert_interrupted(proc, stderr, took[moment], ENDS_WITHIN, moment)
        no_traces(stderr)
        assert f"deleted queue {config.gcm.stats_queue}" in stderr, (moment, stderr)
        assert config.gcm.stats_queue not in queues(config, zk), moment
        if group is not None:  # killed with the driver: gone once reaped
            wait_until(lambda: not _group_alive(group), timeout=10, message=f"the driver's processes gone ({moment})")
    record_figures(f"roq pipeline stats: Ctrl-C at start → exit, SIGINT {inherited} (s)", **took)
