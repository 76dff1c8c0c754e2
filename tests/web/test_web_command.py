"""`roq web` as a command (docs/cli.md): one line and exit 3 at once without a cluster, no
ZooKeeper-client warnings before it; Ctrl-C says "interrupted" and exits 130, as every command does.
Against the session's real ZooKeeper; no GCM is needed for the gateway to start and serve."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from roq.cli import main
from roq.errors import Exit
from roq.tools.ports import free_port
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
ANNOUNCED = re.compile(r"RoQ console: (http://\S+)/ ")


def without_roq_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ROQ_")}, **extra}


def roq_web(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "roq.cli", *args, "web", "--port", "0"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=30)


def assert_one_line(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == Exit.UNAVAILABLE, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("roq: error:") and fragment in lines[0], result.stderr


def test_without_a_cluster_it_says_so_in_one_line_at_once(tmp_path: Path) -> None:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 2181)) == 0:
            pytest.skip("something listens on ZooKeeper's default port here")
    started = time.monotonic()
    guessed = roq_web(cwd=tmp_path, env=without_roq_env())
    took = time.monotonic() - started
    assert_one_line(guessed, "no seeds")
    assert "roq cluster up" in guessed.stderr and took < 8, took
    named = roq_web(cwd=tmp_path, env=without_roq_env(ROQ_SEEDS=f"tcp://127.0.0.1:{free_port()}"))
    assert_one_line(named, "nothing listens there")
    record_figures("roq web outside a cluster", seconds=round(took, 2))


def test_ctrl_c_stops_it_and_says_interrupted(config, zk, paths, procs, tmp_path: Path) -> None:
    from roq.state import read_leader
    config_path = tmp_path / "roq.toml"
    config_path.write_text(config.to_toml())
    procs.start("gcm", "gcm-0")  # a seed that answers: the console's way to the cluster
    wait_until(lambda: read_leader(zk, paths), timeout=20, message="the GCM")
    web = subprocess.Popen([sys.executable, "-m", "roq.cli", "--config", str(config_path), "web", "--port", "0"],
                           cwd=tmp_path, env=without_roq_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)  # its own group: SIGINT as a terminal's Ctrl-C
    try:
        assert web.stdout is not None
        announced = ANNOUNCED.search(web.stdout.readline())
        assert announced, "no announcement"
        url = announced.group(1)
        wait_until(lambda: httpx.get(url + "/", timeout=5).status_code == 200, timeout=20, message="serving")
        os.killpg(web.pid, signal.SIGINT)
        _, stderr = web.communicate(timeout=20)
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGKILL)
            web.wait()
    assert web.returncode == Exit.INTERRUPTED, (web.returncode, stderr)
    assert stderr.strip().splitlines()[-1] == "interrupted", stderr
    assert "Traceback" not in stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/", timeout=5)


@pytest.mark.parametrize("command", [["queue", "list"], ["queue", "show", "q"], ["queue", "rules", "q"]])
def test_every_json_flag_says_what_it_prints(command: list[str]) -> None:
    shown = CliRunner().invoke(main, [*command, "--help"])
    assert shown.exit_code == 0, shown.output
    json_help = shown.output.split("--json", 1)[1].split("--help", 1)[0]
    assert "machine-readable" in json_help, shown.output
