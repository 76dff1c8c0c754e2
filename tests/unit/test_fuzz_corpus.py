"""The fuzzing corpus (tests/fuzz/corpus, grown by scripts/fuzz.py) replayed through every target:
what the fuzzer once found interesting stays refused cleanly, without atheris installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.support.fuzz_targets import TARGETS, seeds

CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"


def test_every_target_has_a_kept_corpus() -> None:
    assert sorted(p.name for p in CORPUS.iterdir() if any(p.iterdir())) == sorted(TARGETS)
    assert set(seeds()) == set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_corpus_inputs_are_handled(name: str) -> None:
    inputs = sorted((CORPUS / name).iterdir())
    for path in inputs:
        TARGETS[name](path.read_bytes())  # raises only on a bug: refusals are caught inside
    for data in seeds()[name]:
        TARGETS[name](data)


@pytest.mark.timeout(120)
def test_fuzz_script_runs_bounded_and_finds_no_crash(tmp_path: Path) -> None:
    """A smoke run of the fuzzer itself (2 s per target) on a scratch corpus, so the tool keeps working."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("atheris") is None:
        unavailable("atheris not installed (pip install -e '.[dev]')", "the fuzzer smoke run")
    script = Path(__file__).resolve().parents[2] / "scripts" / "fuzz.py"
    result = subprocess.run([sys.executable, str(script), "--seconds", "2", "--corpus", str(tmp_path / "corpus"),
                             "--crashes", str(tmp_path / "crashes"), "control_request", "exchange_fetch"],
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "fuzz: no crashes" in result.stdout
    assert all(any((tmp_path / "corpus" / t).iterdir()) for t in ("control_request", "exchange_fetch"))
