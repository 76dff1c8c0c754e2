"""The HCM's restart cap (hcm/supervisor.py): backoff, flapping marked failed, the cool-off and a
new assignment giving a fresh budget. Processes are stand-ins and the clock is the test's, so
every count is exact; tests/integration/test_supervision.py does it with real exchanges."""

from __future__ import annotations

import io
import itertools
from typing import Any

import pytest

import hcm.supervisor
from hcm.supervisor import Supervisor
from roq.config import Config
from roq.errors import Exit
from roq.paths import Paths

KEY = ("q", "x1")
T0 = 1000.0
TICK = 0.1
_pids = itertools.count(50_000)


class FakeProcess:
    """A child that runs until `crash()` (or at once with `crash_at_start`)."""

    crash_at_start = True
    exit_code = 1

    def __init__(self, command: list[str], **_: Any) -> None:
        self.command = command
        self.pid = next(_pids)
        self.stdin, self.stdout, self.stderr = io.BytesIO(), io.BytesIO(), io.BytesIO()
        self.returncode: int | None = self.exit_code if self.crash_at_start else None

    def poll(self) -> int | None:
        return self.returncode

    def crash(self) -> None:
        self.returncode = self.exit_code


@pytest.fixture
def supervisor(monkeypatch: pytest.MonkeyPatch) -> Supervisor:
    monkeypatch.setattr(hcm.supervisor.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(FakeProcess, "crash_at_start", True)
    config = Config().replace(hcm={"restart_backoff": 0.5, "restart_backoff_max": 4.0, "max_restarts": 3,
                                   "restart_window": 60.0, "failed_cooloff": 120.0})
    sup = Supervisor(None, Paths("/test"), config, "host-1")  # no endpoint is ever published
    sup.set_desired({KEY})
    return sup


def run(sup: Supervisor, start: float, seconds: float) -> list[float]:
    """Tick every TICK seconds of the test's clock; the times at which the child was (re)started."""
    starts = []
    for i in range(round(seconds / TICK)):
        now = start + i * TICK
        before = sup.children[KEY].process if KEY in sup.children else None
        sup.tick(now)
        process = sup.children[KEY].process if KEY in sup.children else None
        if process is not None and process is not before:
            starts.append(now)
    return starts


def test_an_exchange_that_always_crashes_is_restarted_max_restarts_times_then_left_alone(supervisor) -> None:
    starts = run(supervisor, T0, 119)
    child = supervisor.children[KEY]
    assert len(starts) == 1 + 3 and child.restarts == 3  # the first start, then hcm.max_restarts restarts
    assert starts[-1] - starts[0] < 60  # all within the window: backoff 0.5, 1, 2 s
    assert child.process is None and child.failed_until is not None
    assert child.failed_until == pytest.approx(starts[-1] + TICK + 120.0)


def test_after_the_cool_off_it_gets_a_fresh_budget(supervisor) -> None:
    first = run(supervisor, T0, 10)
    until = supervisor.children[KEY].failed_until
    assert until is not None and run(supervisor, T0 + 10, until - T0 - 10 - TICK / 2) == []  # left alone
    again = run(supervisor, until - TICK / 2, 60)
    assert again[0] == pytest.approx(until, abs=TICK)
    assert len(again) == 4 and supervisor.children[KEY].failed_until is not None  # the same budget again
    assert supervisor.children[KEY].restarts == len(first) + len(again) - 1


def test_a_new_assignment_starts_from_scratch(supervisor) -> None:
    run(supervisor, T0, 20)
    assert supervisor.children[KEY].failed_until is not None
    supervisor.set_desired(set())
    supervisor.tick(T0 + 20)
    assert KEY not in supervisor.children
    supervisor.set_desired({KEY})
    assert run(supervisor, T0 + 21, TICK) == [T0 + 21]  # at once, not after the cool-off
    assert supervisor.children[KEY].restarts == 0 and supervisor.children[KEY].failed_until is None


def test_crashes_spread_wider_than_the_window_never_mark_it_failed(supervisor) -> None:
    FakeProcess.crash_at_start = False
    now = T0
    for _ in range(12):  # a crash every 25 s: at most 3 in any 60 s, the cap is "more than 3"
        now += 25.0
        supervisor.tick(now)
        process = supervisor.children[KEY].process
        assert process is not None, "restarted after each crash"
        process.crash()
        supervisor.tick(now + TICK)
        assert supervisor.children[KEY].failed_until is None
    assert supervisor.children[KEY].restarts == 11


def test_an_incarnation_sealed_by_its_replica_is_started_again_at_once_and_never_counts_as_a_crash(
        supervisor, monkeypatch) -> None:
    """A regression: a sealed exchange exited with code 4, a crash: six seals in 22 s made it FAILED.
    `Exit.ENDED` means the cluster saw the incarnation end: a new one starts on the next tick."""
    monkeypatch.setattr(FakeProcess, "crash_at_start", False)
    starts = []
    now = T0
    for _ in range(4 * supervisor.config.hcm.max_restarts):
        supervisor.tick(now)
        child = supervisor.children[KEY]
        assert child.process is not None, f"not running at {now - T0:.1f}s"
        starts.append(child.process.pid)
        child.process.returncode = Exit.ENDED
        now += TICK
        supervisor.tick(now)  # reaped ...
        now += TICK
    child = supervisor.children[KEY]
    assert len(set(starts)) == len(starts) and child.failed_until is None and child.crashes == ()


def test_an_exchange_ending_its_incarnation_for_its_storage_is_never_marked_failed(supervisor, monkeypatch,
                                                                                  caplog) -> None:
    """Exit.STORAGE (a journal broken for good): restarted with the backoff, never counted a crash."""
    monkeypatch.setattr(FakeProcess, "exit_code", int(Exit.STORAGE))
    starts = run(supervisor, T0, 119)
    child = supervisor.children[KEY]
    assert len(starts) > 1 + 3, "more restarts than hcm.max_restarts allows crashes"
    assert child.failed_until is None and child.crashes == ()
    assert "FAILED" not in caplog.text and "not counted as a crash" in caplog.text
    assert starts[2] - starts[1] > starts[1] - starts[0], "with the backoff"
