"""Consumer groups seen and managed from outside (docs/work-queues.md): exact figures in the
leader's aggregate, `roq group`, group reset and delete, queue purge, create --if-not-exists and
delete --if-empty / --if-unused, storage policies (queue create --retention, queue set, shown, backed up
and restored), on one cluster of real processes (a GCM, two HCMs) for the module;
each test its own queue. Members that are paused or killed run as their own processes (MEMBER), so
SIGSTOP and SIGKILL are real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.config import Config
from roq.errors import GroupNotFoundError, PreconditionFailedError, QueueExistsError, QueueNotFoundError, UserError
from roq.paths import Paths
from roq.state import read_live
from roq.tools.zkserver import ZooKeeperServer
from roq.zk import start_client, stop_client
from tests.conftest import failed
from tests.integration.conftest import start_cluster
from tests.integration.test_cli import assert_one_line_error, assert_usage_error
from tests.integration.test_replication import create_replicated
from tests.support.helpers import Processes, fast_config, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MEMBER_TIMEOUT = 3.0  # exchange.group_member_timeout here: a paused member is dropped after it
REPORT = 0.5  # exchange.stats_interval (fast_config)
# A change must show in the leader's answers within a report, the HCM's tick and the write: 1 s here.
FRESH = 2 * REPORT + 1.0

# A member process that takes what it is sent and acks nothing ("joined" once it is a member).
MEMBER = textwrap.dedent("""
    import sys
    from roq.config import load_config
    from roq.client.subscriber import Subscriber
    sub = Subscriber(sys.argv[2], load_config(sys.argv[1]), ["jobs"], group="workers", prefetch=int(sys.argv[3]),
                     auto_ack=False)
    print("joined", flush=True)
    held = [msg for msg in sub]
""")


class Lab:
    def __init__(self, config: Config, zk: KazooClient, procs: Processes) -> None:
        self.config, self.zk, self.procs = config, zk, procs
        self.paths = Paths(config.zk.root)
        self.admin = Admin(config)

    def queue(self, name: str, exchanges: int = 1) -> str:
        self.admin.create_queue(name, exchanges=exchanges)
        wait_until(lambda: len(read_live(self.zk, self.paths, name)) == exchanges, timeout=15, message="exchanges")
        return name

    def member(self, queue: str, prefetch: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", MEMBER, str(self.procs.config_path), queue, str(prefetch)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "joined"
        return proc

    def aggregate(self, queue: str, group: str = "workers") -> dict[str, Any]:
        """The group as the leader's `cluster.stats` has it (what `roq stats` shows); {} if absent."""
        return self.admin.cluster_stats()["queues"][queue]["groups"].get(group, {})

    def roq(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(self.procs.config_path), *args],
                              capture_output=True, text=True, timeout=60)

    def publish(self, queue: str, count: int, topic: str = "jobs") -> None:
        with Publisher(queue, self.config) as pub:
            pub.publish_many(topic, [b"%d" % i for i in range(count)])
            pub.flush()


@pytest.fixture(scope="module")
def lab(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Lab]:
    config = fast_config(zookeeper.connect_string).replace(
        hcm={"capacity": 8}, exchange={"group_member_timeout": MEMBER_TIMEOUT})
    procs = Processes(config, tmp_path_factory.mktemp("group-admin") / "daemons")
    zk = start_client(config)
    found = None
    try:
        start_cluster(procs, zk, Paths(config.zk.root))
        found = Lab(config, zk, procs)
        yield found
    finally:
        if found is not None:
            found.admin.close()
        procs.stop_all()
        if failed(request):
            print(procs.dump_logs())
        stop_client(zk)


def figures(shown: dict[str, Any]) -> tuple[int, int, int]:
    return shown.get("members", -1), shown.get("in_flight", -1), shown.get("ready", -1)


def backlog(shown: dict[str, Any]) -> int:
    """Messages not acked: ready, delayed and in flight (a member's prefetch is per exchange)."""
    return sum(shown.get(key, 0) for key in ("ready", "delayed", "in_flight"))


