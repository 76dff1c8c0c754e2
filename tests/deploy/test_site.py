"""site.yml run for real against three systemd containers standing in for EC2 hosts.

node1..3 run the ZooKeeper ensemble, node1 and node2 the GCMs, node2 and node3 the HCMs
(node2 runs all three, as a small cluster would). The playbook must succeed, change
nothing the second time, leave a quorum with the right ids and configurations
pointing at the whole ensemble, and a cluster that carries 1000 messages from a
publisher to a subscriber on this machine with none lost. The web console (roq-web)
runs beside each GCM, over HTTPS with a certificate of the cluster's console CA, and
answers no API call without a token. A changed checkout is then deployed over it: RoQ
is reinstalled, its daemons (not ZooKeeper) restart, and the cluster carries messages
again.

On failure the playbook's output and the hosts' journals for the RoQ units are
printed; the containers and their network are removed in every case. Without a
Docker engine, the host image or the wheelhouse the test is skipped locally and
fails in CI (`make deploy-images` makes the last two).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import ssl
import stat
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.config import Config, load_config
from roq.tools.zkserver import four_letter
from tests.conftest import docker_engine, failed, unavailable
from tests.deploy.conftest import ANSIBLE, recaps, run_playbook
from tests.deploy.hosts import IMAGE, UNITS, SystemdHosts
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

GROUPS = {"zookeeper": ("node1", "node2", "node3"), "gcm": ("node1", "node2"), "hcm": ("node2", "node3")}
NODES = GROUPS["zookeeper"]
WHEELHOUSE = ANSIBLE / ".build" / "wheelhouse"  # roq_wheelhouse's default
CLIENTS = ANSIBLE / ".build" / "clients"  # roq_clients_local's default: one configuration per key
WEB_TOKEN = ANSIBLE / ".build" / "credentials" / "web-admin.token"  # the console's admin token
WEB_CA = ANSIBLE / ".build" / "keys" / "web" / "ca.crt"  # the console CA, which signs every GCM host's certificate
WEB_PORT = 8443
MESSAGES = 1000


WHAT = "the deployment test"


def docker_client() -> Any:
    client = docker_engine(IMAGE, WHAT, "`make deploy-images` makes both")
    if shutil.which("docker") is None:  # Ansible's docker connection drives the CLI
        unavailable("the docker command is missing", WHAT)
    # Built once by `make deploy-images`, as on a controller: the test itself fetches nothing.
    if not list(WHEELHOUSE.glob("kazoo-*.whl")):
        unavailable(f"no dependencies in {WHEELHOUSE}; `make deploy-images` fetches them", WHAT)
    return client


@dataclass
class Deployment:
    hosts: SystemdHosts
    inventory: Path
    first_run: dict[str, dict[str, int]]
    first_run_s: float

    @property
    def zk_hosts(self) -> str:
        return ",".join(f"{self.hosts.ips[n]}:2181" for n in NODES)

    def client_config(self, identity: str) -> Config:
        """The configuration site.yml wrote for one key: the GCMs as seeds, CURVE on, and no ZooKeeper
        address or credential (clients never open a ZooKeeper session: issue 36)."""
        config = load_config(CLIENTS / f"{identity}.toml", env={})
        assert config.cluster.seeds and config.security.curve
        assert config.zk.hosts == Config().zk.hosts and not config.zk.auth, "a client file names no ZooKeeper"
        return config.replace(client={"request_timeout": 15.0})


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The hosts booted and site.yml run once on them; the tests below share that cluster."""
    hosts = SystemdHosts(docker_client())
    try:
        hosts.start(*NODES)
        inventory = write_inventory(hosts, tmp_path_factory.mktemp("deploy") / "inventory.json")
        try:
            recap, took = site(inventory)
        except BaseException:
            print(hosts.journals())
            raise
        yield Deployment(hosts, inventory, recap, took)
    finally:
        hosts.teardown()


@pytest.fixture(autouse=True)
def journals_on_failure(deployment: Deployment, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if failed(request):
        print(deployment.hosts.journals())


def write_inventory(hosts: SystemdHosts, path: Path) -> Path:
    """An inventory like the EC2 one: groups by role, each host's private address."""
    inventory = {"all": {
        "vars": {"ansible_connection": "community.docker.docker", "ansible_user": "root"},
        "hosts": {n: {"ansible_host": hosts.container_name(n), "private_ip": hosts.ips[n]} for n in NODES},
        "children": {group: {"hosts": {n: {} for n in members}} for group, members in GROUPS.items()},
    }}
    path.write_text(json.dumps(inventory, indent=2))  # JSON is YAML
    return path


def site(inventory: Path, *extra: str) -> tuple[dict[str, dict[str, int]], float]:
    """Run site.yml; the recap of every host, and how long it took."""
    started = time.monotonic()
    result = run_playbook("site.yml", str(inventory), *extra)
    took = time.monotonic() - started
    output = result.stdout[-6000:] + result.stderr[-2000:]
    recap = recaps(result)
    assert sorted(recap) == sorted(NODES), output
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in recap.values()), output
    return recap, took


