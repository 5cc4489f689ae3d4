"""Day-of-month beside Quartz's day-of-week forms (n#k, nL), and L-n days that no month has."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from itertools import islice

import pytest

from scheduler.domain.cron import CronSchedule, InvalidCronExpression, fire_times

START = datetime(2026, 1, 1, tzinfo=UTC)  # a Thursday


def upcoming(expression: str, count: int) -> list[str]:
    return [fire.strftime("%Y-%m-%d") for fire in islice(fire_times(expression, "UTC", START), count)]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # The 1st of each month, or its first Monday (2026-01-05, 02-02, 03-02).
        ("0 0 1 * 1#1", ["2026-01-05", "2026-02-01", "2026-02-02", "2026-03-01", "2026-03-02"]),
        # The 15th, or the first and third Mondays.
        ("0 0 15 * 1#1,1#3", ["2026-01-05", "2026-01-15", "2026-01-19", "2026-02-02", "2026-02-15"]),
        # The 1st, or the last Friday (2026-01-30, 02-27).
        ("0 0 1 * 5L", ["2026-01-30", "2026-02-01", "2026-02-27", "2026-03-01", "2026-03-27"]),
        ("0 0 1 * MON#2", ["2026-01-12", "2026-02-01", "2026-02-09", "2026-03-01", "2026-03-09"]),
        # The last day, or the first Monday.
        ("0 0 L * 1#1", ["2026-01-05", "2026-01-31", "2026-02-02", "2026-02-28", "2026-03-02"]),
    ],
)
def test_restricted_day_of_month_or_quartz_weekday_fires_on_either(
    expression: str, expected: list[str]
) -> None:
    # Documented: when both day fields are restricted, a day matching either fires.
    assert upcoming(expression, 5) == expected


def test_a_star_day_of_month_still_ands_with_a_quartz_weekday() -> None:
    # Vixie: a day field beginning with "*" means both must match (odd days that are first Mondays).
    assert upcoming("0 0 */2 * 1#1", 3) == ["2026-01-05", "2026-06-01", "2026-08-03"]


@pytest.mark.parametrize(
    "expression", ["0 0 L-30 2 *", "0 0 L-29 2 *", "0 0 L-30 4,6,9,11 *", "0 0 0 L-30 2 ?"]
)
def test_an_l_n_day_no_month_has_is_refused_at_once(expression: str) -> None:
    began = time.monotonic()
    with pytest.raises(InvalidCronExpression, match="matches no date"):
        CronSchedule.of(expression, "UTC")
    assert time.monotonic() - began < 2.0  # milliseconds now; before, 4 s and a bare ValueError


def test_an_l_n_day_only_some_months_have_still_fires() -> None:
    # 31 - 30: the 1st of the 31-day months only; 29 - 28: 1 February in leap years.
    assert upcoming("0 0 L-30 * *", 2) == ["2026-03-01", "2026-05-01"]
    assert upcoming("0 0 L-28 2 *", 2) == ["2028-02-01", "2032-02-01"]