def test_the_figures_follow_a_paused_member_and_members_that_are_gone(lab: Lab) -> None:
    """Regression: the leader's aggregate (roq stats) had no groups, and was up to a tick older than
    ZooKeeper. Members and in-flight messages are exact within a report: while a member is paused,
    once the exchange dropped it, once it is back, and once every member is gone."""
    queue = lab.queue("paused")
    member = lab.member(queue, prefetch=100)
    try:
        lab.publish(queue, 300)
        wait_until(lambda: figures(lab.aggregate(queue)) == (1, 100, 200), timeout=10, message="100 in flight")
        member.send_signal(signal.SIGSTOP)
        paused = time.monotonic()
        # It holds its 100 the whole time it is paused and not yet dropped: no figure lies meanwhile.
        while time.monotonic() < paused + MEMBER_TIMEOUT - 1.0:
            assert figures(lab.aggregate(queue)) == (1, 100, 200)
            time.sleep(0.2)  # sampling the figures over the pause, not waiting for something
        wait_until(lambda: figures(lab.aggregate(queue)) == (0, 0, 300), timeout=FRESH + 1.0,
                   message="the dropped member gone from members and in flight")
        assert time.monotonic() - paused <= MEMBER_TIMEOUT + FRESH
        member.send_signal(signal.SIGCONT)  # it joins again and gets a prefetch anew
        wait_until(lambda: figures(lab.aggregate(queue)) == (1, 100, 200), timeout=10, message="back")
        member.kill()
        member.wait(10)
        wait_until(lambda: figures(lab.aggregate(queue)) == (0, 0, 300), timeout=FRESH, message="killed: gone")
        # Every member gone by leaving (an in-process member that closes): members 0 at once.
        with Subscriber(queue, lab.config, ["jobs"], group="workers", prefetch=7, auto_ack=False):
            wait_until(lambda: figures(lab.aggregate(queue)) == (1, 7, 293), timeout=FRESH, message="joined")
        wait_until(lambda: figures(lab.aggregate(queue)) == (0, 0, 300), timeout=FRESH, message="left: gone")
        # The same figures in `roq stats --json` and `roq group list --json` (the description's).
        stats = json.loads(lab.roq("stats", "--json").stdout)
        assert figures(stats["queues"][queue]["groups"]["workers"]) == (0, 0, 300)
        assert figures(stats["queues"][queue]["by_exchange"][0]["groups"]["workers"]) == (0, 0, 300)
        listed = json.loads(lab.roq("group", "list", queue, "--json").stdout)
        assert figures(listed["workers"]) == (0, 0, 300) and listed["workers"]["topics"] == ["jobs"]
    finally:
        member.kill()
        member.wait(10)
        lab.admin.delete_queue(queue)


def test_a_reset_drops_the_backlog_once_and_a_retry_changes_nothing_more(lab: Lab) -> None:
    queue = lab.queue("reset", exchanges=2)
    member = Subscriber(queue, lab.config, ["jobs"], group="workers", prefetch=10, auto_ack=False)
    try:
        lab.publish(queue, 200)  # one publisher: its messages go to one exchange
        wait_until(lambda: figures(lab.aggregate(queue)) == (1, 10, 190), timeout=10, message="the backlog")
        held = [member.receive(timeout=5) for _ in range(10)]
        from roq.state import read_leader
        endpoint = read_leader(lab.zk, lab.paths)["endpoint"]
        key = "reset-retry-0001"
        status = lab.admin.request(endpoint, "group.reset", {"name": queue, "group": "workers"}, 5.0, key)
        status = lab.admin.wait_command(queue, status, 10)
        assert status["done"] and status["id"] == f"k-{key}" and status["pending"] == []
        assert sum(r["dropped"] for r in status["results"].values()) == 190
        wait_until(lambda: figures(lab.aggregate(queue)) == (1, 10, 0), timeout=FRESH, message="reset")
        lab.publish(queue, 30)  # after the reset: kept
        wait_until(lambda: backlog(lab.aggregate(queue)) == 40, timeout=FRESH, message="new work waits")
        again = lab.admin.request(endpoint, "group.reset", {"name": queue, "group": "workers"}, 5.0, key)
        assert again["id"] == status["id"] and again["results"] == status["results"]  # the same command
        for msg in held:
            assert msg is not None
            msg.ack()
        wait_until(lambda: lab.aggregate(queue).get("acked") == 10, timeout=FRESH, message="held ones acked")
        wait_until(lambda: backlog(lab.aggregate(queue)) == 30, timeout=FRESH,
                   message="the retry dropped none of the new work")
        assert member.receive(timeout=5) is not None  # and it flows
        # Through the CLI: one line per exchange, exit 0; an unknown group and a bad name: one line, exit 1.
        shown = lab.roq("group", "reset", queue, "workers")
        assert shown.returncode == 0 and "reset group workers" in shown.stdout and "x1:" in shown.stdout, shown
        assert_one_line_error(lab.roq("group", "reset", queue, "nobody"), 1, "has no group 'nobody'")
        assert_one_line_error(lab.roq("group", "reset", queue, "bad name!"), 1, "invalid group name")
        assert_one_line_error(lab.roq("group", "show", queue, "nobody"), 1, "has no group 'nobody'")
        show = json.loads(lab.roq("group", "show", queue, "workers", "--json").stdout)
        assert show["members"] == 1 and set(show["by_exchange"]) == {"x1", "x2"}
    finally:
        member.close()
        lab.admin.delete_queue(queue)