def round_trip(deployment: Deployment, queue: str) -> dict[str, Any]:
    """A queue on both HCM hosts (made with the admin key), MESSAGES published and received with the
    client key, every one confirmed and received once."""
    hosts, config = deployment.hosts, deployment.client_config("app")
    with Admin(deployment.client_config("ops")) as admin:
        status = wait_until(lambda: (s := admin.status()) and len(s["hosts"]) == 2 and len(s["gcms"]) == 2 and s,
                            timeout=60, message="both GCMs and both HCM hosts registered")
        assert {h["name"]: h["address"] for h in status["hosts"]} == {n: hosts.ips[n] for n in GROUPS["hcm"]}
        admin.create_queue(queue, exchanges=2)
        info = admin.wait_running(queue, 2, timeout=60)
        assert sorted(x["host"] for x in info["exchanges"]) == sorted(GROUPS["hcm"])
    with Subscriber(queue, config) as sub, Publisher(queue, config) as pub:
        sub.wait_connected(2, timeout=30)
        pub.wait_for_subscribers(1, timeout=30)
        for i in range(MESSAGES):
            pub.publish("deploy", i.to_bytes(4, "big"))
        pub.flush(60)
        got = []
        while len(got) < MESSAGES:
            msg = sub.receive(timeout=15)
            assert msg is not None, f"stalled after {len(got)} of {MESSAGES} messages"
            got.append(int.from_bytes(msg.payload, "big"))
        extra = sub.receive(timeout=0.5)
        figures = {"sent": MESSAGES, "confirmed": pub.confirmed, "received": len(got),
                   "lost": len(set(range(MESSAGES)) - set(got)), "duplicated": len(got) - len(set(got)),
                   "extra": extra is not None, "gaps": sub.stats().gaps}
    assert figures == {"sent": MESSAGES, "confirmed": MESSAGES, "received": MESSAGES, "lost": 0,
                       "duplicated": 0, "extra": False, "gaps": 0}
    assert got == list(range(MESSAGES))  # one publisher: in order
    return figures


def invocations(hosts: SystemdHosts) -> dict[tuple[str, str], str]:
    """systemd's id of each run of each RoQ unit: a restart changes it."""
    return {(name, unit): hosts.exec(name, "systemctl", "show", "-p", "InvocationID", "--value", unit)
            for name in NODES for unit in UNITS}


def changed_checkout(into: Path, marker: str) -> Path:
    """A copy of this checkout whose roq package differs by one comment (same version)."""
    source = ANSIBLE.parent
    into.mkdir()
    for item in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(source / item, into / item)
    for package in ("roq", "gcm", "hcm", "exchange", "roq_web"):
        shutil.copytree(source / package, into / package, ignore=shutil.ignore_patterns("__pycache__"))
    with (into / "roq" / "__init__.py").open("a") as f:
        f.write(f"# {marker}\n")
    return into


def test_site_yml_succeeds_and_a_second_run_changes_nothing(deployment):
    assert all(r["changed"] > 0 for r in deployment.first_run.values()), deployment.first_run
    again, again_s = site(deployment.inventory)
    assert {h: r["changed"] for h, r in again.items()} == {n: 0 for n in NODES}, again
    record_figures("site.yml on 3 containers", first_run_s=round(deployment.first_run_s, 1),
                   second_run_s=round(again_s, 1))


def test_the_ensemble_has_every_member_with_its_id_and_a_quorum(deployment):
    hosts = deployment.hosts
    members = {i: hosts.ips[n] for i, n in enumerate(NODES, 1)}
    for i, name in enumerate(NODES, 1):
        assert hosts.read(name, "/var/lib/zookeeper/myid") == str(i)
        servers = re.findall(r"^server\.(\d+)=([\d.]+):2888:3888$", hosts.read(name, "/etc/zookeeper/roq-zoo.cfg"),
                             re.MULTILINE)
        assert {int(k): ip for k, ip in servers} == members
        assert hosts.exec(name, "systemctl", "is-active", "roq-zookeeper") == "active"

    def modes() -> list[str]:
        return sorted(re.search(r"Mode: (\w+)", four_letter(ip, 2181, "srvr"))[1] for ip in members.values())
    wait_until(lambda: modes() == ["follower", "follower", "leader"], timeout=90,
               message="one ZooKeeper leader and two followers")


