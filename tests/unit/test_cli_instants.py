"""How the CLI reads a time (``--at``, ``--since``): an instant with its offset, and one line that
says what to give when it has none in a zone that is not UTC, or an offset no zone has."""

from __future__ import annotations

from datetime import datetime

import click
import pytest

from scheduler.cli.common import first_after_gap, parse_instant


def refusal(text: str, zone: str = "UTC") -> str:
    with pytest.raises(click.BadParameter) as raised:
        parse_instant(text, "--at", zone)
    return raised.value.format_message()


@pytest.mark.parametrize(
    ("moment", "zone", "after"),
    [
        ("2027-03-28T02:30:00", "Europe/Berlin", "2027-03-28T03:00:00+02:00"),
        ("2027-03-14T02:00:00", "America/New_York", "2027-03-14T03:00:00-04:00"),
        ("2027-10-03T02:15:00", "Australia/Lord_Howe", "2027-10-03T02:30:00+11:00"),  # a 30-minute gap
    ],
)
def test_a_skipped_wall_time_is_said_with_the_first_instant_after_its_gap(
    moment: str, zone: str, after: str
) -> None:
    said = refusal(moment, zone)
    assert f"where the clocks skip {moment[11:16]} that day" in said and f"e.g. {after}," in said
    assert parse_instant(after, "--at", zone).isoformat() == after


@pytest.mark.parametrize(
    ("moment", "zone"),
    [
        ("2027-10-31T02:30:00", "Europe/Berlin"),  # repeated, not skipped
        ("2027-06-01T09:00:00", "Europe/Berlin"),
        ("2027-03-28T02:30:00", "Mars/Olympus"),  # no such zone: refused as such later
    ],
)
def test_a_wall_time_that_exists_is_no_gap(moment: str, zone: str) -> None:
    assert first_after_gap(datetime.fromisoformat(moment), zone) is None


def test_an_offset_of_a_day_or_more_is_said_in_the_users_terms() -> None:
    said = refusal("2027-01-01T09:00:00+25:00")
    assert "UTC offset must be less than 24 hours" in said and "timedelta" not in said