def test_a_group_with_members_is_not_deleted_and_one_without_is_gone_with_its_messages(lab: Lab) -> None:
    queue = lab.queue("delete")
    member = Subscriber(queue, lab.config, ["jobs"], group="workers", prefetch=5, auto_ack=False)
    try:
        lab.publish(queue, 50)
        wait_until(lambda: figures(lab.aggregate(queue)) == (1, 5, 45), timeout=10, message="the backlog")
        with pytest.raises(PreconditionFailedError, match="1 members connected"):
            lab.admin.delete_group(queue, "workers")
        assert_one_line_error(lab.roq("group", "delete", queue, "workers"), 1, "members connected")
        assert figures(lab.aggregate(queue)) == (1, 5, 45)  # refused: nothing changed
        member.close()
        wait_until(lambda: figures(lab.aggregate(queue)) == (0, 0, 50), timeout=FRESH, message="member gone")
        status = lab.admin.delete_group(queue, "workers")
        assert status["done"] and status["results"]["x1"] == {"deleted": True, "dropped": 50}
        wait_until(lambda: lab.aggregate(queue) == {}, timeout=FRESH, message="the group gone")
        with pytest.raises(GroupNotFoundError):
            lab.admin.delete_group(queue, "workers")
        # A member joining later makes a new group, which collects from then on.
        with Subscriber(queue, lab.config, ["jobs"], group="workers", prefetch=5, auto_ack=False) as again:
            lab.publish(queue, 3)
            assert [again.receive(timeout=5) is not None for _ in range(3)] == [True] * 3
            wait_until(lambda: figures(lab.aggregate(queue)) == (1, 3, 0), timeout=FRESH, message="a new group")
    finally:
        member.close()
        lab.admin.delete_queue(queue)


def test_reset_delete_and_purge_outlive_the_exchange_of_a_replicated_queue(lab: Lab) -> None:
    """What a command dropped never comes back through the replica's state or the publisher's
    resends when the exchange dies: the next incarnation adopts the state the replica recorded
    with the command."""
    queue = "mirrored"
    create_replicated(lab.config, lab.zk, lab.paths, queue)
    pub = Publisher(queue, lab.config)  # stays open over the kills: it resends its replay window
    member = Subscriber(queue, lab.config, ["jobs"], group="workers", prefetch=5, auto_ack=False)
    audit = Subscriber(queue, lab.config, ["jobs"], group="audit", prefetch=1, auto_ack=False)
    try:
        audit.close()  # a group without members
        pub.publish_many("jobs", [b"old %d" % i for i in range(100)])
        pub.flush()
        wait_until(lambda: figures(lab.aggregate(queue)) == (1, 5, 95) and figures(lab.aggregate(queue, "audit"))
                   == (0, 0, 100), timeout=10, message="both groups' backlogs")
        held = {m.id for m in (member.receive(timeout=5) for _ in range(5)) if m is not None}
        assert len(held) == 5
        assert lab.admin.reset_group(queue, "workers")["results"]["x1"] == {"dropped": 95}
        assert lab.admin.delete_group(queue, "audit")["results"]["x1"] == {"deleted": True, "dropped": 100}
        before = kill_exchange(lab, queue)
        # The 5 the member held come again (their acks died with the exchange); nothing else does.
        again = [member.receive(timeout=10) for _ in range(5)]
        assert all(m is not None and m.deliveries == 2 for m in again), again
        assert {m.id for m in again if m is not None} == held
        assert member.receive(timeout=2) is None
        wait_until(lambda: figures(lab.aggregate(queue)) == (1, 5, 0), timeout=FRESH, message="adopted as reset")
        assert lab.aggregate(queue, "audit") == {}  # deleted stays deleted
        for msg in again:
            assert msg is not None
            msg.ack()
        member.close()

        pub.publish_many("jobs", [b"purged %d" % i for i in range(50)])
        pub.flush()
        wait_until(lambda: lab.aggregate(queue).get("ready") == 50, timeout=FRESH, message="a backlog to purge")
        result = lab.admin.purge_queue(queue)["results"]["x1"]
        assert result["group_messages"] == 50 and result["messages"] >= 150  # retention held them all
        pub.publish_many("jobs", [b"kept %d" % i for i in range(10)])
        pub.flush()
        kill_exchange(lab, queue, before)
        pub.flush(timeout=15)  # its replay window went to the new incarnation
        with Subscriber(queue, lab.config, ["jobs"], start="beginning") as reader:
            seen = [m.payload for m in iter(lambda: reader.receive(timeout=3), None)]
        assert sorted(seen) == sorted(b"kept %d" % i for i in range(10))  # the purged ones stay purged
        wait_until(lambda: lab.aggregate(queue).get("ready") == 10, timeout=FRESH, message="only what followed")
    finally:
        member.close()
        pub.close()
        lab.admin.delete_queue(queue)


