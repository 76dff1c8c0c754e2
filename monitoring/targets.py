"""Prometheus target files of a RoQ cluster, from `roq cluster status --json` on standard input.

    roq cluster status --json | python3 monitoring/targets.py monitoring/targets

writes DIR/gcm.json (every GCM) and DIR/hcm.json (every HCM) in Prometheus's file_sd format, for
monitoring/prometheus.yml. Each file is replaced atomically, so Prometheus never reads half of one.
A daemon whose metrics are off (`*.metrics_port = -1`) is left out. Standard library only, so it runs
with any Python 3. Exit codes: 0 written, 1 the input is not the status, 2 bad usage.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def targets(daemons: Any) -> list[str]:
    """host:port of each daemon's advertised metrics URL (`http://host:port/metrics`)."""
    found = []
    for daemon in daemons if isinstance(daemons, list) else []:
        url = daemon.get("metrics") if isinstance(daemon, dict) else None
        if isinstance(url, str) and url.startswith("http://"):
            found.append(urlsplit(url).netloc)
    return sorted(found)


def write_atomically(path: Path, text: str) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: roq cluster status --json | python3 monitoring/targets.py DIR", file=sys.stderr)
        return 2
    try:
        status = json.load(sys.stdin)
    except ValueError as exc:
        print(f"targets.py: standard input is not JSON ({exc}); pipe `roq cluster status --json` into it",
              file=sys.stderr)
        return 1
    if not isinstance(status, dict) or "gcms" not in status or "hosts" not in status:
        print("targets.py: standard input has no `gcms` and `hosts`; pipe `roq cluster status --json` into it",
              file=sys.stderr)
        return 1
    directory = Path(argv[0])
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for role, daemons in (("gcm", status["gcms"]), ("hcm", status["hosts"])):
            group = [{"targets": targets(daemons), "labels": {}}]
            write_atomically(directory / f"{role}.json", json.dumps(group, indent=2) + "\n")
    except OSError as exc:
        print(f"targets.py: cannot write to {directory}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"targets.py: {len(targets(status['gcms']))} GCMs, {len(targets(status['hosts']))} HCMs in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
