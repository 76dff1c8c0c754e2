#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris) of every decoder of untrusted input, for a bounded time.

    scripts/fuzz.py                      every target, 20 s each
    scripts/fuzz.py --seconds 60 delivery control_request
    scripts/fuzz.py --list

Each target (tests/support/fuzz_targets.py) runs in its own process, starting from its corpus in
tests/fuzz/corpus/<target>/ (kept in the repository, seeded from valid frames). Inputs that
reach new code are merged back into that corpus, minimised by libFuzzer, so each run starts
where the last one stopped. A crash (any exception but the decoder's documented refusal, a
hang, or runaway memory) leaves its input in tests/fuzz/crashes/ and makes the exit code 1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from hashlib import sha1
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
CRASHES = ROOT / "tests" / "fuzz" / "crashes"
MAX_LEN = 8192  # frames beyond this only test msgpack's C code, which is not ours
RSS_LIMIT_MB = 2048
INPUT_TIMEOUT_S = 10  # one input taking longer is a hang


def main() -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="targets to run (default: all)")
    parser.add_argument("--seconds", type=int, default=20, help="fuzzing time per target")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="corpus root (default: the kept one)")
    parser.add_argument("--crashes", type=Path, default=CRASHES, help="where crashing inputs are written")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: the fuzzing child process
    args, libfuzzer_args = parser.parse_known_args()
    if args.run:  # before importing anything of ours, so that all of it gets instrumented
        return run_target(args.run, args.targets + libfuzzer_args)  # corpus directories, flags
    from tests.support.fuzz_targets import TARGETS
    if args.list:
        print("\n".join(TARGETS))
        return 0
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; --list shows them")
    if args.seconds < 1:
        parser.error("--seconds must be at least 1")
    failures = [name for name in args.targets or TARGETS
                if not fuzz(name, args.seconds, args.corpus / name, args.crashes)]
    if failures:
        print(f"fuzz: crashes in {', '.join(failures)}; inputs in {args.crashes}", file=sys.stderr)
        return 1
    print("fuzz: no crashes")
    return 0


def fuzz(name: str, seconds: int, corpus: Path, crashes: Path) -> bool:
    """Fuzz one target in a child process, then merge new coverage into its kept corpus."""
    seed_corpus(name, corpus)
    crashes.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"roq-fuzz-{name}-") as found:
        started = time.monotonic()
        result = child(name, [found, str(corpus), f"-max_total_time={seconds}", f"-max_len={MAX_LEN}",
                              f"-rss_limit_mb={RSS_LIMIT_MB}", f"-timeout={INPUT_TIMEOUT_S}",
                              f"-artifact_prefix={crashes}/{name}-", "-print_final_stats=1"],
                       timeout=seconds + 120)
        runs = _stat(result.stderr, "stat::number_of_executed_units")
        ok = result.returncode == 0
        if ok:
            before = len(list(corpus.iterdir()))
            child(name, ["-merge=1", str(corpus), found], timeout=300)
            added = len(list(corpus.iterdir())) - before
            print(f"fuzz: {name}: {runs} inputs in {time.monotonic() - started:.0f}s, "
                  f"no crash, corpus +{added} ({before + added})")
        else:
            print(f"fuzz: {name}: CRASH after {runs} inputs\n{result.stderr[-3000:]}", file=sys.stderr)
    return ok


def child(name: str, libfuzzer_args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, __file__, "--run", name, *libfuzzer_args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_target(name: str, libfuzzer_args: list[str]) -> int:
    import atheris
    with atheris.instrument_imports(include=["roq", "gcm", "exchange"]):
        from tests.support.fuzz_targets import TARGETS
    # libFuzzer's -merge re-runs argv[0] through the shell: make it the command that gets back here.
    atheris.Setup([f"{sys.executable} {Path(__file__).resolve()} --run {name}", *libfuzzer_args], TARGETS[name])
    atheris.Fuzz()
    return 0


def seed_corpus(name: str, corpus: Path) -> None:
    """Add the valid inputs a corpus lacks: all of them to a new one, and those a protocol change
    brought to an old one (whose inputs may now all be refused at the first field)."""
    from tests.support.fuzz_targets import seeds
    corpus.mkdir(parents=True, exist_ok=True)
    for data in seeds()[name]:
        path = corpus / sha1(data).hexdigest()
        if not path.exists():
            path.write_bytes(data)


def _stat(text: str, key: str) -> str:
    for line in text.splitlines():
        if line.startswith(key):
            return line.split(":")[-1].strip()
    return "?"


if __name__ == "__main__":
    sys.exit(main())