def kill_exchange(lab: Lab, queue: str, previous: str | None = None) -> str:
    """SIGKILL the queue's exchange; its next incarnation's id, once it runs with its replica."""
    live = read_live(lab.zk, lab.paths, queue)["x1"]
    os.kill(live["pid"], signal.SIGKILL)
    return wait_until(lambda: (x := read_live(lab.zk, lab.paths, queue).get("x1")) and x["incarnation"] not in
                      (live["incarnation"], previous) and x["incarnation"], timeout=30, message="a new incarnation")


def test_create_if_not_exists_and_delete_if_empty_or_unused(lab: Lab) -> None:
    made = lab.roq("queue", "create", "careful", "-x", "2", "--if-not-exists")
    assert made.returncode == 0 and made.stdout.startswith("created queue careful"), made
    same = lab.roq("queue", "create", "careful", "-x", "2", "--if-not-exists")
    assert same.returncode == 0 and same.stdout.startswith("queue careful exists"), same
    assert lab.admin.create_queue("careful", exist_ok=True)["existed"]  # nothing named: nothing compared
    assert_one_line_error(lab.roq("queue", "create", "careful", "--if-not-exists", "--replicas", "2"), 1,
                          "replicas 1 (asked 2)")
    with pytest.raises(QueueExistsError, match=r"exchanges 2 \(asked 3\)"):
        lab.admin.create_queue("careful", exchanges=3, exist_ok=True)
    assert_one_line_error(lab.roq("queue", "create", "careful"), 1, "already exists")
    wait_until(lambda: len(read_live(lab.zk, lab.paths, "careful")) == 2, timeout=15, message="exchanges")

    with Subscriber("careful", lab.config, ["t"]) as sub:
        sub.wait_connected(2)
        wait_until(lambda: all(x["live"]["stats"].get("subscribers") for x in
                               lab.admin.describe_queue("careful")["exchanges"]),
                   timeout=FRESH, message="the subscriber in the figures")
        assert_one_line_error(lab.roq("queue", "delete", "careful", "--if-unused"), 1, "x1 has 0 publishers and 1")
    lab.publish("careful", 5, topic="t")
    wait_until(lambda: any(x["live"]["stats"].get("retained_frames") for x in
                           lab.admin.describe_queue("careful")["exchanges"]),
               timeout=FRESH, message="the messages in the figures")
    assert_one_line_error(lab.roq("queue", "delete", "careful", "--if-empty"), 1, "is not empty: x")
    assert "careful" in [q["name"] for q in lab.admin.list_queues()]  # refused: still there
    purged = lab.roq("queue", "purge", "careful")
    assert purged.returncode == 0 and "dropped 5 retained messages" in purged.stdout, purged
    deleted = lab.roq("queue", "delete", "careful", "--if-empty", "--if-unused")
    assert deleted.returncode == 0, deleted  # the purge's figures were written before it was reported done
    assert "careful" not in [q["name"] for q in lab.admin.list_queues()]
    assert lab.zk.exists(lab.paths.commands("careful")) is None  # its commands went with it


def policy(described: dict[str, Any]) -> tuple[float, int]:
    return described["retention"], described["retention_bytes"]


