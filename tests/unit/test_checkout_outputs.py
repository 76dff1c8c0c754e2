"""What the README and docs/monitoring.md have a user write, run from a checkout, stays out of
`git status`: the backup file, the Prometheus targets, the local cluster and the pipeline's output
(written under ignored paths), so a checkout that followed them has nothing untracked to commit."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def written_by_the_docs() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    monitoring = (ROOT / "docs" / "monitoring.md").read_text()
    backup = re.search(r"^roq backup (\S+)", readme, re.MULTILINE)
    targets = re.search(r"monitoring/targets\.py (\S+)\n", monitoring)
    assert backup and targets, "the README's backup line or docs/monitoring.md's targets command moved"
    return [backup.group(1), f"{targets.group(1)}/gcm.json", f"{targets.group(1)}/hcm.json",
            ".roq/cluster/config.toml", ".roq/pipeline/report.png"]


@pytest.mark.parametrize("path", written_by_the_docs())
def test_what_the_docs_write_in_a_checkout_is_ignored(path: str) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path])
    assert ignored.returncode == 0, f"{path} would show in git status"
