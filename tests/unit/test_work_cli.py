"""`roq subscribe --group`'s output (roq/tools/work_cli.py) on real pipes and files: a line counts
as delivered once the reader took it out of the pipe, never while it waits in the pipe's buffer."""

from __future__ import annotations

import _signal
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import pytest

from roq.client.group_member import WorkMessage
from roq.config import MESSAGE_ENV, load_config
from roq.tools import process_groups, work_cli
from roq.tools.work_cli import LineOut, message_env
from tests.support.helpers import wait_until

pytestmark = pytest.mark.timeout(30)


def test_a_pipe_line_is_delivered_once_read_and_not_when_the_reader_left_it() -> None:
    r, w = os.pipe()
    out = LineOut(os.fdopen(w, "wb"))
    assert out.pipe and not out.reader_gone()
    reader = threading.Thread(target=lambda: os.read(r, 100))  # reads one line, then goes away
    reader.start()
    assert out.deliver(b"first\n")
    reader.join()
    os.close(r)
    assert out.reader_gone()
    assert not out.deliver(b"second\n")  # EPIPE: nothing was delivered


def test_a_line_left_unread_in_the_pipe_is_not_delivered() -> None:
    r, w = os.pipe()
    out = LineOut(os.fdopen(w, "wb"))
    closer = threading.Timer(0.2, os.close, (r,))  # the reader exits without reading
    closer.start()
    assert not out.deliver(b"never read\n")
    closer.join()


def test_a_file_line_is_delivered_once_written(tmp_path: Path) -> None:
    with open(tmp_path / "out", "wb") as stream:
        out = LineOut(stream)
        assert not out.pipe and out.deliver(b"line\n") and not out.reader_gone()
    assert (tmp_path / "out").read_bytes() == b"line\n"


def test_the_message_environment_names_the_message_and_survives_nul_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROQ_KEY", "from an outer member")
    entry = [7, 2, 3, b"jobs\x00x", "pub-1", 0, [41, 42], [b"a", b"b"], 4, b""]
    env = message_env(WorkMessage(None, entry, 1, "x1", "x1.ab"), "orders", "workers")  # type: ignore[arg-type]
    assert env[b"ROQ_MESSAGE_ID"] == b"pub-1:42" and env[b"ROQ_SEQ"] == b"42"
    assert env[b"ROQ_DELIVERIES"] == b"3" and env[b"ROQ_PRIORITY"] == b"4" and env[b"ROQ_PUBLISHER"] == b"pub-1"
    assert env[b"ROQ_QUEUE"] == b"orders" and env[b"ROQ_GROUP"] == b"workers" and env[b"ROQ_EXCHANGE"] == b"x1"
    assert b"ROQ_TOPIC" not in env and env[b"ROQ_TOPIC_HEX"] == b"jobs\x00x".hex().encode()
    assert b"ROQ_KEY" not in env  # no key: nothing, not the outer one
    assert b"ROQ_HEADERS" not in env and b"ROQ_HEADERS_ENCODING" not in env  # no headers: nothing either
    assert {name.decode() for name in env if name.startswith(b"ROQ_")} <= set(MESSAGE_ENV)


def test_the_message_environment_holds_its_headers_as_json() -> None:
    entry = [7, 0, 1, b"jobs", "pub-1", 0, [41], [b"a"], 0, b"k", {"trace-id": b"4bf9", "n": b"1"}]
    env = message_env(WorkMessage(None, entry, 0, "x1", "x1.ab"), "orders", "workers")  # type: ignore[arg-type]
    assert json.loads(env[b"ROQ_HEADERS"]) == {"trace-id": "4bf9", "n": "1"}
    assert env[b"ROQ_HEADERS_ENCODING"] == b"utf-8"
    assert (env[b"ROQ_TOPIC"], env[b"ROQ_KEY"]) == (b"jobs", b"k")
    entry[10] = {"raw": b"\xff"}
    env = message_env(WorkMessage(None, entry, 0, "x1", "x1.ab"), "orders", "workers")  # type: ignore[arg-type]
    assert json.loads(env[b"ROQ_HEADERS"]) == {"raw": "/w=="} and env[b"ROQ_HEADERS_ENCODING"] == b"base64"


def test_a_command_that_runs_roq_is_not_refused_for_the_message_variables() -> None:
    load_config(env={name: "x" for name in MESSAGE_ENV})


@pytest.mark.parametrize("args, says", [
    (["--exec", "true"], "--exec needs --group"),
    (["--group", "g", "--concurrency", "2"], "--concurrency needs --exec"),
    (["--group", "g", "--exec", "true", "--concurrency", "0"], "--concurrency"),
])
def test_exec_options_are_checked_before_anything_connects(args: list[str], says: str) -> None:
    from click.testing import CliRunner

    from roq.cli import main
    result = CliRunner().invoke(main, ["--set", "zk.hosts=127.0.0.1:1", "subscribe", "q", *args])
    assert result.exit_code == 2 and says in result.output


def test_the_stop_signals_a_command_whose_shell_exited_and_what_it_left_running(tmp_path: Path) -> None:
    """A command's shell exited (not reaped by the loop yet) leaving a process in its group: the
    stop signals the group all the same and waits until nothing of it runs (before: only the groups
    of shells still running were stopped; the sleep ran on after the member said it stopped)."""
    entry = [7, 2, 1, b"jobs", "pub-1", 0, [41], [b"a"], 0, b""]
    msg = WorkMessage(None, entry, 0, "x1", "x1.ab")  # type: ignore[arg-type]
    child = tmp_path / "child"
    run = work_cli.Run(f"sleep 60 & echo $! > {child}; exit 3", msg, dict(os.environb), threading.Event())
    try:
        wait_until(lambda: run.code is not None and child.exists() and child.read_text().strip(), timeout=10,
                   message="the shell exited, its sleep started")
        assert process_groups.running(run.proc.pid), "the sleep runs on in the shell's group"
        assert work_cli._stop([run]) == 1
        assert not process_groups.running(run.proc.pid), "the stop left the sleep running"
    finally:
        process_groups.signal_group(run.proc.pid, signal.SIGKILL)


class Stopped(Exception):
    """What the caller's SIGTERM handler raises."""


def test_a_sigterm_while_the_stop_handlers_go_in_leaves_ctrl_c_as_it_was() -> None:
    """A real SIGTERM right after the first of exec_share's stop handlers went in (a profile hook
    raises it there): the stop reaches the caller and Ctrl-C is handled as before exec_share (before:
    it struck between the two installs, and Ctrl-C stayed with a handler that only held it, for good)."""
    idle = SimpleNamespace(receive=lambda timeout: None, queue="q", group="g")
    ctrl_c = signal.getsignal(signal.SIGINT)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise Stopped

    raised: list[int] = []

    def after_the_first_install(_frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and arg is _signal.signal and not raised:  # signal.signal's own call
            raised.append(1)
            signal.raise_signal(signal.SIGTERM)

    term = signal.signal(signal.SIGTERM, stop)
    try:
        sys.setprofile(after_the_first_install)
        try:
            with pytest.raises(Stopped):
                work_cli.exec_share(idle, "true", 1, 0, 0.05)  # type: ignore[arg-type]
        finally:
            sys.setprofile(None)
        assert raised, "the SIGTERM was raised"
        assert signal.getsignal(signal.SIGINT) is ctrl_c, "Ctrl-C no longer reaches its handler"
        assert signal.getsignal(signal.SIGTERM) is stop
    finally:
        signal.signal(signal.SIGTERM, term)
        signal.signal(signal.SIGINT, ctrl_c)
