"""The permission table (roq/permissions.py): patterns, entries, defaults, and the control API's
authorisation of keys (gcm/api.py), without a cluster."""

from __future__ import annotations

import json

import pytest

from gcm.api import authorise, visible
from roq.errors import ForbiddenError, InvalidNameError, UserError
from roq.permissions import (
    MAX_PATTERNS,
    Entry,
    PermissionTable,
    check_pattern,
    from_message,
    requested,
    to_message,
)

ORDERS = Entry(publish=("orders.*",))


@pytest.mark.parametrize("pattern", ["orders", "orders.*", "*", "log-??", "a_b-c.d", "?x", "*" * 63])
def test_patterns_in_the_queue_name_alphabet_are_taken(pattern: str) -> None:
    assert check_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern", ["", "orders/eu", "orders[12]", "-x", ".x", "_x", "a" * 64, "orders\n",
                                     "ördres", 7, None, ["orders"]])
def test_other_patterns_are_refused_with_the_grammar(pattern: object) -> None:
    with pytest.raises(InvalidNameError, match="wildcards"):
        check_pattern(pattern)


def test_patterns_match_whole_names_case_sensitively() -> None:
    entry = Entry(publish=("orders.*",), subscribe=("log-??", "audit"), consume=("*",))
    assert entry.allows("publish", "orders.eu") and entry.allows("publish", "orders.")
    assert not entry.allows("publish", "orders") and not entry.allows("publish", "Orders.eu")
    assert not entry.allows("publish", "x.orders.eu")  # anchored at both ends
    assert entry.allows("subscribe", "log-01") and not entry.allows("subscribe", "log-001")
    assert entry.allows("subscribe", "audit") and not entry.allows("subscribe", "audit2")
    assert entry.allows("consume", "anything") and not entry.allows("publish", "anything")
    assert Entry(admin=True).allows("publish", "anything")


def test_a_key_without_an_entry_gets_the_default() -> None:
    for default, expected in (("all", True), ("none", False)):
        table = PermissionTable({"pub": ORDERS}, default)
        assert table.allows("stranger", "consume", "billing") is expected
        assert table.uses("stranger", "billing") is expected
        assert table.allows("pub", "publish", "orders.eu") and not table.allows("pub", "subscribe", "orders.eu")
    empty = PermissionTable({"mute": Entry()}, "all")
    assert not empty.uses("mute", "orders.eu")  # an empty entry: nothing, whatever the default


def test_grant_adds_and_revoke_takes_patterns_as_granted() -> None:
    entry = ORDERS.granted(Entry(publish=("orders.*", "eu.*"), subscribe=("eu.*",)))
    assert entry == Entry(publish=("orders.*", "eu.*"), subscribe=("eu.*",))  # no duplicates, order kept
    assert entry.without(Entry(publish=("orders.*",))) == Entry(publish=("eu.*",), subscribe=("eu.*",))
    with pytest.raises(UserError, match="no publish pattern 'orders.eu'"):
        entry.without(Entry(publish=("orders.eu",)))  # not by the queues a pattern matches
    assert Entry(admin=True, consume=("q",)).without(Entry(admin=True)) == Entry(consume=("q",))
    with pytest.raises(UserError, match=f"at most {MAX_PATTERNS}"):
        Entry().granted(Entry(publish=tuple(f"q{i}" for i in range(MAX_PATTERNS + 1))))


def test_the_table_round_trips_through_its_znode_and_the_hcm_line() -> None:
    table = PermissionTable({"pub": ORDERS, "ops": Entry(admin=True)}, "none", 42)
    again = PermissionTable.from_znode(table.to_znode(), "none", 42)
    assert again == table
    assert from_message(json.loads(json.dumps(to_message(table)))["permissions"], "none") == table
    assert PermissionTable.from_znode(None, "all", 0) == PermissionTable(default="all")


