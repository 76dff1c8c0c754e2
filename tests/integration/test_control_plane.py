"""GCM election, failover, fencing and the control API against a real ZooKeeper."""

from __future__ import annotations

import signal
import threading
import time
import uuid

import msgpack
import pytest
import zmq

from gcm.fence import LeaderFence, RequestContext, serving
from roq.client.admin import Admin
from roq.errors import (
    FencedError,
    InvalidNameError,
    NotLeaderError,
    QueueExistsError,
    QueueNotFoundError,
    RequestTimeoutError,
    UnknownCommandError,
    UserError,
    ZooKeeperUnavailableError,
)
from roq.protocol import decode_reply, encode_request
from roq.state import read_exchanges, read_hosts, read_leader
from roq.zk import start_client, stop_client
from tests.support.helpers import record_figures, wait_until

pytestmark = pytest.mark.integration


def leader(zk, paths):
    return read_leader(zk, paths)


def test_leader_failover_keeps_every_queue(config, zk, paths, procs):
    procs.gcm("gcm-a")
    procs.gcm("gcm-b")
    procs.hcm("host-1")
    procs.hcm("host-2")
    wait_until(lambda: leader(zk, paths) and len(read_hosts(zk, paths)) == 2, message="leader and hosts")
    names = [f"q{i}" for i in range(6)]
    with Admin(config) as admin:
        for i, name in enumerate(names):
            admin.create_queue(name, exchanges=1 + i % 3)
        before = {n: admin.describe_queue(n)["exchanges"] for n in names}
        old = leader(zk, paths)
        victim = next(n for n, p in procs.procs.items() if p.pid == old["pid"])
        killed_at = time.monotonic()
        procs.kill(victim, signal.SIGKILL)
        new = wait_until(lambda: (led := leader(zk, paths)) and led["id"] != old["id"] and led,
                         timeout=15, message="a backup to take over")
        listed = wait_until(lambda: admin.list_queues(), timeout=10, message="queue list from the new leader")
        took = time.monotonic() - killed_at
        record_figures("leader SIGKILL (processes)", to_served_queue_list_s=round(took, 2))
        assert new["epoch"] > old["epoch"]
        assert sorted(q["name"] for q in listed) == names
        for name in names:
            after = admin.describe_queue(name)["exchanges"]
            assert [(x["id"], x["host"]) for x in after] == [(x["id"], x["host"]) for x in before[name]]


def test_backup_answers_not_leader_with_the_leader_endpoint(config, zk, paths, procs):
    procs.gcm("gcm-a")
    procs.gcm("gcm-b")
    current = wait_until(lambda: leader(zk, paths), message="a leader")
    contenders = wait_until(lambda: len(zk.get_children(paths.election)) == 2 and zk.get_children(paths.election),
                            message="both GCMs contending")
    assert contenders
    with Admin(config) as admin:
        election = zk.Election(paths.election)
        import json
        endpoints = [json.loads(c)["endpoint"] for c in election.contenders()]
        backup = next(e for e in endpoints if e != current["endpoint"])
        with pytest.raises(NotLeaderError) as info:
            admin.request(backup, "queue.list", {}, timeout=5)
        assert info.value.leader == current["endpoint"]
        assert admin.request(backup, "ping", {}, timeout=5)["leader"] is False


def test_fenced_leader_cannot_write(config, zk, paths):
    from roq.zk import ensure_base_paths
    ensure_base_paths(zk, paths)
    other = start_client(config)
    try:
        old, new = LeaderFence(zk, paths), LeaderFence(other, paths)
        old_epoch = old.claim({"id": "old"})
        old.write(lambda t: t.create(paths.queue("by-old-while-leader"), b"{}"))
        assert zk.exists(paths.queue("by-old-while-leader"))
        new_epoch = new.claim({"id": "new"})
        assert new_epoch == old_epoch + 1
        with pytest.raises(FencedError):
            old.write(lambda t: t.create(paths.queue("must-not-exist"), b"{}"))
        assert not zk.exists(paths.queue("must-not-exist"))
        assert read_leader(zk, paths)["id"] == "new"
        new.write(lambda t: t.create(paths.queue("by-new"), b"{}"))
        assert zk.exists(paths.queue("by-new"))
    finally:
        stop_client(other)


