"""What the machine was like when a comparison ran: CPUs, and how often they stalled.

Latency percentiles on a shared or virtual machine are bounded by how long a
CPU can be taken away from a runnable process (other processes, the
hypervisor). `stalls()` measures that directly: one process per CPU reads the
clock in a tight loop, and every gap between two reads longer than
STALL_FLOOR_US is time the CPU was not running it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

STALL_FLOOR_US = 200
HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def _spin(seconds: float) -> tuple[int, int, float, int]:
    """(gaps over 1 ms, over STALL_FLOOR_US, time lost in those in ms, worst gap in µs)."""
    now = time.perf_counter_ns
    floor = STALL_FLOOR_US * 1000
    start = last = now()
    end = start + int(seconds * 1e9)
    over_ms = over_floor = lost = worst = 0
    while last < end:
        t = now()
        gap = t - last
        last = t
        if gap > floor:
            over_floor += 1
            lost += gap
            worst = max(worst, gap)
            if gap > 1_000_000:
                over_ms += 1
    return over_ms, over_floor, lost / 1e6, worst // 1000


def stalls(seconds: float = 2.0) -> dict[str, Any]:
    """Spin every CPU for `seconds` (nothing else of ours runs meanwhile); per-CPU means."""
    cpus = len(os.sched_getaffinity(0))
    with mp.get_context("spawn").Pool(cpus) as pool:
        results = pool.map(_spin, [seconds] * cpus)
    return {"seconds": seconds, "cpus": cpus,
            "gaps_over_1ms_per_s": round(sum(r[0] for r in results) / cpus / seconds, 1),
            f"gaps_over_{STALL_FLOOR_US}us_per_s": round(sum(r[1] for r in results) / cpus / seconds, 1),
            "lost_percent": round(sum(r[2] for r in results) / cpus / (seconds * 1000) * 100, 2),
            "worst_us": max(r[3] for r in results)}


def halt_poll_ns() -> int | None:
    """A KVM guest's halt polling: how long an idle CPU spins before it halts (0: it halts at
    once, and waking it costs a trip through the hypervisor). None where there is no such knob."""
    try:
        return int(HALT_POLL.read_text())
    except (OSError, ValueError):
        return None
