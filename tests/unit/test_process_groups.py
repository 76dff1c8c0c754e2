"""roq/tools/process_groups.py on real processes: a group counts as running while any process of it
runs, not while only zombies are left, and stop_groups ends even a process that ignores SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from roq.tools import process_groups
from tests.support.helpers import wait_until

pytestmark = pytest.mark.timeout(30)


def start_group(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["/bin/sh", "-c", script], process_group=0, stdout=subprocess.PIPE)


def test_a_group_whose_shell_exited_still_runs_while_its_child_does() -> None:
    proc = start_group("sleep 60 & echo $!")
    try:
        child = int(proc.stdout.readline())  # type: ignore[union-attr]
        proc.wait(10)  # the shell is reaped; its sleep runs on, in the same group
        assert process_groups.running(proc.pid)
        assert process_groups.stop_groups([proc.pid], grace=5.0, kill_wait=5.0) == []
        assert not process_groups.running(proc.pid)
        assert _state(child) in ("Z", "gone")  # init's to reap (in a container it may never)
    finally:
        process_groups.signal_group(proc.pid, signal.SIGKILL)


def test_a_zombie_does_not_count_as_running() -> None:
    proc = start_group("exit 0")
    try:
        wait_until(lambda: _state(proc.pid) == "Z", timeout=10, message="the shell a zombie (not reaped)")
        assert not process_groups.running(proc.pid)  # killpg(pid, 0) would still find it
    finally:
        proc.wait(10)


def test_a_process_that_ignores_sigterm_gets_sigkill_after_the_grace() -> None:
    proc = start_group("trap '' TERM; echo ready; sleep 60")
    try:
        assert proc.stdout.readline() == b"ready\n"  # type: ignore[union-attr]
        started = time.monotonic()
        assert process_groups.stop_groups([proc.pid], grace=0.5, kill_wait=5.0) == []
        assert time.monotonic() - started >= 0.5  # the grace was given first
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        process_groups.signal_group(proc.pid, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