def test_expired_leader_session_cannot_write(config, zk, paths):
    from roq.zk import ensure_base_paths
    ensure_base_paths(zk, paths)
    victim = start_client(config)
    fence = LeaderFence(victim, paths)
    fence.claim({"id": "victim"})
    # Expire the victim's session the way the kazoo test harness does: a second
    # connection with the same session id and password, closed.
    session_id, password = victim.client_id
    from kazoo.client import KazooClient
    twin = KazooClient(hosts=config.zk.hosts, client_id=(session_id, password))
    twin.start()
    twin.stop()
    twin.close()
    wait_until(lambda: read_leader(zk, paths) is None, message="the expired leader record to vanish")
    successor = LeaderFence(zk, paths)
    successor.claim({"id": "successor"})
    with pytest.raises(Exception) as info:
        fence.write(lambda t: t.create(paths.queue("from-the-grave"), b"{}"))
    assert isinstance(info.value, (FencedError, ZooKeeperUnavailableError, RequestTimeoutError)) \
        or "Session" in type(info.value).__name__ \
        or "Connection" in type(info.value).__name__
    assert not zk.exists(paths.queue("from-the-grave"))
    stop_client(victim)


def test_paused_leader_is_fenced_and_rejoins_as_backup(config, zk, paths, procs):
    procs.gcm("gcm-a")
    procs.gcm("gcm-b")
    old = wait_until(lambda: leader(zk, paths), message="a leader")
    wait_until(lambda: len(zk.get_children(paths.election)) == 2, message="both contending")
    victim = next(n for n, p in procs.procs.items() if p.pid == old["pid"])
    procs.kill(victim, signal.SIGSTOP)  # like `docker pause`
    new = wait_until(lambda: (led := leader(zk, paths)) and led["id"] != old["id"] and led, timeout=15,
                     message="a backup to take over from the paused leader")
    with Admin(config) as admin:
        admin.create_queue("after-pause")
    procs.kill(victim, signal.SIGCONT)
    with Admin(config) as admin:
        wait_until(lambda: admin.request(old["endpoint"], "ping", {}, timeout=2)["leader"] is False,
                   timeout=15, message="the old leader to step down")
        # Contending again means its new session is up: until then it answers zookeeper_unavailable.
        wait_until(lambda: len(zk.get_children(paths.election)) == 2, timeout=15,
                   message="the old leader to contend again")
        with pytest.raises(NotLeaderError):
            admin.request(old["endpoint"], "queue.create", {"name": "by-old"}, timeout=5)
        assert leader(zk, paths)["id"] == new["id"]
        assert int(zk.get(paths.epoch)[0]) == new["epoch"]
        assert [q["name"] for q in admin.list_queues()] == ["after-pause"]


def test_control_api_survives_bad_input(config, zk, paths, procs):
    procs.gcm("gcm-a")
    endpoint = wait_until(lambda: leader(zk, paths), message="a leader")["endpoint"]
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)

    def ask(*frames: bytes):
        sock.send_multipart(list(frames))
        assert sock.poll(5000), "no reply: the GCM went silent"
        return decode_reply(sock.recv())

    try:
        garbage = [b"", b"\xc1\xc1", b"not msgpack at all", msgpack.packb([1, 2, 3]),
                   msgpack.packb({"v": 99, "id": 1, "op": "queue.list"}),
                   msgpack.packb({"v": 1, "id": "x", "op": "queue.list"}),
                   msgpack.packb({"v": 1, "id": 2, "op": 42}),
                   msgpack.packb({"v": 1, "id": 3, "op": "queue.list", "args": []})]
        for frame in garbage:
            reply = ask(frame)
            assert not reply.ok and reply.code == "malformed", (frame, reply)
        assert ask(b"a", b"b").code == "malformed"  # two frames in one message
        cases = [("no.such.op", {}, UnknownCommandError.code),
                 ("queue.create", {"name": "bad name!"}, InvalidNameError.code),
                 ("queue.create", {"name": "../etc"}, InvalidNameError.code),
                 ("queue.create", {"name": "ok", "exchanges": 0}, UserError.code),
                 ("queue.create", {"name": "ok", "exchanges": "many"}, UserError.code),
                 ("queue.create", {"name": "ok", "colour": "red"}, UserError.code),
                 ("queue.create", {}, UserError.code),
                 ("queue.describe", {"name": "missing"}, QueueNotFoundError.code),
                 ("queue.delete", {"name": "missing"}, QueueNotFoundError.code)]
        for i, (op, args, code) in enumerate(cases):
            reply = ask(encode_request(100 + i, op, args))
            assert not reply.ok and reply.code == code and reply.id == 100 + i, (op, args, reply)
        ok = ask(encode_request(7, "queue.create", {"name": "good"}))
        assert ok.ok and ok.result["name"] == "good"
        dup = ask(encode_request(8, "queue.create", {"name": "good"}))
        assert dup.code == QueueExistsError.code
        assert procs.procs["gcm-a"].poll() is None
    finally:
        sock.close()
        context.term()


