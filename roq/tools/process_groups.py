"""Whether a process group still runs, and stopping one for good: what `--exec` needs to say
"stopped" only once the command and everything it started are gone.

A process that has exited but was not reaped (a zombie) is not running, yet `killpg(pgid, 0)` counts
it: once a command's shell is reaped, what it started belongs to init, and in a container init may
never reap. So on Linux the group's members are read from /proc, zombies left out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

POLL = 0.02  # s between two looks at groups that are still running


def running(pgid: int) -> bool:
    """Whether a process of group `pgid` runs (a zombie does not)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():  # no /proc: killpg counts zombies too, the best there is
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:  # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(pgid, signum)


def wait_gone(pgids: Iterable[int], deadline: float) -> list[int]:
    """Wait until no process of `pgids` runs or time.monotonic() passes `deadline`; the groups that still run."""
    left = list(pgids)
    while True:
        left = [pgid for pgid in left if running(pgid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL)


def stop_groups(pgids: Iterable[int], grace: float, kill_wait: float) -> list[int]:
    """SIGTERM each group, SIGKILL the ones still running after `grace` s and wait up to `kill_wait` s
    for those; the groups that still run after all (a process stuck in the kernel), for the caller to report."""
    pgids = list(pgids)
    for pgid in pgids:
        signal_group(pgid, signal.SIGTERM)
    left = wait_gone(pgids, time.monotonic() + grace)
    for pgid in left:
        signal_group(pgid, signal.SIGKILL)
    return wait_gone(left, time.monotonic() + kill_wait)
