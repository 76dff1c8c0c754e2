"""A host coming back with its disk (issue 35): real GCM, HCMs, exchange and replica processes.

A queue whose storage policy keeps frames on disk has its segment stores on its hosts' disks, so
the leader waits `gcm.journal_reassign_grace` for a lost host that holds one of its slots (as for
a host that journals), and the host restarted within it serves its exchange's stored frames again.
"""

from __future__ import annotations

import pytest

from roq.client.subscriber import Subscriber
from roq.state import read_live
from roq.zk import read_json
from tests.integration.conftest import start_cluster
from tests.integration.test_disk_retention import MEMORY, create_on_disk, receive_all, taken_then_stored
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def restart_host(procs, host: str, name: str, *settings: str) -> None:
    """The HCM of `host` again, on the data directory its first process had (the disk kept)."""
    procs.start("hcm", name, f"hcm.host={host}", f"hcm.data_dir={procs.workdir / host / 'data'}", *settings)


def test_a_host_back_within_the_grace_gets_its_disk_retained_exchange_and_serves_its_store(config, zk, paths, procs):
    """Journal off: only the segment store holds the frames. Before, the leader gave a host with
    no journal no grace, so the exchange moved at once and the store stayed behind unserved."""
    start_cluster(procs, zk, paths, *MEMORY)
    small = config.replace(client={"max_batch_bytes": 20_000})
    create_on_disk(small, zk, paths, "homing")
    position = taken_then_stored(small, zk, paths, "homing", 410)  # 800 KB: four memory tails, on disk only
    live = read_live(zk, paths, "homing")["x1"]
    host, before = live["host"], live["incarnation"]
    procs.kill(host)  # the HCM and (with it) its exchange: the host is gone
    procs.wait_gone(host)
    wait_until(lambda: f"host {host} is gone" in procs.logs["gcm-0"].read_text(), timeout=30,
               message=f"the leader to see {host} gone")
    line = next(line for line in procs.logs["gcm-0"].read_text().splitlines() if f"host {host} is gone" in line)
    assert "move in 30.0s" in line and "keeps segment stores" in line, line
    assert read_json(zk, paths.exchange("homing", "x1"))["host"] == host, "not moved at once"
    restart_host(procs, host, f"{host}-again", *MEMORY)
    wait_until(lambda: before in read_live(zk, paths, "homing").get("x1", {}).get("archived", []), timeout=60,
               message=f"x1 back on {host}, serving the earlier incarnation's store")
    assert read_live(zk, paths, "homing")["x1"]["host"] == host
    with Subscriber("homing", small, position=position) as back:
        back.wait_connected(1)
        got = receive_all(back, 409)
        gaps = back.stats().gaps
    record_figures("host back within the grace, disk retention", resumed=len(got), gaps=gaps)
    assert got == list(range(10, 410)), "what the lost host stored, once, in order"
    assert gaps == 0
