"""The control plane of replicas, with a real ZooKeeper and real GCM, HCM and exchange processes:
where the leader places replicas (never with their primary), how it restores them after a host
loss, what scale-in and delete remove, what the HCM runs and publishes for a `~r` slot, and what
it tells a primary about its replica on stdin."""

from __future__ import annotations

import io
import itertools
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

import hcm.supervisor
from hcm.supervisor import Supervisor
from roq.client.admin import Admin
from roq.paths import replica_slot, split_assignment
from roq.state import read_exchanges, read_hosts, read_leader
from roq.zk import encode
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration


def start(procs, zk, paths, hosts, *gcm_settings: str) -> None:
    procs.start("gcm", "gcm-0", *gcm_settings)
    for host in hosts:
        add_host(procs, host)
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == len(hosts),
               message="a leader and every host")


def add_host(procs, host: str) -> None:
    """An HCM with its own data directory, as on its own machine."""
    procs.start("hcm", host, f"hcm.host={host}", f"hcm.data_dir={procs.workdir / 'data' / host}")


def slots(zk, paths, queue) -> dict[str, tuple[str | None, str | None]]:
    """Exchange id → (its host, its replica's host), from ZooKeeper."""
    return {x.id: (x.host, x.replica) for x in read_exchanges(zk, paths, queue, live=False)}


def assignments(zk, paths) -> set[tuple[str, str, str]]:
    """(host, queue, slot) of every assignment in ZooKeeper."""
    return {(host, *split_assignment(name)) for host in zk.get_children(paths.assignments)
            for name in zk.get_children(paths.host_assignments(host))}


def expected_assignments(placed: dict[str, tuple[str | None, str | None]], queue: str) -> set[tuple[str, str, str]]:
    found = set()
    for xid, (host, replica) in placed.items():
        found |= {(host, queue, xid)} if host else set()
        found |= {(replica, queue, replica_slot(xid))} if replica else set()
    return found


def running_replicas(zk, paths, queue) -> dict[str, str]:
    """Exchange id → host of its running replica (replicas/<q>/<x>)."""
    return {x.id: x.replica_live["host"] for x in read_exchanges(zk, paths, queue) if x.replica_live}


def all_apart(placed: dict[str, tuple[str | None, str | None]], alive: set[str]) -> bool:
    return all(host in alive and replica in alive and host != replica for host, replica in placed.values())


def roq(config_path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(config_path), *args],
                            capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="200"))
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_replicas_run_apart_from_their_exchanges_and_are_restored_after_a_host_loss(config, zk, paths, procs):
    hosts = {"host-1", "host-2", "host-3"}
    start(procs, zk, paths, sorted(hosts))
    with Admin(config) as admin:
        info = admin.create_queue("rq", exchanges=2, replicas=2)
    assert info["replicas"] == 2 and info["settings"]["replicas"] == 2
    placed = slots(zk, paths, "rq")
    assert all_apart(placed, hosts), placed
    assert assignments(zk, paths) == expected_assignments(placed, "rq")
    data = zk.get(paths.assignment(placed["x1"][1], "rq", "x1~r"))[0]
    assert json.loads(data) == {"queue": "rq", "exchange": "x1", "role": "replica"}

    # Every replica runs where it is placed and is published at replicas/<q>/<x>.
    wait_until(lambda: running_replicas(zk, paths, "rq") == {x: r for x, (_, r) in placed.items()}, timeout=20,
               message="both replicas running")
    shown = roq(procs.config_path, "queue", "show", "rq")
    assert "replica" in shown and "(running)" in shown and "replicas 2" in shown

    # Lose the host that holds the most slots (a primary and a replica with 3 hosts and 4 slots).
    victim = Counter(h for pair in placed.values() for h in pair).most_common(1)[0][0]
    procs.kill(victim, signal.SIGKILL)
    survivors = hosts - {victim}
    wait_until(lambda: all_apart(slots(zk, paths, "rq"), survivors), timeout=20,
               message=f"every exchange and replica placed again, apart, off {victim}")
    after = slots(zk, paths, "rq")
    wait_until(lambda: assignments(zk, paths) == expected_assignments(after, "rq"), timeout=10,
               message="the assignment lists to follow the placements")
    wait_until(lambda: running_replicas(zk, paths, "rq") == {x: r for x, (_, r) in after.items()}, timeout=20,
               message="both replicas running on their new hosts")
    wait_until(lambda: {x.id: x.live and x.live["host"] for x in read_exchanges(zk, paths, "rq")}
               == {x: h for x, (h, _) in after.items()}, timeout=20, message="both exchanges running")


