"""What an install of this checkout packs: the packages and their data files (the console's pages,
`py.typed`), with no setuptools warning (`pip install .` printed one about `web.static`).

setuptools' own build_py runs on a copy of the packaged files, offline and in about a second."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("roq", "gcm", "hcm", "exchange", "roq_web")


def test_the_build_packs_the_console_and_warns_of_nothing(tmp_path: Path) -> None:
    source = tmp_path / "source"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = tmp_path / "built"
    run = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "build_py", "-d", str(built)],
                         cwd=source, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines()
                if "warn" in line.lower() and "byte-compiling is disabled" not in line]
    assert not warnings, run.stderr
    static = sorted(p.name for p in (ROOT / "roq_web" / "static").iterdir())
    assert sorted(p.name for p in (built / "roq_web" / "static").iterdir()) == static
    assert {"index.html", "queue.html", "docs.html", "console.js"} <= set(static)
    assert (built / "roq" / "py.typed").is_file()
