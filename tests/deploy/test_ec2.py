"""provision.yml, the dynamic inventory (inventory/aws_ec2.yml) and teardown.yml against an EC2
emulator (moto's server), as an operator runs them: the cluster named by the environment variable
roq_cluster, the endpoint by AWS_URL.

One cluster, `staging`, is provisioned once for the module. Then:

* EC2 holds one instance per count, each with its own Name (staging-<role>-<index>) and tags, and one
  security group opening only RoQ's ports;
* `ansible-inventory -i inventory/aws_ec2.yml --list` has every instance once (by instance id), under
  its Name, with its private address, in the groups site.yml plays on (zookeeper, gcm, hcm); the
  default cluster's inventory has none of them (the filter follows roq_cluster);
* what site.yml would write, rendered from that inventory with the roles' own templates
  (tests/deploy/render.yml): every zoo.cfg lists the three members with distinct ids, each member's
  myid is its own entry and its index tag, and the HCMs' ids (hcm.toml `host`) are distinct; every
  daemon, the web console too, dials the whole ensemble;
* a lost ZooKeeper member and a lost HCM (terminated) come back from a second provision.yml under
  their names, nothing else changing: every member keeps its myid, every HCM its id;
* the instances of each role are spread over one subnet per availability zone (3 zones), each HCM's
  hcm.toml names its instance's zone (hcm.zone), and each root disk has roq_disk_gb;
* teardown.yml refuses without an explicitly named cluster and its name confirmed, deleting nothing,
  then removes everything.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from roq.config import load_config
from tests.deploy.conftest import ANSIBLE, aws_env, ec2_client, ec2_emulator, inventory_list, recaps, run_playbook
from tests.support.helpers import record_figures

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CLUSTER = "staging"
COUNTS = {"zookeeper": 3, "gcm": 2, "hcm": 3}
NAMES = {role: {f"{CLUSTER}-{role}-{i}" for i in range(1, n + 1)} for role, n in COUNTS.items()}
ALL = set().union(*NAMES.values())
INVENTORY = "inventory/aws_ec2.yml"
RENDER = Path(__file__).with_name("render.yml")


@dataclass
class Cluster:
    endpoint: str
    first: dict[str, int]  # provision.yml's recap

    def env(self, cluster: str | None = CLUSTER) -> dict[str, str]:
        return aws_env(self.endpoint, **({"roq_cluster": cluster} if cluster else {}))

    def provision(self) -> subprocess.CompletedProcess[str]:
        return run_playbook("provision.yml", "localhost,", "-e", "roq_ami=ami-12c6146b",
                            "-e", "roq_admin_cidr=192.0.2.10/32", "-e", json.dumps({"roq_counts": COUNTS}),
                            env=self.env(), timeout=300)

    def instances(self, cluster: str = CLUSTER) -> dict[str, dict[str, Any]]:
        """EC2's running instances of a cluster by instance id: their tags, private address, zone,
        subnet and root volume."""
        found = ec2_client(self.endpoint).describe_instances(Filters=[
            {"Name": "tag:cluster", "Values": [cluster]}, {"Name": "instance-state-name", "Values": ["running"]}])
        return {i["InstanceId"]: {"tags": {t["Key"]: t["Value"] for t in i.get("Tags", [])},
                                  "ip": i["PrivateIpAddress"], "zone": i["Placement"]["AvailabilityZone"],
                                  "subnet": i["SubnetId"],
                                  "volumes": [b["Ebs"]["VolumeId"] for b in i.get("BlockDeviceMappings", [])]}
                for r in found["Reservations"] for i in r["Instances"]}


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    found = recaps(result)
    assert "localhost" in found, result.stdout[-2000:]
    return found["localhost"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with ec2_emulator() as endpoint:
        provisioning = Cluster(endpoint, {})
        provisioning.first = recap(provisioning.provision())
        yield provisioning


@dataclass
class Host:
    instance_id: str
    ip: str
    index: int
    zone: str  # its availability zone, as the inventory says
    files: dict[str, str]  # what site.yml would write, by file name


def rendered(cluster: Cluster, into: Path) -> dict[str, Host]:
    """Each host of the inventory, with what site.yml would write there."""
    hostvars = inventory_list(INVENTORY, env=cluster.env())["_meta"]["hostvars"]
    # render.yml runs beside ansible/group_vars (site.yml's variables, at their precedence).
    into.mkdir()
    shutil.copy(RENDER, into / RENDER.name)
    (into / "group_vars").symlink_to(ANSIBLE / "group_vars")
    (into / "myid.j2").write_text(role_myid_content())
    for name in hostvars:
        (into / "out" / name).mkdir(parents=True)
    result = run_playbook(str(into / RENDER.name), INVENTORY, "-e", f"roq_ansible={ANSIBLE}",
                          "-e", f"render_dir={into / 'out'}", "-e", f"myid_template={into / 'myid.j2'}",
                          env=cluster.env(), timeout=300)
    assert set(recaps(result)) == set(hostvars), result.stdout[-3000:]
    hosts = {name: Host(v["ec2_instance_id"], v["private_ip"], int(v["ec2_tags"]["index"]),
                        v["ec2_placement"]["availability_zone"],
                        {f.name: f.read_text() for f in (into / "out" / name).iterdir()})
             for name, v in hostvars.items()}
    return hosts


@pytest.fixture(scope="module")
def first_render(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Host]:
    """What site.yml would write on each host of the cluster as provisioned."""
    return rendered(cluster, tmp_path_factory.mktemp("first") / "render")


def role_myid_content() -> str:
    """The content the zookeeper role writes to a member's myid: its own expression, from its tasks."""
    tasks = yaml.safe_load((ANSIBLE / "roles" / "zookeeper" / "tasks" / "main.yml").read_text())
    for task in tasks:
        for args in task.values():
            if isinstance(args, dict) and str(args.get("dest", "")).endswith("/myid"):
                if "content" in args:
                    return args["content"]
                return (ANSIBLE / "roles" / "zookeeper" / "templates" / args["src"]).read_text()
    raise AssertionError("no task of roles/zookeeper writes a myid")


