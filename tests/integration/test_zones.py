"""Zones (hcm.zone) with real processes: the leader puts a replicated queue's exchanges in different
zones and each replica in another zone than its exchange, so the loss of a whole zone (both of its
hosts' HCMs killed at once) loses and duplicates nothing."""

from __future__ import annotations

import signal
import time

import pytest

from roq.client.admin import Admin
from roq.state import read_exchanges, read_hosts, read_leader
from tests.support.helpers import SteadyTraffic, record_figures, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ZONES = {"a-1": "zone-a", "a-2": "zone-a", "b-1": "zone-b", "b-2": "zone-b"}


def where(zk, paths, queue: str) -> dict[str, tuple[str | None, str | None]]:
    return {x.id: (x.host, x.replica) for x in read_exchanges(zk, paths, queue, live=False)}


def running(zk, paths, queue: str) -> dict[str, tuple[str | None, str | None]]:
    return {x.id: ((x.live or {}).get("host"), (x.replica_live or {}).get("host"))
            for x in read_exchanges(zk, paths, queue)}


def test_a_replicated_queue_survives_the_loss_of_a_zone(config, zk, paths, procs):
    procs.start("gcm", "gcm-0")
    for host, zone in ZONES.items():
        procs.start("hcm", host, f"hcm.host={host}", f"hcm.zone={zone}")
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == len(ZONES),
               message="a leader and every host")
    assert {h.name: h.zone for h in read_hosts(zk, paths).values()} == ZONES  # in the registration
    with Admin(config) as admin:
        admin.create_queue("zoned", exchanges=2, replicas=2)
    placed = where(zk, paths, "zoned")
    for primary, replica in placed.values():
        assert primary and replica and ZONES[primary] != ZONES[replica], placed
    assert {ZONES[p] for p, _ in placed.values() if p} == {"zone-a", "zone-b"}, placed
    wait_until(lambda: running(zk, paths, "zoned") == placed, timeout=30, message="every slot running")

    traffic = SteadyTraffic("zoned", config, rate=400)
    try:
        traffic.start()
        traffic.wait_for_more(300, timeout=20)
        lost_zone = [h for h, z in ZONES.items() if z == "zone-b"]
        for host in lost_zone:
            procs.kill(host, signal.SIGKILL)
        killed = time.monotonic()
        survivors = set(ZONES) - set(lost_zone)
        wait_until(lambda: all(p in survivors and r in survivors and p != r
                               for p, r in where(zk, paths, "zoned").values()), timeout=40,
                   message="every exchange and replica placed again in zone-a")
        after = where(zk, paths, "zoned")
        wait_until(lambda: running(zk, paths, "zoned") == after, timeout=40, message="every slot running in zone-a")
        recovered = time.monotonic() - killed
        traffic.wait_for_more(300, timeout=30)  # confirms go on with both copies in one zone
        figures = traffic.stop()
    finally:
        traffic.close()
    record_figures("zone lost: replicated 2-exchange queue, 2 zones of 2 hosts",
                   zone_lost_to_running_s=round(recovered, 2), **figures)
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
