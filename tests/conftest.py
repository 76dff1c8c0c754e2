"""Shared fixtures: one real ZooKeeper per session, a fresh root per test,
daemon processes that are always cleaned up, logs printed when a test fails."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from roq.config import Config
from roq.paths import Paths
from roq.tools.zkserver import ZooKeeperNotInstalledError, ZooKeeperServer, find_zookeeper
from roq.zk import start_client, stop_client
from tests.profiles import load_profile
from tests.support.helpers import Processes, fast_config

load_profile()
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str, what: str = "this test") -> NoReturn:
    """Something a test needs is missing: a failure in CI, where everything must be installed,
    a skip elsewhere."""
    if IN_CI:
        pytest.fail(f"{what} must run in CI: {reason}")
    pytest.skip(reason)


def docker_engine(image: str, what: str, hint: str) -> Any:
    """A docker-py client of a running engine that has `image`; else unavailable(), with `hint`
    saying how to get both."""
    try:
        import docker
        client = docker.from_env(version="auto")
        client.ping()
        client.images.get(image)
    except Exception as exc:
        unavailable(f"no Docker engine or no image {image} ({exc}); {hint}", what)
    return client


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    from tests.support.helpers import FIGURES
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
    # The figures a test recorded travel with its report: under xdist it ran in a worker process.
    report.user_properties.extend(("figures", figure) for figure in FIGURES)
    FIGURES.clear()


REPORTED_FIGURES: list[tuple[str, dict[str, object]]] = []


# Seconds each xdist worker spent per test group (setup, call and teardown): the busier worker bounds
# the run's wall time, and its longest groups are where a saving shortens it.
WORKER_SECONDS: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report):
    REPORTED_FIGURES.extend(value for key, value in report.user_properties if key == "figures")
    worker = getattr(report, "node", None)  # set by xdist's controller on a worker's report
    if worker is not None:
        groups = WORKER_SECONDS.setdefault(worker.gateway.id, {})
        group = report.nodeid.rpartition("@")[2]  # --dist loadgroup ends each test id with @group
        groups[group] = groups.get(group, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if REPORTED_FIGURES:
        terminalreporter.section("measured figures")
        for name, values in REPORTED_FIGURES:
            terminalreporter.write_line(f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    if WORKER_SECONDS:
        terminalreporter.section("seconds per worker and test group")
        for worker, groups in sorted(WORKER_SECONDS.items()):
            longest = sorted(groups.items(), key=lambda item: -item[1])
            terminalreporter.write_line(f"{worker}: {sum(groups.values()):.0f} s in {len(groups)} groups; "
                                        + ", ".join(f"{name} {seconds:.0f}" for name, seconds in longest[:12]))


# `make test` runs the suite on three workers (pytest-xdist, --dist loadgroup). A module's tests stay
# together (they share its cluster); the tests that drive a Docker engine (marker `docker`) share one
# worker, as do those that need the Spark session (one JVM), so neither runs twice at once.
ENGINE, SPARK = "engine", "spark"
# Groups start longest first (`--no-loadscope-reorder` keeps the order of the items): the engine's
# (a quarter of an hour), then Spark's, then the modules that start clusters, the unit tests last.
# Short groups then fill the end, and the workers finish near each other.
START_FIRST, START_LAST = {ENGINE: 0, SPARK: 1}, {"unit": 3}


def xdist_group(item: pytest.Item) -> str:
    if item.get_closest_marker("docker"):
        return ENGINE
    if item.path.parent.name == "spark":
        return SPARK
    return item.module.__name__


def start_rank(item: pytest.Item) -> int:
    marker = item.get_closest_marker("xdist_group")
    group = marker.args[0] if marker and marker.args else ""
    return START_FIRST.get(group, START_LAST.get(item.path.parent.name, 2))


@pytest.hookimpl(wrapper=True)  # around xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    if hasattr(config, "workerinput"):  # an xdist worker: the order the controller hands out groups
        items.sort(key=start_rank)  # stable: a module's tests keep their order
    return (yield)


def failed(request: pytest.FixtureRequest) -> bool:
    return any(getattr(getattr(request.node, f"rep_{w}", None), "failed", False) for w in ("setup", "call"))


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    try:
        find_zookeeper()
    except ZooKeeperNotInstalledError as exc:
        unavailable(str(exc), "ZooKeeper")
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def config(zookeeper: ZooKeeperServer) -> Config:
    """A configuration of our own: a fresh ZooKeeper root and short timing knobs."""
    return fast_config(zookeeper.connect_string)


@pytest.fixture
def zk(config: Config, request: pytest.FixtureRequest, zookeeper: ZooKeeperServer):
    client = start_client(config)
    yield client
    if failed(request):
        print("----- zookeeper log tail -----\n" + zookeeper.log_tail())
    stop_client(client)


@pytest.fixture
def paths(config: Config) -> Paths:
    return Paths(config.zk.root)


@pytest.fixture
def procs(config: Config, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Processes]:
    processes = Processes(config, tmp_path / "daemons")
    yield processes
    processes.stop_all()
    if failed(request):
        print(processes.dump_logs())




@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """A factory of real small filesystems (tmpfs): `small_disk("host-1", 4 << 20)` mounts one and
    returns its path (`inodes=N`: at most N files and directories). Mounting needs root: skipped
    where it is not permitted, a failure in CI. Every mount is undone at the end (lazily if a
    process still holds a file there)."""
    from tests.support.helpers import SmallDiskUnavailable, mount_small_disk, unmount_small_disk
    mounted: list[Path] = []

    def make(name: str, size_bytes: int, inodes: int | None = None) -> Path:
        try:
            path = mount_small_disk(tmp_path / "disks" / name, size_bytes, inodes)
        except SmallDiskUnavailable as exc:
            unavailable(f"a small filesystem is needed: {exc}", "this full-disk test")
        mounted.append(path)
        return path

    yield make
    for path in reversed(mounted):
        unmount_small_disk(path)
