"""`roq publish` and `roq subscribe` for more than lines (docs/cli.md): a
message as an argument with headers, priority, delay and key; `--format text|json|base64`, where a
payload never comes out as two lines; `--timeout` bounding the whole publish; `--count -1` refused;
"1 message"; Ctrl-C saying "interrupted". Real `roq` processes, real pipes, one real exchange."""

from __future__ import annotations

import base64
import codecs
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

from roq.client.group_member import GroupMember
from roq.client.publisher import Publisher
from roq.paths import Paths
from roq.zk import encode
from tests.integration.test_cli import assert_one_line_error
from tests.integration.test_headers import Lone, lone  # noqa: F401 (the module's exchange)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def cfg(lone: Lone, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: F811
    path = tmp_path_factory.mktemp("cli") / "roq.toml"
    path.write_text(lone.config.to_toml())
    return str(path)


def roq(cfg: str, *args: str | bytes, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "roq.cli", "--config", cfg, *args], capture_output=True,
                          timeout=timeout)


def test_a_message_argument_with_headers_and_attributes_comes_out_whole_in_every_format(
        lone: Lone, cfg: str) -> None:  # noqa: F811
    queue = lone.queue("formats")
    payloads = [b"two\nlines", b"back\\slash and tab\there", b"cr\rhere", b"\xff\xfe not UTF-8", b""]
    for payload in payloads:
        done = roq(cfg, "publish", queue, "--topic", "formats.eu", payload, "-H", "trace-id=4bf9", "-H", "eq=a=b",
                   "--header", "raw=\udcff", "--priority", "3", "--key", "k1", "--delay", "0")
        assert done.returncode == 0, done.stderr
        assert done.stderr.decode().strip() == f"published 1 message to {queue}, 1 confirmed"  # not "1 messages"
    # The module's queues share one exchange (one stream): each test reads topics of its own.
    printed = {fmt: roq(cfg, "subscribe", queue, "-t", "formats.", "--from", "beginning", "--count",
                        str(len(payloads)), "--format", fmt) for fmt in ("text", "json", "base64")}
    for fmt, result in printed.items():
        assert result.returncode == 0, (fmt, result.stderr)
        assert result.stdout.count(b"\n") == len(payloads), (fmt, result.stdout)  # one line per message
    text = [line.split(b"\t", 1) for line in printed["text"].stdout.splitlines()]
    assert [codecs.escape_decode(p)[0] for _, p in text] == payloads and {t for t, _ in text} == {b"formats.eu"}
    b64 = [line.split(b"\t", 1) for line in printed["base64"].stdout.splitlines()]
    assert [base64.b64decode(p) for _, p in b64] == payloads
    objects = [json.loads(line) for line in printed["json"].stdout.splitlines()]
    decoded = [o["payload"].encode() if o["encoding"] == "utf-8" else base64.b64decode(o["payload"]) for o in objects]
    assert decoded == payloads
    first = objects[0]
    assert first["topic"] == "formats.eu" and first["publisher"].startswith("p-") and first["seq"] == 1
    assert first["headers_encoding"] == "base64"  # one value is not UTF-8: all of them in base64
    assert {k: base64.b64decode(v) for k, v in first["headers"].items()} == {
        "trace-id": b"4bf9", "eq": b"a=b", "raw": b"\xff"}
    assert first["time"].endswith("Z") and first["exchange"] == "x1"
    assert b"received 5 messages" in printed["json"].stderr


