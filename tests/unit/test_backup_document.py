"""The backup document's checks (gcm/backup_document.py), which the leader runs on every `restore`
request: whatever a document holds, `parse()` accepts it whole or refuses it with a UserError
naming a fault, never another exception; and past the limits it refuses before looking further."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from gcm.backup_document import MAX_KEYS, MAX_QUEUES, MAX_SETTINGS, Backup, parse
from roq.errors import UserError
from tests.profiles import examples
from tests.support.hostile_documents import hostile_documents

KEY = "rq>Tb=0C4pZ+8Yn?uQw6sL!mK2jV9xE1hD3gF5aB"  # 40 Z85 characters
GOOD: dict[str, Any] = {
    "format": "roq-backup", "version": 2, "created_at": "2026-11-27T15:00:00Z", "roq_version": "1.0",
    "cluster": {"root": "/roq", "zk_hosts": "127.0.0.1:2181"},
    "queues": [
        {"name": "orders", "exchanges": 2, "replicas": 2, "rules": {"max_rate": 5000},
         "settings": {"replicas": 2, "rules": {"max_rate": 5000}, "retention": 3600, "next_exchange": 3}},
        {"name": "events", "exchanges": 1, "replicas": 1, "rules": None, "settings": {}},
    ],
    "keys": {"server": KEY, "clients": {"app": KEY}, "admins": {"ops": KEY}},
    "permissions": {"format": 1, "keys": {"app": {"publish": ["orders"], "subscribe": ["ev*"], "consume": [],
                                                  "admin": False}}},
}


def test_the_good_document_parses_whole() -> None:
    backup = parse(GOOD, "test")
    assert [q.name for q in backup.queues] == ["orders", "events"] and backup.queues[0].replicas == 2
    assert list(backup.permissions.entries["app"].subscribe) == ["ev*"]
    assert parse(backup.to_json(), "again").to_json() == backup.to_json()


@settings(max_examples=examples(500), deadline=None)
@given(hostile_documents(GOOD))
def test_any_document_is_accepted_whole_or_refused_with_a_user_error(document: Any) -> None:
    try:
        found = parse(document, "hostile")
    except UserError as exc:
        assert str(exc).startswith("hostile: ")
    else:
        assert isinstance(found, Backup)


@pytest.mark.parametrize("document, limit", [
    (dict(GOOD, queues=[GOOD["queues"][1]] * (MAX_QUEUES + 1)), "a backup holds at most"),
    (dict(GOOD, permissions={"format": 1, "keys": {f"k{i}": {} for i in range(MAX_KEYS + 1)}}),
     f"permissions: {MAX_KEYS + 1} entries"),
    (dict(GOOD, keys=dict(GOOD["keys"], clients={f"c{i}": KEY for i in range(MAX_KEYS + 1)})),
     f"keys.clients: {MAX_KEYS + 1} keys"),
    (dict(GOOD, queues=[dict(GOOD["queues"][1], settings={f"s{i}": 0 for i in range(MAX_SETTINGS + 1)})]),
     f"settings hold {MAX_SETTINGS + 1} fields"),
])
def test_past_a_limit_is_refused(document: dict[str, Any], limit: str) -> None:
    with pytest.raises(UserError, match=limit):
        parse(document, "big")
