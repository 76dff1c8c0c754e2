"""The alerting rules of monitoring/alerts.yml, checked by promtool and run against live series.

A real cluster (a GCM, two HCMs on small real disks) is driven through the faults the alerts are
about: a replica's host killed (host lost, endpoint down, replica missing), a confirm held up by a
stopped replica, a durable subscriber that takes nothing, a consumer group that dead-letters and
then has no member, an exchange killed until its HCM gives up on it, a data disk filled, and at
last the GCM killed (no leader). Every endpoint is scraped before the faults, after them and after
the GCM's death. promtool then replays those scrapes as a 50-minute history (each phase holds a
scrape's values, counters growing at the rate the scrapes saw, ages growing with the clock, as the
live ones were seen to) and checks, with `promtool test rules`, that nothing fires while the
cluster is healthy and exactly the expected alerts fire after each fault, with their labels and
annotations.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.state import read_hosts, read_leader, read_live
from roq.zk import read_json
from tests.conftest import unavailable
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
SEVERITIES = {"critical", "warning"}
# The history promtool replays: (phase, minutes). Alerts are checked near each phase's end.
HEALTHY, FAULTS, NO_GCM = 10, 30, 10
AGES = {"roq_exchange_consumer_lag_seconds", "roq_group_lag_seconds"}  # gauges of how long something waited
HOLD = 1.0  # seconds the replica stays stopped while a confirm waits for it: the slow confirm itself

Key = tuple[str, tuple[tuple[str, str], ...]]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        unavailable("no promtool (Debian's prometheus package; `make test` installs it)", "the alert tests")
    return found


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
            for rule in group["rules"]]


def used_metrics() -> set[str]:
    return {name for rule in rules() for name in re.findall(r"\b(roq_[a-z0-9_]+|up)\b", rule["expr"])}


def test_the_rules_are_valid_loaded_by_the_example_and_each_says_what_to_do(tmp_path: Path) -> None:
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(MONITORING / "alerts.yml")], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(MONITORING / name, tmp_path / name)
    (tmp_path / "targets").mkdir()
    for job in ("gcm", "hcm"):
        (tmp_path / "targets" / f"{job}.json").write_text("[]")
    config = subprocess.run([tool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                            text=True, timeout=30)
    assert config.returncode == 0 and "alerts.yml" in config.stdout and "14 rules found" in config.stdout, \
        config.stdout + config.stderr
    for rule in rules():
        assert rule["alert"].startswith("Roq") and rule.get("for"), rule
        assert rule["labels"]["severity"] in SEVERITIES, rule
        assert rule["annotations"]["summary"] and "What to do:" in rule["annotations"]["description"], rule
        # Annotations name labels, never values: what an alert says does not change while it fires.
        assert "$value" not in json.dumps(rule["annotations"]), rule


# ------------------------------------------------------------------ scraping the live cluster

class Targets:
    """The cluster's metrics endpoints, as Prometheus's file discovery would list them."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.urls = {g["metrics"]: "roq-gcm" for g in status["gcms"]}
        self.urls.update({h["metrics"]: "roq-hcm" for h in status["hosts"]})

    @staticmethod
    def instance(url: str) -> str:
        return url.split("/")[2]

    def scrape(self, used: set[str]) -> dict[Key, float]:
        """One scrape of every endpoint: the samples of the metrics the rules use, and `up`."""
        found: dict[Key, float] = {}
        for url, job in self.urls.items():
            target = {"job": job, "instance": self.instance(url)}
            try:
                with urllib.request.urlopen(url, timeout=3) as response:
                    text = response.read().decode()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                found[key("up", target)] = 0.0
                continue
            found[key("up", target)] = 1.0
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in used:
                        found[key(sample.name, {**sample.labels, **target})] = sample.value
        return found


def key(name: str, labels: dict[str, str]) -> Key:
    return name, tuple(sorted(labels.items()))


def values(scrape: dict[Key, float], name: str, **labels: str) -> list[float]:
    return [v for (n, lbls), v in scrape.items() if n == name and labels.items() <= dict(lbls).items()]


def one(scrape: dict[Key, float], name: str, **labels: str) -> float:
    found = values(scrape, name, **labels)
    return found[0] if len(found) == 1 else float("nan")


# ------------------------------------------------------------------ the history promtool replays

def is_counter(name: str) -> bool:
    return name.endswith(("_total", "_bucket", "_count", "_sum"))


def history(phases: list[tuple[dict[Key, float], int]]) -> list[dict[str, str]]:
    """promtool input series: each phase holds its scrape's values for its minutes. A counter is
    constant in the first phase and then grows each minute by what it grew between the previous
    scrape and this one (a series new since, or restarted, by its whole value), going on from where
    the replay left it; an age grows by the minute. A series a scrape lacks is absent then (`_`)."""
    keys = sorted({k for scrape, _ in phases for k in scrape})
    series = []
    for name, labels in keys:
        points: list[str] = []
        previous: float | None = None  # the live value at the previous scrape
        replayed = 0.0  # the replay's last value of this counter
        for phase, (scrape, minutes) in enumerate(phases):
            now = scrape.get((name, labels))
            if now is None:
                points += ["_"] * minutes
                previous = None
                continue
            if is_counter(name):
                if phase == 0:
                    start, step = now, 0.0
                elif previous is None:  # new since the previous scrape
                    start, step = now, now
                else:
                    step = now - previous if now >= previous else now
                    start = replayed + step
                points += [_number(start + step * i) for i in range(minutes)]
                replayed = start + step * (minutes - 1)
            elif name in AGES and now > 0:
                points += [_number(now + 60 * i) for i in range(minutes)]
            else:
                points += [_number(now)] * minutes
            previous = now
        selector = ",".join(f'{k}="{v}"' for k, v in labels)
        series.append({"series": f"{name}{{{selector}}}", "values": " ".join(points)})
    return series


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


