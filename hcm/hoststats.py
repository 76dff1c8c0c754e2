"""This host's CPU and memory, for the leader's autoscaling rules and for `roq stats`."""

from __future__ import annotations

import os
import time

import psutil

from roq.records import HostStats


def host_figures() -> HostStats:
    """CPU use since the previous call (psutil keeps the reference), memory in use, load."""
    memory = psutil.virtual_memory()
    return HostStats(cpu_percent=psutil.cpu_percent(interval=None), memory_percent=memory.percent,
                     memory_used_bytes=memory.total - memory.available, load1=os.getloadavg()[0],
                     cpus=psutil.cpu_count() or 1, at=time.time())
