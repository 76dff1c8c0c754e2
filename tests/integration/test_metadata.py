"""The metadata conversation (docs/protocol.md section 8) against real GCMs and a real ZooKeeper:
any GCM answers, watches get versioned pushes, limits hold, ZooKeeper down changes nothing."""

from __future__ import annotations

import itertools

import pytest
import zmq

from roq.client import Publisher
from roq.client.admin import Admin
from roq.protocol import decode_reply, encode_request
from roq.protocol.metadata import decode_push
from roq.state import read_leader, read_live
from tests.integration.conftest import SharedCluster
from tests.support.helpers import wait_until, zookeeper_connections

pytestmark = pytest.mark.timeout(90)


class Conversation:
    """One DEALER connection to one GCM, speaking the wire protocol by hand."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.ids = itertools.count(1)
        self.pushes: list[dict] = []

    def call(self, op: str, **args):
        req_id = next(self.ids)
        self.sock.send(encode_request(req_id, op, args))
        while self.sock.poll(5000):
            frame = self.sock.recv()
            push = decode_push(frame)
            if push is not None:
                self.pushes.append(push)
                continue
            reply = decode_reply(frame)
            if reply.id == req_id:
                return reply
        raise AssertionError(f"no answer to {op}")

    def poll_pushes(self) -> list[dict]:
        while self.sock.poll(0):
            push = decode_push(self.sock.recv())
            if push is not None:
                self.pushes.append(push)
        return self.pushes

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def two_gcms(two_gcm_cluster: SharedCluster) -> list[str]:
    """The module's shared cluster, healthy again, and its GCMs' endpoints."""
    two_gcm_cluster.wait_healthy()
    return two_gcm_cluster.endpoints()


def test_any_gcm_answers_get_and_pushes_follow_a_scale_out(two_gcm_cluster, two_gcms):
    config, zk, paths = two_gcm_cluster.config, two_gcm_cluster.zk, two_gcm_cluster.paths
    leader = read_leader(zk, paths)["endpoint"]
    backup = next(e for e in two_gcms if e != leader)
    with Admin(config) as admin:
        admin.create_queue("q", exchanges=1)
    wait_until(lambda: len(read_live(zk, paths, "q")) == 1, timeout=15, message="exchange live")
    conv = Conversation(backup)
    try:
        # With its first report in: from then on only its figures move while nothing else changes.
        got = wait_until(lambda: (r := conv.call("metadata.get", queue="q")).ok and r.result["exchanges"]
                         and r.result["exchanges"]["x1"]["stats"] and r.result, message="backup answers")
        assert got["exists"] is True and got["leader"] == leader and sorted(got["gcms"]) == two_gcms
        assert set(got["exchanges"]["x1"]) >= {"pub", "sub", "replay", "incarnation", "stats"}
        missing = conv.call("metadata.get", queue="nope").result
        assert missing["exists"] is False and missing["exchanges"] == {}
        watch = conv.call("metadata.watch", queues=["q"]).result
        first = watch["queues"]["q"]["version"]
        assert watch["lease"] == config.gcm.metadata_lease and watch["gcm"] == got["gcm"]
        same = conv.call("metadata.watch", queues=["q"], version={"q": first}, gcm=watch["gcm"]).result
        assert same["queues"]["q"] == {"queue": "q", "version": first, "gcm": watch["gcm"], "unchanged": True}
        with Publisher("q", config):  # its exchange's statistics change (publishers 0 -> 1): no push
            wait_until(lambda: conv.call("metadata.get", queue="q").result["exchanges"]["x1"]["stats"]
                       .get("publishers") == 1, timeout=15, message="the GCM sees the publisher")
            with Admin(config) as admin:
                admin.call("queue.scale", name="q", exchanges=2)
            pushed = wait_until(lambda: [p for p in conv.poll_pushes() if len(p["exchanges"]) == 2], timeout=15,
                                message="a push with the new exchange")
        # Pushes go out in the order of the changes: a push for the statistics would come first. (A
        # push of the version the watch answered may come too, if the change it shows was numbered
        # by a request just before the push thread saw it: clients take only higher versions, 8.3.)
        newer = [p for p in conv.pushes if p["version"] > first]
        assert [len(p["exchanges"]) for p in newer[:newer.index(pushed[0]) + 1]] == [2]
        assert pushed[0]["version"] > first and pushed[0]["queue"] == "q"
        versions = [p["version"] for p in conv.pushes]
        assert versions == sorted(set(versions))  # increasing, never repeated
    finally:
        conv.close()


def test_a_queue_created_while_a_client_asks_is_found_not_refused(two_gcm_cluster, two_gcms):
    """A GCM's cache follows the leader's writes a few ms behind: `follow` waits NOT_FOUND_GRACE for
    the push that shows a queue the seed does not know yet, and only then says it does not exist."""
    import threading

    from roq.client.metadata import NOT_FOUND_GRACE, MetadataClient
    from roq.errors import QueueNotFoundError
    config = two_gcm_cluster.config
    with Admin(config) as admin:
        client = MetadataClient(config)
        try:
            creator = threading.Timer(NOT_FOUND_GRACE / 4, lambda: admin.create_queue("late-made", exchanges=1))
            creator.start()
            body = client.follow("late-made", lambda body: None, timeout=10)
            creator.join()
            assert body["exists"] is True, "the queue made during the grace is found"
            with pytest.raises(QueueNotFoundError):
                client.follow("never-made", lambda body: None, timeout=10)
        finally:
            client.close()


def test_bad_requests_and_limits(two_gcm_cluster, two_gcms):
    config = two_gcm_cluster.config
    conv = Conversation(two_gcms[0])
    try:
        wait_until(lambda: conv.call("metadata.get", queue="q").ok, message="cache read")
        for args, code in [({}, "bad_request"), ({"queue": 5}, "invalid_name"), ({"queue": "../x"}, "invalid_name"),
                           ({"queue": "q", "extra": 1}, "bad_request")]:
            reply = conv.call("metadata.get", **args)
            assert not reply.ok and reply.code == code, (args, reply)
        too_many = [f"q{i}" for i in range(config.gcm.metadata_max_queues + 1)]
        reply = conv.call("metadata.watch", queues=too_many)
        assert reply.code == "limit_exceeded" and "metadata_max_queues" in reply.message
        assert conv.call("metadata.watch", queues=["q"], version={"q": -1}).code == "bad_request"
        codes = [conv.call("metadata.get", queue="q").code or "ok" for _ in range(int(config.gcm.metadata_rate) * 3)]
        assert "limit_exceeded" in codes  # the connection's rate is bounded
        assert Conversation(two_gcms[0]).call("metadata.get", queue="q").ok  # another connection is not
    finally:
        conv.close()


def test_clients_open_no_zookeeper_session_and_skip_a_dead_seed(two_gcm_cluster, two_gcms, zookeeper):
    config, zk, paths = two_gcm_cluster.config, two_gcm_cluster.zk, two_gcm_cluster.paths
    from roq.client import Publisher, Subscriber
    with Admin(config) as admin:
        admin.create_queue("quiet", exchanges=2)
    wait_until(lambda: len(read_live(zk, paths, "quiet")) == 2, timeout=15, message="exchanges live")
    before = zookeeper_connections(zookeeper)
    # The third reserved seed has no GCM: first in the list, so every client meets it first.
    seeds = config.cluster.seeds.split(",")
    dead_first = config.replace(cluster={"seeds": ",".join([seeds[2], *seeds[:2]])})
    with Subscriber("quiet", dead_first, topics=["t"]) as sub, Publisher("quiet", dead_first) as pub, \
            Admin(dead_first) as admin:
        assert admin.describe_queue("quiet")["name"] == "quiet"
        pub.wait_for_subscribers(1, timeout=15)
        for i in range(100):
            pub.publish("t", str(i).encode())
        pub.flush(timeout=15)
        got = sorted(int(sub.receive(timeout=10).payload) for _ in range(100))
        assert got == list(range(100))
        assert zookeeper_connections(zookeeper) <= before


# Last in the module: it stops the shared ZooKeeper for a moment.
def test_zookeeper_down_answers_from_the_last_view(two_gcm_cluster, two_gcms, zookeeper):
    config, zk, paths = two_gcm_cluster.config, two_gcm_cluster.zk, two_gcm_cluster.paths
    with Admin(config) as admin:
        admin.create_queue("down", exchanges=1)
    wait_until(lambda: len(read_live(zk, paths, "down")) == 1, timeout=15, message="exchange live")
    conv = Conversation(two_gcms[1])
    try:
        before = wait_until(lambda: (r := conv.call("metadata.get", queue="down")).ok and r.result["exchanges"]
                            and r.result, message="answered")
        zookeeper.stop()
        try:
            during = conv.call("metadata.get", queue="down")
            assert during.ok and during.result["exchanges"].keys() == before["exchanges"].keys()
        finally:
            zookeeper.start()
    finally:
        conv.close()
