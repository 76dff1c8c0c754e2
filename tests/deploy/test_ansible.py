"""The Ansible playbooks: lint-clean, and provision.yml's checks of its variables, which come before
anything is created (against an EC2 emulator, moto, to show that nothing was). The cluster itself,
the dynamic inventory and teardown.yml: test_ec2.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from tests.deploy.conftest import ANSIBLE, BIN, aws_env, ec2_client, ec2_emulator, run_playbook, tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

AMI = "ami-12c6146b"  # one of moto's
ADMIN = "192.0.2.10/32"  # TEST-NET-1


@pytest.fixture
def emulator() -> Iterator[str]:
    with ec2_emulator() as url:
        yield url


def provision(endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_playbook("provision.yml", "localhost,", *extra, env=aws_env(endpoint), timeout=240)


def nothing_created(endpoint: str) -> bool:
    ec2 = ec2_client(endpoint)
    instances = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    groups = [g for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupName"] != "default"]
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "tag-key", "Values": ["cluster"]}])["Vpcs"]
    return not instances and not groups and not vpcs


def missing(result: subprocess.CompletedProcess[str]) -> set[str]:
    """The variables provision.yml's failed checks name ("roq_ami is required: ...")."""
    assert result.returncode != 0, result.stdout[-3000:]
    return set(re.findall(r"\b(roq_\w+) is required: ", result.stdout + result.stderr))


def test_provision_names_each_missing_variable_in_one_line_before_creating_anything(emulator):
    # On AWS (no endpoint) with nothing set: no AMI, no key pair, SSH open to the placeholder.
    result = run_playbook("provision.yml", "localhost,", env={"AWS_REGION": "eu-west-1"}, timeout=120)
    assert missing(result) == {"roq_ami", "roq_key_name", "roq_admin_cidr"}, result.stdout[-3000:]
    # The emulator needs no key pair; the placeholder (0.0.0.0/32: SSH open to nobody) is refused there
    # too, and so is what is not an address.
    assert missing(provision(emulator, "-e", f"roq_ami={AMI}")) == {"roq_admin_cidr"}
    assert missing(provision(emulator, "-e", f"roq_ami={AMI}", "-e", "roq_admin_cidr=me")) == {"roq_admin_cidr"}
    assert nothing_created(emulator)


def test_provision_refuses_an_even_zookeeper_ensemble(emulator):
    result = provision(emulator, "-e", f"roq_ami={AMI}", "-e", f"roq_admin_cidr={ADMIN}",
                       "-e", '{"roq_counts": {"zookeeper": 2, "gcm": 2, "hcm": 2}}')
    assert result.returncode != 0 and "odd ZooKeeper count" in result.stdout
    assert nothing_created(emulator)


def test_no_role_registers_a_result_under_the_name_of_a_cluster_variable() -> None:
    """A task's `register` outranks group_vars and inventory variables for the rest of the play: a role
    registering, say, roq_zk_myid would make every later zoo.cfg list results instead of ids."""
    variables = set(yaml.safe_load((ANSIBLE / "group_vars" / "all.yml").read_text()))
    variables |= set(yaml.safe_load((ANSIBLE / "inventory" / "aws_ec2.yml").read_text())["compose"])
    registered = set()
    for path in (ANSIBLE / "roles").glob("*/tasks/*.yml"):
        registered |= set(re.findall(r"^\s*register:\s*(\w+)", path.read_text(), re.MULTILINE))
    assert registered and not registered & variables, registered & variables


def test_playbooks_are_ansible_lint_clean() -> None:
    lint = tool("ansible-lint")
    result = subprocess.run([lint, "--offline", "provision.yml", "site.yml", "teardown.yml"], cwd=ANSIBLE,
                            capture_output=True, text=True, timeout=240,
                            env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert shutil.which("ansible-lint", path=str(BIN))
