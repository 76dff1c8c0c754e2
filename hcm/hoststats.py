"""This host's CPU, memory and data disk, for the leader's rules and placement and for `roq stats`.

The data disk is the file system of `hcm.data_dir`, where the exchanges keep their journals: the
leader places no journaling exchange on a host with too little free there (gcm/placement.py). A
data directory that does not exist yet is measured at its nearest existing parent; a file system
that cannot be measured reports 0 bytes in all (unknown), never an error.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from roq.records import HostStats


def host_figures(data_dir: str | Path = ".") -> HostStats:
    """CPU use since the previous call (psutil keeps the reference), memory in use, load, data disk."""
    memory = psutil.virtual_memory()
    free, total = disk_space(Path(data_dir))
    return HostStats(cpu_percent=psutil.cpu_percent(interval=None), memory_percent=memory.percent,
                     memory_used_bytes=memory.total - memory.available, load1=os.getloadavg()[0],
                     cpus=psutil.cpu_count() or 1, data_free_bytes=free, data_total_bytes=total, at=time.time())


def disk_space(path: Path) -> tuple[int, int]:
    """(bytes free to an unprivileged writer, bytes in all) of the file system holding `path`;
    (0, 0) when it cannot be measured."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        fs = os.statvfs(path)
    except OSError:
        return 0, 0
    return fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
