"""The HTTP answer to an admin command's status, and the group rows of the gateway (roq_web/groups.py)."""

from __future__ import annotations

from typing import Any

import pytest

from roq.errors import GroupNotFoundError, PreconditionFailedError
from roq_web.groups import command_status_code, group_detail, group_rows


def status(results: dict[str, Any], waiting: list[str]) -> dict[str, Any]:
    return {"id": "k-1", "op": "group.delete", "results": results, "waiting": waiting, "done": not waiting}


def test_a_command_is_200_once_every_running_exchange_applied_it_and_202_before() -> None:
    assert command_status_code(status({"x1": {"deleted": True, "dropped": 3}, "x2": {"missing": True}}, [])) == 200
    assert command_status_code(status({"x1": {"deleted": True, "dropped": 3}}, ["x2"])) == 202


def test_a_command_an_exchange_refused_is_a_conflict_naming_it() -> None:
    refused = status({"x1": {"deleted": True, "dropped": 3}, "x2": {"refused": "1 members connected"}}, [])
    with pytest.raises(PreconditionFailedError, match=r"refused by x2 \(1 members connected\) \(command k-1"):
        command_status_code(refused)


STATS = {"groups": {"b": {"members": 2, "ready": 7, "topics": ["jobs"]}, "a": {"in_flight": 1}},
         "by_exchange": [{"id": "x1", "groups": {"b": {"members": 2, "ready": 3}}}, {"id": "x2", "groups": {}},
                         {"id": "x3", "groups": {"b": {"members": 1, "ready": 4}}}]}


def test_group_rows_are_by_name_with_every_figure() -> None:
    rows = group_rows(STATS)
    assert [r["name"] for r in rows] == ["a", "b"]
    assert rows[1]["ready"] == 7 and rows[1]["delayed"] == 0 and rows[1]["topics"] == ["jobs"]
    assert group_rows({}) == []


def test_one_group_has_its_figures_on_each_exchange_that_runs_it() -> None:
    shown = group_detail("q", STATS, "b")
    assert (shown["queue"], shown["name"], shown["members"]) == ("q", "b", 2)
    assert {x: f["ready"] for x, f in shown["by_exchange"].items()} == {"x1": 3, "x3": 4}
    with pytest.raises(GroupNotFoundError, match="has no group 'c'"):
        group_detail("q", STATS, "c")