def test_queue_lifecycle_and_scaling(config, zk, paths, procs):
    procs.gcm("gcm-a")
    procs.hcm("host-1")
    procs.hcm("host-2")
    wait_until(lambda: leader(zk, paths) and len(read_hosts(zk, paths)) == 2, message="leader and hosts")
    with Admin(config) as admin:
        info = admin.create_queue("orders", exchanges=2)
        assert sorted(x["host"] for x in info["exchanges"]) == ["host-1", "host-2"]  # spread over hosts
        wait_until(lambda: all(x.live for x in read_exchanges(zk, paths, "orders")), message="exchanges live")
        admin.scale_queue("orders", 3)
        wait_until(lambda: len([x for x in read_exchanges(zk, paths, "orders") if x.live]) == 3,
                   message="the third exchange live")
        admin.scale_queue("orders", 1)
        wait_until(lambda: [x.id for x in read_exchanges(zk, paths, "orders")] == ["x1"], message="scaled in")
        admin.delete_queue("orders")
        assert admin.list_queues() == []
        wait_until(lambda: not zk.exists(paths.live_queue("orders")) or not zk.get_children(paths.live_queue("orders")),
                   message="exchanges stopped")
        for host in ("host-1", "host-2"):
            assert zk.get_children(paths.host_assignments(host)) == []


# ------------------------------------------------------------------ names, retries, deadlines


def test_names_with_a_trailing_newline_are_refused_at_once(config, zk, paths, procs):
    procs.gcm("gcm-a")
    wait_until(lambda: leader(zk, paths), message="a leader")
    with Admin(config) as admin:
        started = time.monotonic()
        for name in ("abc\n", "abc\r", "abc\r\n", "abc ", "abc\t"):
            with pytest.raises(InvalidNameError):  # not ZooKeeper's BadArguments, retried for 10 s
                admin.create_queue(name)
        record_figures("5 creates of names with trailing whitespace", refused_in_s=round(time.monotonic() - started, 3))
        assert admin.list_queues() == []
    assert zk.get_children(paths.queues) == []


