"""The cluster's recent events, kept by the leader (gcm/events.py, `cluster.events`): what happens
is logged once, numbered, and a new leader goes on with the same log after a failover. Real
ZooKeeper, GCM and HCM processes; every kill is a real SIGKILL."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from roq.client.admin import Admin
from roq.errors import UserError
from roq.state import read_exchanges, read_leader
from roq.zk import read_json
from tests.integration.conftest import start_cluster
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def events_of(admin: Admin, after: int = 0) -> list[dict[str, Any]]:
    return admin.cluster_events(after)["events"]


def logged(admin: Admin, kind: str, fragment: str) -> dict[str, Any] | None:
    return next((e for e in events_of(admin) if e["kind"] == kind and fragment in e["detail"]), None)


def test_the_leader_logs_what_happens_and_a_new_leader_keeps_the_log(config, zk, paths, procs):
    start_cluster(procs, zk, paths)
    procs.gcm("gcm-backup")
    first = read_leader(zk, paths)
    with Admin(config) as admin:
        wait_until(lambda: len(admin.status()["gcms"]) == 2, message="a backup GCM")
        wait_until(lambda: logged(admin, "leader", f"{first['id']} is the leader (epoch {first['epoch']})"),
                   message="the first leader's own event")
        admin.create_queue("ev", exchanges=2)
        created = wait_until(lambda: logged(admin, "queue created", "queue ev created"), message="queue created")
        assert created["queue"] == "ev"
        on_host_2 = wait_until(lambda: [x.id for x in read_exchanges(zk, paths, "ev") if x.host == "host-2"],
                               message="an exchange on host-2")

        procs.kill("host-2", signal.SIGKILL)
        wait_until(lambda: logged(admin, "host lost", "host host-2 is gone"), timeout=30, message="host lost")
        wait_until(lambda: logged(admin, "failover", f"exchange {on_host_2[0]} moved from host-2 to host-1"),
                   timeout=30, message="its exchange moved")
        before = events_of(admin)
        assert [e["seq"] for e in before] == sorted({e["seq"] for e in before})  # numbered once, in order
        assert sum(1 for e in before if e["kind"] == "queue created" and e["queue"] == "ev") == 1
        newest = before[-1]["seq"]
        assert events_of(admin, newest) == [] and admin.cluster_events(newest)["last"] == newest
        assert [e["seq"] for e in events_of(admin, newest - 1)] == [newest]
        with pytest.raises(UserError, match="after must be"):
            admin.cluster_events("soon")  # type: ignore[arg-type]
        stored = read_json(zk, paths.events)
        assert stored is not None and [e["seq"] for e in stored["events"]] == [e["seq"] for e in before]

        victim = next(name for name, p in procs.procs.items() if p.pid == first["pid"])
        procs.kill(victim, signal.SIGKILL)
        second = wait_until(lambda: (led := read_leader(zk, paths)) and led["id"] != first["id"] and led,
                            timeout=20, message="the backup to take over")
        took_over = wait_until(lambda: logged(admin, "leader", f"{second['id']} is the leader"),
                               timeout=20, message="the new leader's own event")
        after = events_of(admin)
        assert after[:len(before)] == before  # the old leader's events, as they were
        assert took_over["seq"] > newest