def test_daemons_run_under_systemd_where_their_group_says(deployment, tmp_path):
    hosts = deployment.hosts
    for daemon in ("gcm", "hcm"):
        for name in NODES:
            state = hosts.exec(name, "systemctl", "is-active", f"roq-{daemon}", check=False)
            assert state == ("active" if name in GROUPS[daemon] else "inactive"), (name, daemon, state)
        for name in GROUPS[daemon]:
            assert hosts.exec(name, "systemctl", "is-enabled", f"roq-{daemon}") == "enabled"
            # RoQ itself reads the file: an unknown key or a bad value fails here.
            config = load_config(hosts.fetch(name, f"/etc/roq/{daemon}.toml", tmp_path), env={})
            assert config.zk.hosts == deployment.zk_hosts and config.zk.root == "/roq"
            assert getattr(config, daemon).advertise == hosts.ips[name]
            assert config.security.curve and config.zk.auth.startswith("roq:") and config.zk.readers
            # The file holds the ZooKeeper password: root and the service user only.
            assert hosts.exec(name, "stat", "-c", "%a %U %G", f"/etc/roq/{daemon}.toml") == "640 root roq"
            assert hosts.exec(name, "stat", "-c", "%a %U %G", "/etc/roq/keys/server.key_secret") == "640 root roq"
            assert hosts.exec(name, "ls", "/etc/roq/keys/clients") == "app.key"  # public halves only
            if daemon == "hcm":
                assert config.hcm.host == name


@dataclass
class Answer:
    status: int
    body: Any
    headers: Any


