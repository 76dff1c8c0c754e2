"""Real Spark sessions for the Spark tests: one local session shared by all of them (it takes
seconds to start), and the standalone cluster's session for tests/spark/test_standalone.py.
A process holds one SparkContext at a time, so asking for the other master stops the current one."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import unavailable
from tests.integration.conftest import SharedCluster, shared_cluster

LOCAL = "local[2]"


class Sessions:
    def __init__(self) -> None:
        self.current: Any = None
        self.master: str | None = None

    def get(self, master: str, conf: dict[str, str] | None = None) -> Any:
        if self.current is not None and self.master == master:
            return self.current
        self.close()
        from roq.spark.session import spark_session
        self.current, self.master = spark_session(master, "roq-tests", conf=conf), master
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
        self.current = self.master = None


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[Sessions]:
    if importlib.util.find_spec("pyspark") is None:
        unavailable("pyspark not installed (pip install -e '.[spark]')", "the Spark tests")
    sessions = Sessions()
    yield sessions
    sessions.close()


@pytest.fixture
def spark(spark_sessions: Sessions) -> Any:
    return spark_sessions.get(LOCAL)


def sink(frame: Any, config: Any, queue: str, **options: str) -> Any:
    """A DataFrame writer to RoQ queue `queue` of this test's cluster."""
    writer = frame.write.format("roq").option("seeds", config.cluster.seeds)
    writer = writer.option("queue", queue)
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


def written_and_received(frame: Any, config: Any, zk: Any, queue: str, count: int) -> list[bytes]:
    """Write `frame` to `queue` through the sink while a subscriber listens; the payloads it got
    (`count` of them expected). save() returns once every task's messages were confirmed."""
    from roq.client.subscriber import Subscriber
    from tests.support.helpers import wait_until
    got: list[bytes] = []
    with Subscriber(queue, config, callback=lambda m: got.append(m.payload)) as sub:
        sub.wait_connected()
        sink(frame, config, queue).mode("append").save()
        wait_until(lambda: len(got) >= count, timeout=20, message=f"the {count} rows")
    return got


@pytest.fixture
def cluster(config, zk, paths, procs):
    from tests.integration.conftest import start_cluster
    return start_cluster(procs, zk, paths)


@pytest.fixture(scope="module")
def module_cluster(zookeeper, tmp_path_factory: pytest.TempPathFactory,
                   request: pytest.FixtureRequest) -> Iterator[SharedCluster]:
    """One GCM and two HCMs for the tests of a module (shared_cluster_fixtures). Room on the hosts
    for every queue the module makes: 16 exchanges each, where fast_config's 4 would refuse the ninth."""
    with shared_cluster(zookeeper, tmp_path_factory.mktemp("spark-module"), request, "hcm.capacity=16") as cluster:
        yield cluster


def shared_cluster_fixtures() -> tuple[Any, ...]:
    """The fixtures config, zk, paths and cluster of a module whose tests share one cluster
    (module_cluster: started once, each test with queues of its own names) instead of starting one
    each: `config, zk, paths, cluster = shared_cluster_fixtures()` in the module."""

    def field(name: str, attribute: str) -> Any:
        @pytest.fixture(name=name)
        def fixture(module_cluster: SharedCluster) -> Any:
            return getattr(module_cluster, attribute)
        return fixture

    return tuple(field(name, attribute) for name, attribute in
                 (("config", "config"), ("zk", "zk"), ("paths", "paths"), ("cluster", "procs")))
