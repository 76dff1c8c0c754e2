"""A queue's storage policy in human units (roq/storage_policy.py): what the CLI reads, what it shows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roq.errors import UserError
from roq.storage_policy import (
    MAX_RETENTION,
    MAX_RETENTION_BYTES,
    StoragePolicy,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
    policy_from_line,
    policy_of,
    storage_line,
)
from tests.profiles import examples


@pytest.mark.parametrize("text, seconds", [("90", 90), ("30s", 30), ("15m", 900), ("24h", 86_400), ("7d", 604_800),
                                           ("2w", 1_209_600), ("1h30m", 5_400), ("250ms", 0.25), ("0", 0),
                                           (" 1.5h ", 5_400), ("1H", 3_600)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "24x", "1h 30", "h1", "-5", "nan", "inf", "1e12", "24hh", "1.h"])
def test_bad_durations_say_which_units_work(text: str) -> None:
    with pytest.raises(UserError, match="duration|retention must be"):
        parse_duration(text)


@pytest.mark.parametrize("text, size", [("1024", 1024), ("512MiB", 512 << 20), ("50GiB", 50 << 30),
                                        ("1.5TB", 1_500_000_000_000), ("2 kb", 2000), ("0", 0), ("1b", 1)])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "50G", "1.5B", "abc", "-1", "1.5.5MiB", "2EiB", "1e3"])
def test_bad_sizes_say_which_units_work(text: str) -> None:
    with pytest.raises(UserError, match="size|whole number"):
        parse_size(text)


@settings(max_examples=examples(200))
@given(st.integers(0, int(MAX_RETENTION)))
def test_a_shown_duration_reads_back_as_itself(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@settings(max_examples=examples(200))
@given(st.integers(0, MAX_RETENTION_BYTES))
def test_a_shown_size_reads_back_as_itself(size: int) -> None:
    assert parse_size(format_size(size)) == size


def test_settings_without_a_policy_or_with_a_broken_one_are_memory_only() -> None:
    assert policy_of({}) == StoragePolicy(0, 0) and not policy_of({}).on_disk
    assert policy_of({"retention": "24h", "retention_bytes": -1}) == StoragePolicy(0, 0)
    assert policy_of({"retention": 60}).on_disk and policy_of({"retention_bytes": 1}).on_disk
    assert StoragePolicy(0, 50 << 30).describe() == "on disk with no age limit, up to 50 GiB"


def test_the_line_to_an_exchange_reads_back() -> None:
    policy = StoragePolicy(3_600, 1 << 30)
    assert policy_from_line(storage_line(policy)) == policy
    assert policy_from_line({"commands": []}) is None
    assert policy_from_line({"storage": "24h"}) is None
