"""Permissions per key and queue (docs/security.md "Permissions"), against real processes: CURVE and
ZooKeeper ACLs on, two GCMs, two HCMs, a queue `orders.eu` with replicas (so a replica's replay
socket is there to refuse too) and a queue `billing`, shared by the module's tests.

Keys: `pub` may publish to orders.*, `sub` subscribe to orders.*, `worker` consume from orders.*;
`app` has no entry (the default, `all`, keeps what clusters did before permissions); `ops` is an
admin. A refusal is observed positively, from the refused client's own socket monitor, and counted
by the exchange; an admission by a completed handshake (and, for the real clients, messages). The
last test kills the leader GCM: the new one has the same table."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from kazoo.client import KazooClient

from gcm.backup_document import MAX_QUEUES
from roq.client import Admin, Publisher, Subscriber
from roq.config import Config
from roq.errors import ForbiddenError, InvalidNameError, RefusedError, RoqError
from roq.paths import Paths
from roq.security import generate_keys
from roq.state import read_hosts, read_leader, read_live
from roq.zk import read_json, start_client, stop_client
from tests.profiles import examples
from tests.support.helpers import (
    OK,
    REFUSED,
    Processes,
    carry,
    fast_config,
    handshake,
    record_figures,
    wait_until,
    znodes,
)
from tests.support.hostile_documents import hostile_restores

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DAEMON_ZK = "roq:perm-daemon-secret"
READER_ZK = "reader:perm-reader-secret"
ORDERS, BILLING = "orders.eu", "billing"
KINDS = {"pub": zmq.DEALER, "sub": zmq.SUB, "replay": zmq.DEALER, "work": zmq.DEALER}
SERVER_ONLY = "repl"  # a replica's replication socket: the cluster's own key alone


@dataclass
class Cluster:
    config: Config  # the daemons'
    keys_dir: Path
    workdir: Path
    procs: Processes
    zk: KazooClient
    paths: Paths

    def client(self, identity: str) -> Config:
        """What a publisher, subscriber or admin tool holds: a reader identity and its own key."""
        return self.config.replace(zk={"auth": READER_ZK, "readers": ""}, security={"identity": identity})

    def admin(self, identity: str = "admins/ops") -> Admin:
        return Admin(self.client(identity))

    def endpoints(self, queue: str) -> dict[str, str]:
        """The sockets of the queue's exchange, and its replica's replay (`replica`) and replication
        (`repl`) sockets."""
        live = next(iter(read_live(self.zk, self.paths, queue).values()))
        found = {kind: live[kind] for kind in KINDS}
        replica = read_json(self.zk, self.paths.replica_live(queue, "x1"))
        if replica:
            found["replica"], found[SERVER_ONLY] = replica["replay"], replica["repl"]
        return found

    def stats(self, queue: str, replica: bool = False) -> dict[str, Any]:
        path = self.paths.replica_live(queue, "x1") if replica else self.paths.live_exchange(queue, "x1")
        return (read_json(self.zk, path) or {}).get("stats", {})

    def wait_version(self, version: int) -> None:
        """Until every exchange and replica judges new connections by table `version` or a newer one."""
        def holding() -> bool:
            return all(self.stats(q, r).get("permissions_version", 0) >= version
                       for q, r in ((ORDERS, False), (ORDERS, True), (BILLING, False)))
        wait_until(holding, timeout=20, message=f"the exchanges and the replica to hold permissions {version}")

    def roq(self, identity: str, *args: str) -> subprocess.CompletedProcess[str]:
        path = self.workdir / f"{identity.replace('/', '-')}.toml"
        if not path.exists():
            path.write_text(self.client(identity).to_toml())
        return subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(path), *args],
                              capture_output=True, text=True, timeout=60)


def outcome(endpoint: str, kind: str, config: Config) -> str:
    return handshake(endpoint, KINDS.get(kind, zmq.DEALER), config=config)


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
            ) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("permissions")
    keys_dir = workdir / "keys"
    generate_keys(keys_dir, clients=["pub", "sub", "worker", "app", "late"], admins=["ops"])
    config = fast_config(zookeeper.connect_string).replace(
        security={"curve": True, "keys_dir": str(keys_dir)}, zk={"auth": DAEMON_ZK, "readers": READER_ZK})
    procs = Processes(config, workdir / "daemons")
    zk = start_client(config)
    paths = Paths(config.zk.root)
    failures = request.session.testsfailed
    try:
        for name in ("gcm-0", "gcm-1"):
            procs.start("gcm", name)
        for host in ("host-1", "host-2"):
            procs.start("hcm", host, f"hcm.host={host}")
        wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 2, timeout=30, message="cluster")
        found = Cluster(config, keys_dir, workdir, procs, zk, paths)
        with found.admin() as admin:
            admin.create_queue(ORDERS, replicas=2)
            admin.create_queue(BILLING)
            admin.grant("pub", publish=["orders.*"])
            admin.grant("sub", subscribe=["orders.*"])
            version = admin.grant("worker", consume=["orders.*"])["version"]
        wait_until(lambda: len(found.endpoints(ORDERS)) == 6 and found.endpoints(BILLING), timeout=30,
                   message="the exchanges and the replica running")
        found.wait_version(version)
        yield found
    finally:
        procs.stop_all()
        if request.session.testsfailed > failures:  # a test of this module failed: the daemons' side
            print(procs.dump_logs())
        stop_client(zk)


def refusals(cluster: Cluster, queue: str) -> tuple[int, int]:
    stats = cluster.stats(queue)
    return stats.get("refused_connections", 0), stats.get("refused_permission", 0)


# ------------------------------------------------------------------ every socket


@pytest.mark.parametrize("key, right, admitted", [
    ("pub", "publish", {"pub"}),
    ("sub", "subscribe", {"sub", "replay", "replica"}),
    ("worker", "consume", {"work"}),
])
def test_a_key_is_admitted_only_where_its_right_lets_it(cluster: Cluster, key: str, right: str,
                                                        admitted: set[str]) -> None:
    config = cluster.client(f"clients/{key}")
    before = refusals(cluster, ORDERS)
    orders = cluster.endpoints(ORDERS)
    seen = {kind: outcome(endpoint, kind, config) for kind, endpoint in orders.items()}
    assert seen == {kind: OK if kind in admitted else REFUSED for kind in orders}, f"{key} ({right} orders.*)"
    # Another queue: no socket at all, not even the one its right is for.
    billing = cluster.endpoints(BILLING)
    assert {kind: outcome(endpoint, kind, config) for kind, endpoint in billing.items()} == \
        {kind: REFUSED for kind in billing}
    refused_here = sum(1 for kind in KINDS if kind not in admitted)
    wait_until(lambda: all(now >= then + refused_here for now, then in zip(refusals(cluster, ORDERS), before)),
               timeout=10, message="the exchange to count the refusals as refused for a permission")
    wait_until(lambda: cluster.stats(ORDERS, replica=True).get("refused_permission", 0) > 0, timeout=10,
               message="the replica to count its refusals too")
    assert all(p.poll() is None for p in cluster.procs.procs.values())


def test_keys_with_rights_carry_messages_end_to_end(cluster: Cluster) -> None:
    got = carry(ORDERS, cluster.client("clients/pub"), cluster.client("clients/sub"), 200)
    assert got == [str(i).encode() for i in range(200)]


def test_the_client_library_says_why_nothing_gets_through(cluster: Cluster) -> None:
    pub = Publisher(ORDERS, cluster.client("clients/sub"))  # no publish right
    try:
        pub.publish("t", b"never")
        with pytest.raises(RefusedError, match="lack the publish right"):
            pub.flush(timeout=3)  # not a bare timeout: the handshake was refused
    finally:
        pub.close(timeout=0)
    with Subscriber(ORDERS, cluster.client("clients/pub"), topics=["t"]) as sub:  # no subscribe right
        with pytest.raises(RefusedError, match="lack the subscribe right"):
            deadline = time.monotonic() + 10  # its first handshake's refusal: milliseconds
            while time.monotonic() < deadline:
                sub.receive(timeout=0.2)


def test_a_key_learns_no_topology_of_a_queue_it_has_no_right_on(cluster: Cluster) -> None:
    """The GCMs' metadata is guarded as the data path is: no right on the queue, no endpoints."""
    with pytest.raises(ForbiddenError, match="no right on queue"):
        Subscriber(BILLING, cluster.client("clients/sub"), topics=["t"])
    with Subscriber(ORDERS, cluster.client("clients/sub"), topics=["t"]) as sub:  # its own queue: followed
        assert sub.topology.snapshot()