def test_parallel_creates_with_short_attempts_all_succeed(config, zk, paths, procs):
    """8 creators, each its own Admin: attempts time out while requests queue at the GCM, and the
    retries carry the key of an attempt the leader may already have applied."""
    procs.gcm("gcm-a")
    wait_until(lambda: leader(zk, paths), message="a leader")
    impatient = config.replace(client={"attempt_timeout": 0.15})
    workers, per_worker = 8, 16
    results: dict[str, dict] = {}
    errors: list[tuple[str, Exception]] = []

    def create_many(worker: int) -> None:
        with Admin(impatient) as admin:
            for i in range(per_worker):
                name = f"w{worker}-q{i}"
                try:
                    results[name] = admin.create_queue(name)
                except Exception as exc:  # reported below, with the queue it happened to
                    errors.append((name, exc))

    started = time.monotonic()
    threads = [threading.Thread(target=create_many, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    took = time.monotonic() - started
    answered_retries = procs.logs["gcm-a"].read_text().count("was applied before: answering the retry")
    record_figures("8 parallel creators, attempt_timeout 0.15 s", queues=len(results), seconds=round(took, 1),
                   retries_answered_from_keys=answered_retries)
    assert errors == []
    assert all(info["name"] == name for name, info in results.items()) and len(results) == workers * per_worker
    assert sorted(zk.get_children(paths.queues)) == sorted(results)


def test_a_retried_write_is_applied_once_even_after_a_failover(config, zk, paths, procs):
    procs.gcm("gcm-a")
    procs.gcm("gcm-b")
    first = wait_until(lambda: leader(zk, paths), message="a leader")
    wait_until(lambda: len(zk.get_children(paths.election)) == 2, message="both GCMs contending")
    create = {"name": "orders", "exchanges": 2}
    key = uuid.uuid4().hex
    with Admin(config) as admin:
        assert admin.request(first["endpoint"], "queue.create", create, 5, key)["name"] == "orders"
        again = admin.request(first["endpoint"], "queue.create", create, 5, key)
        assert again["name"] == "orders" and [x["id"] for x in again["exchanges"]] == ["x1", "x2"]
        with pytest.raises(QueueExistsError):  # another call
            admin.request(first["endpoint"], "queue.create", create, 5, uuid.uuid4().hex)
        with pytest.raises(QueueExistsError):  # an old client, without a key
            admin.request(first["endpoint"], "queue.create", create, 5)
        with pytest.raises(UserError, match="already used"):  # a key reused for another change
            admin.request(first["endpoint"], "queue.delete", {"name": "orders"}, 5, key)
        scale_key = uuid.uuid4().hex
        assert len(admin.request(first["endpoint"], "queue.scale", {"name": "orders", "exchanges": 3}, 5,
                                 scale_key)["exchanges"]) == 3
        assert zk.exists(paths.request(key)) and zk.exists(paths.request(scale_key))

        victim = next(n for n, p in procs.procs.items() if p.pid == first["pid"])
        procs.kill(victim, signal.SIGKILL)
        new = wait_until(lambda: (led := leader(zk, paths)) and led["id"] != first["id"] and led, timeout=15,
                         message="a backup to take over")
        # The keys live in ZooKeeper: the new leader recognises retries of its predecessor's writes.
        assert admin.request(new["endpoint"], "queue.create", create, 5, key)["name"] == "orders"
        assert len(admin.request(new["endpoint"], "queue.scale", {"name": "orders", "exchanges": 3}, 5,
                                 scale_key)["exchanges"]) == 3
        delete_key = uuid.uuid4().hex
        for _ in range(2):
            assert admin.request(new["endpoint"], "queue.delete", {"name": "orders"}, 5, delete_key) == \
                {"name": "orders", "deleted": True}
        with pytest.raises(QueueNotFoundError):
            admin.request(new["endpoint"], "queue.delete", {"name": "orders"}, 5, uuid.uuid4().hex)
        assert admin.list_queues() == []


def test_writes_that_waited_past_the_deadline_are_refused_and_change_nothing(config, zk, paths, procs):
    """A burst of slow creates (64 exchanges each) on one socket: the GCM stamps them all at arrival,
    serves what it can within the deadline and refuses the rest unapplied."""
    from gcm.api import REQUEST_DEADLINE
    procs.gcm("gcm-a")
    endpoint = wait_until(lambda: leader(zk, paths), message="a leader")["endpoint"]
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    burst = 200
    try:
        for i in range(burst):
            sock.send(encode_request(i, "queue.create", {"name": f"b{i}", "exchanges": 64}, uuid.uuid4().hex))
        replies = {}
        while len(replies) < burst:
            assert sock.poll(30_000), f"the GCM answered {len(replies)} of {burst} requests"
            reply = decode_reply(sock.recv())
            replies[reply.id] = reply
    finally:
        sock.close()
        context.term()
    applied = sorted(f"b{i}" for i, r in replies.items() if r.ok)
    refused = [r for r in replies.values() if not r.ok]
    record_figures(f"burst of {burst} creates of 64 exchanges, deadline {REQUEST_DEADLINE} s",
                   applied=len(applied), refused=len(refused))
    assert refused and all(r.code == "unavailable" for r in refused), {r.code for r in refused}
    assert any("waited" in r.message for r in refused)
    assert sorted(zk.get_children(paths.queues)) == applied  # a refused create left nothing behind


def test_request_keys_are_recorded_with_the_write_and_bounded(config, zk, paths):
    from kazoo.exceptions import NodeExistsError

    from roq.zk import ensure_base_paths
    ensure_base_paths(zk, paths)
    fence = LeaderFence(zk, paths)
    fence.claim({"id": "me"})
    keys = [uuid.uuid4().hex for _ in range(25)]

    def create(i: int, key: str) -> None:
        with serving(RequestContext(time.monotonic() + 5, "queue.create", key, f"q{i}")):
            fence.write(lambda txn: txn.create(paths.queue(f"q{i}"), b"{}"))

    for i, key in enumerate(keys):
        create(i, key)
    assert sorted(zk.get_children(paths.requests)) == sorted(keys)
    failed_key = uuid.uuid4().hex
    with pytest.raises(NodeExistsError):
        create(0, failed_key)  # q0 exists: the transaction fails as a whole, its key with it
    assert not zk.exists(paths.request(failed_key))
    assert fence.prune_keys(keep=20) == 0  # not yet twice as many as kept
    assert fence.prune_keys(keep=10) == 15
    assert sorted(zk.get_children(paths.requests)) == sorted(keys[-10:])  # the newest stay
