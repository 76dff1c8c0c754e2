"""The HCM's restart cap with real processes: an exchange that refuses its configuration at every
start is restarted hcm.max_restarts times, then marked failed and left alone."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from roq.client.admin import Admin
from roq.errors import Exit
from roq.state import read_hosts, read_leader, read_live
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration

MAX_RESTARTS = 2


def gauge(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    m = re.search(rf'^{name}{{[^}}]*exchange="x1"[^}}]*}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_an_exchange_that_always_crashes_is_left_alone_after_max_restarts(config, zk, paths, procs,
                                                                          tmp_path):
    procs.gcm("gcm-0")
    # CURVE keys the exchange cannot read: the HCM passes the setting through without using it,
    # and every exchange it starts exits at once with Exit.CONFIG.
    procs.start("hcm", "host-1", "hcm.host=host-1", "security.curve=true",
                f"security.keys_dir={tmp_path / 'no-keys'}", f"hcm.max_restarts={MAX_RESTARTS}",
                "hcm.restart_window=60", "hcm.failed_cooloff=600")
    wait_until(lambda: read_leader(zk, paths) and "host-1" in read_hosts(zk, paths), message="leader and host")
    metrics = wait_until(lambda: json.loads(zk.get(paths.host("host-1"))[0]).get("metrics"), message="metrics URL")
    with Admin(config) as admin:
        admin.create_queue("q", exchanges=1)

    wait_until(lambda: gauge(metrics, "roq_exchange_failed") == 1.0, timeout=45,
               message="the exchange marked failed")
    log = procs.logs["host-1"]
    assert gauge(metrics, "roq_exchange_restarts_total") == MAX_RESTARTS
    assert log.read_text().count("started exchange q/x1 ") == MAX_RESTARTS + 1
    text = log.read_text()
    assert f"exited with code {int(Exit.CONFIG)}" in text and "FAILED, 3 crashes within 60s" in text
    # The exchange's own error came through the HCM's logging, level and logger kept.
    assert re.search(r"ERROR roq\.daemon: q/x1\[\d+\] roq-exchange: security\.keys_dir .* is not a directory", text)

    # Left alone: nothing starts for longer than the longest backoff (restart_backoff_max) and
    # several ticks, and clients see no endpoint. A bounded observation, not a readiness wait.
    quiet_until = time.monotonic() + config.hcm.restart_backoff_max + 10 * config.hcm.tick
    while time.monotonic() < quiet_until:
        assert read_live(zk, paths, "q") == {}
        assert log.read_text().count("started exchange q/x1 ") == MAX_RESTARTS + 1
        time.sleep(0.2)
    assert gauge(metrics, "roq_exchange_restarts_total") == MAX_RESTARTS
    assert gauge(metrics, "roq_exchange_failed") == 1.0
