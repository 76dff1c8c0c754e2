"""`roq pipeline stats` runs the Spark driver (roq/spark/stats_job.py) as a child process.

Why a child: a terminal's Ctrl-C signals the whole foreground process group, and with the
driver in it, PySpark's Python workers and its own SIGINT handler would each react
halfway through a micro-batch, with Python and Java stack traces. The child runs in a
session of its own, so Ctrl-C reaches only `roq`, which forwards SIGTERM to the driver:
the driver stops its queries between two micro-batches and its session in order, and
exits 130. The driver's stdout and stderr are the terminal's. Should the driver not be
done within STOP_WAIT seconds (or Ctrl-C come again), its whole process group (the JVM,
the Python workers) is killed, and a line says so. A Ctrl-C that comes while the driver
is being started is acted on once it has started, so the driver is never left running.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys

from roq.errors import Exit, UserError
from roq.interrupts import ctrl_c_held, raise_if_interrupted

SPARK_EXTRA = "pip install -e '.[spark]' from the RoQ checkout (or: bash scripts/setup.sh dev,spark)"
STOP_WAIT = 30.0  # seconds the driver has to stop its queries and its session after Ctrl-C
WAIT_TICK = 0.5  # s between looks for a Ctrl-C that Python swallowed (roq.interrupts), while the driver runs


def require_extra(*modules: str) -> None:
    """UserError, one line, unless every module of the spark extra named is importable."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserError(f"the Spark pipeline needs the spark extra ({module} is missing): {SPARK_EXTRA}") from None


def require_java() -> None:
    home = os.environ.get("JAVA_HOME")
    if not (home and os.access(os.path.join(home, "bin", "java"), os.X_OK)) and not shutil.which("java"):
        raise UserError("Spark needs Java 17: install it (bash scripts/setup.sh dev,spark does) or set JAVA_HOME")


def run_stats_job(args: list[str]) -> int:
    """Run `python -m roq.spark.stats_job ARGS` until it ends; its exit code. KeyboardInterrupt
    (Ctrl-C) stops it as the module docstring says, then is raised again."""
    from roq.spark.stats_job import PARENT_ENV
    env = dict(os.environ, **{PARENT_ENV: str(os.getpid())})
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stopping `roq` stops the driver as Ctrl-C does
    child = None
    try:
        with ctrl_c_held():  # never between the fork and `child`: that driver would run on, unstopped
            child = subprocess.Popen([sys.executable, "-m", "roq.spark.stats_job", *args], env=env,
                                     start_new_session=True)
        while True:
            try:
                return child.wait(WAIT_TICK)
            except subprocess.TimeoutExpired:
                raise_if_interrupted()
    except KeyboardInterrupt:
        if child is not None:
            stop(child)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop(child: subprocess.Popen[bytes]) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        code = child.wait(STOP_WAIT)
    except subprocess.TimeoutExpired:
        why = f"did not stop within {STOP_WAIT:.0f}s"
    except KeyboardInterrupt:
        why = "was interrupted again"
    else:
        # -SIGTERM: the driver had not set up its handlers yet, so nor started Spark: nothing to stop
        if code not in (Exit.INTERRUPTED, -signal.SIGTERM):
            print(f"roq: the pipeline's driver exited with {code} while stopping", file=sys.stderr)
        _kill_group(child)  # a JVM whose start it abandoned would leave only once it noticed
        return
    _kill_group(child)
    child.wait()
    print(f"roq: the pipeline's driver {why}: killed it with its Spark processes (a micro-batch it was "
          "running is done again at the next start)", file=sys.stderr)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the driver's process group: the driver, its JVM, the JVM's Python workers."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:  # all of it gone already
        pass


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt
