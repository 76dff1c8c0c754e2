"""HCM supervision and host failover, with real HCM and exchange processes."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from roq.client.admin import Admin
from roq.state import read_exchanges, read_hosts, read_leader, read_live
from tests.support.helpers import record_figures, wait_until

pytestmark = pytest.mark.integration


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start(procs, zk, paths, hosts=("host-1",), gcms=1):
    for i in range(gcms):
        procs.gcm(f"gcm-{i}")
    for host in hosts:
        procs.hcm(host)
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == len(hosts),
               message="a leader and every host")


def live_pids(zk, paths, queue):
    return {xid: data["pid"] for xid, data in read_live(zk, paths, queue).items()}


def test_crashed_exchange_is_restarted_and_its_endpoint_follows(config, zk, paths, procs):
    start(procs, zk, paths)
    with Admin(config) as admin:
        admin.create_queue("q", exchanges=1)
    first = wait_until(lambda: live_pids(zk, paths, "q").get("x1"), message="exchange live")
    os.kill(first, signal.SIGKILL)
    # The endpoint must go at once (within a couple of HCM ticks), then come back.
    wait_until(lambda: live_pids(zk, paths, "q").get("x1") != first, timeout=3,
               message="the dead exchange's endpoint to be removed or replaced")
    second = wait_until(lambda: live_pids(zk, paths, "q").get("x1"), timeout=10, message="restarted exchange")
    assert second != first
    assert read_live(zk, paths, "q")["x1"]["restarts"] >= 1


def test_repeated_crashes_back_off(config, zk, paths, procs):
    start(procs, zk, paths)
    with Admin(config) as admin:
        admin.create_queue("q")
    gaps = []
    pid = wait_until(lambda: live_pids(zk, paths, "q").get("x1"), message="exchange live")
    for _ in range(3):
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        pid = wait_until(lambda old=pid: (p := live_pids(zk, paths, "q").get("x1")) and p != old and p,
                         timeout=15, message="restart")
        gaps.append(time.monotonic() - killed)
    record_figures("exchange restart backoff", delays_s=[round(g, 2) for g in gaps])
    assert gaps[2] > gaps[0]  # 0.2s, 0.4s, 0.8s backoff (plus start-up)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopping_an_hcm_leaves_no_orphan_exchange(config, zk, paths, procs, sig):
    start(procs, zk, paths)
    with Admin(config) as admin:
        admin.create_queue("q", exchanges=3)
    pids = wait_until(lambda: len(p := live_pids(zk, paths, "q")) == 3 and p, message="3 exchanges live")
    hcm = procs.procs["host-1"]
    assert {c.pid for c in psutil.Process(hcm.pid).children()} == set(pids.values())
    procs.kill("host-1", sig)
    wait_until(lambda: all(pid_gone(p) for p in pids.values()), timeout=10,
               message=f"every exchange to die with its HCM ({sig.name})")
    hcm.wait(timeout=10)


def test_lost_host_exchanges_move_to_survivors(config, zk, paths, procs):
    start(procs, zk, paths, hosts=("host-1", "host-2"))
    with Admin(config) as admin:
        admin.create_queue("q", exchanges=2)
    wait_until(lambda: len(live_pids(zk, paths, "q")) == 2, message="2 exchanges live")
    placed = {x.id: x.host for x in read_exchanges(zk, paths, "q")}
    lost = placed["x1"]
    survivor = "host-2" if lost == "host-1" else "host-1"
    killed = time.monotonic()
    procs.kill(lost, signal.SIGKILL)
    wait_until(lambda: {x.host for x in read_exchanges(zk, paths, "q")} == {survivor}, timeout=15,
               message="both exchanges placed on the survivor")
    wait_until(lambda: {d["host"] for d in read_live(zk, paths, "q").values()} == {survivor}
               and len(read_live(zk, paths, "q")) == 2, timeout=15, message="both running on the survivor")
    took = time.monotonic() - killed
    record_figures("host loss (processes)", exchanges_running_elsewhere_s=round(took, 2),
                   session_timeout_s=config.zk.session_timeout)
    assert zk.get_children(paths.host_assignments(lost)) == []


def test_restarted_hcm_registers_again_and_runs_its_exchanges(config, zk, paths, procs):
    start(procs, zk, paths, hosts=("host-1",))
    with Admin(config) as admin:
        admin.create_queue("q", exchanges=2)
    wait_until(lambda: len(live_pids(zk, paths, "q")) == 2, message="2 exchanges live")
    procs.kill("host-1", signal.SIGKILL)
    procs.procs["host-1"].wait(timeout=5)
    procs.hcm("host-1")  # same host name, new process, new session
    wait_until(lambda: read_hosts(zk, paths).get("host-1") and
               read_hosts(zk, paths)["host-1"].pid == procs.procs["host-1"].pid, timeout=15,
               message="the new HCM registered")
    wait_until(lambda: len(live_pids(zk, paths, "q")) == 2, timeout=15, message="exchanges running again")
    assert {x.host for x in read_exchanges(zk, paths, "q")} == {"host-1"}


def test_queue_waits_for_capacity_then_gets_placed(config, zk, paths, procs):
    procs.gcm("gcm-0")
    wait_until(lambda: read_leader(zk, paths), message="a leader")
    with Admin(config) as admin:
        info = admin.create_queue("early", exchanges=2)
        assert [x["host"] for x in info["exchanges"]] == [None, None]
        assert admin.status()["unplaced"] == 2
    procs.hcm("late-host")
    wait_until(lambda: len(live_pids(zk, paths, "early")) == 2, timeout=15,
               message="exchanges placed once a host appears")