def ensemble(hosts: dict[str, Host]) -> dict[str, int]:
    """Each ZooKeeper member's myid, once checked against every zoo.cfg: complete, distinct, consistent."""
    members = {name: h for name, h in hosts.items() if name in NAMES["zookeeper"]}
    myids = {name: int(h.files["myid"].strip()) for name, h in members.items()}
    assert len(set(myids.values())) == len(members) == COUNTS["zookeeper"], myids
    expected = {myids[name]: h.ip for name, h in members.items()}
    for name, h in members.items():
        servers = re.findall(r"^server\.(\d+)=([\d.]+):2888:3888$", h.files["zoo.cfg"], re.MULTILINE)
        assert {int(k): ip for k, ip in servers} == expected and len(servers) == len(expected), (name, servers)
    # Stable: a member's id is its instance's index tag, which its replacement gets too.
    assert myids == {name: h.index for name, h in members.items()}, myids
    return myids


def daemons(hosts: dict[str, Host], into: Path) -> dict[str, str]:
    """The HCMs' ids (hcm.toml `host`), once every GCM's, HCM's and web console's configuration is checked by
    RoQ's own loader: the whole ensemble, this cluster's root, the host's private address advertised."""
    zk_hosts = ",".join(f"{hosts[n].ip}:2181" for n in sorted(NAMES["zookeeper"]))
    hcm_ids = {}
    for role in ("gcm", "hcm"):
        for name in NAMES[role]:
            path = into / f"{name}.toml"
            path.write_text(hosts[name].files[f"{role}.toml"])
            config = load_config(path, env={})
            assert (config.zk.hosts, config.zk.root) == (zk_hosts, f"/{CLUSTER}"), name
            assert getattr(config, role).advertise == hosts[name].ip, name
            if role == "hcm":
                hcm_ids[name] = config.hcm.host
                assert config.hcm.zone == hosts[name].zone and config.hcm.zone, name  # its instance's zone
    for name in NAMES["gcm"]:  # the web console beside each GCM: HTTPS, tokens, an admin key
        path = into / f"{name}-web.toml"
        path.write_text(hosts[name].files["web.toml"])
        web = load_config(path, env={})
        gcm_ips = sorted(hosts[g].ip for g in NAMES["gcm"])
        assert sorted(seed.rpartition(":")[0] for seed in web.cluster.seeds.split(",")) == \
            [f"tcp://{ip}" for ip in gcm_ips], name  # the console reaches the GCMs, not ZooKeeper
        assert web.web.auth and web.web.tls_cert and web.security.identity == "admins/web", name
    assert len(set(hcm_ids.values())) == COUNTS["hcm"], hcm_ids
    return hcm_ids


def test_provision_makes_one_named_instance_per_count_and_opens_only_roqs_ports(cluster):
    assert cluster.first["changed"] >= 6 and cluster.first["failed"] == 0
    instances = cluster.instances()
    names = sorted(i["tags"]["Name"] for i in instances.values())
    assert names == sorted(ALL)
    for i in instances.values():
        assert i["tags"]["Name"] == f"{CLUSTER}-{i['tags']['role']}-{i['tags']['index']}"
    groups = ec2_client(cluster.endpoint).describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [CLUSTER]}])["SecurityGroups"]
    ports = sorted((p["FromPort"], p["ToPort"]) for g in groups for p in g["IpPermissions"])
    # Only what RoQ needs: SSH, ZooKeeper (client, peer, election), control API, web console, metrics, exchanges.
    assert ports == [(22, 22), (2181, 2181), (2888, 2888), (3888, 3888), (5500, 5500), (8443, 8443), (9101, 9101),
                     (9102, 9102), (49152, 65535)]


def test_each_role_is_spread_over_three_availability_zones_and_disks_have_their_size(cluster):
    ec2 = ec2_client(cluster.endpoint)
    subnets = ec2.describe_subnets(Filters=[{"Name": "tag:cluster", "Values": [CLUSTER]}])["Subnets"]
    zones = {s["SubnetId"]: s["AvailabilityZone"] for s in subnets}
    assert len(subnets) == 3 and len(set(zones.values())) == 3, zones
    instances = cluster.instances()
    spread = {role: sorted(i["zone"] for i in instances.values() if i["tags"]["role"] == role) for role in COUNTS}
    for role, count in COUNTS.items():
        assert len(set(spread[role])) == min(count, 3), spread  # one zone per instance while zones last
    for i in instances.values():
        assert zones[i["subnet"]] == i["zone"]
    volumes = [v for i in instances.values() for v in i["volumes"]]
    sizes = {v["Size"] for v in ec2.describe_volumes(VolumeIds=volumes)["Volumes"]}
    assert len(volumes) == len(instances) and sizes == {20}, sizes  # roq_disk_gb
    record_figures("provision: zones per role", **{role: len(set(z)) for role, z in spread.items()})


def test_the_inventory_has_every_instance_once_in_the_groups_site_yml_needs(cluster):
    listed = inventory_list(INVENTORY, env=cluster.env())
    hostvars = listed["_meta"]["hostvars"]
    instances = cluster.instances()
    assert set(hostvars) == ALL
    assert sorted(v["ec2_instance_id"] for v in hostvars.values()) == sorted(instances)  # each instance once
    for name, v in hostvars.items():
        assert instances[v["ec2_instance_id"]]["tags"]["Name"] == name
        assert v["private_ip"] == instances[v["ec2_instance_id"]]["ip"] and v["ansible_user"] == "admin"
    for role, names in NAMES.items():
        assert set(listed[role]["hosts"]) == names, role
    # The filter follows roq_cluster: the default cluster (roq) has no instance here.
    default = inventory_list(INVENTORY, env=cluster.env(cluster=None))
    assert not default["_meta"]["hostvars"] and "zookeeper" not in default


def test_site_yml_would_build_a_three_member_ensemble_and_distinct_hcms(first_render, tmp_path):
    hosts = first_render
    myids = ensemble(hosts)
    hcm_ids = daemons(hosts, tmp_path)
    assert hcm_ids == {name: name for name in NAMES["hcm"]}  # the Name: kept when the instance is replaced
    record_figures("ids site.yml computes from the EC2 inventory", myids=sorted(myids.items()),
                   hcm_ids=sorted(hcm_ids.values()))


def test_a_replaced_instance_comes_back_under_its_name_and_every_id_is_kept(cluster, first_render, tmp_path):
    before = first_render
    lost = {f"{CLUSTER}-zookeeper-2", f"{CLUSTER}-hcm-2"}
    ec2_client(cluster.endpoint).terminate_instances(InstanceIds=[before[n].instance_id for n in lost])
    result = cluster.provision()
    again = recap(result)
    # Only the start task changed, and only for the lost instances: the rest of provision.yml is idempotent.
    assert again["changed"] == 1, result.stdout[-3000:]
    replaced = set(re.findall(r"^changed: \[localhost\] => \(item=([\w-]+)\)$", result.stdout, re.MULTILINE))
    assert replaced == lost, result.stdout[-3000:]
    after = rendered(cluster, tmp_path / "after")
    assert set(after) == ALL
    assert {n for n in ALL if after[n].instance_id != before[n].instance_id} == lost
    assert ensemble(after) == ensemble(before)
    assert daemons(after, tmp_path) == daemons(before, tmp_path)
    # The new member's address is in every zoo.cfg (ensemble() checked it) and every daemon's ensemble.
    assert after[f"{CLUSTER}-zookeeper-2"].ip in after[f"{CLUSTER}-zookeeper-1"].files["zoo.cfg"]


def test_teardown_asks_for_the_cluster_by_name_then_removes_it(cluster):
    running = set(cluster.instances())
    unnamed = run_playbook("teardown.yml", "localhost,", "-e", "confirm=roq", env=cluster.env(cluster=None),
                           timeout=120)  # the default cluster, named by nobody
    assert unnamed.returncode != 0 and "name the cluster to tear down: export roq_cluster=NAME" in unnamed.stdout
    unconfirmed = run_playbook("teardown.yml", "localhost,", env=cluster.env(), timeout=120)  # no terminal to ask
    assert unconfirmed.returncode != 0 and "confirm with its name" in unconfirmed.stdout, unconfirmed.stdout[-2000:]
    wrong = run_playbook("teardown.yml", "localhost,", "-e", "confirm=prod", env=cluster.env(), timeout=120)
    assert wrong.returncode != 0 and '(got "prod")' in wrong.stdout and "nothing was deleted" in wrong.stdout
    assert set(cluster.instances()) == running  # nothing was deleted

    result = run_playbook("teardown.yml", "localhost,", "-e", f"confirm={CLUSTER}", env=cluster.env(), timeout=300)
    assert recap(result)["failed"] == 0
    assert cluster.instances() == {}
    ec2 = ec2_client(cluster.endpoint)
    assert ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [CLUSTER]}])["SecurityGroups"] == []
    assert ec2.describe_vpcs(Filters=[{"Name": "tag:cluster", "Values": [CLUSTER]}])["Vpcs"] == []
    assert ec2.describe_subnets(Filters=[{"Name": "tag:cluster", "Values": [CLUSTER]}])["Subnets"] == []
