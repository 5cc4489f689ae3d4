"""A day-of-week step from a starting day runs to the end of the field, which is 7 (Sunday again).

The dialect's day-of-week field is 0-7, 0 and 7 both Sunday (docs/architecture.md, the field's own
error message), and a step from a start (`n/k`, as in Quartz and Spring) means `n-<end of field>/k`:
`5/1` is `5-7`, Friday to Sunday. Expectations are the calendar's own weekdays, not the scheduler's.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from itertools import islice

import pytest

from scheduler.domain.cron import CronExpression, InvalidCronExpression, fire_times


def days_fired(expression: str, weeks: int = 2) -> list[date]:
    start = datetime(2027, 1, 3, tzinfo=UTC)  # a Sunday, 00:00: its own midnight is not after it
    end = start + timedelta(weeks=weeks)
    return [fire.date() for fire in islice(fire_times(expression, "UTC", start), 50) if fire <= end]


def calendar_days(cron_weekdays: set[int], weeks: int = 2) -> list[date]:
    """Days in (2027-01-03, + weeks] whose weekday (cron numbering, Sunday 0) is in the set."""
    first = date(2027, 1, 4)
    days = (first + timedelta(days=n) for n in range(7 * weeks))
    return [day for day in days if day.isoweekday() % 7 in cron_weekdays]


@pytest.mark.parametrize(
    ("expression", "weekdays"),
    [
        ("0 0 * * 5/1", {5, 6, 0}),  # 5, 6, 7: Friday, Saturday, Sunday, as 5-7 is
        ("0 0 * * 1/3", {1, 4, 0}),  # 1, 4, 7: Monday, Thursday, Sunday, as 1-7/3 is
        ("0 0 * * 3/2", {3, 5, 0}),  # 3, 5, 7
    ],
)
def test_a_weekday_step_from_a_start_reaches_sunday_as_seven(expression: str, weekdays: set[int]) -> None:
    assert days_fired(expression) == calendar_days(weekdays)


def test_the_same_days_written_as_a_range_already_do() -> None:
    assert days_fired("0 0 * * 5-7") == calendar_days({5, 6, 0})
    assert days_fired("0 0 * * 1-7/3") == calendar_days({1, 4, 0})


@pytest.mark.parametrize(
    ("expression", "weekdays"),
    [
        ("0 0 * * 7/1", {0}),  # 7 alone: Sunday, not every day
        ("0 0 * * 6/1", {6, 0}),  # 6, 7
        ("0 0 * * 0/1", {0, 1, 2, 3, 4, 5, 6}),  # 0-7: every day, Sunday once
        ("0 0 * * 0/7", {0}),  # 0 and 7, both Sunday
        ("0 0 * * 6/2", {6}),  # 6; 8 is past the field
        ("0 0 * * */2", {0, 2, 4, 6}),  # 0-7/2 stops at 6: unchanged
        ("0 0 * * fri/1", {5, 6, 0}),  # a name starts a step as its number does
        ("0 0 * * 5/1,1", {5, 6, 0, 1}),  # in a list
    ],
)
def test_the_ends_of_the_field_and_the_wildcard_step(expression: str, weekdays: set[int]) -> None:
    assert days_fired(expression) == calendar_days(weekdays)


def test_a_weekday_step_of_zero_is_refused() -> None:
    with pytest.raises(InvalidCronExpression, match="a step must be at least 1"):
        CronExpression.parse("0 0 * * 5/0")


@pytest.mark.parametrize(
    ("expression", "weekdays"),
    [
        # The field takes a day with a leading zero ("05" is Friday, "05-07" Friday to Sunday), and
        # a step from such a start runs to 7 as its bare form does.
        ("0 0 * * 05/1", {5, 6, 0}),
        ("0 0 * * 01/3", {1, 4, 0}),
        ("0 0 * * 07/1", {0}),
    ],
)
def test_a_weekday_step_from_a_start_with_a_leading_zero_is_the_same_step(
    expression: str, weekdays: set[int]
) -> None:
    assert days_fired("0 0 * * 05") == calendar_days({5})  # a leading zero is accepted elsewhere
    assert days_fired(expression) == calendar_days(weekdays)
    assert days_fired("0 0 * * 05L") == days_fired("0 0 * * 5L")  # Quartz's last Friday, likewise
