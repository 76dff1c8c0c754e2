"""What the deployment tests share: where the playbooks are, the Ansible tools of this
virtualenv, and running a playbook."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import unavailable

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """The path of a tool of the dev extra; skips the test locally when it is missing, fails it in CI."""
    path = BIN / name
    if not path.exists():
        unavailable(f"{name} not installed (pip install -e '.[dev]')", name)
    return str(path)


def run_playbook(playbook: str, inventory: str, *extra: str, env: dict[str, str] | None = None,
                 timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """ansible-playbook of this virtualenv, with the project's ansible.cfg, in ansible/."""
    full_env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                    PATH=f"{BIN}:{os.environ['PATH']}", **(env or {}))
    return subprocess.run([tool("ansible-playbook"), "-i", inventory, playbook, *extra], cwd=ANSIBLE,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def recaps(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, int]]:
    """Every host's PLAY RECAP counts of a playbook that must have succeeded."""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    rows = re.findall(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
                      result.stdout, re.MULTILINE)
    return {host: {"ok": int(ok), "changed": int(ch), "unreachable": int(un), "failed": int(fa)}
            for host, ok, ch, un, fa in rows}
