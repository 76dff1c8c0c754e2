"""The leader's cache of the tree (gcm.cache) and the fence as the one writer, against a real ZooKeeper."""

from __future__ import annotations

import time
import uuid

import pytest
from kazoo.client import KazooClient

from gcm.cache import ClusterCache
from gcm.fence import LeaderFence, RequestContext, serving
from roq.errors import FencedError, UnavailableError
from roq.state import read_hosts, read_live, read_queue
from roq.zk import create_ephemeral, encode, ensure_base_paths, start_client, stop_client
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration

FOLLOW_DEADLINE = 5.0  # seconds for a change by another client to show in the cache


def counting_reads(client: KazooClient) -> list[str]:
    """Record every read the client sends from now on (the async calls every read goes through)."""
    sent: list[str] = []
    for name in ("get_async", "get_children_async", "exists_async"):
        call = getattr(client, name)
        setattr(client, name, lambda *a, _call=call, _name=name, **k: (sent.append(_name), _call(*a, **k))[1])
    return sent


@pytest.fixture
def leader(config, zk, paths):
    ensure_base_paths(zk, paths)
    fence = LeaderFence(zk, paths)
    fence.claim({"id": "leader"})
    return fence, ClusterCache(zk, paths, fence)


def test_a_deposed_leaders_ensure_path_is_refused_by_the_fence(config, zk, paths):
    ensure_base_paths(zk, paths)
    other = start_client(config)
    try:
        old, new = LeaderFence(zk, paths), LeaderFence(other, paths)
        old.claim({"id": "old"})
        old.ensure_path(paths.host_assignments("made-while-leader"))
        assert zk.exists(paths.host_assignments("made-while-leader"))
        new.claim({"id": "new"})
        doomed = f"{paths.live}/by-old/deeper"
        with pytest.raises(FencedError):
            old.ensure_path(doomed)
        assert not zk.exists(f"{paths.live}/by-old")  # no parent either: one transaction, refused whole
        old.ensure_path(paths.host_assignments("made-while-leader"))  # there already: nothing to write
        new.ensure_path(doomed)  # the new leader makes it, parents included
        assert zk.exists(doomed)
        new.ensure_path(doomed)
    finally:
        stop_client(other)


def test_ensure_path_neither_spends_the_request_key_nor_waits_for_its_deadline(config, zk, paths):
    ensure_base_paths(zk, paths)
    fence = LeaderFence(zk, paths)
    fence.claim({"id": "me"})
    key = uuid.uuid4().hex
    with serving(RequestContext(time.monotonic() + 5, "queue.create", key, "q")) as request:
        fence.ensure_path(paths.host_assignments("h1"))
        assert not request.recorded and not zk.exists(paths.request(key))
        fence.write(lambda txn: txn.create(paths.queue("q"), b"{}"))
    assert zk.exists(paths.request(key))  # recorded with the change the client asked for
    with serving(RequestContext(time.monotonic() - 1, "queue.create", uuid.uuid4().hex, "r")):
        with pytest.raises(UnavailableError):
            fence.write(lambda txn: txn.create(paths.queue("r"), b"{}"))  # past its deadline: not sent
        fence.ensure_path(paths.live_queue("q"))  # an empty directory is no change: made late all the same
    assert zk.exists(paths.live_queue("q")) and not zk.exists(paths.queue("r"))


def test_the_cache_follows_other_clients_within_a_deadline(config, zk, paths, leader):
    _, cache = leader
    assert read_hosts(cache, paths) == {}
    hcm = start_client(config)
    try:
        started = time.monotonic()
        create_ephemeral(hcm, paths.host("h1"), {"address": "10.0.0.1", "capacity": 4})
        wait_until(lambda: "h1" in read_hosts(cache, paths), timeout=FOLLOW_DEADLINE, message="the host in the cache")
        assert read_hosts(cache, paths)["h1"].capacity == 4
        create_ephemeral(hcm, paths.live_exchange("q", "x1"), {"pub": "tcp://a:1", "stats": {"msgs_in": 1}})
        wait_until(lambda: read_live(cache, paths, "q").get("x1", {}).get("stats") == {"msgs_in": 1},
                   timeout=FOLLOW_DEADLINE, message="the exchange live in the cache")
        hcm.set(paths.live_exchange("q", "x1"), encode({"pub": "tcp://a:1", "stats": {"msgs_in": 2}}))
        wait_until(lambda: read_live(cache, paths, "q")["x1"]["stats"] == {"msgs_in": 2},
                   timeout=FOLLOW_DEADLINE, message="the new statistics in the cache")
        followed = time.monotonic() - started
    finally:
        stop_client(hcm)  # its ephemeral znodes go with its session
    wait_until(lambda: read_hosts(cache, paths) == {} and read_live(cache, paths, "q") == {},
               timeout=FOLLOW_DEADLINE, message="the host and the exchange gone from the cache")
    print(f"three changes by another client followed in {followed:.3f}s")
    reads = counting_reads(zk)
    for _ in range(100):
        read_hosts(cache, paths)
        read_live(cache, paths, "q")
    assert reads == []  # read from memory: ZooKeeper is not asked


def test_the_leader_reads_its_own_writes_at_once(config, zk, paths, leader):
    fence, cache = leader
    assert read_queue(cache, paths, "orders") is None
    for attempt in range(20):  # no polling below: each read must show the write just committed
        name = f"orders{attempt}"
        queue, exchanges, x1 = paths.queue(name), paths.exchanges(name), paths.exchange(name, "x1")
        settings = encode({"n": attempt})
        fence.write(lambda txn, q=queue, xs=exchanges, x=x1, s=settings: (
            txn.create(q, s), txn.create(xs, b""), txn.create(x, encode({"host": "h1"}))))
        info = read_queue(cache, paths, name)
        assert info is not None and info.settings == {"n": attempt}
        assert [(x.id, x.host) for x in info.exchanges] == [("x1", "h1")]
        fence.write(lambda txn, x=x1: txn.set_data(x, encode({"host": "h2"})))
        assert [x.host for x in read_queue(cache, paths, name).exchanges] == ["h2"]
        fence.write(lambda txn, q=queue, xs=exchanges, x=x1: (txn.delete(x), txn.delete(xs), txn.delete(q)))
        assert read_queue(cache, paths, name) is None


def test_a_new_term_and_a_lost_session_build_the_cache_again(config, zk, paths):
    ensure_base_paths(zk, paths)
    client = start_client(config)
    try:
        fence = LeaderFence(client, paths)
        cache = ClusterCache(client, paths, fence)
        fence.claim({"id": "first"})
        assert read_hosts(cache, paths) == {} and cache.builds == 1
        fence.release()
        fence.claim({"id": "second"})
        create_ephemeral(zk, paths.host("h1"), {"capacity": 1})
        assert "h1" in read_hosts(cache, paths) and cache.builds == 2  # built anew, not carried over

        # Expire the session (kazoo's test harness does it this way): watches are gone with it, and
        # a change made meanwhile must show once the client is back.
        session_id, password = client.client_id
        twin = KazooClient(hosts=config.zk.hosts, client_id=(session_id, password))
        twin.start()
        twin.stop()
        twin.close()
        zk.delete(paths.host("h1"))
        create_ephemeral(zk, paths.host("h2"), {"capacity": 2})
        wait_until(lambda: client.connected and client.client_id[0] != session_id, timeout=15,
                   message="a new session")
        hosts = wait_until(lambda: read_hosts(cache, paths), timeout=FOLLOW_DEADLINE, message="the cache read again")
        assert set(hosts) == {"h2"} and cache.builds == 3
    finally:
        stop_client(client)