def test_a_key_without_an_entry_and_an_admin_keep_every_right(cluster: Cluster) -> None:
    for identity in ("clients/app", "admins/ops"):  # security.default_permissions = "all"; admins: always
        config = cluster.client(identity)
        for queue in (ORDERS, BILLING):
            endpoints = cluster.endpoints(queue)
            seen = {kind: outcome(endpoint, kind, config) for kind, endpoint in endpoints.items()}
            assert seen == {kind: REFUSED if kind == SERVER_ONLY else OK for kind in endpoints}, (identity, queue)


# ------------------------------------------------------------------ the control API


def test_only_admins_manage_permissions_and_clients_see_their_own_queues(cluster: Cluster) -> None:
    with cluster.admin() as admin:
        before = admin.permissions()
    for identity in ("clients/pub", "clients/app"):
        with cluster.admin(identity) as client:
            for attempt in (lambda: client.grant("pub", publish=["*"]), lambda: client.revoke("worker"),
                            lambda: client.reset_permissions("sub"), client.permissions,
                            lambda: client.key_permissions("ops")):
                with pytest.raises(ForbiddenError):
                    attempt()
    with cluster.admin() as admin:
        assert admin.permissions() == before  # nothing changed
        assert {k["name"]: (k["publish"], k["subscribe"], k["consume"], k["admin"], k["certificate"])
                for k in before["keys"]} == {
            "pub": (["orders.*"], [], [], False, "clients/pub"), "sub": ([], ["orders.*"], [], False, "clients/sub"),
            "worker": ([], [], ["orders.*"], False, "clients/worker")}
        assert (before["default"], before["enforced"]) == ("all", True)

    with cluster.admin("clients/pub") as client:
        assert client.key_permissions("pub")["entry"]["publish"] == ["orders.*"]  # its own
        assert [q["name"] for q in client.list_queues()] == [ORDERS]
        assert client.describe_queue(ORDERS)["name"] == ORDERS
        assert list(client.cluster_stats()["queues"]) in ([ORDERS], [])
        assert client.status()["queues"] == [ORDERS]
        for queue in (BILLING, "no-such-queue"):  # the same answer whether it exists or not
            with pytest.raises(ForbiddenError, match="no right on queue"):
                client.describe_queue(queue)
    with cluster.admin("clients/app") as client:  # no entry: the default, every queue
        assert sorted(q["name"] for q in client.list_queues()) == sorted([ORDERS, BILLING])