def test_a_storage_policy_is_set_at_create_changed_by_set_and_shown_everywhere(lab: Lab) -> None:
    made = lab.roq("queue", "create", "kept", "--retention", "24h", "--retention-bytes", "50GiB")
    assert made.returncode == 0 and made.stdout.rstrip().endswith("; on disk for 1d, up to 50 GiB"), made
    shown = json.loads(lab.roq("queue", "show", "kept", "--json").stdout)
    assert policy(shown) == (86_400, 50 << 30)
    listed = {q["name"]: q for q in json.loads(lab.roq("queue", "list", "--json").stdout)}
    assert policy(listed["kept"]) == (86_400, 50 << 30)
    assert "on disk for 1d, up to 50 GiB" in lab.roq("queue", "list").stdout

    changed = lab.roq("queue", "set", "kept", "--retention", "1h30m")
    assert changed.returncode == 0 and changed.stdout.strip() == "queue kept: on disk for 90m, up to 50 GiB", changed
    assert policy(lab.admin.describe_queue("kept")) == (5_400, 50 << 30)  # the size bound stayed
    lab.admin.set_queue("kept", retention_bytes=512 << 20)
    assert policy(lab.admin.describe_queue("kept")) == (5_400, 512 << 20)

    # Bad input: a clear error, and nothing changed.
    assert_usage_error(lab.roq("queue", "set", "kept", "--retention", "24x"), "not a duration")
    assert_usage_error(lab.roq("queue", "set", "kept", "--retention-bytes", "50G"), "KiB, MiB, GiB")
    assert_usage_error(lab.roq("queue", "create", "never", "--retention-bytes", "1.5B"), "whole number of bytes")
    nothing = lab.roq("queue", "set", "kept")
    assert nothing.returncode == 2 and "give --retention, --retention-bytes or both" in nothing.stderr, nothing
    assert_one_line_error(lab.roq("queue", "set", "absent", "--retention", "1h"), 1, "does not exist")
    for bad in ({"retention": -1}, {"retention": "24h"}, {"retention_bytes": True}, {"retention_bytes": 1.5},
                {"retention": float("inf")}):
        with pytest.raises(UserError, match="retention"):
            lab.admin.call("queue.set", name="kept", **bad)
        with pytest.raises(UserError, match="retention"):
            lab.admin.call("queue.create", name="never", **bad)
    with pytest.raises(UserError, match="needs retention or retention_bytes"):
        lab.admin.call("queue.set", name="kept")
    assert policy(lab.admin.describe_queue("kept")) == (5_400, 512 << 20)
    assert "never" not in [q["name"] for q in lab.admin.list_queues()]
    with pytest.raises(QueueNotFoundError):
        lab.admin.set_queue("absent", retention=60)

    with pytest.raises(QueueExistsError, match=r"retention 5400.0 \(asked 60\)"):
        lab.admin.create_queue("kept", exist_ok=True, retention=60)
    assert lab.admin.create_queue("kept", exist_ok=True, retention=5_400)["existed"]
    plain = lab.roq("queue", "create", "plain")  # the cluster's defaults (0, 0): memory only, as before
    assert plain.returncode == 0 and plain.stdout.rstrip().endswith("; memory only"), plain
    assert policy(lab.admin.describe_queue("plain")) == (0, 0)
    for name in ("kept", "plain"):
        lab.admin.delete_queue(name)


def test_backup_and_restore_keep_a_queues_storage_policy(lab: Lab, tmp_path: Any) -> None:
    lab.admin.create_queue("archived", retention=7 * 86_400, retention_bytes=10**12)
    lab.admin.create_queue("volatile")
    file = str(tmp_path / "backup.json")
    assert lab.roq("backup", file).returncode == 0
    saved = {q["name"]: q["settings"] for q in json.loads(open(file).read())["queues"]}
    assert (saved["archived"]["retention"], saved["archived"]["retention_bytes"]) == (7 * 86_400, 10**12)
    lab.admin.set_queue("volatile", retention=60)  # differs from the backup now: reported, kept
    lab.admin.delete_queue("archived")
    restored = lab.roq("restore", file, "--force")
    assert restored.returncode == 0, restored
    assert "created queue archived: 1 exchange" in restored.stdout and "storage on disk for 1w, up to 1 TB" in \
        restored.stdout, restored.stdout
    assert "kept queue volatile as it is: storage on disk for 1m, with no size limit (backup: memory only)" in \
        restored.stdout, restored.stdout
    assert policy(lab.admin.describe_queue("archived")) == (7 * 86_400, 10**12)
    assert policy(lab.admin.describe_queue("volatile")) == (60, 0)
    for name in ("archived", "volatile"):
        lab.admin.delete_queue(name)
