"""The `roq` command as a user meets it: clear one-line errors, the local cluster, failover."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roq.tools.ports import free_port
from tests.support.helpers import record_figures, wait_until

pytestmark = pytest.mark.integration


def roq(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "roq.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("roq: error:"), result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def assert_usage_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    """A bad flag or value: click's usage error (exit 2, like `--prefetch 0`), naming it, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Error: Invalid value for" in result.stderr and fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def config_file(tmp_path: Path, config) -> Path:
    path = tmp_path / "roq.toml"
    path.write_text(config.replace(client={"request_timeout": 2.0}).to_toml())
    return path


def test_no_gcm_at_the_seeds(tmp_path):
    result = roq("--set", f"cluster.seeds=tcp://127.0.0.1:{free_port()}", "queue", "list", cwd=tmp_path)
    assert_one_line_error(result, 3, "nothing listens there")


def test_no_leader_yet(tmp_path, config, zk):
    result = roq("--config", str(config_file(tmp_path, config)), "queue", "list", cwd=tmp_path)
    assert_one_line_error(result, 3, "no GCM leader")


def test_user_mistakes(tmp_path, config, zk, paths, procs):
    from roq.state import read_leader
    procs.gcm("gcm-0")
    wait_until(lambda: read_leader(zk, paths), message="a leader")
    cfg = str(config_file(tmp_path, config))
    assert_one_line_error(roq("--config", cfg, "queue", "create", "bad name!", cwd=tmp_path), 1, "invalid queue name")
    assert_one_line_error(roq("--config", cfg, "queue", "show", "nope", cwd=tmp_path), 1, "does not exist")
    assert_one_line_error(roq("--config", cfg, "queue", "delete", "nope", cwd=tmp_path), 1, "does not exist")
    assert_usage_error(roq("--config", cfg, "queue", "create", "q", "-x", "0", cwd=tmp_path), "'--exchanges'")
    assert_usage_error(roq("--config", cfg, "queue", "scale", "q", "65", cwd=tmp_path), "EXCHANGES")
    assert_one_line_error(roq("--set", "zk.nonsense=1", "config", "show", cwd=tmp_path), 2, "unknown key zk.nonsense")
    assert_one_line_error(roq("--set", "zk.session_timeout=soon", "config", "show", cwd=tmp_path), 1, "must be float")
    assert roq("--config", cfg, "queue", "create", "q", cwd=tmp_path).returncode == 0
    assert_one_line_error(roq("--config", cfg, "queue", "create", "q", cwd=tmp_path), 1, "already exists")
    assert json.loads(roq("--config", cfg, "queue", "list", "--json", cwd=tmp_path).stdout)[0]["name"] == "q"


def test_a_name_with_a_trailing_newline_is_refused_at_once(tmp_path, config, zk, paths, procs):
    from roq.state import read_leader
    procs.gcm("gcm-0")
    wait_until(lambda: read_leader(zk, paths), message="a leader")
    started = time.monotonic()
    result = roq("--config", str(config_file(tmp_path, config)), "queue", "create", "abc\n", cwd=tmp_path)
    record_figures("roq queue create $'abc\\n'", exit_code=result.returncode,
                   seconds=round(time.monotonic() - started, 2))
    assert_one_line_error(result, 1, "invalid queue name")  # was exit 3, "ZooKeeper is unavailable"
    assert zk.get_children(paths.queues) == []


def test_config_show_layers(tmp_path):
    (tmp_path / "c.toml").write_text('[zk]\nhosts = "zk1:2181"\n[hcm]\ncapacity = 3\n')
    result = roq("--config", str(tmp_path / "c.toml"), "--set", "hcm.capacity=5", "config", "show",
                 cwd=tmp_path, env={"ROQ_GCM_TICK": "0.5"})
    assert result.returncode == 0, result.stderr
    assert 'hosts = "zk1:2181"' in result.stdout and "capacity = 5" in result.stdout and "tick = 0.5" in result.stdout


