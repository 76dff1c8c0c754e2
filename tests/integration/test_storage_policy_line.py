"""The HCM hands each exchange its queue's storage policy (hcm/storage_policies.py, hcm/channel.py):
right after the configuration, and again whenever the leader changes it, without a restart. A real
ZooKeeper, the HCM's own channel, and real child processes that copy what they hear to a file."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hcm.channel import ChildChannel
from hcm.child import Child
from roq.zk import encode
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Raw reads: a buffered copy would wait for 64 KiB before writing anything.
COPY = "import os, sys\nout = open(sys.argv[1], 'wb', buffering=0)\nwhile chunk := os.read(0, 65536): out.write(chunk)"


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        assert child.process is not None
        child.process.kill()
        child.process.wait()


def start(children: list[Child], key: tuple[str, str], heard: Path) -> Child:
    child = Child(key, process=subprocess.Popen([sys.executable, "-c", COPY, str(heard)], stdin=subprocess.PIPE))
    children.append(child)
    return child


def lines(heard: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in heard.read_bytes().splitlines()] if heard.exists() else []


def storage_lines(heard: Path) -> list[dict[str, Any]]:
    return [line["storage"] for line in lines(heard) if "storage" in line]


def test_each_child_hears_the_policy_after_its_configuration_and_each_change(config, zk, paths, tmp_path,
                                                                            children) -> None:
    zk.ensure_path(paths.queues)
    zk.create(paths.queue("orders"), encode({"replicas": 2, "retention": 86_400.0, "retention_bytes": 1 << 30}))
    wake = threading.Event()
    channel = ChildChannel(zk, paths, config, wake)
    primary, replica = tmp_path / "primary", tmp_path / "replica"
    for slot, heard in (("x1", primary), ("x1~r", replica)):
        channel.storage.follow("orders")
        channel.open(start(children, ("orders", slot), heard))
    for heard in (primary, replica):
        wait_until(lambda heard=heard: len(lines(heard)) >= 2, message="configuration and policy")
        first, second = lines(heard)[:2]
        assert "zk" in first  # the configuration comes first, the policy right after it
        assert second == {"storage": {"retention": 86_400.0, "retention_bytes": 1 << 30}}

    wake.clear()
    zk.set(paths.queue("orders"), encode({"replicas": 2, "retention": 3_600.0, "retention_bytes": 1 << 30}))
    wait_until(wake.is_set, message="the watch to wake the tick")
    for child in children:
        channel.send_changes(child)
        channel.send_changes(child)  # unchanged: not written twice
    for heard in (primary, replica):
        wait_until(lambda heard=heard: len(storage_lines(heard)) == 2, message="the changed policy")
        assert storage_lines(heard)[1] == {"retention": 3_600.0, "retention_bytes": 1 << 30}

    # Settings that are not JSON (a hand edit): the children keep what they have, nothing is written.
    zk.set(paths.queue("orders"), b"{not json")
    zk.set(paths.queue("orders"), encode({"replicas": 2}))  # no policy: memory only
    wait_until(lambda: channel.storage.policy("orders") is not None
               and not channel.storage.policy("orders").on_disk, message="memory only")
    for child in children:
        channel.send_changes(child)
    for heard in (primary, replica):
        wait_until(lambda heard=heard: len(storage_lines(heard)) == 3, message="memory only")
        assert storage_lines(heard)[2] == {"retention": 0.0, "retention_bytes": 0}
    channel.storage.keep_only(set())
    assert channel.storage.policy("orders") is None
