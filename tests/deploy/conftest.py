"""What the deployment tests share: where the playbooks are, the Ansible tools of this
virtualenv, running a playbook, and an EC2 emulator (moto's server) to run them against."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from roq.tools.ports import free_port
from tests.conftest import unavailable
from tests.support.helpers import wait_until

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """The path of a tool of the dev extra; skips the test locally when it is missing, fails it in CI."""
    path = BIN / name
    if not path.exists():
        unavailable(f"{name} not installed (pip install -e '.[dev]')", name)
    return str(path)


def ansible_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for an Ansible tool, less what would point the playbooks or the
    inventory elsewhere than the test says (AWS_*, roq_cluster), plus `env`."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "roq_cluster"}
    return dict(inherited, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                PATH=f"{BIN}:{os.environ['PATH']}", **(env or {}))


def run_playbook(playbook: str, inventory: str, *extra: str, env: dict[str, str] | None = None,
                 timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """ansible-playbook of this virtualenv, with the project's ansible.cfg, in ansible/."""
    return subprocess.run([tool("ansible-playbook"), "-i", inventory, playbook, *extra], cwd=ANSIBLE,
                          env=ansible_env(env), capture_output=True, text=True, timeout=timeout)


def inventory_list(inventory: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`ansible-inventory -i INVENTORY --list` in ansible/, as data (Ansible's unsafe-string wrappers removed)."""
    result = subprocess.run([tool("ansible-inventory"), "-i", inventory, "--list"], cwd=ANSIBLE,
                            env=ansible_env(env), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return plain(json.loads(result.stdout))


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        if value.keys() == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


# The emulator's fake credentials and region; AWS_URL points the modules and the inventory at it.
def aws_env(endpoint: str, **more: str) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "eu-west-1",
            "AWS_URL": endpoint, **more}


@contextmanager
def ec2_emulator() -> Iterator[str]:
    """moto's server (the dev extra's moto[server]) on a free loopback port: its URL."""
    port = free_port()
    proc = subprocess.Popen([tool("moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/moto-api/", timeout=1).status == 200, timeout=30,
                   message="moto server")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def ec2_client(endpoint: str) -> Any:
    import boto3
    return boto3.client("ec2", region_name="eu-west-1", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def recaps(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, int]]:
    """Every host's PLAY RECAP counts of a playbook that must have succeeded."""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    rows = re.findall(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
                      result.stdout, re.MULTILINE)
    return {host: {"ok": int(ok), "changed": int(ch), "unreachable": int(un), "failed": int(fa)}
            for host, ok, ch, un, fa in rows}