def expected(alert: str, *label_sets: dict[str, str]) -> list[dict[str, Any]]:
    """The alerts `alert` should raise, one per label set: its labels and its rendered annotations."""
    rule = next(r for r in rules() if r["alert"] == alert)
    out = []
    for labels in label_sets:
        def render(text: str, labels: dict[str, str] = labels) -> str:
            return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        out.append({"exp_labels": {**labels, **rule["labels"]},
                    "exp_annotations": {k: render(v) for k, v in rule["annotations"].items()}})
    return out


# ------------------------------------------------------------------ the faults

def test_the_alerts_fire_on_live_series_exactly_when_they_should(config, zk, paths, procs, tmp_path, small_disk):
    tool = promtool()
    used = used_metrics()
    disks = {host: small_disk(host, 16 << 20) for host in ("host-1", "host-2")}
    procs.start("gcm", "gcm-0")
    for host, disk in disks.items():
        procs.start("hcm", host, f"hcm.host={host}", f"hcm.data_dir={disk}", "hcm.max_restarts=1",
                    "hcm.stats_interval=0.5")
    wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 2, message="the cluster")
    admin = Admin(config)
    try:
        admin.create_queue("mirrored", exchanges=1, replicas=2)
        primary = wait_until(lambda: read_live(zk, paths, "mirrored").get("x1"), message="the exchange")
        replica = wait_until(lambda: read_json(zk, paths.replica_live("mirrored", "x1")), message="the replica")
        survivor = primary["host"]
        victim = replica["host"]
        assert {survivor, victim} == set(disks)
        targets = Targets(admin.status())
        survivor_url = next(h["metrics"] for h in admin.status()["hosts"] if h["name"] == survivor)
        victim_url = next(h["metrics"] for h in admin.status()["hosts"] if h["name"] == victim)
        healthy = wait_until(lambda: (s := targets.scrape(used)) and values(s, "roq_replica_failed")
                             and one(s, "roq_queue_running", queue="mirrored") == 1 and s, message="a healthy scrape")

        # A confirm of the replicated queue held by its stopped replica.
        with Publisher("mirrored", config) as pub:
            os.kill(replica["pid"], signal.SIGSTOP)
            try:
                pub.publish("t", b"slow")
                wait_until(lambda: one(targets.scrape(used | {"roq_exchange_held_acks"}), "roq_exchange_held_acks",
                                       queue="mirrored") >= 1, message="the confirm held")
                threading.Event().wait(HOLD)  # the fault: the replica stays stopped this long
            finally:
                os.kill(replica["pid"], signal.SIGCONT)
            pub.flush(10)

        # The replica's host is lost.
        procs.kill(victim, signal.SIGKILL)
        wait_until(lambda: one(targets.scrape(used), "roq_cluster_hosts") == 1, timeout=30, message="a host lost")

        # On the survivor: a durable subscriber that takes nothing, a group that dead-letters, then has no
        # member, an exchange killed until it is left alone, a data disk over 90% full.
        admin.create_queue("work", exchanges=1)
        admin.create_queue("flaky", exchanges=1)
        wait_until(lambda: len(read_live(zk, paths, "work")) == len(read_live(zk, paths, "flaky")) == 1,
                   message="work and flaky running")
        lagging = Subscriber("work", config.replace(client={"state_dir": str(tmp_path / "state"),
                                                            "position_save_interval": 0.2}), durable="dash")
        member = Subscriber("work", config, ["jobs"], group="workers", auto_ack=False, max_deliveries=1,
                            callback=lambda msg: msg.nack())
        try:
            lagging.wait_connected()
            member.wait_connected()
            with Publisher("work", config) as pub:
                for i in range(5):
                    pub.publish("jobs", b"poison %d" % i)
                pub.flush(10)
                wait_until(lambda: one(targets.scrape(used), "roq_group_dead_lettered_total", group="workers") == 5,
                           message="5 dead letters")
                member.close()
                for i in range(20):
                    pub.publish("jobs", b"job %d" % i)
                pub.publish_many("load", [b"%d" % i for i in range(200)])
                pub.flush(10)
            for _ in range(2):  # killed twice within hcm.restart_window: more than hcm.max_restarts (1)
                pid = wait_until(lambda: (x := read_live(zk, paths, "flaky").get("x1")) and x["pid"],
                                 message="flaky running")
                os.kill(pid, signal.SIGKILL)
                wait_until(lambda pid=pid: (read_live(zk, paths, "flaky").get("x1") or {}).get("pid") != pid,
                           message="the killed exchange gone")
            free = os.statvfs(disks[survivor])
            with open(disks[survivor] / "filler", "wb") as filler:
                filler.write(b"\0" * (free.f_bavail * free.f_frsize - free.f_blocks * free.f_frsize // 20))

            def faults_seen() -> dict[Key, float] | None:
                s = targets.scrape(used)
                seen = (one(s, "roq_exchange_failed", queue="flaky") == 1
                        and one(s, "roq_queue_running", queue="flaky") == 0
                        and one(s, "roq_group_ready_messages", group="workers") == 20
                        and one(s, "roq_exchange_consumer_lag_seconds", subscriber="dash") > 0
                        and sum(values(s, "roq_host_data_free_bytes", host=survivor)) <
                        0.1 * sum(values(s, "roq_host_data_total_bytes", host=survivor)))
                return s if seen else None
            before = wait_until(faults_seen, timeout=60, message="every fault in the scrapes")
            # The ages grow with the clock in the live cluster, as the history has them grow.
            faulty = wait_until(lambda: (s := targets.scrape(used)) and all(
                one(s, name) > one(before, name) for name in AGES) and s, message="the ages growing")
        finally:
            member.close()
            lagging.close()

        procs.kill("gcm-0", signal.SIGKILL)
        no_gcm = wait_until(lambda: (s := targets.scrape(used)) and not values(s, "roq_gcm_leader") and s,
                            message="the GCM gone")
    finally:
        admin.close()

    # The history and what should fire when: nothing while healthy; each fault's alert once its `for`
    # passed; with the GCM gone, no leader.
    # Checked 12 minutes into the faults: every `for` has passed, and the 15-minute look-back of
    # RoqHostLost still sees the healthy phase's hosts.
    healthy_end, faults_end, no_gcm_end = HEALTHY - 1, HEALTHY + 12, HEALTHY + FAULTS + NO_GCM - 1
    victim_target = {"job": "roq-hcm", "instance": Targets.instance(victim_url)}
    gcm_target = {"job": "roq-gcm", "instance": Targets.instance(next(u for u, j in targets.urls.items()
                                                                       if j == "roq-gcm"))}
    firing = {
        "RoqEndpointDown": expected("RoqEndpointDown", victim_target),
        "RoqHostLost": expected("RoqHostLost", {}),
        "RoqExchangesNotRunning": expected("RoqExchangesNotRunning", {"queue": "flaky"}),
        "RoqExchangeFailed": expected("RoqExchangeFailed", {"queue": "flaky", "exchange": "x1", "host": survivor}),
        "RoqReplicaMissing": expected("RoqReplicaMissing", {"queue": "mirrored", "exchange": "x1"}),
        "RoqConfirmLatency": expected("RoqConfirmLatency", {"queue": "mirrored"}),
        "RoqConsumerLag": expected("RoqConsumerLag", {"queue": "work", "subscriber": "dash"}),
        "RoqGroupBacklog": expected("RoqGroupBacklog", {"queue": "work", "group": "workers"}),
        "RoqDeadLetters": expected("RoqDeadLetters", {"queue": "work", "group": "workers"}),
        "RoqDataDiskLow": expected("RoqDataDiskLow", {"host": survivor}),
    }
    last = {"RoqNoLeader": expected("RoqNoLeader", {}),
            "RoqEndpointDown": expected("RoqEndpointDown", victim_target, gcm_target)}
    checks = []
    for rule in rules():
        name = rule["alert"]
        checks += [{"eval_time": f"{healthy_end}m", "alertname": name, "exp_alerts": []},
                   {"eval_time": f"{faults_end}m", "alertname": name, "exp_alerts": firing.get(name, [])}]
        if name in last:
            checks.append({"eval_time": f"{no_gcm_end}m", "alertname": name, "exp_alerts": last[name]})
    not_driven = {r["alert"] for r in rules()} - set(firing) - set(last)
    assert not_driven == {"RoqSeveralLeaders", "RoqReplicaFailed", "RoqStorageFull"}  # checked not to fire

    # Only the replicated queue's confirms were made slow: the others' depend on this machine's load.
    def kept(k: Key) -> bool:
        return k[0] != "roq_exchange_confirm_seconds_bucket" or ("queue", "mirrored") in k[1]
    phases = [({k: v for k, v in scrape.items() if kept(k)}, minutes)
              for scrape, minutes in ((healthy, HEALTHY), (faulty, FAULTS), (no_gcm, NO_GCM))]
    assert one(faulty, "up", **victim_target) == 0 and one(no_gcm, "up", instance=Targets.instance(survivor_url)) == 1
    shutil.copy(MONITORING / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "alerts.test.yml").write_text(json.dumps({
        "rule_files": ["alerts.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": history(phases), "alert_rule_test": checks}]}, indent=1))
    tested = subprocess.run([tool, "test", "rules", str(tmp_path / "alerts.test.yml")], capture_output=True,
                            text=True, timeout=120)
    assert tested.returncode == 0, (tested.stdout + tested.stderr)[-8000:]
