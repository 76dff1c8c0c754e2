"""A host coming back with its disk (issue 35), on a containerised cluster.

A queue whose storage policy keeps frames on disk, `exchange.journal` off (so the segment store
alone holds what the exchange confirmed), a durable subscriber away. The exchange's host
container is stopped (SIGKILL at once: `docker stop -t 0`; its filesystem, the data directory
included, stays) and started again within `gcm.journal_reassign_grace`: the leader waits for it
rather than moving the exchange, which comes back on that host and serves its earlier
incarnation's stored frames; the subscriber resumes with lost 0, duplicated 0 and no gap.

    make docker-images   # the image carries the code: rebuild it after a change
    .venv/bin/python -m pytest tests/docker/test_disk.py -s
    (ROQ_TEST_IMAGE=<tag> runs it on another image than roq:test)
"""

from __future__ import annotations

import pytest

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.records import ExchangeStats
from roq.state import read_hosts, read_live
from tests.docker.test_replication import DurableReader, Tally, check, settle
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

DISK_ENV = {"ROQ_HCM_DATA_DIR": "/var/lib/roq/data", "ROQ_EXCHANGE_JOURNAL": "off"}
TAKEN, TOTAL = 10, 3000


def stored(lab, queue: str, messages: int) -> bool:
    """x1's latest report counts `messages` sent and its store writing (the store is synced on
    the stats tick, before the report): what a SIGKILL must not lose."""
    stats = ExchangeStats.from_dict((read_live(lab.zk, lab.paths, queue).get("x1") or {}).get("stats"))
    return stats.msgs_out >= messages and not stats.storage_full


def test_a_host_container_stopped_and_started_serves_its_exchanges_stored_frames(lab, tmp_path):
    lab.start(gcms=1, hcms=2, env=DISK_ENV)
    with Admin(lab.config) as admin:
        admin.create_queue("disk", exchanges=1, retention=3_600.0, retention_bytes=1 << 30)
    lab.wait_serving("disk", 1)
    config = lab.config.replace(client={"state_dir": str(tmp_path / "state"), "position_save_interval": 0.2})
    tally = Tally()
    reader = DurableReader("away", "disk", config, lab.zk, tally)
    pub = Publisher("disk", lab.config)
    try:
        reader.open(limit=TAKEN)
        assert reader.sub is not None
        reader.sub.wait_connected(timeout=30)
        pub.wait_for_subscribers(1, timeout=30)
        for i in range(TAKEN):
            pub.publish("load", str(i).encode())
        pub.flush(30)
        wait_until(lambda: reader.taken >= TAKEN, timeout=30, message=f"the reader to take {TAKEN}")
        reader.close()  # its position is saved: it is away while the rest is published
        for i in range(TAKEN, TOTAL):
            pub.publish("load", str(i).encode())
        pub.flush(60)
        confirmed = {pub.id: pub.confirmed}
    finally:
        pub.close()  # no replay window left: what it confirmed lives only in the store
    assert confirmed[pub.id] == TOTAL
    wait_until(lambda: stored(lab, "disk", TOTAL), timeout=30, message=f"the store to write all {TOTAL}")
    live = read_live(lab.zk, lab.paths, "disk")["x1"]
    host, before = live["host"], live["incarnation"]
    lab.launcher.stop(host, timeout=0)
    wait_until(lambda: host not in read_hosts(lab.zk, lab.paths), timeout=30, message=f"{host} gone")
    lab.launcher.start(host)  # the same container: its data directory is still there
    wait_until(lambda: before in (read_live(lab.zk, lab.paths, "disk").get("x1") or {}).get("archived", []),
               timeout=90, message=f"x1 back on {host}, serving its earlier incarnation's store")
    assert read_live(lab.zk, lab.paths, "disk")["x1"]["host"] == host, "the leader waited for the host"
    try:
        reader.open()
        resumed = settle(tally, confirmed, timeout=60)
        stats = reader.close()
    finally:
        reader.close()
    report = tally.account(confirmed)
    record_figures("Docker: a host container stopped and started with its disk, disk retention",
                   resumed_s=None if resumed is None else round(resumed, 2), gaps=stats.get("gaps"), **report)
    check(report)
    assert stats.get("gaps") == 0
