"""Every repository path the docs name exists: a file moved or renamed must take its docs along.

A pure file check over docs/*.md and README.md. A token that starts with one of the tree's
top-level directories and ends in a file name with an extension (`exchange/fanout.py`) or in a
slash (`roq/cli/`) must name a file or directory of the checkout, from the root or (for a doc
under docs/) from the doc's own directory, as a Markdown link resolves it. Znode paths
(`gcm/leader`, `queues/<q>`), paths on a user's machine (`.roq/cluster/config.toml`) and what is
made at run time under a directory .gitignore lists (`ansible/.build/`) are not checked.
Relative Markdown links (`[monitoring.md](monitoring.md)`) must point at a file too, and an
anchor (`protocol.md#37-batching-in-roqclientpublisher`) at a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = ("roq", "roq_web", "gcm", "hcm", "exchange", "tests", "bench", "scripts", "docker", "ansible",
             "monitoring", "docs")
# Not preceded by a path or name character (so `.roq/x` and `a/roq/x` are left alone); then a file
# with an extension, or a directory with its trailing slash (not followed by a name, a placeholder
# or an ellipsis: `gcm/requests/<key>` is a znode).
PATH = re.compile(r"(?<![\w./~<>-])((?:%s)/(?:[\w.-]+/)*(?:[\w-]+\.[A-Za-z0-9]+\b|(?![\w<…*{])))"
                  % "|".join(TOP_LEVEL))
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def generated_dirs() -> tuple[str, ...]:
    """Directories .gitignore lists by name: what is in them is made at run time, not shipped."""
    lines = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    return tuple(line.strip() for line in lines if line.strip().endswith("/") and "*" not in line)


def named_paths(text: str) -> set[str]:
    return {path for path in (m.group(1) for m in PATH.finditer(text))
            if path.endswith("/") or "." in path.rsplit("/", 1)[-1]}


def linked_paths(text: str) -> set[str]:
    """Relative link targets, anchors dropped (`protocol.md#4-subscribing` → `protocol.md`)."""
    return {target.split("#", 1)[0] for target in LINK.findall(text)
            if not re.match(r"[a-z]+:|#|/", target) and target.split("#", 1)[0]}


def anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ +(.+?) *$", doc.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def broken_anchors(doc: Path, text: str) -> list[str]:
    broken = []
    for target in LINK.findall(text):
        name, _, anchor = target.partition("#")
        linked = doc if not name else doc.parent / name
        if anchor and not re.match(r"[a-z]+:", target) and linked.suffix == ".md" and linked.exists() \
                and anchor not in anchors(linked):
            broken.append(target)
    return broken


def missing(doc: Path, paths: set[str]) -> list[str]:
    generated = generated_dirs()
    return sorted(path for path in paths if not path.startswith(generated)
                  and not (ROOT / path).exists() and not (doc.parent / path).exists())


def test_the_pattern_finds_files_and_directories_but_not_znodes() -> None:
    text = ("see `exchange/fanout.py`, roq/cli/, (docs/journal.md), `gcm/leader`, `queues/<q>`, "
            "`gcm/election/…`, `gcm/requests/<key>`, .roq/cluster/config.toml and tests/support/helpers.py.")
    assert named_paths(text) == {"exchange/fanout.py", "roq/cli/", "docs/journal.md", "tests/support/helpers.py"}
    assert linked_paths("[a](protocol.md#4-subscribing), [b](https://x.org/y.md), [c](#here)") == {"protocol.md"}
    assert {"37-batching-in-roqclientpublisher", "44-subscriber-rules-roqclientsubscriberstreamspy",
            "63-ended-incarnations-reading-a-copy"} <= anchors(ROOT / "docs" / "protocol.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    assert missing(doc, named_paths(text)) == [], f"{doc.relative_to(ROOT)} names paths that do not exist"
    assert missing(doc, linked_paths(text)) == [], f"{doc.relative_to(ROOT)} links to files that do not exist"
    assert broken_anchors(doc, text) == [], f"{doc.relative_to(ROOT)} links to headings that do not exist"
