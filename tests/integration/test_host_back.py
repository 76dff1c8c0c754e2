"""A host coming back with its disk (issue 35): real GCM, HCMs, exchange and replica processes.

A queue whose storage policy keeps frames on disk has its segment stores on its hosts' disks, so
the leader waits `gcm.journal_reassign_grace` for a lost host that holds one of its slots (as for
a host that journals), and the host restarted within it serves its exchange's stored frames again.
"""

from __future__ import annotations

import os
import signal

import pytest

from roq import protocol
from roq.client.admin import Admin
from roq.client.subscriber import Subscriber
from roq.state import read_hosts, read_leader, read_live
from roq.zk import read_json
from tests.integration.conftest import start_cluster
from tests.integration.test_disk_retention import MEMORY, create_on_disk, receive_all, taken_then_stored
from tests.integration.test_replication import (
    HOSTS,
    PADDED_PUBLISHER,
    Collector,
    create_replicated,
    fetch_copy,
    publish_with_a_subscriber_away,
    start_hosts,
    start_publisher,
)
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


def test_a_restart_of_every_host_under_load_with_disk_and_replicas_loses_nothing_confirmed(config, zk, paths,
                                                                                            procs) -> None:
    """Disk retention, replicas 2, a memory tail of 200 KB: a durable subscriber away while ~3 MB
    are confirmed under load, then the publisher and every HCM (with its exchanges and replicas)
    SIGKILLed and the hosts started again on their data directories. The replica adopts the store
    of the ended incarnation (written before it acknowledged, so it holds every confirmed message,
    which the exchange's own store, written after the ack, may not), and serves it; the subscriber
    resumes with every confirmed message once and no gap."""
    start_hosts(procs, zk, paths, *MEMORY)
    create_replicated(config, zk, paths, "whole", retention=3_600.0)
    config = config.replace(client={"state_dir": str(procs.workdir / "subscribers")})
    publish_with_a_subscriber_away(config, zk, "whole", "audit", taken=10, total=10)
    old = read_live(zk, paths, "whole")["x1"]
    replica = read_json(zk, paths.replica_live("whole", "x1"))
    assert replica and replica["host"] != old["host"]
    publisher, lines, reader = start_publisher(procs, "whole", PADDED_PUBLISHER)
    back: Collector | None = None
    try:
        wait_until(lambda: lines and lines[-1] >= 3000, timeout=60, message="3,000 confirmed messages")
        os.killpg(publisher.pid, signal.SIGKILL)
        for host in HOSTS:
            procs.kill(host)
        publisher.wait(timeout=10)
        reader.join(timeout=5)
        confirmed = lines[-1]  # numbered from 0: the 10 the subscriber took before are not asked again
        for host in HOSTS:
            procs.wait_gone(host)
        for host in HOSTS:
            restart_host(procs, host, f"{host}-again", *MEMORY)
        wait_until(lambda: old["incarnation"] in (read_live(zk, paths, "whole").get("x1") or {}).get("archived", []),
                   timeout=60, message="x1 back on its host, serving its earlier incarnation's store")
        assert read_live(zk, paths, "whole")["x1"]["host"] == old["host"]
        # The killed replica's node stays until its HCM's session expires: wait for the new one's.
        wait_until(lambda: (read_json(zk, paths.replica_live("whole", "x1")) or {}).get("replay")
                   not in (None, replica["replay"]), timeout=60, message="the replica running again")
        again = read_json(zk, paths.replica_live("whole", "x1"))
        assert again and again["host"] == replica["host"]
        page = fetch_copy(again["replay"], old["incarnation"])
        assert page.oldest == 1 and protocol.decode_delivery(page.frames[0][1]).pos == 1, \
            "the restarted replica adopted its store of the ended incarnation"
        back = Collector("whole", config, zk, durable="audit")
        wanted = set(range(confirmed))
        wait_until(lambda: wanted <= set(back.counts), timeout=90, message=f"the {confirmed} confirmed messages")
        gaps = back.sub.stats().gaps
        record_figures("every host restarted under load, disk retention, replicas 2", confirmed=confirmed,
                       received=len(back.counts), lost=len(wanted - set(back.counts)),
                       duplicated=back.duplicated(), gaps=gaps)
        assert back.duplicated() == 0
        assert gaps == 0
    finally:
        if publisher.poll() is None:
            os.killpg(publisher.pid, signal.SIGKILL)
        if back is not None:
            back.sub.close()


def test_an_exchange_keeping_frames_on_disk_is_not_rebalanced_away_from_its_store(config, zk, paths, procs):
    """Both queues' exchanges on host-1, then host-2 joins: `queue.rebalance` moves a memory-only
    queue's exchange, never the disk-retained one's (its store would stay behind on host-1)."""
    procs.start("gcm", "gcm-0")
    procs.start("hcm", "host-1", "hcm.host=host-1")
    wait_until(lambda: read_leader(zk, paths) and read_hosts(zk, paths), message="leader and host-1")
    with Admin(config) as admin:
        admin.create_queue("stored", exchanges=2, retention=3_600.0)
        admin.create_queue("volatile", exchanges=2)
    wait_until(lambda: len(read_live(zk, paths, "stored")) == 2 and len(read_live(zk, paths, "volatile")) == 2,
               timeout=30, message="both queues running on host-1")
    procs.start("hcm", "host-2", "hcm.host=host-2")
    wait_until(lambda: len(read_hosts(zk, paths)) == 2, message="host-2")
    with Admin(config) as admin:
        assert admin.rebalance("stored")["moves"] == [], "a disk-retained exchange stays with its store"
        moved = admin.rebalance("volatile")["moves"]
    assert len(moved) == 1 and moved[0]["to"] == "host-2", moved
