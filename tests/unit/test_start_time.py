"""Start times as text (roq/start_time.py): the two spellings agree, anything else is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roq.start_time import looks_like_time, parse_start_time
from tests.profiles import examples

MOMENTS = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30),
                       timezones=st.just(UTC))
ZONES = st.integers(-14 * 60, 14 * 60).map(lambda minutes: timezone(timedelta(minutes=minutes)))


@settings(max_examples=examples(200), deadline=None)
@given(moment=MOMENTS, zone=ZONES)
def test_iso_8601_in_any_zone_and_epoch_milliseconds_name_the_same_time(moment, zone) -> None:
    moment = moment.replace(microsecond=moment.microsecond // 1000 * 1000)  # milliseconds: the epoch form's unit
    millis = round(moment.timestamp() * 1000)
    assert parse_start_time(moment.astimezone(zone).isoformat()) == pytest.approx(millis / 1000, abs=1e-6)
    assert parse_start_time(str(millis)) == millis / 1000
    assert looks_like_time(str(millis)) and looks_like_time(moment.isoformat())


@pytest.mark.parametrize("text, says", [
    ("now", "is not a time: give ISO 8601 with a zone"),
    ("2026-13-01T00:00:00Z", "is not a time"),
    ("2026-11-27T10:00:00", "has no time zone"),
    ("1969-12-31T23:59:59Z", "before 1970-01-01"),
    ("99999999999999999999", "past the year 9999"),
    ("-5", "is not a time"),
    ("", "is not a time"),
])
def test_anything_else_is_refused_saying_what_is_accepted(text, says) -> None:
    with pytest.raises(ValueError, match=says):
        parse_start_time(text)


def test_words_and_file_names_do_not_look_like_times() -> None:
    assert not any(looks_like_time(text) for text in ("now", "beginning", "pos.json", "-5", ""))


def test_roq_subscribe_from_reads_a_time_as_the_gateway_and_spark_do() -> None:
    """`--from` parses with roq/start_time.py: both spellings; a word or a path is not a time."""
    import click

    from roq.cli.pubsub import _start_time
    assert _start_time("1795773600000") == _start_time("2026-11-27T10:00:00Z")
    assert _start_time("positions/audit.json") is None and _start_time("yesterday") is None
    with pytest.raises(click.BadParameter, match="has no time zone"):
        _start_time("2026-11-27T10:00:00")
