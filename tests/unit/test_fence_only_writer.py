"""Every leader write goes through the fence: no module of gcm/ but gcm/fence.py writes with the client."""

from __future__ import annotations

import re
from pathlib import Path

GCM = Path(__file__).resolve().parents[2] / "gcm"
# A client call that changes ZooKeeper, bare or through client.retry(...).
DIRECT_WRITE = re.compile(r"\bclient\s*(?:\.retry\(\s*(?:self\.)?client)?\s*\.\s*"
                          r"(create|set|set_data|delete|ensure_path|transaction)(?:_async)?\b")


def test_only_the_fence_writes_to_zookeeper() -> None:
    offenders = []
    for module in sorted(GCM.glob("*.py")):
        if module.name == "fence.py":
            continue
        for number, line in enumerate(module.read_text().splitlines(), 1):
            if DIRECT_WRITE.search(line):
                offenders.append(f"gcm/{module.name}:{number}: {line.strip()}")
    assert offenders == [], "leader writes must go through gcm.fence (write or ensure_path):\n" + "\n".join(offenders)


def test_the_pattern_catches_direct_writes() -> None:
    for line in ("self.client.ensure_path(p)", "self.client.retry(self.client.create, p)", "client.delete(p)",
                 "self.client.set(p, b'')", "self.client.transaction()"):
        assert DIRECT_WRITE.search(line), line
    for line in ("self.client.exists(p)", "txn.create(p)", "self.fence.ensure_path(p)", "self.client.get(p)"):
        assert not DIRECT_WRITE.search(line), line
