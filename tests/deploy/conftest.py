"""What the deployment tests share: where the playbooks are, and the Ansible tools of this virtualenv."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import IN_CI

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """The path of a tool of the dev extra; skips the test locally when it is missing, fails it in CI."""
    path = BIN / name
    if not path.exists():
        if IN_CI:
            pytest.fail(f"{name} is required in CI (the dev extra installs it)")
        pytest.skip(f"{name} not installed (pip install -e '.[dev]')")
    return str(path)