def test_only_admins_purge_queues_and_reset_or_delete_groups(cluster: Cluster) -> None:
    """The operations that drop messages are an admin's: a client key, even one with every right on
    the queue, is refused and nothing is written (no command reaches an exchange)."""
    for identity in ("clients/worker", "clients/app"):
        with cluster.admin(identity) as client:
            for attempt in (lambda: client.purge_queue(ORDERS), lambda: client.reset_group(ORDERS, "workers"),
                            lambda: client.delete_group(ORDERS, "workers"),
                            lambda: client.delete_queue(ORDERS, if_empty=True, if_unused=True),
                            lambda: client.create_queue(ORDERS, exist_ok=True)):
                with pytest.raises(ForbiddenError, match="needs an admin key"):
                    attempt()
        for args in (("queue", "purge", ORDERS), ("group", "reset", ORDERS, "workers"),
                     ("group", "delete", ORDERS, "workers")):
            result = cluster.roq(identity, *args)
            assert result.returncode == 1 and result.stderr.count("\n") == 1, (args, result.stderr)
            assert "needs an admin key" in result.stderr
    assert cluster.zk.exists(cluster.paths.commands(ORDERS)) is None  # nothing was written
    with cluster.admin() as admin:  # an admin's purge goes through, behind CURVE and the ACLs
        status = admin.purge_queue(BILLING)
        assert status["done"] and set(status["results"]) == {"x1"} and ORDERS in admin.describe_queue(ORDERS)["name"]