def console(hosts: SystemdHosts, name: str, path: str, token: str | None = None,
            body: dict[str, Any] | bytes | None = None) -> Answer:
    """One call to a GCM host's console, over HTTPS checked against the console CA and the host's
    address (no proxy); a body makes it a POST (a dict as JSON)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if isinstance(body, dict):
        body, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(f"https://{hosts.ips[name]}:{WEB_PORT}{path}", data=body, headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=WEB_CA)))
    try:
        with opener.open(request, timeout=15) as answer:
            return Answer(answer.status, json.load(answer), answer.headers)
    except urllib.error.HTTPError as error:
        return Answer(error.code, json.load(error), error.headers)


def test_the_web_console_serves_https_and_asks_for_a_token_on_each_gcm_host(deployment, tmp_path):
    """roq-web beside each GCM: HTTPS, a token for every API call, the admin token on the control
    machine only (the hosts hold its SHA-256), and the console's own admin key admitted by the GCMs
    and the exchanges."""
    hosts = deployment.hosts
    token = WEB_TOKEN.read_text().strip()
    assert stat.S_IMODE(WEB_TOKEN.stat().st_mode) == 0o600
    for name in NODES:
        state = hosts.exec(name, "systemctl", "is-active", "roq-web", check=False)
        assert state == ("active" if name in GROUPS["gcm"] else "inactive"), (name, state)
    # Every host admits the console's key; its secret half is only where the console runs.
    assert hosts.exec("node3", "ls", "/etc/roq/keys/admins").split() == ["ops.key", "web.key"]
    for name in GROUPS["gcm"]:
        assert hosts.exec(name, "systemctl", "is-enabled", "roq-web") == "enabled"
        config = load_config(hosts.fetch(name, "/etc/roq/web.toml", tmp_path), env={})
        assert (config.web.bind, config.web.port, config.web.auth) == ("0.0.0.0", WEB_PORT, True)
        assert config.web.tls_cert and config.security.curve and config.security.identity == "admins/web"
        assert config.cluster.seeds and not config.zk.auth  # the GCMs as seeds: no ZooKeeper identity at all
        for path in ("/etc/roq/web.toml", "/etc/roq/web-tokens", "/etc/roq/web/tls.key",
                     "/etc/roq/keys/admins/web.key_secret"):
            assert hosts.exec(name, "stat", "-c", "%a %U %G", path) == "640 root roq", path
        tokens = hosts.read(name, "/etc/roq/web-tokens")
        assert token not in tokens and f"admin admin {hashlib.sha256(token.encode()).hexdigest()}" in tokens

        session = wait_until(lambda n=name: console(hosts, n, "/api/session"), timeout=60,
                             message=f"the console of {name} to answer")  # it may still be starting
        assert (session.status, session.body) == (200, {"auth": True, "name": None, "role": None, "csrf": None})
        for wrong in (None, "not-a-token"):
            refused = console(hosts, name, "/api/cluster", wrong)
            assert (refused.status, refused.body["error"]) == (401, "unauthorized"), refused
        cluster = wait_until(lambda n=name: (a := console(hosts, n, "/api/cluster", token)).status == 200
                             and len(a.body["hosts"]) == 2 and a.body, timeout=60,
                             message=f"{name}'s view of the cluster")
        assert sorted(h["name"] for h in cluster["hosts"]) == list(GROUPS["hcm"]) and len(cluster["gcms"]) == 2

    # A browser's login: an HttpOnly cookie, Secure under TLS; the token never comes back.
    gateway = GROUPS["gcm"][0]
    login = console(hosts, gateway, "/api/session", body={"token": token})
    cookie = login.headers["Set-Cookie"].lower()
    assert login.status == 200 and login.body["role"] == "admin" and token not in json.dumps(login.body)
    assert all(flag in cookie for flag in ("httponly", "secure", "samesite=strict")), cookie
    # The console's admin key at work: a queue made through the leader, a message through its exchange.
    created = console(hosts, gateway, "/api/queues", token, body={"name": "console"})
    assert created.status == 201, created
    wait_until(lambda: console(hosts, gateway, "/api/queues/console", token).body.get("running") == 1, timeout=60,
               message="the console's queue running")
    published = console(hosts, gateway, "/api/queues/console/messages?topic=t", token, body=b"from the console")
    assert published.status == 200 and published.body["count"] == 1, published
    peeked = console(hosts, gateway, "/api/queues/console/peek?topic=t", token)
    assert [m["payload"] for m in peeked.body["messages"]] == ["from the console"], peeked


def test_a_round_trip_through_the_deployed_cluster_loses_nothing(deployment):
    figures = round_trip(deployment, "deployed")
    record_figures("round trip through the deployed cluster", **figures)


def test_an_upgrade_reinstalls_roq_and_restarts_its_daemons(deployment, tmp_path):
    hosts = deployment.hosts
    marker = f"upgrade-{uuid.uuid4().hex[:8]}"
    source = changed_checkout(tmp_path / "src", marker)
    wheelhouse = tmp_path / "wheelhouse"  # a copy, so the checkout's own wheelhouse still matches it
    shutil.copytree(WHEELHOUSE, wheelhouse)
    before = invocations(hosts)
    recap, _ = site(deployment.inventory, "-e", f"roq_source={source}", "-e", f"roq_wheelhouse={wheelhouse}")
    assert all(r["changed"] > 0 for r in recap.values()), recap
    after = invocations(hosts)
    restarted = {key for key in before if before[key] != after[key]}
    expected = {(n, f"roq-{d}") for d in ("gcm", "hcm") for n in GROUPS[d]} | {(n, "roq-web") for n in GROUPS["gcm"]}
    assert restarted == expected  # every RoQ daemon of node2, and never ZooKeeper
    for name in NODES:
        installed = hosts.exec(name, "/opt/roq/venv/bin/python", "-c", "import roq; print(open(roq.__file__).read())")
        assert marker in installed
    round_trip(deployment, "upgraded")


def test_the_deployed_cluster_lets_in_only_known_keys_and_zookeeper_credentials(deployment):
    """Security is on in deployments: CURVE at the GCM and the exchanges, admin rights, ZooKeeper ACLs."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    from roq.client.metadata import MetadataClient
    from roq.errors import ForbiddenError
    from tests.support.helpers import OK, REFUSED, handshake

    app = deployment.client_config("app")
    with Admin(deployment.client_config("ops")) as admin:
        admin.create_queue("guarded")
        admin.wait_running("guarded", 1, timeout=60)
    with Admin(app) as admin, pytest.raises(ForbiddenError):
        admin.delete_queue("guarded")
    # Where the GCMs and the exchange listen, as a client learns it: from the seeds' metadata.
    control = app.cluster.seeds.split(",")[0]
    metadata = MetadataClient(app)
    try:
        exchange = next(iter(metadata.follow("guarded", lambda body: None, timeout=30)["exchanges"].values()))
    finally:
        metadata.close()
    import zmq
    for endpoint, kind in ((control, zmq.DEALER), (exchange["pub"], zmq.DEALER), (exchange["sub"], zmq.SUB),
                           (exchange["replay"], zmq.DEALER)):
        assert handshake(endpoint, kind) == REFUSED, f"{endpoint} let in a client without CURVE"
        assert handshake(endpoint, kind, config=app) == OK, endpoint
    anonymous = KazooClient(hosts=deployment.zk_hosts)
    anonymous.start(timeout=15)
    try:
        with pytest.raises(NoAuthError):
            anonymous.get_children("/roq/queues")
        with pytest.raises(NoAuthError):
            anonymous.create("/roq/queues/evil", b"{}")
    finally:
        anonymous.stop()
        anonymous.close()
