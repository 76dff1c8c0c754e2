"""Monitoring: host figures in ZooKeeper, `roq stats`, `roq queue rules`, Prometheus endpoints (checked
by promtool, with the scrape example and the Grafana dashboard of monitoring/)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from itertools import combinations
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.state import read_hosts, read_live
from tests.conftest import unavailable
from tests.integration.conftest import create, start_cluster
from tests.integration.test_cli import assert_one_line_error, config_file, roq
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
COUNTERS = ("roq_exchange_messages_in", "roq_exchange_messages_out", "roq_exchange_bytes_in",
            "roq_exchange_bytes_out", "roq_exchange_drops", "roq_exchange_duplicates", "roq_exchange_fetches",
            "roq_exchange_restarts")


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


@pytest.fixture
def monitored(config, zk, paths, procs):
    start_cluster(procs, zk, paths, "exchange.stats_interval=0.5", "hcm.stats_interval=0.5")
    create(config, zk, paths, "watched", 2)
    return procs


def test_hosts_report_cpu_and_memory(config, zk, paths, monitored):
    # The queue's two exchanges are spread over both hosts: each reports one.
    hosts = wait_until(lambda: (h := read_hosts(zk, paths)) and all(x.stats.get("exchanges") == 1
                                                                    for x in h.values()) and h,
                       message="host figures in ZooKeeper")
    for host in hosts.values():
        assert 0 <= host.stats["cpu_percent"] <= 100 and 0 < host.stats["memory_percent"] < 100


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        unavailable("no promtool (Debian's prometheus package; `make test` installs it)", "the Prometheus checks")
    return found


def families(url: str) -> dict[str, Metric]:
    """The endpoint's metric families by name (a counter's without `_total`, as the parser gives it)."""
    return {family.name: family for family in text_string_to_metric_families(scrape(url))}


def value(fams: dict[str, Metric], name: str, sample: str | None = None) -> float:
    """The sum of the family's samples called `sample` (default: the family's name); 0 without it."""
    family = fams.get(name)
    return sum(s.value for s in family.samples if s.name == (sample or name)) if family else 0.0


def total(urls: list[str], name: str, sample: str) -> float:
    """`value` summed over the endpoints."""
    return sum(value(families(url), name, sample) for url in urls)


def test_prometheus_endpoints_under_load(config, zk, paths, monitored, tmp_path):
    tool = promtool()
    # Every daemon's metrics URL, as an operator finds them.
    shown = roq("--config", str(config_file(tmp_path, config)), "cluster", "status", "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    leader = next(g["metrics"] for g in status["gcms"] if g["id"] == status["leader"]["id"])
    hosts = [h["metrics"] for h in status["hosts"]]
    assert len(hosts) == 2 and all(url.startswith("http://") for url in hosts)
    with Admin(config) as admin:  # an exchange and its replica, on the two hosts
        admin.create_queue("mirrored", exchanges=1, replicas=2)
    wait_until(lambda: value(families(leader), "roq_queue_running") == 3, message="the leader's aggregates")
    wait_until(lambda: all("roq_exchange_messages_in" in families(url) for url in hosts)
               and any("roq_replica_retained_bytes" in families(url) for url in hosts),
               message="the exchanges' and the replica's first reports on their hosts' endpoints")

    # Counters increase with the load (the exchanges report every 0.5 s); a durable subscriber that
    # takes nothing falls behind by all of it (consumer lag).
    lagging = Subscriber("watched", config.replace(client={"state_dir": str(tmp_path / "state"),
                                                           "position_save_interval": 0.2}), durable="dash")
    lagging.wait_connected(2)
    # A consumer group whose member holds at most 10 per exchange and acks nothing: the roq_group_*
    # series of the dashboard's group panels, with a backlog of what the load leaves.
    member = Subscriber("watched", config, ["load"], group="workers", prefetch=10, auto_ack=False)
    batches = (300, 200)
    for batch in batches:
        before = total(hosts, "roq_exchange_messages_in", "roq_exchange_messages_in_total")
        with Publisher("watched", config) as pub:
            pub.publish_many("load", [b"%d" % i for i in range(batch)], timeout=10)
            pub.flush(10)
        wait_until(lambda before=before, batch=batch: total(hosts, "roq_exchange_messages_in",
                                                            "roq_exchange_messages_in_total") >= before + batch,
                   message=f"{batch} more messages counted")
    confirms = wait_until(lambda: total(hosts, "roq_exchange_confirm_seconds", "roq_exchange_confirm_seconds_count"),
                          message="confirm latencies in the histogram")
    assert confirms >= 2  # at least a batch per publisher
    payload_bytes = sum(len(b"%d" % i) for batch in batches for i in range(batch))
    assert total(hosts, "roq_exchange_bytes_out", "roq_exchange_bytes_out_total") == payload_bytes

    wait_until(lambda: total(hosts, "roq_exchange_consumer_lag_messages", "roq_exchange_consumer_lag_messages")
               == sum(batches), message="the durable subscriber's lag")
    lagging.close()
    wait_until(lambda: total(hosts, "roq_group_ready_messages", "roq_group_ready_messages")
               + total(hosts, "roq_group_in_flight_messages", "roq_group_in_flight_messages") == sum(batches)
               and total(hosts, "roq_group_members", "roq_group_members") == 2, message="the group's figures")
    store_figures(config, zk, paths, hosts, tmp_path)
    texts = {url: scrape(url) for url in [leader, *hosts]}
    member.close()
    for url, text in texts.items():
        check = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), (url, check.stdout, check.stderr)
    parsed = {url: list(text_string_to_metric_families(text)) for url, text in texts.items()}
    for url, fams in parsed.items():
        names = {f.name for f in fams}
        assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info"} <= names, url
        assert not [n for n in names if n.endswith(("_per_s", "_percent"))], url
        for family in fams:
            if family.type == "counter":  # every sample of a counter is its `_total`
                assert {s.name for s in family.samples} == {f"{family.name}_total"}, family
    host_names = {f.name: f for url in hosts for f in parsed[url]}
    assert all(host_names[name].type == "counter" for name in COUNTERS)
    histogram = host_names["roq_exchange_confirm_seconds"]
    assert histogram.type == "histogram" and {s.labels.get("le") for s in histogram.samples} >= {"0.001", "+Inf"}
    assert all(0 <= s.value <= 1 for s in host_names["roq_host_cpu_ratio"].samples)

    # One series per exchange, replica and host over all the endpoints; the leader exports none of them.
    def series(url: str) -> set[tuple[str, ...]]:
        """(exchange|replica, queue, id) or (host, name) of each such series of the endpoint."""
        return {(kind, s.labels["queue"], s.labels["exchange"]) if kind != "host" else (kind, s.labels["host"])
                for f in parsed[url] if (kind := f.name.split("_")[1]) in ("exchange", "replica", "host")
                for s in f.samples}
    assert not series(leader)
    assert {f.name for f in parsed[leader]} >= {"roq_gcm_leader", "roq_queue_exchanges", "roq_cluster_hosts"}
    for a, b in combinations(hosts, 2):
        assert not series(a) & series(b)
    assert set().union(*map(series, hosts)) == {
        *(("exchange", q, xid) for q in ("watched", "mirrored", "kept") for xid in read_live(zk, paths, q)),
        ("replica", "mirrored", "x1"), ("host", "host-1"), ("host", "host-2")}

    # The scrape example, with targets written from the status, and the dashboard's metrics.
    for name in ("prometheus.yml", "alerts.yml"):  # the example loads the alerts beside it
        shutil.copy(MONITORING / name, tmp_path / name)
    written = subprocess.run([sys.executable, str(MONITORING / "targets.py"), str(tmp_path / "targets")],
                             input=shown.stdout, capture_output=True, text=True, timeout=30)
    assert written.returncode == 0, written.stderr
    hcm_targets = json.loads((tmp_path / "targets" / "hcm.json").read_text())[0]["targets"]
    assert sorted(hcm_targets) == sorted(url.split("/")[2] for url in hosts)
    checked = subprocess.run([tool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    exported = {s.name for fams in parsed.values() for f in fams for s in f.samples}
    queries = dashboard_queries()
    used = {name for query in queries for name in re.findall(r"\b((?:roq|process)_[a-z0-9_]+)", query)}
    assert len(used) >= 20 and used <= exported, sorted(used - exported)
    assert {"roq_group_ready_messages", "roq_group_delayed_messages", "roq_group_in_flight_messages",
            "roq_group_members", "roq_group_lag_seconds", "roq_group_redelivered_total",
            "roq_group_dead_lettered_total"} <= used  # the group panels
    # promtool parses PromQL in rule files: the dashboard's queries as recording rules (JSON is YAML).
    rules = [{"record": f"dashboard:query_{i}", "expr": query.replace("$__rate_interval", "1m")
              .replace("$queue", ".*").replace("$group", ".*")}
             for i, query in enumerate(queries) if not query.startswith("label_values(")]
    (tmp_path / "dashboard.rules.yml").write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    parsed_rules = subprocess.run([tool, "check", "rules", str(tmp_path / "dashboard.rules.yml")],
                                  capture_output=True, text=True, timeout=30)
    assert parsed_rules.returncode == 0, parsed_rules.stdout + parsed_rules.stderr


def store_figures(config, zk, paths, hosts: list[str], tmp_path: Path) -> None:
    """A queue with a disk storage policy: its exchange's segment store in the metrics and `roq stats`."""
    with Admin(config) as admin:
        admin.create_queue("kept", exchanges=1, retention=3_600.0, retention_bytes=1 << 30)
    wait_until(lambda: read_live(zk, paths, "kept").get("x1"), timeout=20, message="kept/x1 running")
    before = time.time()
    with Publisher("kept", config) as pub:
        pub.publish_many("t", [bytes(1_000)] * 100, timeout=10)
        pub.flush(10)
    after = time.time()

    def store(name: str) -> float | None:
        found = [s.value for url in hosts for f in families(url).values() for s in f.samples
                 if s.name == name and s.labels.get("queue") == "kept"]
        return found[0] if found else None
    wait_until(lambda: (store("roq_exchange_store_bytes") or 0) > 100_000, message="kept's store in the metrics")
    assert store("roq_exchange_store_segments") == 1 and store("roq_exchange_store_oldest_position") == 1
    assert store("roq_exchange_store_full") == 0
    assert before <= (store("roq_exchange_store_oldest_timestamp_seconds") or 0) <= after
    watched = [f.name for url in hosts for f in families(url).values() for s in f.samples
               if f.name.startswith("roq_exchange_store") and s.labels.get("queue") == "watched"]
    assert not watched, "a memory-only queue has no store series"
    cfg = str(config_file(tmp_path, config))
    kept = wait_until(lambda: (q := json.loads(roq("--config", cfg, "stats", "--json").stdout)["queues"]["kept"])
                      ["store_bytes"] > 100_000 and q, message="kept's store in the leader's aggregate")
    (x1,) = kept["by_exchange"]
    assert (x1["store_state"], x1["store_segments"], x1["store_oldest_pos"]) == ("ok", 1, 1)
    assert before <= x1["store_oldest_time"] <= after
    view = roq("--config", cfg, "stats", "--once")
    assert view.returncode == 0 and "segment stores" in view.stdout and "kept / x1" in view.stdout, view.stdout