def test_the_cli_checks_names_and_patterns_before_connecting(cluster: Cluster) -> None:
    for args, fragment in ((("grant", "pub", "--publish", "orders/eu"), "invalid queue pattern"),
                           (("grant", "../pub", "--publish", "x"), "invalid key name"),
                           (("revoke", "pub", "--subscribe", "[a]"), "invalid queue pattern")):
        result = cluster.roq("admins/ops", "keys", *args)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, (result.returncode, result.stderr)
        assert result.stderr.startswith("roq: error:") and fragment in result.stderr
    result = cluster.roq("admins/ops", "keys", "grant", "pub")
    assert result.returncode == 2 and "at least one right" in result.stderr
    result = cluster.roq("clients/pub", "keys", "grant", "pub", "--publish", "*")
    assert result.returncode == 1 and "needs an admin key" in result.stderr, result.stderr
    result = cluster.roq("admins/ops", "keys", "revoke", "pub", "--publish", "orders.eu")
    assert result.returncode == 1 and "no publish pattern 'orders.eu'" in result.stderr, result.stderr
    with cluster.admin() as admin, pytest.raises(InvalidNameError):  # the library's caller gets the same
        admin.grant("pub", publish=["orders/eu"])

    result = cluster.roq("admins/ops", "keys", "list", "--json")
    assert result.returncode == 0, result.stderr
    assert {k["name"] for k in json.loads(result.stdout)["keys"]} == {"pub", "sub", "worker"}
    result = cluster.roq("clients/sub", "keys", "show", "sub")
    assert result.returncode == 0 and "subscribe orders.*" in result.stdout, result.stdout


# ------------------------------------------------------------------ changes take effect


def test_a_revoked_right_refuses_the_next_connection_and_open_ones_stay(cluster: Cluster) -> None:
    late = cluster.client("clients/late")
    with cluster.admin() as admin:
        cluster.wait_version(admin.grant("late", publish=[ORDERS])["version"])
        assert outcome(cluster.endpoints(ORDERS)["pub"], "pub", late) == OK
        with Publisher(ORDERS, late) as pub:
            pub.publish("t", b"before")
            pub.flush(timeout=15)
            answer = admin.revoke("late", publish=[ORDERS])
            assert answer["entry"] == {"publish": [], "subscribe": [], "consume": [], "admin": False}
            cluster.wait_version(answer["version"])
            assert outcome(cluster.endpoints(ORDERS)["pub"], "pub", late) == REFUSED  # the very next one
            pub.publish("t", b"after")  # its connection predates the revocation: it stays
            pub.flush(timeout=15)
        # An empty entry is not the default: the key gets nothing though the default is `all`.
        assert outcome(cluster.endpoints(BILLING)["pub"], "pub", late) == REFUSED
        cluster.wait_version(admin.reset_permissions("late")["version"])
        assert outcome(cluster.endpoints(BILLING)["pub"], "pub", late) == OK  # back to the default


