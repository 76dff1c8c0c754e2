"""One Spark session for RoQ's jobs: local[*] by default, any master with --master.

Spark's own log goes to stderr at `log_level` (env ROQ_SPARK_LOG_LEVEL wins), set from the
JVM's first line through a log4j2 file, so a terminal sees no start-up chatter; `quiet()`
silences it before a deliberate stop, whose interrupted jobs Spark would log as errors
with their Java stack traces.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = {level}
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = {level}
"""


def spark_session(master: str | None = "local[*]", app: str = "roq", log_level: str = "WARN",
                  conf: dict[str, str] | None = None) -> Any:
    """A session with the `roq` data source registered, and `conf` set. Python workers run this
    interpreter (PYSPARK_PYTHON), so they import the same RoQ: on a cluster, this path must hold
    a Python with RoQ on every worker (docs/spark.md). Under spark-submit, pass master=None to
    keep the master spark-submit chose."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from roq.spark.datasource import register
    level = os.environ.get("ROQ_SPARK_LOG_LEVEL", log_level).upper()
    builder = (SparkSession.builder.appName(app)
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_log4j2_file(level)}")
               .config("spark.ui.showConsoleProgress", "false"))
    if master:
        builder = builder.master(master)
    if (master or "").startswith("local"):
        builder = builder.config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(level)
    register(spark)
    return spark


def quiet(spark: Any) -> None:
    """Nothing more from Spark: before stopping queries and the session on purpose (and nothing
    more through the stderr gate, if this process has one)."""
    if _gate is not None:
        _gate.close()
    spark.sparkContext.setLogLevel("OFF")


class StderrGate:
    """This process's stderr (fd 2, which the JVM it starts and the JVM's Python workers inherit)
    through a pipe, copied to the real stderr until close(). What those processes print while
    being stopped on purpose (an interrupted task, a planner whose socket closed: a Python
    traceback or a Java one) then never reaches the terminal. `say()` always does."""

    def __init__(self) -> None:
        self.terminal = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self.open = True
        threading.Thread(target=self._copy, args=(read_end,), name="roq-stderr-gate", daemon=True).start()

    def _copy(self, read_end: int) -> None:
        while chunk := os.read(read_end, 1 << 16):  # always read: a full pipe would block the writers
            if self.open:
                os.write(self.terminal, chunk)

    def close(self) -> None:
        self.open = False

    def say(self, text: str) -> None:
        os.write(self.terminal, text.encode() + b"\n")


_gate: StderrGate | None = None


def say(text: str) -> None:
    """One line to the terminal, past this process's stderr gate if it has one."""
    if _gate is not None:
        _gate.say(text)
    else:
        print(text, file=sys.stderr, flush=True)


def gate_stderr() -> StderrGate:
    """Install this process's StderrGate (once); quiet() closes it."""
    global _gate
    if _gate is None:
        sys.stderr.flush()
        _gate = StderrGate()
    return _gate


def _log4j2_file(level: str) -> Path:
    """A log4j2 configuration at `level` (the JVM reads it at start, before setLogLevel can act)."""
    path = Path(tempfile.gettempdir()) / f"roq-spark-log4j2-{os.getuid()}-{level.lower()}.properties"
    text = LOG4J2.format(level=level.lower())
    if not path.is_file() or path.read_text() != text:
        scratch = path.with_suffix(f".{os.getpid()}")
        scratch.write_text(text)
        scratch.replace(path)  # atomic: a JVM starting meanwhile reads a whole file
    return path
