"""Real Spark sessions for the Spark tests: one local session shared by all of them (it takes
seconds to start), and the standalone cluster's session for tests/spark/test_standalone.py.
A process holds one SparkContext at a time, so asking for the other master stops the current one."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import unavailable

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


@pytest.fixture
def cluster(config, zk, paths, procs):
    from tests.integration.conftest import start_cluster
    return start_cluster(procs, zk, paths)
