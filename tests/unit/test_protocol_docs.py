"""docs/protocol.md and the frame declarations (roq/protocol) say the same: every frame layout the
docs write (`["kind", 3, field, ...]` in a code block or a table, and the `| # | field |` tables)
matches the declaration of that kind in the conversation of its section, and every declared frame
is written in the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from roq import protocol
from roq.protocol import Frame

DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
# Sections by conversation; 7.6 (the groups' state at the replica) is spoken on `repl`.
SECTIONS = {"3": "publish", "4": "deliver", "5": "replay", "6": "replica", "7": "work", "7.6": "replica"}


def _conversation(heading: str) -> str | None:
    number = heading.lstrip("#").split()[0]
    return SECTIONS.get(number) or SECTIONS.get(number.split(".")[0])


def _literal(text: str) -> str:
    """The bracket-balanced frame layout starting at text's first `["`."""
    start, depth = text.index('["'), 0
    for i, char in enumerate(text[start:], start):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth == 0:
            return re.sub(r"\s+", " ", text[start:i + 1])
    raise AssertionError(f"unbalanced frame layout: {text[start:start + 80]}")


def documented() -> tuple[list[tuple[str, str, str]], list[tuple[str, str, list[str]]]]:
    """(conversation, kind, layout) of every written layout, and (conversation, kind, field names)
    of every `| # | field |` table."""
    layouts, tables = [], []
    conversation, in_code, code = None, False, ""
    lines = DOCS.read_text().splitlines()
    for n, line in enumerate(lines):
        if line.startswith("## ") or line.startswith("### ") or line.startswith("#### "):
            conversation = _conversation(line.split(" ", 1)[1])
        if line.startswith("```"):
            in_code, code = not in_code, ""
            continue
        if conversation is None:
            continue
        if in_code:
            code += " " + line
            if '["' in code and code.count("[") == code.count("]"):
                layout = _literal(code)
                layouts.append((conversation, layout.split('"')[1], layout))
                code = ""
            elif '["' not in code:
                code = ""
        elif line.startswith("|"):
            for cell in line.split("|"):
                if cell.strip().startswith('`["'):
                    layout = _literal(cell)
                    layouts.append((conversation, layout.split('"')[1], layout))
        if line.startswith("| # | field |"):
            rows = []
            for row in lines[n + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.split("|")[1:-1]])
            kind = re.search(r'"(\w+)"', rows[0][2])
            assert kind, rows[0]
            names = [re.sub(r"\s*\(optional\)", "", r[1]).strip("`") for r in rows[2:]]
            tables.append((conversation, kind.group(1), names))
    return layouts, tables


def declared(conversation: str, kind: str) -> list[Frame]:
    return [c.frames[kind] for c in protocol.CONVERSATIONS[conversation] if kind in c.frames]


def _optional_cuts(frame: Frame) -> set[str]:
    """The layout, and the layouts without its trailing optional fields."""
    required = sum(1 for f in frame.fields if not f.optional)
    head = [f'"{frame.kind}"', str(protocol.DATA_VERSION)]
    return {"[" + ", ".join(head + [f.layout for f in frame.fields[:n]]) + "]"
            for n in range(required, len(frame.fields) + 1)}


LAYOUTS, TABLES = documented()


def test_the_docs_were_read() -> None:
    assert len(LAYOUTS) > 30 and len(TABLES) >= 6


@pytest.mark.parametrize(("conversation", "kind", "layout"), LAYOUTS)
def test_every_written_layout_is_declared(conversation: str, kind: str, layout: str) -> None:
    frames = declared(conversation, kind)
    assert frames, f"{kind} is not declared in {conversation}"
    assert any(layout in _optional_cuts(f) for f in frames), (layout, [f.layout for f in frames])


@pytest.mark.parametrize(("conversation", "kind", "names"), TABLES)
def test_every_field_table_matches_its_declaration(conversation: str, kind: str, names: list[str]) -> None:
    (frame,) = declared(conversation, kind)
    assert names == [f.name if f.name in names else f.layout for f in frame.fields]


def test_every_declared_frame_is_written_in_the_docs() -> None:
    written = {(c, k) for c, k, _ in LAYOUTS} | {(c, k) for c, k, _ in TABLES}
    missing = [(name, kind) for name, conversations in protocol.CONVERSATIONS.items()
               for c in conversations for kind in c.frames if (name, kind) not in written]
    assert not missing
