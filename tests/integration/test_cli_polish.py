"""What a new user trips over: rules that never shrink a queue below the size
its operator chose, Ctrl-C and bad --set without tracebacks, whole rows when piped, fast failures
outside a cluster, `cluster down --purge`, secret keys kept private."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roq.client.admin import Admin
from roq.state import read_live
from roq.tools.ports import free_port
from tests.integration.conftest import create, start_cluster
from tests.integration.test_cli import assert_one_line_error, assert_usage_error, config_file, roq
from tests.support.helpers import record_figures, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
# A leader that would shrink an idle queue within a second of being allowed to.
QUICK_LEADER = ("gcm.tick=0.3", "autoscale.scale_in_after=1", "autoscale.cooldown=0.5")


def without_roq_env(**extra: str) -> dict[str, str]:
    """The environment with no ROQ_* variable (nothing names a cluster), plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ROQ_")}, **extra}


def exchanges_of(config, zk, queue: str) -> int:
    with Admin(config) as admin:
        return len(admin.describe_queue(queue)["exchanges"])


# ---------------------------------------------------------------- rules


@pytest.mark.timeout(90)
def test_rules_without_min_keep_the_queue_at_its_size(tmp_path, config, zk, paths, procs):
    start_cluster(procs, zk, paths, "exchange.stats_interval=0.3", gcm_settings=QUICK_LEADER)
    create(config, zk, paths, "orders", 2)
    cfg = str(config_file(tmp_path, config))
    unset = roq("--config", cfg, "queue", "rules", "orders", "--json")  # none yet: the floor they would get
    assert unset.returncode == 0 and json.loads(unset.stdout)["min_exchanges"] == 2, unset.stdout + unset.stderr
    shown = roq("--config", cfg, "queue", "rules", "orders", "--max-rate", "50000", "--max", "6", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["min_exchanges"] == 2  # the floor: its size when the rules were set
    # No load at all: with a floor of 1 the leader would scale in after about a second. Sample the size
    # over several times that (the leader ticks every 0.3 s).
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        assert exchanges_of(config, zk, "orders") == 2
        time.sleep(0.3)  # sampling the size over the window
    with Admin(config) as admin:
        assert admin.cluster_stats()["queues"]["orders"]["events"] == []
    table = roq("--config", cfg, "queue", "rules", "orders")
    assert table.returncode == 0 and "--max-rate" in table.stdout and "--min" in table.stdout, table.stdout
    assert "min_exchanges" not in table.stdout
    assert_one_line_error(roq("--config", cfg, "queue", "rules", "orders", "--min", "7"), 1,
                          "--min must be <= --max")
    assert_usage_error(roq("--config", cfg, "queue", "rules", "orders", "--max-rate", "-5"), "'--max-rate'")
    # Asked for explicitly, a floor of 1 does let it shrink (and shows the window above would have seen it).
    assert roq("--config", cfg, "queue", "rules", "orders", "--min", "1").returncode == 0
    allowed = time.monotonic()
    wait_until(lambda: exchanges_of(config, zk, "orders") == 1, timeout=20, message="scaled in to --min 1")
    record_figures("idle 2-exchange queue: --min 1 → scaled in", seconds=round(time.monotonic() - allowed, 2))


# ---------------------------------------------------------------- no tracebacks


def test_a_bad_set_is_bad_usage(tmp_path):
    for setting, fragment in (("nosection=1", "SECTION.KEY=VALUE"), ("bad", "SECTION.KEY=VALUE"),
                              ("nosection.key=1", "unknown section 'nosection'"),
                              ("cluster.nokey=1", "unknown key cluster.nokey")):
        assert_one_line_error(roq("--set", setting, "config", "show", cwd=tmp_path), 2, fragment)
    # A known key with a bad value is a bad configuration, as in a file.
    assert_one_line_error(roq("--set", "zk.session_timeout=soon", "config", "show", cwd=tmp_path), 1, "must be float")


@pytest.mark.timeout(120)
def test_ctrl_c_in_bench_says_interrupted_and_cleans_up(config, zk, paths, cluster):
    env = dict(os.environ, ROQ_SEEDS=config.cluster.seeds, ROQ_ZK_HOSTS=config.zk.hosts, ROQ_ZK_ROOT=config.zk.root)
    # Its own session: the SIGINT goes to the whole group, workers included, as a terminal's Ctrl-C does.
    bench = subprocess.Popen([sys.executable, "-m", "roq.cli", "bench", "--queue", "interrupted", "-n", "10000000",
                              "--rate", "2000", "-s", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        # Measuring: the workers run and the exchange receives their messages.
        wait_until(lambda: read_live(zk, paths, "interrupted")["x1"]["stats"].get("msgs_in_per_s", 0) > 0,
                   timeout=60, message="the benchmark's messages at the exchange")
        os.killpg(bench.pid, signal.SIGINT)
        interrupted = time.monotonic()
        out, err = bench.communicate(timeout=60)
        took = time.monotonic() - interrupted
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    stderr = err.decode()
    record_figures("roq bench: Ctrl-C → exit", seconds=round(took, 2))
    assert bench.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted", stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    with Admin(config) as admin:
        assert "interrupted" not in [q["name"] for q in admin.list_queues()]  # the queue it created is gone
    wait_until(lambda: not _group_alive(bench.pid), timeout=10, message="the worker processes gone")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------- piped output


@pytest.mark.timeout(120)
def test_piped_listings_are_whole(tmp_path, config, zk, paths, procs):
    # Long host names make every row wider than a terminal's 80 columns.
    long_hosts = ("host-with-a-rather-long-name-in-the-rack-one", "host-with-a-rather-long-name-in-the-rack-two")
    procs.start("gcm", "gcm-0")
    for host in long_hosts:
        procs.start("hcm", host, f"hcm.host={host}")
    create(config, zk, paths, "piped", 2)
    cfg = str(config_file(tmp_path, config))
    assert roq("--config", cfg, "queue", "rules", "piped", "--max-rate", "12345").returncode == 0
    info = json.loads(roq("--config", cfg, "queue", "show", "piped", "--json").stdout)
    endpoints = [x["live"][kind] for x in info["exchanges"] for kind in ("pub", "sub")]
    status = json.loads(roq("--config", cfg, "cluster", "status", "--json").stdout)
    wait_until(lambda: len(json.loads(roq("--config", cfg, "stats", "--json").stdout)["hosts"]) == 2,
               message="both hosts in the statistics")
    expected = {
        ("queue", "show", "piped"): [*endpoints, *(x["host"] for x in info["exchanges"])],
        ("queue", "list"): ["piped"],
        ("queue", "rules", "piped"): ["--max-rate", "12345", "--scale-in-below"],
        ("cluster", "status"): [status["leader"]["endpoint"], *long_hosts],
        ("stats", "--once"): ["piped", *long_hosts],
        ("config", "show"): [config.zk.hosts, config.zk.root],
    }
    for command, values in expected.items():
        result = roq("--config", cfg, *command)  # stdout and stderr are pipes
        assert result.returncode == 0, (command, result.stderr)
        assert "…" not in result.stdout, (command, result.stdout)
        for value in values:
            assert value in result.stdout, (command, value, result.stdout)
    shown = json.loads(roq("--config", cfg, "config", "show", "--json").stdout)
    assert shown["zk"]["hosts"] == config.zk.hosts and shown["zk"]["root"] == config.zk.root
    # `roq bench`: --json with no file prints the result on stdout; its table (stderr) is whole.
    bench = roq("--config", cfg, "bench", "-n", "2000", "--queue", "piped", "--json", timeout=100)
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert json.loads(bench.stdout)["received"] == 2000
    assert "p99.9 µs" in bench.stderr and "…" not in bench.stderr, bench.stderr


@pytest.mark.timeout(60)
def test_a_gcm_whose_port_is_taken_says_so_and_exits_with_the_config_code(config, zk, paths, procs):
    """CI saw another process's ephemeral bind take a GCM's port: the GCM must say which port and
    what to do, without a traceback, and exit with Exit.CONFIG (not a retryable code)."""
    from roq.errors import Exit
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        port = holder.getsockname()[1]
        gcm = procs.start("gcm", "gcm-taken", f"gcm.port={port}")
        code = gcm.wait(timeout=45)
    log = procs.logs["gcm-taken"].read_text(errors="replace")
    assert code == Exit.CONFIG, log
    assert f"cannot listen on 127.0.0.1:{port}" in log and "Traceback" not in log, log
    assert not zk.get_children(paths.election), "it never stood for election"


# ---------------------------------------------------------------- outside a cluster


def test_outside_a_cluster_commands_fail_fast_and_say_how_to_name_one(tmp_path):
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 2181)) == 0:
            pytest.skip("something listens on ZooKeeper's default port here")
    started = time.monotonic()
    result = roq("queue", "list", cwd=tmp_path, env=without_roq_env())
    took = time.monotonic() - started
    record_figures("roq queue list outside a cluster", seconds=round(took, 2))
    assert_one_line_error(result, 3, "no seeds")
    for way in ("--config FILE", "ROQ_CONFIG=FILE", "ROQ_SEEDS=tcp://host:port", "roq cluster up"):
        assert way in result.stderr
    assert took < 5, took
    # Named explicitly (zk.connect_timeout 15 s by default), a server that refuses connections still
    # fails in seconds, and the message is about that server only.
    started = time.monotonic()
    result = roq("queue", "list", cwd=tmp_path, env=without_roq_env(ROQ_SEEDS=f"tcp://127.0.0.1:{free_port()}"))
    took = time.monotonic() - started
    record_figures("roq queue list, no GCM at the seed", seconds=round(took, 2))
    assert_one_line_error(result, 3, "nothing listens there")
    assert "ROQ_CONFIG" not in result.stderr and took < 5, (took, result.stderr)


# `roq cluster down` (says ZooKeeper's data is kept) and `--purge`: in test_cli.py's local cluster test,
# which already runs the one slow up/down cycle.


# ---------------------------------------------------------------- keys


def test_secret_keys_are_private_and_a_checkout_is_warned(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "app"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    result = roq("keys", "generate", "keys", "--client", "app", "--admin", "ops", cwd=repo)
    assert result.returncode == 0, result.stderr
    warning = result.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("roq: warning:") and "not ignored" in warning[0], warning
    keys = repo / "keys"
    secrets = sorted(keys.rglob("*.key_secret"))
    publics = sorted(keys.rglob("*.key"))
    assert len(secrets) == len(publics) == 3
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in publics:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    (repo / ".gitignore").write_text("keys/\n")
    again = roq("keys", "generate", "keys", "--client", "other", cwd=repo)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert stat.S_IMODE((keys / "clients" / "other.key_secret").stat().st_mode) == 0o600
    outside = roq("keys", "generate", str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert outside.returncode == 0 and outside.stderr == "", outside.stderr


def test_the_readme_keys_directory_is_ignored_by_this_repository():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "keys/server.key_secret"])
    assert ignored.returncode == 0
