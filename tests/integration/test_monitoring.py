"""Monitoring: host figures in ZooKeeper, `roq stats`, `roq queue rules`, Prometheus endpoints."""

from __future__ import annotations

import json
import urllib.request

import pytest

from roq.client.admin import Admin
from roq.state import read_hosts, read_leader
from roq.tools.testing import wait_until
from tests.integration.conftest import create, start_cluster
from tests.integration.test_cli import assert_one_line_error, config_file, roq

pytestmark = pytest.mark.integration


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


def test_prometheus_endpoints_of_the_leader_and_the_hosts(config, zk, paths, monitored):
    leader = wait_until(lambda: read_leader(zk, paths), message="leader")
    wait_until(lambda: 'roq_queue_exchanges{queue="watched"} 2.0' in scrape(leader["metrics"]),
               message="the leader's per-queue aggregates")
    text = scrape(leader["metrics"])
    assert "roq_gcm_leader" in text and "roq_exchange_msgs_in_per_s" in text
    for name in read_hosts(zk, paths):
        url = wait_until(lambda name=name: json.loads(zk.get(paths.host(name))[0]).get("metrics"),
                         message="metrics URL in the registration")
        wait_until(lambda url=url: 'roq_exchange_subscriptions{exchange=' in scrape(url),
                   message="exchange figures on the host endpoint")
        assert "roq_host_cpu_percent" in scrape(url)


def test_roq_stats_and_rules_from_the_command_line(config, zk, paths, monitored, tmp_path):
    cfg = str(config_file(tmp_path, config))
    shown = roq("--config", cfg, "queue", "rules", "watched", "--max-rate", "5000", "--max", "4", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["max_rate"] == 5000 and json.loads(shown.stdout)["max_exchanges"] == 4
    assert_one_line_error(roq("--config", cfg, "queue", "rules", "watched", "--min", "5"), 1, "above max_exchanges")
    assert_one_line_error(roq("--config", cfg, "queue", "rules", "nope", "--max", "2"), 1, "does not exist")
    with Admin(config, zk) as admin:
        assert admin.queue_rules("watched")["max_exchanges"] == 4  # the refused changes changed nothing
    stats = json.loads(roq("--config", cfg, "stats", "--json").stdout)
    assert stats["queues"]["watched"]["exchanges"] == 2 and len(stats["hosts"]) == 2
    view = roq("--config", cfg, "stats", "--once")
    assert view.returncode == 0 and "watched" in view.stdout and "host-1" in view.stdout
