"""`roq backup` and `roq restore` against real processes and a ZooKeeper of the test's own, whose
data directory the test wipes (docs/backup.md).

A secured cluster (CURVE, ZooKeeper ACLs) gets queues with rules, replicas and a scaled size, and
a permission entry; a client key may not back it up, an admin does, through the leader (ZooKeeper's
session count does not grow while `roq backup` and `roq restore` run: no client opens one);
everything is stopped, ZooKeeper's data directory deleted, ZooKeeper and the daemons started
again; bad files are refused on the empty cluster with nothing created; an admin restores the
backup and every queue, rule, setting and permission is back, the exchanges (and replicas) run and
carry messages; a second restore is refused on the now non-empty cluster, and
with --force only the missing queue is made."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq.auth
from kazoo.client import KazooClient

from roq.client import Admin, Publisher, Subscriber
from roq.config import Config
from roq.paths import Paths
from roq.security import generate_keys
from roq.state import queue_names, read_exchanges, read_hosts, read_leader, read_queue
from roq.tools.backup import BOOKKEEPING
from roq.tools.zkserver import ZooKeeperNotInstalledError, ZooKeeperServer, find_zookeeper
from roq.zk import start_client, stop_client
from tests.conftest import failed, unavailable
from tests.support.helpers import (
    Processes,
    fast_config,
    most_connections_while,
    record_figures,
    wait_until,
    znodes,
    zookeeper_connections,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DAEMON_ZK = "roq:backup-daemon-password"
READER_ZK = "reader:backup-reader-password"
# What key `app` may do: every queue of the test but `metrics` (the restored exchanges carry its messages).
APP_RIGHTS = {"publish": ["orders", "ev*"], "subscribe": ["orders"], "consume": [], "admin": False}
# name → (exchanges, replicas, rules, scaled to): min_exchanges = the size, so the autoscaler leaves it be.
QUEUES: dict[str, tuple[int, int, dict[str, Any] | None, int | None]] = {
    "orders": (2, 2, {"max_rate": 50_000, "min_exchanges": 2, "max_exchanges": 4}, None),
    "events": (1, 1, None, 2),  # scaled 1 → 2: its next_exchange is 3
    "metrics": (2, 1, {"max_publishers": 20, "min_exchanges": 2, "max_exchanges": 6, "scale_in_below": 0.3}, None),
}


@pytest.fixture
def own_zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A server of this test alone: its data directory can be wiped."""
    try:
        find_zookeeper()
    except ZooKeeperNotInstalledError as exc:
        unavailable(str(exc), "ZooKeeper")
    server = ZooKeeperServer(tmp_path / "zookeeper")
    server.start()
    yield server
    server.stop()


def roq(config_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(config_file), *args],
                          capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess[str], fragment: str, code: int = 1) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("roq: error:"), result.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def start_daemons(config: Config, workdir: Path) -> Processes:
    procs = Processes(config, workdir)
    procs.start("gcm", "gcm-0")
    for host in ("host-1", "host-2"):
        procs.start("hcm", host, f"hcm.host={host}", "hcm.capacity=6")
    return procs


def wait_cluster(zk: KazooClient, paths: Paths) -> None:
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 2, timeout=30, message="cluster")


def wait_all_running(zk: KazooClient, paths: Paths, names: list[str]) -> None:
    def running() -> bool:
        for name in names:
            exchanges = read_exchanges(zk, paths, name)
            info = read_queue(zk, paths, name)
            if not exchanges or info is None or not all(x.live for x in exchanges):
                return False
            if info.replicas == 2 and not all(x.replica_live for x in exchanges):
                return False
        return True
    wait_until(running, timeout=45, message="every exchange and replica running")


def queue_state(zk: KazooClient, paths: Paths) -> dict[str, dict[str, Any]]:
    """What a restore must bring back: per queue, its size, replicas and settings but the bookkeeping."""
    state = {}
    for name in queue_names(zk, paths):
        info = read_queue(zk, paths, name)
        assert info is not None
        state[name] = {"exchanges": len(info.exchanges), "replicas": info.replicas,
                       "settings": {k: v for k, v in info.settings.items() if k not in BOOKKEEPING}}
    return state


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} \
        if root.exists() else {}


