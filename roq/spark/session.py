"""One Spark session for RoQ's jobs: local[*] by default, any master with --master."""

from __future__ import annotations

import os
import sys
from typing import Any


def spark_session(master: str | None = "local[*]", app: str = "roq") -> Any:
    """A session with the `roq` data source registered. Python workers run this interpreter
    (PYSPARK_PYTHON), so they import the same RoQ. Under spark-submit, pass master=None to keep
    the master spark-submit chose."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from roq.spark.datasource import register
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    if (master or "").startswith("local"):
        builder = builder.config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("ROQ_SPARK_LOG_LEVEL", "WARN"))
    register(spark)
    return spark
