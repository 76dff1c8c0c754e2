"""One real local Spark session for all Spark tests (it takes seconds to start)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import unavailable


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if importlib.util.find_spec("pyspark") is None:
        unavailable("pyspark not installed (pip install -e '.[spark]')", "the Spark tests")
    from roq.spark.session import spark_session
    session = spark_session("local[2]", "roq-tests")
    yield session
    session.stop()
