"""A naive time near either end of what Python's datetime holds, in a zone that is not UTC, is
refused with the usual line (give an offset), as it was before 766aa83: looking for a
spring-forward gap converts it to UTC, which overflows there, and the CLI ended in a traceback."""

from __future__ import annotations

import click
import pytest

from scheduler.cli.common import parse_instant


@pytest.mark.parametrize(
    ("text", "zone"),
    [("9999-12-31T23:00", "America/New_York"), ("0001-01-01T00:00", "Asia/Tokyo")],
)
def test_a_naive_time_at_the_far_ends_is_refused_with_a_usage_error(text: str, zone: str) -> None:
    with pytest.raises(click.BadParameter) as raised:
        parse_instant(text, "--end", zone)
    assert "has no offset" in raised.value.format_message()