def test_backup_wipe_restore_round_trip_and_refusals(own_zookeeper: ZooKeeperServer, tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys, clients=["app"], admins=["ops"])
    daemons = fast_config(own_zookeeper.connect_string).replace(
        security={"curve": True, "keys_dir": str(keys)}, zk={"auth": DAEMON_ZK, "readers": READER_ZK})
    admin_config = daemons.replace(zk={"auth": READER_ZK, "readers": ""}, security={"identity": "admins/ops"})
    client_config = daemons.replace(zk={"auth": READER_ZK, "readers": ""}, security={"identity": "clients/app"})
    admin_file, client_file = tmp_path / "admin.toml", tmp_path / "client.toml"
    admin_file.write_text(admin_config.to_toml())
    client_file.write_text(client_config.to_toml())
    paths = Paths(daemons.zk.root)
    backups = tmp_path / "backups"
    backups.mkdir()
    backup_file = backups / "roq.json"
    restored_keys = tmp_path / "restored-keys"  # a machine whose keys directory was lost too
    all_procs: list[Processes] = []

    try:
        # ---- a cluster with queues, rules, replicas, a scaled queue
        procs = start_daemons(daemons, tmp_path / "daemons-1")
        all_procs.append(procs)
        zk = start_client(daemons)
        try:
            wait_cluster(zk, paths)
            with Admin(admin_config) as admin:
                for name, (exchanges, replicas, rules, scaled) in QUEUES.items():
                    admin.create_queue(name, exchanges, replicas)
                    if rules:
                        admin.queue_rules(name, rules)
                    if scaled:
                        admin.scale_queue(name, scaled)
                admin.grant("app", APP_RIGHTS["publish"], APP_RIGHTS["subscribe"])
                permissions_before = admin.permissions()["keys"]
            wait_all_running(zk, paths, list(QUEUES))
            before = queue_state(zk, paths)
        finally:
            stop_client(zk)
        assert before["orders"]["replicas"] == 2 and before["events"]["exchanges"] == 2
        assert before["events"]["settings"]["replicas"] == 1 and "rules" not in before["events"]["settings"]

        # ---- back up: a client key may not read the permissions, an admin may; neither opens a ZooKeeper session
        sessions = zookeeper_connections(own_zookeeper)
        one_line_error(roq(client_file, "backup", str(backup_file)), "needs an admin key")
        assert not backup_file.exists()
        result, most = most_connections_while(own_zookeeper, lambda: roq(admin_file, "backup", str(backup_file)))
        assert result.returncode == 0, result.stderr
        assert most <= sessions, f"ZooKeeper sessions grew from {sessions} to {most} during roq backup"
        assert "3 queues, 1 permission entry, 3 public keys" in result.stdout
        assert stat.S_IMODE(backup_file.stat().st_mode) == 0o600
        assert sorted(p.name for p in backups.iterdir()) == ["roq.json"]  # no temporary file left
        text = backup_file.read_text()
        document = json.loads(text)
        assert (document["format"], document["version"]) == ("roq-backup", 2)
        assert document["permissions"] == {"format": 1, "keys": {"app": APP_RIGHTS}}
        assert document["cluster"]["root"] == paths.root and document["created_at"].endswith("Z")
        assert {q["name"]: (q["exchanges"], q["replicas"]) for q in document["queues"]} == \
            {"orders": (2, 2), "events": (2, 1), "metrics": (2, 1)}
        assert {q["name"]: q["settings"]["next_exchange"] for q in document["queues"]}["events"] == 3
        public = {rel: zmq.auth.load_certificate(str(keys / rel))[0].decode()
                  for rel in ("server.key", "clients/app.key", "admins/ops.key")}
        assert document["keys"] == {"server": public["server.key"], "clients": {"app": public["clients/app.key"]},
                                    "admins": {"ops": public["admins/ops.key"]}}
        for secret_file in keys.rglob("*.key_secret"):
            secret = zmq.auth.load_certificate(str(secret_file))[1]
            assert secret and secret.decode() not in text, f"secret of {secret_file} in the backup"
        for credential in (DAEMON_ZK, READER_ZK):
            assert credential.partition(":")[2] not in text
        # a GCM host's cron job uses the daemon's own configuration: the same backup
        from_daemon = roq(procs.config_path, "backup", str(backups / "daemon.json"))
        assert from_daemon.returncode == 0, from_daemon.stderr
        daemon_document = json.loads((backups / "daemon.json").read_text())
        assert {k: v for k, v in daemon_document.items() if k != "created_at"} == \
            {k: v for k, v in document.items() if k != "created_at"}
        (backups / "daemon.json").unlink()

        # ---- stop everything, wipe ZooKeeper's data directory, start again
        for p in all_procs:
            p.stop_all()
        own_zookeeper.stop()
        shutil.rmtree(own_zookeeper.base_dir / "data")
        own_zookeeper.start()
        procs = start_daemons(daemons, tmp_path / "daemons-2")
        all_procs.append(procs)
        zk = start_client(daemons)
        try:
            wait_cluster(zk, paths)
            assert queue_names(zk, paths) == []  # the wipe took everything

            # ---- bad files are refused on the empty cluster; nothing is created, no key written
            broken = tmp_path / "broken.json"
            good = json.loads(text)
            bad_files = {
                "not valid JSON": text[: len(text) // 2],
                "version 3 is newer than this roq reads": json.dumps(dict(good, version=3)),
                "permissions: key app: invalid queue pattern 'or/ders'": json.dumps(dict(good, permissions={
                    "format": 1, "keys": {"app": dict(APP_RIGHTS, publish=["or/ders"])}})),
                "the file lacks permissions": json.dumps({k: v for k, v in good.items() if k != "permissions"}),
                "not a RoQ backup": json.dumps({"queues": good["queues"]}),
                # the first queues are fine: a restore that did not check everything first would make them
                "(rule max_rate) must be from 0": json.dumps(dict(good, queues=good["queues"] + [
                    {"name": "late", "exchanges": 1, "replicas": 1, "rules": {"max_rate": -1},
                     "settings": {"replicas": 1, "rules": {"max_rate": -1}}}])),
                "exchanges must be an integer": json.dumps(dict(good, queues=good["queues"] + [
                    {"name": "late", "exchanges": "2", "replicas": 1, "rules": None, "settings": {}}])),
                "keys.admins.ops must be a 40-character Z85 public key": json.dumps(
                    dict(good, keys=dict(good["keys"], admins={"ops": "short"}))),
                "appears twice": json.dumps(dict(good, queues=good["queues"] + good["queues"][:1])),
            }
            for fragment, content in bad_files.items():
                broken.write_text(content)
                for extra in ((), ("--force",)):
                    one_line_error(roq(admin_file, "restore", str(broken), "--keys-dir", str(restored_keys),
                                       *extra), fragment)
                    assert queue_names(zk, paths) == [] and not restored_keys.exists(), fragment
            one_line_error(roq(admin_file, "restore", str(tmp_path / "missing.json")), "cannot read")

            checked = roq(admin_file, "restore", "--check", str(backup_file))
            assert checked.returncode == 0 and "3 queues, 1 permission entry, 3 public keys" in checked.stdout, \
                checked.stderr
            # A version 1 file (before permissions) is still read: no permission entries.
            version_1 = tmp_path / "version-1.json"
            version_1.write_text(json.dumps(dict({k: v for k, v in good.items() if k != "permissions"}, version=1)))
            checked = roq(admin_file, "restore", "--check", str(version_1))
            assert checked.returncode == 0 and "3 queues, 0 permission entries" in checked.stdout, checked.stderr

            # ---- restore, with no ZooKeeper session of its own
            sessions = zookeeper_connections(own_zookeeper)
            result, most = most_connections_while(own_zookeeper, lambda: roq(
                admin_file, "restore", str(backup_file), "--keys-dir", str(restored_keys)))
            assert result.returncode == 0, result.stdout + result.stderr
            assert most <= sessions, f"ZooKeeper sessions grew from {sessions} to {most} during roq restore"
            assert "restored 3 queues (0 kept as they were), 1 permission entry (0 kept as they were); public keys: " \
                "3 written" in result.stdout, result.stdout
            with Admin(admin_config) as admin:
                assert admin.permissions()["keys"] == permissions_before
            wait_all_running(zk, paths, list(QUEUES))
            after = queue_state(zk, paths)
            assert after == before
            record_figures("backup/restore round trip", queues=len(after),
                           exchanges=sum(q["exchanges"] for q in after.values()),
                           backup_bytes=backup_file.stat().st_size)
            with Admin(admin_config) as admin:
                for name, (_, _, rules, _) in QUEUES.items():
                    shown = admin.queue_rules(name)
                    assert all(shown[k] == v for k, v in (rules or {}).items()), (name, shown)
            # the restored exchanges carry messages, for a client key the cluster knows
            with Subscriber("orders", client_config, topics=["t"]) as sub, Publisher("orders", client_config) as pub:
                pub.wait_for_subscribers(1, timeout=20)
                for i in range(20):
                    pub.publish("t", str(i).encode())
                pub.flush(timeout=20)
                got = sorted(int(sub.receive(timeout=10).payload) for _ in range(20))
            assert got == list(range(20))
            # public keys only, the same ones, readable by all
            assert sorted(files_under(restored_keys)) == ["admins/ops.key", "clients/app.key", "server.key"]
            for rel, key in public.items():
                assert zmq.auth.load_certificate(str(restored_keys / rel)) == (key.encode(), None)
                assert stat.S_IMODE((restored_keys / rel).stat().st_mode) == 0o644

            # ---- a second restore on the non-empty cluster: refused, nothing changed
            snapshot, key_files = znodes(zk, paths.queues), files_under(restored_keys)
            one_line_error(roq(admin_file, "restore", str(backup_file), "--keys-dir", str(restored_keys)),
                           "is not empty (3 queues: events, metrics, orders; 1 permission entry); nothing was restored")
            assert znodes(zk, paths.queues) == snapshot and files_under(restored_keys) == key_files

            # ---- --force: the missing queue is made, the others are kept as they are
            with Admin(admin_config) as admin:
                admin.delete_queue("events")
                admin.queue_rules("metrics", {"max_exchanges": 7})
            wait_until(lambda: "events" not in queue_names(zk, paths), message="events deleted")
            (restored_keys / "clients" / "app.key").unlink()
            generate_keys(tmp_path / "other", clients=["app"])
            shutil.copy(tmp_path / "other" / "clients" / "app.key", restored_keys / "clients" / "app.key")
            other_app = (restored_keys / "clients" / "app.key").read_bytes()
            kept_before = {name: znodes(zk, paths.queue(name)) for name in ("metrics", "orders")}
            result = roq(admin_file, "restore", "--force", str(backup_file), "--keys-dir", str(restored_keys))
            assert result.returncode == 0, result.stdout + result.stderr
            assert "created queue events: 2 exchanges" in result.stdout
            assert "kept queue orders as it is (same as the backup)" in result.stdout
            assert "kept queue metrics as it is: rules " in result.stdout and "max_exchanges=7" in result.stdout
            assert "restored 1 queue (2 kept as they were), 0 permission entries (1 kept as they were)" in result.stdout
            assert "kept the permissions of key app as they are (same as the backup)" in result.stdout
            assert "1 different (kept)" in result.stdout and "clients/app.key" in result.stderr
            assert (restored_keys / "clients" / "app.key").read_bytes() == other_app
            # kept: their settings (rules included) and exchanges untouched, znode versions too
            assert {name: znodes(zk, paths.queue(name)) for name in ("metrics", "orders")} == kept_before
            wait_all_running(zk, paths, list(QUEUES))
            events = queue_state(zk, paths)["events"]
            assert events == before["events"]
        finally:
            stop_client(zk)
    finally:
        for p in all_procs:
            p.stop_all()
        if failed(request):
            for p in all_procs:
                print(p.dump_logs())
            print("----- zookeeper log tail -----\n" + own_zookeeper.log_tail())


def test_backup_of_a_missing_cluster_is_refused_and_a_write_is_atomic(
        own_zookeeper: ZooKeeperServer, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    config = fast_config(own_zookeeper.connect_string)
    config_file = tmp_path / "roq.toml"
    config_file.write_text(config.to_toml())
    target = tmp_path / "roq.json"
    one_line_error(roq(config_file, "backup", str(target)), "there is no RoQ cluster under /test-")
    assert not target.exists()

    # a cluster with no queue yet: a GCM answers (its files elsewhere: the listing below is of the backup's directory)
    procs = Processes(config, tmp_path_factory.mktemp("gcm"))
    try:
        procs.start("gcm", "gcm-0")
        probe = tmp_path_factory.mktemp("probe") / "roq.json"  # the GCM elected and answering (CI: it was not yet)
        wait_until(lambda: roq(config_file, "backup", str(probe)).returncode == 0, timeout=30,
                   message="the GCM leader answers")
        backup_with_no_queue(config_file, target, tmp_path)
    finally:
        procs.stop_all()


def backup_with_no_queue(config_file: Path, target: Path, tmp_path: Path) -> None:
    one_line_error(roq(config_file, "backup", str(tmp_path / "no-such-dir" / "roq.json")), "cannot write")
    target.write_text("an older backup")
    target.chmod(0o644)
    result = roq(config_file, "backup", str(target))
    assert result.returncode == 0 and "0 queues, 0 permission entries, 0 public keys" in result.stdout, result.stderr
    assert json.loads(target.read_text())["queues"] == [] and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roq.json", "roq.toml", "zookeeper"]