def test_a_replica_waits_for_a_second_host(config, zk, paths, procs):
    start(procs, zk, paths, ["host-1"])
    with Admin(config) as admin:
        info = admin.create_queue("lonely", exchanges=1, replicas=2)
        assert [(x["host"], x["replica"]) for x in info["exchanges"]] == [("host-1", None)]
        status = admin.status()
        assert (status["exchanges"], status["replicas"], status["unplaced_replicas"]) == (1, 1, 1)
    assert "(unplaced)" in roq(procs.config_path, "queue", "show", "lonely")
    add_host(procs, "host-2")
    wait_until(lambda: slots(zk, paths, "lonely") == {"x1": ("host-1", "host-2")}, timeout=15,
               message="the replica placed on the new host")
    wait_until(lambda: running_replicas(zk, paths, "lonely") == {"x1": "host-2"}, timeout=20,
               message="the replica running")


def test_scale_in_and_delete_remove_replica_assignments(config, zk, paths, procs):
    start(procs, zk, paths, ["host-1", "host-2"], "gcm.default_replicas=2")
    with Admin(config) as admin:
        info = admin.create_queue("sq", exchanges=1)  # replicas from the leader's configuration
        assert info["replicas"] == 2
        admin.create_queue("plain", exchanges=1, replicas=1)
        assert "replica" not in json.loads(zk.get(paths.exchange("plain", "x1"))[0])
        admin.scale_queue("sq", 2)
        placed = slots(zk, paths, "sq")
        assert all_apart(placed, {"host-1", "host-2"}) and len(placed) == 2
        wait_until(lambda: len(running_replicas(zk, paths, "sq")) == 2, timeout=20, message="two replicas running")
        admin.scale_queue("sq", 1)
        assert {(q, s) for _, q, s in assignments(zk, paths) if q == "sq"} == {("sq", "x1"), ("sq", "x1~r")}
        wait_until(lambda: set(running_replicas(zk, paths, "sq")) == {"x1"}, timeout=15,
                   message="the removed exchange's replica stopped")
        admin.delete_queue("sq")
        assert {q for _, q, _ in assignments(zk, paths)} == {"plain"}
    wait_until(lambda: not zk.exists(paths.replica_queue("sq")), timeout=15,
               message="the deleted queue's replicas directory removed")


# ------------------------------------------------------------------ the HCM and its children

_pids = itertools.count(60_000)


class FakeProcess:
    """A child that stays up, reports what `ready` says, and keeps what the HCM writes to it."""

    instances: list[FakeProcess] = []
    ready: dict[str, Any] = {}

    def __init__(self, command: list[str], **_: Any) -> None:
        self.command = command
        self.pid = next(_pids)
        self.stdin = io.BytesIO()
        self.stdout = io.BytesIO(json.dumps(dict(self.ready, event="ready")).encode() + b"\n")
        self.stderr = io.BytesIO()
        self.returncode: int | None = None
        FakeProcess.instances.append(self)

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, _sig: int) -> None:
        self.returncode = -15

    def lines(self) -> list[dict[str, Any]]:
        """What the HCM wrote after the configuration line."""
        return [json.loads(line) for line in self.stdin.getvalue().splitlines()[1:]]


@pytest.fixture
def supervisor(config, zk, paths, monkeypatch):
    monkeypatch.setattr(hcm.supervisor.subprocess, "Popen", FakeProcess)
    FakeProcess.instances = []
    zk.ensure_path(paths.replica_queue("q"))
    zk.create(paths.queue("q"), encode({"replicas": 2}), makepath=True)
    return Supervisor(zk, paths, config, "host-1")


def ticking(sup: Supervisor, until: Any, message: str) -> Any:
    """Run the supervisor's tick (in this thread, as the HCM does) until `until()` holds."""
    def tick_and_check() -> Any:
        sup.tick()
        return until()
    return wait_until(tick_and_check, timeout=10, message=message)