def dashboard_queries() -> list[str]:
    """The Grafana dashboard's queries (panels and variables)."""
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", ())]  # a row has none
    return queries + [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]


def test_the_target_writer_refuses_what_is_not_the_status(tmp_path):
    for stdin, fragment in (("not json", "is not JSON"), ('{"queues": []}', "has no `gcms` and `hosts`")):
        result = subprocess.run([sys.executable, str(MONITORING / "targets.py"), str(tmp_path)], input=stdin,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 1 and fragment in result.stderr and len(result.stderr.splitlines()) == 1
        assert not list(tmp_path.iterdir())


def test_roq_stats_and_rules_from_the_command_line(config, zk, paths, monitored, tmp_path):
    cfg = str(config_file(tmp_path, config))
    shown = roq("--config", cfg, "queue", "rules", "watched", "--max-rate", "5000", "--max", "4", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["max_rate"] == 5000 and json.loads(shown.stdout)["max_exchanges"] == 4
    assert_one_line_error(roq("--config", cfg, "queue", "rules", "watched", "--min", "5"), 1, "--min must be <= --max")
    assert_one_line_error(roq("--config", cfg, "queue", "rules", "nope", "--max", "2"), 1, "does not exist")
    with Admin(config) as admin:
        assert admin.queue_rules("watched")["max_exchanges"] == 4  # the refused changes changed nothing
    stats = json.loads(roq("--config", cfg, "stats", "--json").stdout)
    assert stats["queues"]["watched"]["exchanges"] == 2 and len(stats["hosts"]) == 2
    view = roq("--config", cfg, "stats", "--once")
    assert view.returncode == 0 and "watched" in view.stdout and "host-1" in view.stdout