def test_permissions_survive_a_backup_and_restore(cluster: Cluster, tmp_path: Path) -> None:
    backup = tmp_path / "roq.json"
    refused = cluster.roq("clients/app", "backup", str(backup))  # the permissions are for admins to read
    assert refused.returncode == 1 and "needs an admin key" in refused.stderr and not backup.exists(), refused.stderr
    result = cluster.roq("admins/ops", "backup", str(backup), "--keys-dir", str(cluster.keys_dir))
    assert result.returncode == 0, result.stderr
    document = json.loads(backup.read_text())
    assert document["version"] == 2 and set(document["permissions"]["keys"]) == {"pub", "sub", "worker"}

    # An empty cluster under another root: one GCM is enough to restore into.
    from roq.tools.ports import free_port
    other = cluster.config.replace(zk={"root": cluster.config.zk.root + "-restored"},
                                   cluster={"seeds": f"tcp://127.0.0.1:{free_port()}"})  # its own GCM
    procs = Processes(other, tmp_path / "restored")
    try:
        procs.start("gcm", "gcm-r")
        wait_until(lambda: read_leader(cluster.zk, Paths(other.zk.root)), timeout=20, message="a leader there")
        config = tmp_path / "ops-restored.toml"
        config.write_text(other.replace(zk={"auth": READER_ZK, "readers": ""},
                                        security={"identity": "admins/ops"}).to_toml())
        result = subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(config), "restore", str(backup)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "3 permission entries (0 kept as they were)" in result.stdout, result.stdout
        with cluster.admin() as admin, Admin(other.replace(zk={"auth": READER_ZK, "readers": ""},
                                                           security={"identity": "admins/ops"})) as restored:
            assert restored.permissions()["keys"] == admin.permissions()["keys"]
        again = subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(config), "restore", str(backup)],
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 1 and "3 permission entries" in again.stderr, again.stderr  # not empty now
    except BaseException:
        print(procs.dump_logs())
        raise
    finally:
        procs.stop_all()


def test_hostile_restore_documents_are_refused_and_change_nothing(cluster: Cluster) -> None:
    watched = (cluster.paths.queues, cluster.paths.permissions)
    with cluster.admin() as admin, cluster.admin("clients/pub") as client:
        good = admin.call("backup.export")
        before = {path: znodes(cluster.zk, path) for path in watched}
        for op, args in (("backup.export", {}), ("restore", {"document": good, "dry_run": True})):
            with pytest.raises(ForbiddenError):
                client.call(op, **args)

        @settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
        @given(hostile_restores(good))
        def refused(args: dict[str, Any]) -> None:
            try:
                answer = admin.call("restore", **args)
            except RoqError as exc:  # a clear refusal, never the leader's internal error
                assert exc.code in ("bad_request", "invalid_name"), (exc.code, str(exc))
            else:  # only a dry run can be answered, and then it changed nothing
                assert args["dry_run"] is True and answer["created"] == answer["granted"] == [], answer
            assert {path: znodes(cluster.zk, path) for path in watched} == before

        refused()
        # Past the limits: refused whole, before anything is planned.
        bomb = dict(good, queues=[{"name": f"q{i}", "exchanges": 1, "replicas": 1, "rules": None, "settings": {}}
                                  for i in range(MAX_QUEUES + 1)])
        with pytest.raises(RoqError, match="a backup holds at most"):
            admin.call("restore", document=bomb, dry_run=True)
        assert admin.call("ping")  # the leader lives on
    assert {path: znodes(cluster.zk, path) for path in watched} == before


def test_permissions_survive_a_leader_failover(cluster: Cluster) -> None:
    """Last: it kills the leader GCM."""
    with cluster.admin() as admin:
        before = admin.permissions()
    leader = read_leader(cluster.zk, cluster.paths)
    name = next(n for n, p in cluster.procs.procs.items() if p.pid == leader["pid"])
    cluster.procs.kill(name)
    new = wait_until(lambda: (found := read_leader(cluster.zk, cluster.paths)) and found["pid"] != leader["pid"]
                     and found, timeout=30, message="a new leader")
    with cluster.admin() as admin:
        assert admin.permissions()["keys"] == before["keys"]
        answer = admin.grant("app", subscribe=[BILLING])  # the new leader writes it too
        assert answer["entry"]["subscribe"] == [BILLING] and answer["version"] > before["version"]
        cluster.wait_version(answer["version"])
    assert outcome(cluster.endpoints(ORDERS)["sub"], "sub", cluster.client("clients/app")) == REFUSED
    record_figures("permissions after failover", new_leader_epoch=new["epoch"])


