"""A daemon raises its soft limit of open files to the hard one (roq/daemon.py): it holds a
descriptor per client connection, and systemd's default soft limit is 1,024."""

from __future__ import annotations

import subprocess
import sys


def test_a_daemon_raises_its_soft_limit_of_open_files_to_the_hard_one() -> None:
    code = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "from roq.daemon import more_open_files\n"
        "more_open_files()\n"
        "print(*resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    soft, hard = (int(v) for v in out.stdout.split())
    assert soft == hard > 256
