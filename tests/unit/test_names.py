"""Names users choose: the whole string must match, not a prefix up to a newline."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roq.errors import InvalidNameError
from roq.names import check_group_name, check_host_name, check_queue_name, check_subscriber_name
from roq.protocol import MAX_GROUP_NAME

CHECKS = [check_queue_name, check_host_name, check_subscriber_name, check_group_name]
# `^...$` with match() accepted the first: `$` also matches before a final "\n".
BAD = ["abc\n", "abc\r", "abc\r\n", "\nabc", "ab\nc", "abc ", " abc", "abc\t", "abc\x00", "abc\u2028",
       "abc\x0b", "abc\x0c", "", ".", "..", "-abc", "_abc", "a" * 64, "a/b", "a~b", "ab\u00e9", "abc\n\n"]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused(check, name: str) -> None:
    with pytest.raises(InvalidNameError):
        check(name)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["a", "abc", "Q-1.two_3", "9", "a" * 63])
def test_good_names_pass_unchanged(check, name: str) -> None:
    assert check(name) == name


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("value", [None, 3, b"abc", ["abc"]])
def test_non_strings_are_refused(check, value: object) -> None:
    with pytest.raises(InvalidNameError):
        check(value)


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,40}", fullmatch=True),
       st.sampled_from(["\n", "\r", " ", "\t", "\r\n", "\x00", "~", "/"]))
def test_a_good_name_with_anything_appended_is_refused(name: str, tail: str) -> None:
    assert check_queue_name(name) == name
    with pytest.raises(InvalidNameError):
        check_queue_name(name + tail)


def test_a_group_name_is_as_long_as_the_protocol_allows() -> None:
    """The CLI, the gateway and the leader check a group's name with check_group_name; the exchange
    with protocol.MAX_GROUP_NAME: the same bound, so none accepts a name another refuses."""
    assert check_group_name("g" * MAX_GROUP_NAME) == "g" * MAX_GROUP_NAME
    with pytest.raises(InvalidNameError, match="invalid group name"):
        check_group_name("g" * (MAX_GROUP_NAME + 1))
