"""When the HCM writes statistics to ZooKeeper (hcm/heartbeat.py): on a material change, on an
exchange going silent or reporting again, else on the heartbeat; and how publishers judge a stale
exchange from that (roq/client/publisher/exchange_choice.py is_stale). The supervisor and the registration are driven
with the test's clock and a stand-in ZooKeeper client that counts writes, so every count is exact;
tests/integration/test_zk_writes.py does it with real processes."""

from __future__ import annotations

import io
import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from kazoo.exceptions import NodeExistsError, NoNodeError

import hcm.supervisor
from hcm.channel import REPLICA_READY_FIELDS
from hcm.heartbeat import SILENT_AFTER, exchange_changed, host_changed, write_due
from hcm.hoststats import disk_space, host_figures
from hcm.registration import HostRegistration
from hcm.supervisor import Supervisor
from roq.client.publisher.exchange_choice import STALE_STATS, is_stale
from roq.config import Config
from roq.paths import Paths
from roq.records import ExchangeStats, HostStats

KEY = ("q", "x1")
T0 = 1000.0
TICK = 0.1
INTERVAL = 0.5  # exchange.stats_interval
HEARTBEAT = 30.0  # hcm.stats_heartbeat
_pids = itertools.count(60_000)


class FakeZooKeeper:
    """Records every write; `get` finds nothing (no queue settings: one replica)."""

    client_id = (1, b"")

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, dict[str, Any]]] = []

    def retry(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    def get(self, path: str) -> Any:
        raise NoNodeError(path)

    def create(self, path: str, value: bytes, ephemeral: bool = False, makepath: bool = False) -> None:
        if path in self.nodes:
            raise NodeExistsError(path)
        self._write(path, value)

    def set(self, path: str, value: bytes) -> None:
        if path not in self.nodes:
            raise NoNodeError(path)
        self._write(path, value)

    def delete(self, path: str) -> None:
        if self.nodes.pop(path, None) is None:
            raise NoNodeError(path)

    def ensure_path(self, path: str) -> None:
        pass

    def get_children(self, path: str) -> list[str]:
        raise NoNodeError(path)

    def DataWatch(self, path: str, func: Any) -> None:  # noqa: N802 - kazoo's name (the admin commands' watch)
        func(None, None)

    def _write(self, path: str, value: bytes) -> None:
        data = json.loads(value)
        self.nodes[path] = data
        self.writes.append((path, data))


class RunningProcess:
    def __init__(self, command: list[str], **_: Any) -> None:
        self.pid = next(_pids)
        self.stdin, self.stdout, self.stderr = io.BytesIO(), io.BytesIO(), io.BytesIO()
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9


# ------------------------------------------------------------------ the rule


def test_only_figures_that_move_with_work_or_clients_count_as_a_change() -> None:
    base = ExchangeStats(msgs_in=10, rss_bytes=40 << 20, retained_frames=5, at=1.0)
    assert exchange_changed(None, base) and not exchange_changed(base, None)
    # Drifting gauges and the arrival time: no write of their own.
    assert not exchange_changed(base, replace(base, at=2.0, rss_bytes=41 << 20, retained_frames=0,
                                              retained_bytes=0, evicted_frames=5, tracked_prefixes=1,
                                              replay_held_bytes=10))
    for change in ({"msgs_in": 11}, {"msgs_in_per_s": 0.5}, {"publishers": 1}, {"subscribers": 1},
                   {"subscriptions": 2}, {"top_publishers": (("p", 1.0),)}, {"held_acks": 1},
                   {"latency_p50_ms": 1.0}, {"refused_connections": 1}):
        assert exchange_changed(base, replace(base, **change)), change


def test_host_figures_count_as_a_change_by_steps() -> None:
    base = HostStats(cpu_percent=20.0, memory_percent=50.0, load1=0.3, cpus=2, exchanges=3, at=1.0)
    assert host_changed(None, base)
    assert not host_changed(base, replace(base, cpu_percent=24.9, memory_percent=45.1, load1=1.5,
                                          memory_used_bytes=123, at=9.0))
    for change in ({"cpu_percent": 25.0}, {"cpu_percent": 15.0}, {"memory_percent": 55.0}, {"exchanges": 4},
                   {"cpus": 4}):
        assert host_changed(base, replace(base, **change)), change


def test_the_data_disk_counts_by_steps_and_when_its_free_space_halves() -> None:
    base = HostStats(data_free_bytes=800 << 20, data_total_bytes=1000 << 20)
    assert not host_changed(base, replace(base, data_free_bytes=760 << 20))
    assert host_changed(base, replace(base, data_free_bytes=750 << 20))  # 5 points
    big = HostStats(data_free_bytes=40 << 30, data_total_bytes=1 << 40)  # 4% of a big disk free
    assert not host_changed(big, replace(big, data_free_bytes=30 << 30))
    assert host_changed(big, replace(big, data_free_bytes=20 << 30))  # halved: running out shows early
    near_zero = HostStats(data_free_bytes=100 << 10, data_total_bytes=1 << 40)
    assert not host_changed(near_zero, replace(near_zero, data_free_bytes=10 << 10))  # not a write per page
    assert not host_changed(HostStats(), HostStats(data_free_bytes=5))  # unknown disks never count


def test_the_data_disk_is_measured_at_the_nearest_existing_directory(tmp_path) -> None:
    free, total = disk_space(tmp_path / "not" / "yet" / "made")
    assert total > 0 and 0 <= free <= total
    assert disk_space(tmp_path)[1] == total  # the same file system
    assert host_figures(tmp_path).data_total_bytes == total


def test_write_due() -> None:
    assert write_due(None, T0, changed=False, heartbeat=HEARTBEAT)
    assert not write_due(T0, T0 + HEARTBEAT - 0.01, changed=False, heartbeat=HEARTBEAT)
    assert write_due(T0, T0 + HEARTBEAT, changed=False, heartbeat=HEARTBEAT)
    assert write_due(T0, T0 + INTERVAL, changed=True, heartbeat=HEARTBEAT, min_interval=INTERVAL)
    assert not write_due(T0, T0 + INTERVAL / 2, changed=True, heartbeat=HEARTBEAT, min_interval=INTERVAL)


# ------------------------------------------------------------------ the supervisor


@pytest.fixture(params=[0.0])
def running(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> tuple[Supervisor, FakeZooKeeper]:
    """One exchange, ready at T0 and published, with one report written. Silent exchanges stay
    (hcm.hung_timeout 0) unless a test asks for a timeout (indirect parametrization)."""
    monkeypatch.setattr(hcm.supervisor.subprocess, "Popen", RunningProcess)
    zk = FakeZooKeeper()
    config = Config().replace(exchange={"stats_interval": INTERVAL},
                              hcm={"stats_heartbeat": HEARTBEAT, "hung_timeout": request.param})
    sup = Supervisor(zk, Paths("/test"), config, "host-1")  # type: ignore[arg-type]
    sup.set_desired({KEY})
    sup.tick(T0)
    child = sup.children[KEY]
    child.ready = {"pub": "tcp://a:1", "sub": "tcp://a:2", "replay": "tcp://a:3", "incarnation": "x1.1"}
    report(sup, T0, ExchangeStats())
    sup.tick(T0)
    assert len(zk.writes) == 1 and zk.writes[0][1]["heartbeat"] == HEARTBEAT
    assert zk.writes[0][1]["stats_interval"] == INTERVAL  # clients judge the age of `at` with it
    return sup, zk


def report(sup: Supervisor, now: float, stats: ExchangeStats) -> None:
    """What the events thread does when a report arrives (at `now` on the test's clock)."""
    child = sup.children[KEY]
    child.stats, child.reported = replace(stats, at=now), now


def run(sup: Supervisor, start: float, seconds: float, stats: ExchangeStats | None = ExchangeStats()) -> None:
    """Tick every TICK; a report (the same figures, a new `at`) every INTERVAL unless `stats` is None."""
    for i in range(round(seconds / TICK)):
        now = start + i * TICK
        if stats is not None and i % round(INTERVAL / TICK) == 0:
            report(sup, now, stats)
        sup.tick(now)


def test_an_idle_exchange_is_written_once_per_heartbeat(running) -> None:
    sup, zk = running
    run(sup, T0 + TICK, HEARTBEAT - 2 * TICK)  # 59 reports, all alike
    assert len(zk.writes) == 1
    run(sup, T0 + HEARTBEAT, 3 * HEARTBEAT)
    assert len(zk.writes) == 4  # the heartbeats
    path, data = zk.writes[-1]
    assert path == "/test/live/q/x1" and data["silent"] is False
    assert data["stats"]["at"] >= T0 + 3 * HEARTBEAT - TICK  # a fresh `at` with each heartbeat


def test_a_change_is_written_at_once_then_never_more_often_than_the_reports(running) -> None:
    sup, zk = running
    busy = ExchangeStats(msgs_in=100, msgs_in_per_s=100.0, publishers=1)
    report(sup, T0 + 1, busy)
    sup.tick(T0 + 1)
    assert len(zk.writes) == 2 and zk.writes[-1][1]["stats"]["msgs_in"] == 100
    for step in range(1, 11):  # new figures with every report: one write per report interval
        report(sup, T0 + 1 + step * INTERVAL, replace(busy, msgs_in=100 + step))
        for tick in range(round(INTERVAL / TICK)):
            sup.tick(T0 + 1 + step * INTERVAL + tick * TICK)
    assert len(zk.writes) == 12


def test_a_silent_exchange_is_written_once_as_silent_and_again_when_it_reports(running) -> None:
    sup, zk = running
    silent_after = SILENT_AFTER * INTERVAL
    run(sup, T0 + TICK, silent_after - TICK, stats=None)  # it stops reporting: frozen
    assert len(zk.writes) == 1
    run(sup, T0 + silent_after, 2 * TICK, stats=None)
    assert len(zk.writes) == 2, "written as silent once no report came for SILENT_AFTER intervals"
    data = zk.writes[-1][1]
    assert data["silent"] is True and data["stats"]["at"] == T0  # its last report, ageing
    run(sup, T0 + silent_after + 2 * TICK, 10 * HEARTBEAT, stats=None)
    assert len(zk.writes) == 2, "no heartbeat while silent"
    run(sup, T0 + 11 * HEARTBEAT, 1.0)
    assert len(zk.writes) == 3 and zk.writes[-1][1]["silent"] is False


@pytest.mark.parametrize("running", [5.0], indirect=True)
def test_a_hung_exchange_is_killed_after_hung_timeout_and_started_again(running) -> None:
    """A frozen replica once stalled its primary's confirms for as long as it hung."""
    sup, zk = running
    first = sup.children[KEY].process
    run(sup, T0 + TICK, 5.0 - 2 * TICK, stats=None)  # silent, not yet hung
    assert sup.children[KEY].process is first and first.returncode is None
    run(sup, T0 + 5.0, 2 * TICK, stats=None)
    assert first.returncode == -9, "killed once it sent nothing for hcm.hung_timeout"
    run(sup, T0 + 5.0 + 2 * TICK, 2.0, stats=None)
    child = sup.children[KEY]
    assert child.process is not None and child.process is not first and child.restarts == 1
    assert len(child.crashes) == 1  # a hang counts as a crash: one that keeps hanging ends FAILED


@pytest.mark.parametrize("running", [5.0], indirect=True)
def test_a_paused_hcm_does_not_kill_for_its_own_pause(running) -> None:
    sup, _ = running
    process = sup.children[KEY].process
    sup.tick(T0 + 8)  # the HCM itself was held up for 8 s: the reports meanwhile are not read yet
    assert process.returncode is None


def test_a_paused_hcm_does_not_take_its_own_pause_for_the_exchange_s_silence(running) -> None:
    sup, zk = running
    sup.tick(T0 + 5)  # the HCM itself was held up for 5 s; the reports meanwhile are not read yet
    assert len(zk.writes) == 1
    report(sup, T0 + 5 + TICK / 2, ExchangeStats())  # read now
    run(sup, T0 + 5 + TICK, 2.0)
    assert len(zk.writes) == 1
    sup.tick(T0 + 10)  # late again, and this time no report follows: silent from the next tick
    sup.tick(T0 + 10 + TICK)
    assert len(zk.writes) == 2 and zk.writes[-1][1]["silent"] is True


def test_a_restarted_exchange_is_published_in_full(running) -> None:
    sup, zk = running
    child = sup.children[KEY]
    assert child.process is not None
    child.process.returncode = 1  # crashed
    sup.tick(T0 + 1)
    sup.tick(T0 + 1 + sup.hcm.restart_backoff)  # started again
    child.ready = {"pub": "tcp://a:4", "sub": "tcp://a:5", "replay": "tcp://a:6", "incarnation": "x1.2"}
    child.reported = T0 + 2
    assert "/test/live/q/x1" not in zk.nodes  # removed when it was reaped
    sup.tick(T0 + 2)
    assert zk.writes[-1][1]["pub"] == "tcp://a:4" and zk.writes[-1][1]["restarts"] == 1


def test_a_changed_ready_event_is_written_at_once_and_a_repeated_one_not_at_all(running) -> None:
    """A replica sends its ready event again when the ended incarnations it serves change
    (`stored`, protocol section 1): subscribers starting from the beginning must see them soon."""
    sup, zk = running
    child = sup.children[KEY]
    ready = {"event": "ready", "repl": "tcp://a:7", "replay": "tcp://a:8", "incarnation": "x1~r.1", "pid": 1,
             "stored": ["x1.a"]}
    sup.channel._on_event(child, ready, REPLICA_READY_FIELDS)
    run(sup, T0 + TICK, 1.0)
    assert len(zk.writes) == 2 and zk.writes[-1][1]["stored"] == ["x1.a"]
    sup.channel._on_event(child, dict(ready), REPLICA_READY_FIELDS)  # the same again: nothing to write
    run(sup, T0 + 1.0 + TICK, 1.0)
    assert len(zk.writes) == 2
    sup.channel._on_event(child, dict(ready, stored=["x1.a", "x1.b"]), REPLICA_READY_FIELDS)
    sup.tick(T0 + 2.0 + TICK)
    assert len(zk.writes) == 3 and zk.writes[-1][1]["stored"] == ["x1.a", "x1.b"], "written at the next tick"


# ------------------------------------------------------------------ the host registration


def test_an_idle_host_is_written_once_per_heartbeat() -> None:
    zk = FakeZooKeeper()
    registration = HostRegistration(zk, Paths("/test"), "host-1", "127.0.0.1", 4, heartbeat=HEARTBEAT)  # type: ignore[arg-type]
    assert registration.try_register() and len(zk.writes) == 1
    figures = HostStats(cpu_percent=3.0, memory_percent=40.0, cpus=2, exchanges=1)
    written = [registration.report(replace(figures, cpu_percent=3.0 + (i % 4), at=T0 + i), now=T0 + i)
               for i in range(int(3 * HEARTBEAT))]  # one report a second, CPU jittering by < 5 points
    assert [i for i, w in enumerate(written) if w] == [0, 30, 60]
    assert registration.report(replace(figures, cpu_percent=60.0), now=T0 + 61)  # a real change: at once
    assert registration.report(replace(figures, cpu_percent=60.0, exchanges=2), now=T0 + 62)
    assert len(zk.writes) == 1 + 5 and zk.writes[-1][1]["stats"]["exchanges"] == 2
    assert zk.writes[-1][1]["heartbeat"] == HEARTBEAT


# ------------------------------------------------------------------ the publisher's view


def test_publishers_judge_age_against_the_heartbeat_and_believe_silence() -> None:
    stale_after = STALE_STATS * INTERVAL
    newest = T0 + 100
    quiet = ExchangeStats(at=newest - HEARTBEAT - stale_after + 0.1)  # idle: last heartbeat nearly due
    assert not is_stale({"heartbeat": HEARTBEAT, "silent": False}, quiet, newest, INTERVAL)
    assert is_stale({"heartbeat": HEARTBEAT, "silent": True}, ExchangeStats(at=newest), newest, INTERVAL)
    frozen = ExchangeStats(at=newest - HEARTBEAT - stale_after - 0.1)  # no heartbeat for too long
    assert is_stale({"heartbeat": HEARTBEAT}, frozen, newest, INTERVAL)
    # A znode without `heartbeat` (an HCM writing every report): the age alone, as before.
    assert is_stale({}, ExchangeStats(at=newest - stale_after - 0.1), newest, INTERVAL)
    assert not is_stale({"heartbeat": "soon"}, ExchangeStats(at=newest - stale_after + 0.1), newest, INTERVAL)


def test_publishers_take_the_report_interval_from_the_znode() -> None:
    """A client cannot read the cluster's exchange.stats_interval; the znode
    says it (`stats_interval`), and our own setting stands in only when an older HCM did not."""
    newest = T0 + 100
    slow = {"heartbeat": HEARTBEAT, "stats_interval": 10 * INTERVAL}
    aged = ExchangeStats(at=newest - HEARTBEAT - STALE_STATS * 10 * INTERVAL + 0.1)
    assert not is_stale(slow, aged, newest, INTERVAL)  # within 3 of its own (longer) intervals
    assert is_stale({"heartbeat": HEARTBEAT}, aged, newest, INTERVAL)  # judged by ours: stale
    assert is_stale({**slow, "stats_interval": "slow"}, aged, newest, INTERVAL)
