"""A local cluster keeps the settings it was started with, and its journals.

Reported: a cluster restarted with a plain `roq cluster up` after it ran with
`--set exchange.journal=fsync` moved its exchange at once to another host, and a durable
subscriber got 0 of 5,000 confirmed messages with gaps 0. Here, through the `roq` command as a
user runs it: the settings persist in the run directory, the exchange comes back to its host and
its journal, and the subscriber resumes whole. Why the exchange moved "at once": a leader knew
which hosts journal only from what it had seen in its own term, and a freshly started one had
seen none, so it waited `gcm.reassign_grace` (0) for the journaling host instead of
`gcm.journal_reassign_grace`; the leader now records it in ZooKeeper.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.config import Config, load_config
from roq.paths import Paths
from roq.state import read_hosts, read_leader, read_live
from roq.zk import read_json, start_client, stop_client
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TAKEN, AWAY = 100, 5_000


def roq(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROQ_")}  # only what the test says
    return subprocess.run([sys.executable, "-m", "roq.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def cluster_config(run: Path, state_dir: Path) -> Config:
    return load_config(run / ".roq" / "cluster" / "config.toml", env={}).replace(
        client={"state_dir": str(state_dir), "confirm_timeout": 2.0})


class Collector:
    def __init__(self, queue: str, config: Config, durable: str) -> None:
        self.counts: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.sub = Subscriber(queue, config, durable=durable, callback=self.on_message)

    def on_message(self, msg) -> None:
        with self.lock:
            self.counts[int(msg.payload)] += 1

    def received(self, numbers: range) -> int:
        with self.lock:
            return sum(1 for i in numbers if i in self.counts)


def live_x1(config: Config) -> dict:
    client = start_client(config)
    try:
        return read_live(client, Paths(config.zk.root), "ledger").get("x1") or {}
    finally:
        stop_client(client)


@pytest.mark.parametrize("second_up", [(), ("--set", "exchange.journal=off")], ids=["plain", "journal-off"])
def test_a_cluster_restarted_keeps_its_journal_and_a_durable_subscriber_resumes_whole(tmp_path, second_up) -> None:
    state_dir = tmp_path / "subscribers"
    try:
        up = roq(tmp_path, "--set", "exchange.journal=fsync", "cluster", "up")
        assert up.returncode == 0, up.stderr
        assert roq(tmp_path, "queue", "create", "ledger").returncode == 0
        config = cluster_config(tmp_path, state_dir)
        wait_until(lambda: live_x1(config), timeout=30, message="x1 running")
        host = live_x1(config)["host"]
        first = Collector("ledger", config, durable="books")
        with Publisher("ledger", config) as pub:
            first.sub.wait_connected(timeout=15)
            pub.wait_for_subscribers(1, timeout=15)
            for i in range(TAKEN):
                pub.publish("load", str(i).encode())
            pub.flush(30)
            wait_until(lambda: first.received(range(TAKEN)) == TAKEN, timeout=30, message="the first messages")
            first.sub.close()  # away: its position is saved
            for i in range(TAKEN, TAKEN + AWAY):
                pub.publish("load", str(i).encode())
            pub.flush(60)
            assert pub.confirmed == TAKEN + AWAY
        down = roq(tmp_path, "cluster", "down")
        assert down.returncode == 0, down.stderr

        again = roq(tmp_path, *second_up, "cluster", "up")
        assert again.returncode == 0, again.stderr
        said = again.stdout + again.stderr
        if second_up:
            assert "exchange.journal" in said and "off" in said, said  # the change is named ...
        else:
            assert 'exchange.journal = "fsync"' in said, said  # ... and so is what was kept
        config = cluster_config(tmp_path, state_dir)
        wait_until(lambda: live_x1(config).get("archived"), timeout=30, message="x1 serving its journal")
        assert live_x1(config)["host"] == host, "the exchange came back to the host that has its journal"
        back = Collector("ledger", config, durable="books")
        try:
            wait_until(lambda: back.received(range(TAKEN, TAKEN + AWAY)) == AWAY, timeout=60,
                       message="the messages confirmed while the subscriber was away")
            stats = back.sub.stats().as_dict()
            record_figures(f"cluster restarted ({'plain up' if not second_up else 'journal off'})",
                           confirmed=AWAY, received=back.received(range(TAKEN, TAKEN + AWAY)),
                           gaps=stats["gaps"], duplicates=stats["duplicates"])
            assert stats["gaps"] == 0
            assert back.received(range(TAKEN)) == 0, "taken before: not again"
            with back.lock:
                assert all(count == 1 for count in back.counts.values())
        finally:
            back.sub.close()
    finally:
        roq(tmp_path, "cluster", "down")
    if second_up:
        kept = load_config(tmp_path / ".roq" / "cluster" / "config.toml", env={})
        assert kept.exchange.journal == "off", "the change was persisted with the cluster"


def test_a_new_leader_waits_for_a_lost_host_that_keeps_journals(config, zk, paths, procs) -> None:
    """The leader and the journaling host go together (as in `roq cluster down`); a leader that
    never saw that host still gives it gcm.journal_reassign_grace to come back to its journals."""
    procs.start("gcm", "gcm-0")
    procs.start("hcm", "host-1", "hcm.host=host-1", "exchange.journal=fsync")
    wait_until(lambda: read_leader(zk, paths) and read_hosts(zk, paths), message="leader and host-1")
    with Admin(config) as admin:
        admin.create_queue("ledger")
    wait_until(lambda: read_live(zk, paths, "ledger").get("x1"), timeout=20, message="x1 on host-1")
    with Publisher("ledger", config) as pub:
        pub.publish("load", b"confirmed")
        pub.flush(15)  # in x1's journal on host-1's disk
    wait_until(lambda: (read_json(zk, paths.host_assignments("host-1")) or {}).get("journals"), timeout=10,
               message="the leader to record that host-1 keeps journals")
    procs.start("hcm", "host-2", "hcm.host=host-2", "exchange.journal=fsync")
    wait_until(lambda: len(read_hosts(zk, paths)) == 2, message="host-2")
    old_leader = read_leader(zk, paths)["id"]
    procs.kill("gcm-0")
    procs.kill("host-1")
    procs.start("gcm", "gcm-1")  # has never seen host-1
    wait_until(lambda: (read_leader(zk, paths) or {}).get("id", old_leader) != old_leader, timeout=20,
               message="a new leader")
    wait_until(lambda: "host host-1 is gone" in procs.logs["gcm-1"].read_text(), timeout=20,
               message="the new leader to see host-1 gone")
    line = next(line for line in procs.logs["gcm-1"].read_text().splitlines() if "host host-1 is gone" in line)
    assert "move in 30.0s" in line and "keeps journals" in line, line
    assert read_json(zk, paths.exchange("ledger", "x1"))["host"] == "host-1", "not moved at once"
    procs.start("hcm", "host-1-again", "hcm.host=host-1", f"hcm.data_dir={procs.workdir / 'host-1' / 'data'}",
                "exchange.journal=fsync")
    wait_until(lambda: read_live(zk, paths, "ledger").get("x1", {}).get("archived"), timeout=30,
               message="x1 back on host-1, serving its journal")
    assert read_live(zk, paths, "ledger")["x1"]["host"] == "host-1"