def test_local_cluster_survives_killing_the_leader(tmp_path):
    from roq.tools.cluster import ClusterState
    """The acceptance path: cluster up, queue create, SIGKILL the leader, queue list; with
    the default configuration, so the figure is what a user gets (the goal: at most 3 s)."""
    env: dict[str, str] = {}
    try:
        up = roq("cluster", "up", cwd=tmp_path, env=env)
        assert up.returncode == 0, up.stderr
        assert roq("queue", "create", "q1", cwd=tmp_path, env=env).returncode == 0
        status = json.loads(roq("cluster", "status", "--json", cwd=tmp_path, env=env).stdout)
        assert len(status["gcms"]) == 2 and len(status["hosts"]) == 2
        os.kill(status["leader"]["pid"], signal.SIGKILL)
        killed = time.monotonic()
        listed = roq("queue", "list", "--json", cwd=tmp_path, env=env)
        took = time.monotonic() - killed
        assert listed.returncode == 0, listed.stderr
        assert [q["name"] for q in json.loads(listed.stdout)] == ["q1"]
        new = json.loads(roq("cluster", "status", "--json", cwd=tmp_path, env=env).stdout)
        assert new["leader"]["pid"] != status["leader"]["pid"]
        record_figures("roq cluster: leader SIGKILL → queue list (default configuration)", seconds=round(took, 2))
        # The killed GCM is started again by the next `up` (a cluster with a dead process is repaired,
        # not refused), which refuses only once all runs.
        killed_name = next(g["name"] for g in ClusterState.load(tmp_path / ".roq" / "cluster").processes
                           if g["pid"] == status["leader"]["pid"])
        again = roq("cluster", "up", cwd=tmp_path, env=env)
        assert again.returncode == 0 and f"restarted {killed_name} " in again.stdout, again.stdout
        assert_one_line_error(roq("cluster", "up", cwd=tmp_path, env=env), 1, "already running")
    finally:
        down = roq("cluster", "down", cwd=tmp_path)
    assert down.returncode == 0 and "stopped" in down.stdout
    state = tmp_path / ".roq" / "cluster" / "cluster.json"
    assert not state.exists()
    # Its queues would come back with the next `up` (ZooKeeper's data is kept): it says so, and how to purge.
    assert "kept ZooKeeper's data (queues, rules)" in down.stdout and "roq cluster down --purge" in down.stdout
    assert (tmp_path / ".roq" / "cluster" / "zookeeper").is_dir()
    purged = roq("cluster", "down", "--purge", cwd=tmp_path)
    assert purged.returncode == 0 and "no local cluster was running" in purged.stdout, purged.stderr
    assert "purged" in purged.stdout and "zookeeper" in purged.stdout and "kept" not in purged.stdout
    assert not (tmp_path / ".roq" / "cluster").exists()  # ZooKeeper's data, logs, state: the next `up` starts empty
    assert roq("cluster", "down", "--purge", cwd=tmp_path).stdout.splitlines()[-1].startswith("nothing to purge")


def test_publish_and_subscribe_commands(tmp_path, config, zk, paths, procs):
    from roq.client.admin import Admin
    from roq.state import read_hosts, read_leader, read_live
    procs.gcm("gcm-0")
    procs.hcm("host-1")
    wait_until(lambda: read_leader(zk, paths) and read_hosts(zk, paths), message="cluster")
    with Admin(config) as admin:
        admin.create_queue("lines")
    wait_until(lambda: read_live(zk, paths, "lines"), message="exchange live")
    cfg = str(config_file(tmp_path, config))
    sub = subprocess.Popen([sys.executable, "-m", "roq.cli", "--config", cfg, "subscribe", "lines",
                            "-t", "greetings", "--count", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Wait until the subscriber's subscription reached the exchange (its stats count it).
        wait_until(lambda: read_live(zk, paths, "lines")["x1"]["stats"].get("subscriptions", 0) >= 1,
                   message="the subscription to arrive")
        (tmp_path / "in.txt").write_text("hello\nbonjour\nhallo\n")
        pub = roq("--config", cfg, "publish", "lines", "-t", "greetings", "-f", str(tmp_path / "in.txt"))
        assert pub.returncode == 0 and "published 3 messages" in pub.stderr, pub.stderr
        out, err = sub.communicate(timeout=30)
    finally:
        sub.kill()
    assert out.decode().splitlines() == ["greetings\thello", "greetings\tbonjour", "greetings\thallo"]
    assert "received 3 messages" in err.decode()
    assert_one_line_error(roq("--config", cfg, "publish", "nope", cwd=tmp_path), 1, "does not exist")


def test_demo_round_trip(tmp_path):
    """The README's main job, small: starts its own cluster, delivers everything, stops it."""
    result = roq("demo", "-n", "3000", cwd=tmp_path, env={"ROQ_ZK_SESSION_TIMEOUT": "2"}, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "delivered 3000" in result.stderr and "lost 0" in result.stderr
    assert not (tmp_path / ".roq" / "cluster" / "cluster.json").exists()