def test_a_replica_slot_runs_a_replica_and_is_published_under_replicas(supervisor, zk, paths):
    FakeProcess.ready = {"repl": "tcp://h:1", "replay": "tcp://h:2", "incarnation": 7, "pid": 1}
    supervisor.set_desired({("q", "x1~r")})
    ticking(supervisor, lambda: zk.exists(paths.replica_live("q", "x1")), "the replica published")
    command = FakeProcess.instances[0].command
    assert command[command.index("--id") + 1] == "x1" and command[command.index("--role") + 1] == "replica"
    data = json.loads(zk.get(paths.replica_live("q", "x1"))[0])
    assert {k: data[k] for k in ("repl", "replay", "incarnation", "host")} == \
        {"repl": "tcp://h:1", "replay": "tcp://h:2", "incarnation": 7, "host": "host-1"}
    assert not zk.exists(paths.live_exchange("q", "x1"))
    supervisor.set_desired(set())
    ticking(supervisor, lambda: not zk.exists(paths.replica_live("q", "x1")), "the replica unpublished")


def replica_lines(child) -> list[dict]:
    """What the HCM told a primary of its replica (the admin command lines left out)."""
    return [line for line in child.lines() if "replica" in line]


def test_the_hcm_tells_a_primary_where_its_replica_is(supervisor, zk, paths):
    FakeProcess.ready = {}  # never ready: only its stdin matters here
    supervisor.set_desired({("q", "x1")})
    ticking(supervisor, lambda: FakeProcess.instances, "the primary started")
    child = FakeProcess.instances[0]
    command = child.command
    assert command[command.index("--role") + 1] == "primary" and command[command.index("--replicas") + 1] == "2"
    assert replica_lines(child) == [{"replica": None}]  # at once, after the configuration line
    assert {"commands": [], "purged": {}} in child.lines()  # and the queue's admin commands

    replica = {"repl": "tcp://r:1", "replay": "tcp://r:2", "incarnation": 3, "host": "host-2", "stats": {}}
    zk.create(paths.replica_live("q", "x1"), encode(replica))
    ticking(supervisor, lambda: len(replica_lines(child)) == 2, "the replica's endpoint written")
    assert replica_lines(child)[-1] == {"replica": {"repl": "tcp://r:1", "incarnation": 3}}
    zk.set(paths.replica_live("q", "x1"), encode(dict(replica, stats={"msgs_in": 5})))  # a statistics refresh
    zk.set(paths.replica_live("q", "x1"), encode(dict(replica, incarnation=4)))  # a new replica incarnation
    ticking(supervisor, lambda: len(replica_lines(child)) == 3, "the new incarnation written")
    assert replica_lines(child)[-1] == {"replica": {"repl": "tcp://r:1", "incarnation": 4}}
    zk.delete(paths.replica_live("q", "x1"))
    ticking(supervisor, lambda: replica_lines(child)[-1] == {"replica": None}, "the replica's end written")
    assert len(replica_lines(child)) == 4  # nothing for the statistics refresh

    # The watch lasts while the slot is assigned and stops when its child is dropped.
    watch = supervisor.children[("q", "x1")].peer_watch
    supervisor.set_desired(set())
    ticking(supervisor, lambda: ("q", "x1") not in supervisor.children, "the primary dropped")
    assert watch is not None and watch.stopped  # kazoo drops it at its next event


def test_the_hcm_tells_a_replica_which_incarnation_of_its_primary_runs_and_its_copy_digest(supervisor, zk, paths):
    """What exchange/replica.py checks copies against, and decides sealing by (protocol 6.1, 6.3)."""
    FakeProcess.ready = {}  # never ready: only its stdin matters here
    supervisor.set_desired({("q", "x1~r")})
    ticking(supervisor, lambda: FakeProcess.instances, "the replica started")
    child = FakeProcess.instances[0]

    def primary_lines() -> list[dict]:
        """The lines about the primary (the HCM also sends the queue's storage policy, in any order)."""
        return [line for line in child.lines() if "primary" in line]

    assert primary_lines() == [{"primary": None}]  # at once, after the configuration line
    live = {"pub": "tcp://p:1", "sub": "tcp://p:2", "incarnation": "x1.aaaa", "copy_digest": "ab" * 32,
            "host": "host-2", "stats": {}}
    zk.ensure_path(paths.live_queue("q"))
    zk.create(paths.live_exchange("q", "x1"), encode(live))
    ticking(supervisor, lambda: len(primary_lines()) == 2, "the primary's incarnation written")
    assert primary_lines()[-1] == {"primary": {"incarnation": "x1.aaaa", "copy_digest": "ab" * 32}}
    zk.set(paths.live_exchange("q", "x1"), encode(dict(live, stats={"msgs_in": 5})))  # a statistics refresh
    zk.delete(paths.live_exchange("q", "x1"))  # the primary ended
    ticking(supervisor, lambda: primary_lines()[-1] == {"primary": None}, "the primary's end written")
    assert len(primary_lines()) == 3  # nothing for the statistics refresh
