"""The README's "Using it" section, run top to bottom as written, in a fresh directory: every
command ends (or, when it runs until Ctrl-C, stops on SIGINT) with the documented exit code, and
no command prints a traceback or hangs. Its Python snippet runs too, on the cluster the commands
left (before the last, `roq cluster down`), and prints what its comment says."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import record_figures

# Some thirty commands, a Spark pipeline among them: minutes, more than the suite's 120 s default.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

README = Path(__file__).resolve().parents[2] / "README.md"
RUNS_UNTIL_CTRL_C = 3.0  # seconds such a command must keep running before it is interrupted
COMMAND_TIMEOUT = 240.0


def using_it() -> list[str]:
    """The commands of the README's "Using it" block, comments removed, in order."""
    section = README.read_text().split("## Using it", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def python_snippet() -> str:
    """The first Python block of the README's "### Python" section."""
    section = README.read_text().split("### Python", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def check_python_snippet(cwd: Path, env: dict[str, str]) -> float:
    """Run the snippet where the commands ran; it must print what the comment of its print() says."""
    code = python_snippet()
    expected = next(line.split("#", 1)[1].strip() for line in code.splitlines() if line.lstrip().startswith("print("))
    started = time.monotonic()
    ran = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=COMMAND_TIMEOUT)
    assert ran.returncode == 0, f"the README's Python snippet exited {ran.returncode}:\n{ran.stderr[-4000:]}"
    assert ran.stdout.strip() == expected, ran.stdout
    return time.monotonic() - started


def command_of(line: str) -> str:
    return re.split(r"\s+#", line, maxsplit=1)[0].strip()


def run(line: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str, float]:
    """Run one README line with bash; a line whose comment says Ctrl-C is interrupted once it has
    run RUNS_UNTIL_CTRL_C seconds without ending by itself."""
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", command_of(line)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if "Ctrl-C" in line:
            try:
                proc.wait(timeout=RUNS_UNTIL_CTRL_C)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=COMMAND_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err, time.monotonic() - started


def test_the_readme_using_it_section_runs_as_written(tmp_path):
    pytest.importorskip("pyspark", reason="the README's pipeline commands need the spark extra")
    lines = using_it()
    assert lines[0].startswith(". .venv/bin/activate") and lines[-1].startswith("roq cluster down")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYSPARK_PYTHON=sys.executable)
    for key in [k for k in env if k.startswith("ROQ_")]:
        del env[key]  # as a newcomer: nothing but the README
    took: dict[str, float] = {}
    try:
        for line in lines[1:]:
            if line is lines[-1]:  # before `roq cluster down`: the snippet needs the cluster
                took["the Python snippet"] = round(check_python_snippet(tmp_path, env), 1)
            code, out, err, seconds = run(line, tmp_path, env)
            took[command_of(line)] = round(seconds, 1)
            expected = (0, 130) if "Ctrl-C" in line else (0,)
            assert code in expected, f"{line!r} exited {code}:\n{out[-2000:]}\n{err[-4000:]}"
            assert "Traceback" not in out + err and "Exception in thread" not in err, f"{line!r}:\n{err[-4000:]}"
            if line.startswith("roq subscribe orders --topic numbers"):
                assert len(out.splitlines()) == 10, out  # the messages published just before
    finally:
        subprocess.run([sys.executable, "-m", "roq.cli", "cluster", "down"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=120)
    record_figures("README 'Using it' run as written", commands=len(lines) - 1,
                   slowest=max(took, key=lambda k: took[k]), seconds=round(sum(took.values()), 1))
