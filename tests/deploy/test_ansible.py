"""The Ansible playbooks: lint-clean, and provision.yml run for real against an EC2 emulator (moto)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator

import pytest

from roq.tools.testing import wait_until
from roq.tools.zkserver import free_port
from tests.deploy.conftest import ANSIBLE, BIN, recaps, run_playbook, tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def ec2_emulator() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([tool("moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request
        wait_until(lambda: urllib.request.urlopen(url + "/moto-api/", timeout=1).status == 200, timeout=30,
                   message="moto server")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def playbook(name: str, endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "eu-west-1"}
    return run_playbook(name, "localhost,", "-e", f"aws_endpoint_url={endpoint}", "-e", "roq_ami=ami-12c6146b",
                        *extra, env=aws, timeout=240)


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    found = recaps(result)
    assert "localhost" in found, result.stdout[-2000:]
    return found["localhost"]


def cluster_view(endpoint: str) -> tuple[Counter[str], list[tuple[int, int]]]:
    import boto3
    ec2 = boto3.client("ec2", region_name="eu-west-1", endpoint_url=endpoint, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    found = ec2.describe_instances(Filters=[{"Name": "tag:cluster", "Values": ["roq"]},
                                            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    roles = Counter(t["Value"] for r in found["Reservations"] for i in r["Instances"]
                    for t in i.get("Tags", []) if t["Key"] == "role")
    groups = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["roq"]}])["SecurityGroups"]
    ports = sorted((p["FromPort"], p["ToPort"]) for g in groups for p in g["IpPermissions"])
    return roles, ports


def test_provision_creates_the_cluster_idempotently_and_teardown_removes_it(ec2_emulator):
    first = recap(playbook("provision.yml", ec2_emulator, "-e", '{"roq_counts": {"zookeeper": 3, "gcm": 2, "hcm": 4}}'))
    assert first["changed"] >= 6
    roles, ports = cluster_view(ec2_emulator)
    assert roles == Counter({"zookeeper": 3, "gcm": 2, "hcm": 4})
    # Only what RoQ needs: SSH, ZooKeeper (client, peer, election), control API, metrics, exchanges.
    assert ports == [(22, 22), (2181, 2181), (2888, 2888), (3888, 3888), (5500, 5500), (9101, 9101),
                     (9102, 9102), (49152, 65535)]
    again = recap(playbook("provision.yml", ec2_emulator, "-e", '{"roq_counts": {"zookeeper": 3, "gcm": 2, "hcm": 4}}'))
    assert again["changed"] == 0  # idempotent
    recap(playbook("teardown.yml", ec2_emulator))
    assert cluster_view(ec2_emulator) == (Counter(), [])


def test_provision_refuses_an_even_zookeeper_ensemble(ec2_emulator):
    result = playbook("provision.yml", ec2_emulator, "-e", '{"roq_counts": {"zookeeper": 2, "gcm": 2, "hcm": 2}}')
    assert result.returncode != 0 and "odd ZooKeeper count" in result.stdout
    assert cluster_view(ec2_emulator) == (Counter(), [])  # nothing was created


def test_playbooks_are_ansible_lint_clean() -> None:
    lint = tool("ansible-lint")
    result = subprocess.run([lint, "--offline", "provision.yml", "site.yml", "teardown.yml"], cwd=ANSIBLE,
                            capture_output=True, text=True, timeout=240,
                            env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert shutil.which("ansible-lint", path=str(BIN))
