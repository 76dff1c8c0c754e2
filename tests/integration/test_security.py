"""Security, against real processes: CURVE at every endpoint, admin rights on the control API,
ZooKeeper ACLs, and the limits (connections per client, queues, message size, topic length).

A refusal is observed positively, never by waiting for nothing to happen: the refused client's
socket monitor reports the failed handshake, and the server counts it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from roq import protocol
from roq.client import Admin, Publisher
from roq.config import Config
from roq.errors import ForbiddenError, InvalidNameError, LimitExceededError, MessageTooLargeError, RefusedError
from roq.paths import Paths
from roq.security import generate_keys
from roq.state import read_hosts, read_leader, read_live
from roq.zk import start_client, stop_client
from tests.conftest import failed
from tests.support.helpers import OK, REFUSED, Processes, carry, fast_config, handshake, record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

DAEMON_ZK = "roq:daemon-secret"
READER_ZK = "reader:reader-secret"


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    generate_keys(tmp_path / "keys", clients=["app"], admins=["ops"])
    return tmp_path / "keys"


@pytest.fixture
def daemon_config(zookeeper, keys_dir: Path) -> Config:
    return fast_config(zookeeper.connect_string).replace(
        security={"curve": True, "keys_dir": str(keys_dir)},
        zk={"auth": DAEMON_ZK, "readers": READER_ZK})


def as_client(daemon_config: Config, identity: str) -> Config:
    """What a publisher, subscriber or admin tool holds: a reader identity and its own key."""
    return daemon_config.replace(zk={"auth": READER_ZK, "readers": ""}, security={"identity": identity})


@pytest.fixture
def secure_cluster(daemon_config: Config, tmp_path: Path, request: pytest.FixtureRequest
                   ) -> Iterator[Processes]:
    """One GCM and one HCM with CURVE and ZooKeeper ACLs on; a queue `orders` with one exchange."""
    procs = Processes(daemon_config, tmp_path / "daemons")
    try:
        procs.start("gcm", "gcm-0")
        procs.start("hcm", "host-1", "hcm.host=host-1")
        zk = start_client(daemon_config)
        try:
            paths = Paths(daemon_config.zk.root)
            wait_until(lambda: read_leader(zk, paths) and read_hosts(zk, paths), timeout=20, message="cluster")
            with Admin(as_client(daemon_config, "admins/ops")) as admin:
                admin.create_queue("orders")
                admin.wait_running("orders", 1)
        finally:
            stop_client(zk)
        yield procs
    finally:
        procs.stop_all()
        if failed(request):
            print(procs.dump_logs())


def live_exchange(config: Config) -> dict:
    zk = start_client(config)
    try:
        return next(iter(read_live(zk, Paths(config.zk.root), "orders").values()))
    finally:
        stop_client(zk)


# ------------------------------------------------------------------ CURVE and roles


def test_clients_with_keys_publish_and_subscribe_admins_alone_change_the_cluster(
        secure_cluster: Processes, daemon_config: Config) -> None:
    client = as_client(daemon_config, "clients/app")
    assert carry("orders", client, client, 500) == [str(i).encode() for i in range(500)]

    with Admin(client) as admin:
        assert [q["name"] for q in admin.list_queues()] == ["orders"]  # reads are allowed
        assert admin.describe_queue("orders")["name"] == "orders"
        for attempt in (lambda: admin.create_queue("sneaky"), lambda: admin.delete_queue("orders"),
                        lambda: admin.scale_queue("orders", 3),
                        lambda: admin.queue_rules("orders", {"max_rate": 5})):
            with pytest.raises(ForbiddenError):
                attempt()
        info = admin.describe_queue("orders")
        assert [q["name"] for q in admin.list_queues()] == ["orders"] and len(info["exchanges"]) == 1
        assert not info.get("rules")


def test_unauthenticated_and_unknown_keys_are_refused_at_every_endpoint(
        secure_cluster: Processes, daemon_config: Config, keys_dir: Path) -> None:
    import zmq.auth
    server_key, _ = zmq.auth.load_certificate(str(keys_dir / "server.key"))
    stranger = zmq.curve_keypair()  # a valid CURVE key the cluster never saw
    live = live_exchange(daemon_config)
    zk = start_client(daemon_config)
    try:
        control = read_leader(zk, Paths(daemon_config.zk.root))["endpoint"]
    finally:
        stop_client(zk)
    client = as_client(daemon_config, "clients/app")
    endpoints = {"control": (control, zmq.DEALER), "publishers": (live["pub"], zmq.DEALER),
                 "subscribers": (live["sub"], zmq.SUB), "replay": (live["replay"], zmq.DEALER)}
    for name, (endpoint, kind) in endpoints.items():
        assert handshake(endpoint, kind) == REFUSED, f"{name}: a client without CURVE got in"
        assert handshake(endpoint, kind, keypair=stranger, server_key=server_key) == REFUSED, \
            f"{name}: an unknown key got in"
        assert handshake(endpoint, kind, config=client) == OK, f"{name}: a known client key was refused"

    # Counted by the exchange; nothing crashed; the cluster still serves its clients.
    wait_until(lambda: live_exchange(daemon_config)["stats"].get("refused_connections", 0) >= 6, timeout=10,
               message="the exchange to report the refused handshakes")
    assert all(p.poll() is None for p in secure_cluster.procs.values())
    with Admin(as_client(daemon_config, "admins/ops")) as admin:
        assert admin.describe_queue("orders")["name"] == "orders"


def test_a_client_key_added_later_is_admitted_without_restarts(
        secure_cluster: Processes, daemon_config: Config, keys_dir: Path) -> None:
    generate_keys(keys_dir, clients=["late"])
    with Admin(as_client(daemon_config, "clients/late")) as admin:
        assert [q["name"] for q in admin.list_queues()] == ["orders"]


def test_missing_keys_are_a_clear_error_before_connecting(daemon_config: Config, tmp_path: Path) -> None:
    from roq.errors import ConfigError
    with pytest.raises(ConfigError, match="clients/nobody.key_secret"):
        Publisher("orders", as_client(daemon_config, "clients/nobody"))
    with pytest.raises(ConfigError, match="not a directory"):
        Admin(daemon_config.replace(security={"keys_dir": str(tmp_path / "absent")}))


# ------------------------------------------------------------------ ZooKeeper ACLs


def test_zookeeper_state_is_closed_to_clients_without_credentials(
        secure_cluster: Processes, daemon_config: Config) -> None:
    paths = Paths(daemon_config.zk.root)
    hosts = daemon_config.zk.hosts

    def connect(*auth: str) -> KazooClient:
        client = KazooClient(hosts=hosts, auth_data=[("digest", a) for a in auth] or None)
        client.start(timeout=10)
        return client

    anonymous, reader, impostor = connect(), connect(READER_ZK), connect("reader:wrong-password")
    try:
        for client in (anonymous, impostor):
            for read in (lambda c: c.get_children(paths.queues), lambda c: c.get(paths.leader),
                         lambda c: c.get_children(paths.live_queue("orders")), lambda c: c.get(paths.hosts)):
                with pytest.raises(NoAuthError):
                    read(client)
        for client in (anonymous, impostor, reader):
            for write in (lambda c: c.create(paths.queue("evil"), b"{}"),
                          lambda c: c.set(paths.queue("orders"), b"{}"),
                          lambda c: c.delete(paths.exchange("orders", "x1")),
                          lambda c: c.create(paths.live_exchange("orders", "x9"), b"{}")):
                with pytest.raises(NoAuthError):
                    write(client)
        assert reader.get_children(paths.queues) == ["orders"]  # the reader identity reads
        assert reader.get_children(paths.live_queue("orders")) == ["x1"]
    finally:
        for client in (anonymous, reader, impostor):
            client.stop()
            client.close()


# ------------------------------------------------------------------ limits


@pytest.fixture
def limited_exchange(zookeeper) -> Iterator[dict]:
    """An exchange process on its own, allowing 3 connections per client address and socket."""
    config = fast_config(zookeeper.connect_string).replace(
        security={"max_connections_per_client": 3}, exchange={"max_message_bytes": 1024, "max_batch_bytes": 65536})
    proc = subprocess.Popen([sys.executable, "-m", "exchange.main", "--queue", "limits", "--id", "x1",
                             "--config-stdin", "--no-watch-stdin"],
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(config.to_json().encode() + b"\n")
    proc.stdin.close()
    ready = json.loads(proc.stdout.readline())
    assert ready["event"] == "ready"
    stats: list[dict] = []
    threading.Thread(target=lambda: [stats.append(json.loads(line)) for line in proc.stdout],
                     daemon=True).start()
    yield dict(ready, stats=stats, proc=proc)
    proc.kill()
    proc.wait()


def test_connections_per_client_are_capped(limited_exchange: dict) -> None:
    context = zmq.Context.instance()
    held = []
    try:
        for _ in range(3):
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            sock.connect(limited_exchange["pub"])
            assert monitor.poll(10_000), "one of the first 3 connections did not get in"
            monitor.close()
            held.append(sock)
        assert handshake(limited_exchange["pub"]) == REFUSED  # the 4th from this address
        assert handshake(limited_exchange["sub"], zmq.SUB) == OK  # the limit is per socket
        held.pop().close()
        wait_until(lambda: handshake(limited_exchange["pub"]) == OK, timeout=10,
                   message="a freed connection slot to be usable again")
        wait_until(lambda: any(s.get("refused_over_limit", 0) >= 1 for s in limited_exchange["stats"]),
                   timeout=10, message="the exchange to count the refusal")
        assert limited_exchange["proc"].poll() is None
    finally:
        for sock in held:
            sock.close()


def test_an_admin_over_the_gcm_connection_limit_is_refused_at_once(config: Config, zk, paths, procs,
                                                                   tmp_path: Path) -> None:
    procs.start("gcm", "gcm-0", "security.max_connections_per_client=3")
    endpoint = wait_until(lambda: read_leader(zk, paths), message="a leader")["endpoint"]
    context = zmq.Context()
    held = []
    try:
        for i in range(5):  # 3 get in, 2 are refused (and keep trying in the background)
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            if i < 3:
                monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            sock.connect(endpoint)
            if i < 3:
                assert monitor.poll(10_000), "one of the first 3 connections did not get in"
                monitor.close()
            held.append(sock)
        assert handshake(endpoint) == REFUSED
        with Admin(config) as admin:
            started = time.monotonic()
            with pytest.raises(RefusedError, match="refused the connection") as info:
                admin.list_queues()  # used to retry in silence until client.request_timeout (10 s)
            refused_after = time.monotonic() - started
            assert endpoint in str(info.value) and "max_connections_per_client" in str(info.value)
            cli_config = tmp_path / "client.toml"
            cli_config.write_text(config.to_toml())
            result = subprocess.run([sys.executable, "-m", "roq.cli", "--config", str(cli_config), "queue", "list"],
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode == 5 and "refused the connection" in result.stderr, (result.returncode,
                                                                                          result.stderr)
            record_figures("admin call over the GCM's connection limit", refused_after_s=round(refused_after, 3))
            for sock in held:
                sock.close()
            held.clear()
            assert wait_until(lambda: admin.list_queues() == [], timeout=10,
                              message="the admin to get in once the connections closed")
    finally:
        for sock in held:
            sock.close()
        context.term()


def test_message_size_and_topic_length_are_enforced(limited_exchange: dict, config: Config) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(limited_exchange["pub"])
    try:
        token = b"limits".ljust(16, b".")
        pid = protocol.publisher_id_for(token)
        sock.send(protocol.encode_hello(pid, token, 1))
        assert sock.poll(5000) and msgpack.unpackb(sock.recv())[0] == "welcome"
        sock.send(protocol.encode_batch(pid, 1, 0, [b"t", b"x" * 1025, b"t" * 256, b"ok", b"t", b"fine"]))
        replies = []
        while len(replies) < 3 and sock.poll(5000):
            replies.append(msgpack.unpackb(sock.recv()))
        assert {r[2]: r[3] for r in replies if r[0] == "reject"} == {1: "too_large", 2: "invalid_name"}
        assert ["ack", protocol.DATA_VERSION, 3] == [replies[-1][0], replies[-1][1], replies[-1][2]]
        sock.send(b"\x00" * 70_000)  # above max_batch_bytes: libzmq drops the connection, nothing else
        sock.send(protocol.encode_batch(pid, 4, 0, [b"t", b"after"]))
    finally:
        sock.close()
    assert handshake(limited_exchange["pub"]) == OK and limited_exchange["proc"].poll() is None
    # The client library refuses the same before anything leaves (config: 1 MiB messages, 255-byte topics).
    from roq.names import check_topic
    with pytest.raises(InvalidNameError):
        check_topic(b"t" * 256)
    assert check_topic(b"t" * 255)


def test_queue_count_is_capped(config: Config, zk, paths, procs) -> None:
    from tests.integration.conftest import start_cluster
    start_cluster(procs, zk, paths, gcm_settings=("gcm.max_queues=2",))
    with Admin(config) as admin:
        admin.create_queue("one")
        admin.create_queue("two")
        with pytest.raises(LimitExceededError, match="gcm.max_queues"):
            admin.create_queue("three")
        assert sorted(q["name"] for q in admin.list_queues()) == ["one", "two"]
        admin.delete_queue("one")
        admin.create_queue("three")  # room again
    with Publisher("two", config) as pub, pytest.raises(MessageTooLargeError):
        pub.publish("t", b"x" * (config.exchange.max_message_bytes + 1))