@pytest.mark.parametrize("document, message", [
    (b"not json", "not valid JSON"),
    (b'{"keys": {}}', "not a permission table"),
    (b'{"format": 2, "keys": {}}', "not a permission table"),
    (b'{"format": 1, "keys": {}, "extra": 1}', "not a permission table"),
    (b'{"format": 1, "keys": []}', "keys must be an object"),
    (b'{"format": 1, "keys": {"../x": {}}}', "invalid key name"),
    (b'{"format": 1, "keys": {"a": {"publish": "orders"}}}', "must be a list"),
    (b'{"format": 1, "keys": {"a": {"publish": ["or/ders"]}}}', "invalid queue pattern"),
    (b'{"format": 1, "keys": {"a": {"admin": 1}}}', "admin must be true or false"),
    (b'{"format": 1, "keys": {"a": {"write": ["q"]}}}', "unknown fields write"),
])
def test_a_table_that_is_not_one_is_refused_whole(document: bytes, message: str) -> None:
    with pytest.raises(UserError, match=message):
        PermissionTable.from_znode(document)


@pytest.mark.parametrize("body", [None, {}, {"version": "1", "table": {}}, {"version": -1, "table": {}},
                                  {"version": True, "table": {"format": 1, "keys": {}}}, {"version": 1, "table": []}])
def test_a_bad_hcm_line_is_refused(body: object) -> None:
    with pytest.raises(UserError):
        from_message(body, "all")


def test_requests_name_rights_by_their_fields() -> None:
    assert requested({"name": "x", "publish": ["a"], "admin": True}) == Entry(publish=("a",), admin=True)
    assert requested({"name": "x"}).empty
    with pytest.raises(UserError, match="publish must be a list"):
        requested({"publish": "a"})  # one string is not taken for its letters


# ------------------------------------------------------------------ the control API's checks

TABLE = PermissionTable({"pub": ORDERS, "boss": Entry(admin=True)}, "none")


@pytest.mark.parametrize("op, args", [("keys.grant", {"name": "pub", "publish": ["*"]}), ("keys.list", {}),
                                      ("keys.revoke", {"name": "pub"}), ("keys.reset", {"name": "pub"}),
                                      ("queue.create", {"name": "q"}), ("keys.show", {"name": "boss"}),
                                      ("queue.describe", {"name": "billing"}),
                                      ("queue.rules", {"name": "billing"})])
def test_a_client_key_is_forbidden_what_is_not_its_own(op: str, args: dict) -> None:
    with pytest.raises(ForbiddenError):
        authorise(op, args, "client", "pub", TABLE)


def test_a_client_key_sees_its_own_queues_and_permissions() -> None:
    assert authorise("queue.describe", {"name": "orders.eu"}, "client", "pub", TABLE) is False
    assert authorise("keys.show", {"name": "pub"}, "client", "pub", TABLE) is False
    assert authorise("keys.grant", {"name": "pub"}, "client", "boss", TABLE) is True  # granted admin
    assert authorise("keys.list", {}, "admin", "ops", TABLE) is True  # under admins/
    listed = [{"name": "orders.eu"}, {"name": "billing"}]
    assert visible("queue.list", listed, "client", "pub", TABLE) == [{"name": "orders.eu"}]
    assert visible("cluster.status", {"queues": ["billing", "orders.eu"], "exchanges": 2}, "client", "pub",
                   TABLE) == {"queues": ["orders.eu"], "exchanges": 2}
    assert visible("cluster.stats", {"queues": {"billing": {}, "orders.eu": {}}}, "client", "pub", TABLE) == \
        {"queues": {"orders.eu": {}}}
    assert visible("queue.list", listed, "server", "server", TABLE) == listed  # the daemons see everything
    events = {"events": [{"seq": 1, "queue": None}, {"seq": 2, "queue": "billing"}, {"seq": 3, "queue": "orders.eu"}],
              "last": 3}  # the cluster's own events, and those of the queues the key uses
    assert visible("cluster.events", events, "client", "pub", TABLE) == \
        {"events": [{"seq": 1, "queue": None}, {"seq": 3, "queue": "orders.eu"}], "last": 3}