def test_a_group_member_prints_json_with_its_deliveries_and_attributes(lone: Lone, cfg: str) -> None:  # noqa: F811
    queue = lone.queue("member")
    # The group exists on the exchange before the message comes (as the CLI member will join it).
    # The constructor waits only for the exchanges its first topology names, and a queue made a
    # moment ago may have none yet (the GCM's cache sees its node before its live exchange's): wait
    # for the join, or the group never existed and the message, published before it, is not its.
    with GroupMember(queue, lone.config, ["jobs"], group="cli-json", prefetch=1) as creator:
        creator.wait_connected(1)
    assert roq(cfg, "publish", queue, "-t", "jobs", "job 1", "-H", "attempt=1", "--key", "k", "--priority",
               "4").returncode == 0
    result = roq(cfg, "subscribe", queue, "-t", "jobs", "--group", "cli-json", "--format", "json", "--count", "1")
    assert result.returncode == 0, result.stderr
    (member,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert (member["payload"], member["headers"], member["key"], member["priority"], member["deliveries"]) == (
        "job 1", {"attempt": "1"}, "k", 4, 1)
    assert member["id"] == f"{member['publisher']}:{member['seq']}"


@pytest.mark.parametrize("args, says", [
    (["-H", "roq-reason=nack", "m"], "RoQ's own"),
    (["-H", "no-equals-sign", "m"], "expected KEY=VALUE"),
    (["-H", "a=1", "-H", "a=2", "m"], "twice"),
    (["-H", "big=" + "v" * 8193, "m"], "at most 8192"),
    (["--priority", "256", "m"], "256"),
    (["--delay", "-1", "m"], "-1"),
    (["--timeout", "0", "m"], "0"),
    (["-f", "/dev/null", "m"], "not both"),
])
def test_bad_publish_options_are_refused_before_anything_connects(args: list[str], says: str) -> None:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "roq.cli", "--set", "zk.hosts=127.0.0.1:1", "publish", "q", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 10  # no ZooKeeper wait: nothing connected


def test_subscribe_count_and_timeout_must_not_be_negative() -> None:
    for args in (["--count", "-1"], ["--timeout", "-2"]):
        result = subprocess.run([sys.executable, "-m", "roq.cli", "--set", "zk.hosts=127.0.0.1:1", "subscribe", "q",
                                 *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "x>=0" in result.stderr, result.stderr


def test_publish_timeout_bounds_the_whole_command(lone: Lone, cfg: str) -> None:  # noqa: F811
    """An exchange that never answers: the command gives up after --timeout, not after --timeout and
    then the publisher's own 10 s close (it took 20.3 s for --timeout 10)."""
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes connections, answers nothing
    silent.linger = 0
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    queue = "silent"
    paths = Paths(lone.config.zk.root)
    lone.zk.ensure_path(paths.live_queue(queue))
    lone.zk.ensure_path(paths.queue(queue))
    lone.zk.create(paths.live_exchange(queue, "x1"), encode({
        "pub": f"tcp://127.0.0.1:{port}", "sub": lone.ready["sub"], "replay": lone.ready["replay"],
        "work": lone.ready["work"], "incarnation": "x1.00000000", "host": "local", "stats": {}}), ephemeral=True)
    try:
        started = time.monotonic()
        result = roq(cfg, "publish", queue, "--timeout", "3", "never confirmed")
        took = time.monotonic() - started
    finally:
        silent.close()
    assert_one_line_error(subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(),
                                                      result.stderr.decode()), 3, "still unconfirmed")
    assert took < 3 + 5, f"--timeout 3 took {took:.1f}s"  # Python and ZooKeeper start-up, at most


def test_ctrl_c_on_subscribe_says_interrupted(lone: Lone, cfg: str) -> None:  # noqa: F811
    queue = lone.queue("ctrlc")
    with Publisher(queue, lone.config) as pub:
        pub.publish("ctrl-c", b"first")
        pub.flush()
    sub = subprocess.Popen([sys.executable, "-m", "roq.cli", "--config", cfg, "subscribe", queue, "-t", "ctrl-c",
                            "--from", "beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        assert sub.stdout is not None
        assert sub.stdout.readline() == b"ctrl-c\tfirst\n"  # it runs, subscribed
        os.killpg(sub.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        _, err = sub.communicate(timeout=30)
    finally:
        sub.kill()
    lines = err.decode().strip().splitlines()
    assert sub.returncode == 130 and lines[-1] == "interrupted", err.decode()
    assert lines[-2].startswith("received 1 message (") and "Traceback" not in err.decode()


def test_a_line_too_large_stops_publish_once_the_lines_before_it_are_confirmed(lone: Lone, cfg: str,  # noqa: F811
                                                                              tmp_path_factory) -> None:
    queue = lone.queue("toolarge")
    lines = tmp_path_factory.mktemp("lines") / "in.txt"
    lines.write_bytes(b"before\n" + b"x" * 5000 + b"\nafter\n")  # the module's exchange.max_message_bytes: 4096
    result = roq(cfg, "publish", queue, "-t", "too-large", "-f", str(lines), "--timeout", "20")
    assert result.returncode == 1 and b"exceeds exchange.max_message_bytes=4096" in result.stderr, result.stderr
    printed = roq(cfg, "subscribe", queue, "-t", "too-large", "--from", "beginning", "--timeout", "2")
    assert printed.stdout == b"too-large\tbefore\n", printed.stderr