# ------------------------------------------------------------------ one exchange, as its HCM drives it


class ExchangeProcess:
    """An exchange started as an HCM starts it (configuration, then JSON lines, on stdin), without
    ZooKeeper: the test writes the permission lines itself and reads the ready and stats events."""

    def __init__(self, config: Config, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.stderr = workdir / "exchange.log"
        with self.stderr.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "exchange.main", "--queue", ORDERS, "--id", "x1",
                                          "--config-stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log)
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.line(config.to_json())

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.events.append(json.loads(raw))

    def line(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def table(self, version: int, keys: dict[str, Any]) -> None:
        self.line(json.dumps({"permissions": {"version": version, "table": {"format": 1, "keys": keys}}}))

    def ready(self) -> dict[str, Any]:
        return wait_until(lambda: next((e for e in self.events if e["event"] == "ready"), None), timeout=20,
                          message="the exchange ready")

    def versions(self) -> list[int]:
        return [e.get("permissions_version", 0) for e in list(self.events) if e["event"] == "stats"]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def deny_by_default(zookeeper, tmp_path: Path) -> Iterator[tuple[Config, Path]]:
    keys_dir = tmp_path / "keys"
    generate_keys(keys_dir, clients=["pub", "app"], admins=["ops"])
    config = fast_config(zookeeper.connect_string).replace(
        security={"curve": True, "keys_dir": str(keys_dir), "default_permissions": "none"},
        hcm={"ready_timeout": 3.0, "data_dir": str(tmp_path / "data")})
    yield config, tmp_path


def test_an_exchange_admits_no_client_before_its_table_and_denies_keys_without_an_entry(
        deny_by_default: tuple[Config, Path]) -> None:
    config, workdir = deny_by_default
    as_key = {name: config.replace(security={"identity": identity})
              for name, identity in (("pub", "clients/pub"), ("app", "clients/app"), ("ops", "admins/ops"))}

    silent = ExchangeProcess(config, workdir / "silent")  # an HCM that never sends a table
    try:
        assert silent.proc.wait(timeout=30) == 1  # Exit.CONFIG, before reporting ready
        assert not silent.events and "no permission table from the HCM" in silent.stderr.read_text()
    finally:
        silent.close()

    exchange = ExchangeProcess(config, workdir)
    try:
        exchange.table(5, {"pub": {"publish": ["orders.*"]}})
        live = exchange.ready()
        assert outcome(live["pub"], "pub", as_key["pub"]) == OK
        assert outcome(live["sub"], "sub", as_key["pub"]) == REFUSED
        assert outcome(live["pub"], "pub", as_key["app"]) == REFUSED  # no entry, and the default is none
        assert outcome(live["work"], "work", as_key["ops"]) == OK  # admins: every right
        wait_until(lambda: 5 in exchange.versions(), message="the exchange reporting table 5")

        # A line that is not a table is ignored (logged): the next good one is taken.
        exchange.table(6, {"app": {"publish": "orders.eu"}})
        exchange.line("not json at all")
        exchange.table(7, {"app": {"subscribe": ["orders.*"]}})
        wait_until(lambda: 7 in exchange.versions(), message="the exchange reporting table 7")
        assert 6 not in exchange.versions() and exchange.proc.poll() is None
        assert outcome(live["sub"], "sub", as_key["app"]) == OK
        assert outcome(live["pub"], "pub", as_key["pub"]) == REFUSED  # table 7 has no entry for pub
        assert "ignored a permission table from the HCM" in exchange.stderr.read_text()
    finally:
        exchange.close()
