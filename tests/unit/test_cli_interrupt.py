"""Ctrl-C says "interrupted" and exits 130 wherever it comes (docs/cli.md), also while click itself
is still at work: here `roq publish --file FIFO` opening its file (a parameter click converts, before
the command runs) blocks until the FIFO has a writer, and the Ctrl-C comes then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roq.errors import Exit


@pytest.mark.timeout(60)
def test_ctrl_c_while_click_opens_a_file_is_interrupted_too(tmp_path: Path) -> None:
    fifo = tmp_path / "lines"
    os.mkfifo(fifo)
    roq = subprocess.Popen([sys.executable, "-m", "roq.cli", "publish", "orders", "--file", str(fifo)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        # The kernel's word that it waits in open() for a writer ("0" while it runs).
        while "partner" not in Path(f"/proc/{roq.pid}/wchan").read_text():
            assert roq.poll() is None and time.monotonic() < deadline, "never blocked opening the FIFO"
            time.sleep(0.02)  # polling the kernel's view of the process, which has no event to wait on
        os.killpg(roq.pid, signal.SIGINT)
        _, stderr = roq.communicate(timeout=20)
    finally:
        if roq.poll() is None:
            os.killpg(roq.pid, signal.SIGKILL)
            roq.wait()
    assert roq.returncode == Exit.INTERRUPTED, (roq.returncode, stderr)
    assert stderr == "interrupted\n"
