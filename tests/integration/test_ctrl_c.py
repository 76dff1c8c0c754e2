"""Ctrl-C at any moment of `roq bench`, as a terminal sends it (SIGINT to the whole process group,
worker processes included): the command ends within seconds with "interrupted" as its last line and
exit 130, no traceback, its worker processes gone and the queue it created deleted.

Also when `roq` was started with SIGINT ignored, as a non-interactive shell starts a background job
(and so a CI runner started that way): it used to run on, its queue left behind. And at the moments
of its start-up: a Ctrl-C that came while the workers were being started used to be lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import pytest

from roq.client.admin import Admin
from roq.state import read_live
from tests.integration.test_cli_polish import _group_alive
from tests.support.helpers import record_figures, wait_until

pytestmark = pytest.mark.integration

# `python -m roq.cli ...` started with SIGINT ignored, as `cmd &` in a non-interactive shell is; the
# exec keeps the process id, so the test's process group is the command's.
IGNORING_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                   "os.execv(sys.executable, [sys.executable] + sys.argv[1:])")
ENDS_WITHIN = 15.0  # s from Ctrl-C to exit: the workers' stop and the queue's deletion, on a busy machine
MOMENTS = ("connecting", "creating", "starting workers", "warming up", "measuring")


def workers(pid: int) -> list[psutil.Process]:
    """The benchmark's worker processes (multiprocessing's resource tracker is not one)."""
    try:
        return [c for c in psutil.Process(pid).children() if "spawn_main" in " ".join(c.cmdline())]
    except psutil.Error:
        return []


def connected_to(pid: int, ports: set[int]) -> bool:
    try:
        return any(c.raddr and c.raddr.port in ports for c in psutil.Process(pid).net_connections("tcp"))
    except psutil.Error:
        return False


def moments(config, zk, paths, queue: str, pid: int) -> dict[str, Callable[[], object]]:
    """When to press Ctrl-C, from the first thing the command does to the measurement, by what shows."""
    seeds = {int(seed.rpartition(":")[2]) for seed in config.cluster.seeds.split(",")}
    return {
        "connecting": lambda: connected_to(pid, seeds),  # to a GCM, to create the queue
        "creating": lambda: zk.exists(paths.queue(queue)),  # waiting for its exchange
        "starting workers": lambda: workers(pid),
        "warming up": lambda: len(workers(pid)) == 3,
        "measuring": lambda: read_live(zk, paths, queue)["x1"]["stats"].get("msgs_in_per_s", 0) > 0,
    }


def press_ctrl_c(proc: subprocess.Popen, within: float) -> tuple[str, float]:
    """SIGINT to `proc`'s process group, as a terminal's Ctrl-C: its stderr and the seconds it took to
    end. Its group is killed should it outlive `within` by far, so that a failing test leaves nothing."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:  # it ended by itself: the caller's assertions say how
        pass
    pressed = time.monotonic()
    try:
        _, err = proc.communicate(timeout=within + 30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return err if isinstance(err, str) else err.decode(), round(time.monotonic() - pressed, 2)


def assert_interrupted(proc: subprocess.Popen, stderr: str, took: float, within: float, moment: str) -> None:
    """Exit 130 within `within` seconds, "interrupted" the last line, no traceback."""
    assert proc.returncode == 130, (moment, stderr)
    assert stderr.strip().splitlines()[-1] == "interrupted", (moment, stderr)
    assert not any(word in stderr for word in ("Traceback", "KeyboardInterrupt", "Exception ignored")), \
        (moment, stderr)
    assert took < within, (moment, took, stderr)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_at_any_moment_of_bench_ends_it_cleanly(config, zk, paths, cluster, inherited):
    env = dict(os.environ, ROQ_SEEDS=config.cluster.seeds, ROQ_ZK_HOSTS=config.zk.hosts, ROQ_ZK_ROOT=config.zk.root)
    launcher = [sys.executable, "-c", IGNORING_SIGINT] if inherited == "ignored" else [sys.executable]
    took: dict[str, float] = {}
    for moment in MOMENTS:
        queue = "ctrlc-" + moment.replace(" ", "-")
        bench = subprocess.Popen([*launcher, "-m", "roq.cli", "bench", "--queue", queue, "-n", "10000000",
                                  "--rate", "2000", "-s", "2"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        try:
            wait_until(moments(config, zk, paths, queue, bench.pid)[moment], timeout=60, interval=0.005,
                       message=f"roq bench {moment}")
        finally:
            stderr, took[moment] = press_ctrl_c(bench, ENDS_WITHIN)
        assert_interrupted(bench, stderr, took[moment], ENDS_WITHIN, moment)
        with Admin(config) as admin:
            assert queue not in [q["name"] for q in admin.list_queues()], moment  # deleted, or never created
        wait_until(lambda: not _group_alive(bench.pid), timeout=10, message=f"the workers gone ({moment})")
    record_figures(f"roq bench: Ctrl-C → exit, SIGINT {inherited} at start (s)", **took)
