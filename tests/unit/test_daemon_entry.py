"""The daemons' shared entry point (roq/daemon.py): one exit-code enum with the CLI, a bad
configuration exits with Exit.CONFIG from every daemon, stop requests wake the loops."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from roq.daemon import JsonLinesFormatter, Stop
from roq.errors import (
    ConfigError,
    Exit,
    NoLeaderError,
    QueueNotFoundError,
    RefusedError,
    RoqError,
    ZooKeeperUnavailableError,
)

BIN = Path(sys.executable).parent


def daemon(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a console script (or its module where the scripts are not installed) to its end."""
    module = {"roq-gcm": "gcm.daemon", "roq-hcm": "hcm.daemon", "roq-exchange": "exchange.main"}[script]
    command = [str(BIN / script)] if (BIN / script).exists() else [sys.executable, "-m", module]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROQ_")}
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


def assert_refused_config(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == Exit.CONFIG, (result.returncode, result.stderr)
    assert fragment in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_the_cli_and_the_daemons_share_one_enum() -> None:
    from roq import cli
    assert cli.Exit is Exit
    assert (Exit.OK, Exit.USER_ERROR, Exit.USAGE, Exit.UNAVAILABLE, Exit.INTERNAL, Exit.REFUSED) == (0, 1, 2, 3, 4, 5)
    assert Exit.for_error(ConfigError("x")) == Exit.CONFIG
    assert Exit.for_error(QueueNotFoundError("x")) == Exit.USER_ERROR
    assert Exit.for_error(RefusedError("x")) == Exit.REFUSED
    assert Exit.for_error(ZooKeeperUnavailableError("x")) == Exit.UNAVAILABLE
    assert Exit.for_error(NoLeaderError("x")) == Exit.UNAVAILABLE
    assert Exit.for_error(RoqError("x")) == Exit.INTERNAL
    assert Exit.for_error(ValueError("a bug")) == Exit.INTERNAL


@pytest.mark.parametrize("script, settings, fragment", [
    ("roq-gcm", ["--set", "zk.nonsense=1"], "unknown key zk.nonsense"),
    ("roq-hcm", ["--set", "hcm.capacity=many"], "must be int"),
    ("roq-hcm", ["--set", "hcm.max_restarts=0"], "hcm.max_restarts must be positive"),
])
def test_a_daemon_refuses_a_bad_configuration(script: str, settings: list[str], fragment: str) -> None:
    result = daemon(script, *settings)
    assert_refused_config(result, fragment)
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line, before any logging
    assert result.stderr.startswith(f"{script}: ")


def test_an_exchange_refuses_a_bad_configuration() -> None:
    result = daemon("roq-exchange", "--queue", "q", "--id", "x1", "--no-watch-stdin",
                    "--config-json", json.dumps({"exchange": {"sub_hwm": 0}}))
    assert_refused_config(result, "exchange.sub_hwm must be positive")


def test_an_exchange_refuses_keys_it_cannot_read(tmp_path: Path) -> None:
    """A setting only the exchange checks (the HCM passes it through): still Exit.CONFIG."""
    config = {"security": {"curve": True, "keys_dir": str(tmp_path / "missing")}}
    result = daemon("roq-exchange", "--queue", "q", "--id", "x1", "--no-watch-stdin", "--json-logs",
                    "--config-json", json.dumps(config))
    assert_refused_config(result, "is not a directory")
    record = json.loads(result.stderr.strip().splitlines()[-1])
    assert record["level"] == "ERROR" and "is not a directory" in record["msg"]


def test_a_stop_request_wakes_the_events_loops_wait_on() -> None:
    stop, tick = Stop(), threading.Event()
    stop.also_wake(tick)
    threading.Thread(target=stop.set).start()
    assert tick.wait(5) and stop.is_set()
    late = threading.Event()
    stop.also_wake(late)  # named after the request: set at once
    assert late.is_set()


def test_child_records_are_relogged_by_the_hcm(caplog: pytest.LogCaptureFixture) -> None:
    """What an exchange writes with --json-logs comes out of the HCM's logging, level kept."""
    from hcm.supervisor import _forward_logs
    formatter = JsonLinesFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord("exchange.forwarder", logging.ERROR, __file__, 1, "frame %s failed", ("7",),
                                   sys.exc_info())
    info = logging.LogRecord("exchange.main", logging.INFO, __file__, 1, "ready", (), None)
    stream = io.BytesIO("\n".join([formatter.format(failed), formatter.format(info),
                                   "Fatal Python error: not JSON"]).encode() + b"\n")
    with caplog.at_level(logging.INFO):
        _forward_logs(("q", "x1"), 4242, stream)
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert got[0][:2] == ("exchange.forwarder", logging.ERROR)
    assert got[0][2].startswith("q/x1[4242] frame 7 failed\nTraceback") and "ValueError: boom" in got[0][2]
    assert got[1] == ("exchange.main", logging.INFO, "q/x1[4242] ready")
    assert got[2] == ("exchange", logging.WARNING, "q/x1[4242] Fatal Python error: not JSON")
