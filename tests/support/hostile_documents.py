"""Hypothesis strategies of hostile backup documents and restore requests: a good document with one
place replaced, dropped or given an unknown field, or any value at all (the unit test of
gcm/backup_document.py and the leader's `restore` in tests/integration/test_permissions.py)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Any value msgpack carries (its integers end at 64 bits), nested.
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
                       | st.text(max_size=12) | st.binary(max_size=8),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                   max_size=4),
                       max_leaves=12)


def places(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and indexes) into a JSON document."""
    found = [at]
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found += places(child, (*at, key))
    return found


@st.composite
def hostile_documents(draw: st.DrawFn, good: dict[str, Any]) -> Any:
    """The good document with one place replaced, dropped or given an unknown field, or any value."""
    document: Any = json.loads(json.dumps(good))
    how = draw(st.sampled_from(["replace", "drop", "add", "anything"]))
    if how == "anything":
        document = draw(JSONISH)
    else:
        at = draw(st.sampled_from(places(document)[1:]))
        parent = document
        for key in at[:-1]:
            parent = parent[key]
        if how == "replace":
            parent[at[-1]] = draw(JSONISH)
        elif how == "drop":
            del parent[at[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(JSONISH)
        else:
            parent.append(draw(JSONISH))
    return document


@st.composite
def hostile_restores(draw: st.DrawFn, good: dict[str, Any]) -> dict[str, Any]:
    """A restore request's arguments: a hostile document and flags of any type. Never a forced
    restore that applies."""
    document = draw(hostile_documents(good))
    dry_run = draw(st.sampled_from([True, False, 0, "yes", None]))
    force = draw(st.sampled_from([False, 1, "true"] + ([True] if dry_run is True else [])))
    return {"document": document, "force": force, "dry_run": dry_run}
