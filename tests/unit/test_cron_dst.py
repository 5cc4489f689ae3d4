"""Daylight saving time: Vixie's rules for fixed-time schedules, real time for
wildcard ones, in zones with one-hour, 30-minute and 45-minute offsets and shifts."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice

import pytest

from scheduler.domain.cron import fire_times, next_fire_after, skipped_until, time_zone


def fires(expression: str, tz: str, after: str, count: int) -> list[str]:
    start = datetime.fromisoformat(after)
    return [fire.strftime("%Y-%m-%dT%H:%M:%SZ") for fire in islice(fire_times(expression, tz, start), count)]


def test_berlin_spring_forward_fires_once_right_after_the_gap() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2027-03-27T00:00:00Z", 3) == [
        "2027-03-27T01:30:00Z",
        "2027-03-28T01:00:00Z",  # 03:00 CEST: 02:30 does not exist that night
        "2027-03-29T00:30:00Z",
    ]


def test_berlin_fall_back_fires_once_at_the_first_occurrence() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2026-10-24T00:00:00Z", 3) == [
        "2026-10-24T00:30:00Z",
        "2026-10-25T00:30:00Z",  # 02:30 CEST; not again at 02:30 CET (01:30Z)
        "2026-10-26T01:30:00Z",
    ]


def test_many_matching_times_in_a_gap_fire_once() -> None:
    # 02:00, 02:15, 02:30 and 02:45 all fall in the gap: one fire at 03:00 CEST, then 03:15 onwards.
    assert fires("0/15 2,3 * * *", "Europe/Berlin", "2027-03-28T00:00:00Z", 4) == [
        "2027-03-28T01:00:00Z",
        "2027-03-28T01:15:00Z",
        "2027-03-28T01:30:00Z",
        "2027-03-28T01:45:00Z",
    ]
    assert fires("0-59 2 * * *", "Europe/Berlin", "2027-03-28T00:00:00Z", 2) == [
        "2027-03-28T01:00:00Z",
        "2027-03-29T00:00:00Z",
    ]


def test_wildcard_schedules_skip_the_gap_without_catching_up() -> None:
    assert fires("*/20 2 * * *", "Europe/Berlin", "2027-03-28T00:00:00Z", 2) == [
        "2027-03-29T00:00:00Z",
        "2027-03-29T00:20:00Z",
    ]
    assert fires("30 * * * *", "Europe/Berlin", "2027-03-28T00:00:00Z", 3) == [
        "2027-03-28T00:30:00Z",  # 01:30 CET; 02:30 does not exist
        "2027-03-28T01:30:00Z",  # 03:30 CEST
        "2027-03-28T02:30:00Z",
    ]


def test_wildcard_schedules_fire_both_occurrences_of_a_repeated_time() -> None:
    assert fires("*/30 * * * *", "Europe/Berlin", "2026-10-24T23:45:00Z", 7) == [
        "2026-10-25T00:00:00Z",  # 02:00 CEST
        "2026-10-25T00:30:00Z",  # 02:30 CEST
        "2026-10-25T01:00:00Z",  # 02:00 CET
        "2026-10-25T01:30:00Z",  # 02:30 CET
        "2026-10-25T02:00:00Z",  # 03:00 CET
        "2026-10-25T02:30:00Z",
        "2026-10-25T03:00:00Z",
    ]
    assert fires("@hourly", "Europe/Berlin", "2026-10-24T23:30:00Z", 3) == [
        "2026-10-25T00:00:00Z",
        "2026-10-25T01:00:00Z",
        "2026-10-25T02:00:00Z",
    ]


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        # Inside the first pass of the repeated hour (02:10 CEST).
        ("2026-10-25T00:10:00Z", ["2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z"]),
        # Inside the second pass (02:10 CET): the first pass is history.
        ("2026-10-25T01:10:00Z", ["2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z", "2026-10-25T02:30:00Z"]),
        # After the first pass's last match, before the second pass begins.
        ("2026-10-25T00:45:00Z", ["2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"]),
    ],
)
def test_wildcard_starting_inside_a_repeated_hour(after: str, expected: list[str]) -> None:
    assert fires("*/30 * * * *", "Europe/Berlin", after, 3) == expected


def test_fixed_time_starting_inside_the_second_pass_waits_for_the_next_day() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2026-10-25T01:10:00Z", 1) == ["2026-10-26T01:30:00Z"]
    assert fires("45 2 * * *", "Europe/Berlin", "2026-10-25T00:40:00Z", 1) == ["2026-10-25T00:45:00Z"]


def test_seconds_fields_follow_the_same_rules() -> None:
    assert fires("15 30 2 * * *", "Europe/Berlin", "2027-03-28T00:00:00Z", 2) == [
        "2027-03-28T01:00:00Z",
        "2027-03-29T00:30:15Z",
    ]
    # A seconds field beginning with "*" makes the schedule wildcard: both 02:30s fire.
    assert fires("*/30 30 2 * * *", "Europe/Berlin", "2026-10-25T00:00:00Z", 5) == [
        "2026-10-25T00:30:00Z",
        "2026-10-25T00:30:30Z",
        "2026-10-25T01:30:00Z",
        "2026-10-25T01:30:30Z",
        "2026-10-26T01:30:00Z",
    ]


def test_lord_howe_half_hour_shift() -> None:
    # Standard +10:30, summer +11:00. Spring forward 02:00 -> 02:30, fall back 02:00 -> 01:30.
    assert fires("15 2 * * *", "Australia/Lord_Howe", "2026-10-02T00:00:00Z", 3) == [
        "2026-10-02T15:45:00Z",
        "2026-10-03T15:30:00Z",  # 02:30 +11:00, right after the gap
        "2026-10-04T15:15:00Z",
    ]
    assert fires("45 1 * * *", "Australia/Lord_Howe", "2026-04-03T00:00:00Z", 3) == [
        "2026-04-03T14:45:00Z",
        "2026-04-04T14:45:00Z",  # first 01:45 (+11:00) only
        "2026-04-05T15:15:00Z",
    ]
    assert fires("*/15 1 * * *", "Australia/Lord_Howe", "2026-04-04T12:00:00Z", 7) == [
        "2026-04-04T14:00:00Z",
        "2026-04-04T14:15:00Z",
        "2026-04-04T14:30:00Z",
        "2026-04-04T14:45:00Z",
        "2026-04-04T15:00:00Z",  # 01:30 again, at +10:30
        "2026-04-04T15:15:00Z",
        "2026-04-05T14:30:00Z",
    ]
    assert fires("*/15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00:00Z", 3) == [
        "2026-10-03T15:30:00Z",
        "2026-10-03T15:45:00Z",
        "2026-10-04T15:00:00Z",
    ]


def test_new_york() -> None:
    assert fires("30 2 * * *", "America/New_York", "2027-03-13T00:00:00Z", 3) == [
        "2027-03-13T07:30:00Z",
        "2027-03-14T07:00:00Z",  # 03:00 EDT
        "2027-03-15T06:30:00Z",
    ]
    assert fires("30 1 * * *", "America/New_York", "2027-11-06T00:00:00Z", 3) == [
        "2027-11-06T05:30:00Z",
        "2027-11-07T05:30:00Z",  # 01:30 EDT, not 01:30 EST
        "2027-11-08T06:30:00Z",
    ]
    assert fires("0,30 * * * *", "America/New_York", "2027-11-07T04:59:00Z", 5) == [
        "2027-11-07T05:00:00Z",
        "2027-11-07T05:30:00Z",
        "2027-11-07T06:00:00Z",
        "2027-11-07T06:30:00Z",
        "2027-11-07T07:00:00Z",
    ]


def test_chatham_45_minute_offset() -> None:
    # +12:45 standard, +13:45 summer; the clocks change at 02:45 standard time.
    assert fires("0 3 * * *", "Pacific/Chatham", "2026-09-25T00:00:00Z", 3) == [
        "2026-09-25T14:15:00Z",
        "2026-09-26T14:00:00Z",  # 03:45 +13:45, right after the gap
        "2026-09-27T13:15:00Z",
    ]
    assert fires("0 3 * * *", "Pacific/Chatham", "2027-04-02T00:00:00Z", 3) == [
        "2027-04-02T13:15:00Z",
        "2027-04-03T13:15:00Z",  # first 03:00 only
        "2027-04-04T14:15:00Z",
    ]


def test_kolkata_and_utc_have_no_daylight_saving() -> None:
    assert fires("0 9 * * *", "Asia/Kolkata", "2027-03-27T00:00:00Z", 2) == [
        "2027-03-27T03:30:00Z",
        "2027-03-28T03:30:00Z",
    ]
    assert fires("30 2 * * *", "UTC", "2027-03-27T00:00:00Z", 2) == [
        "2027-03-27T02:30:00Z",
        "2027-03-28T02:30:00Z",
    ]


def test_a_midnight_transition() -> None:
    # America/Havana springs forward at midnight: 2027-03-14 00:00 CST -> 01:00 CDT.
    assert fires("30 0 * * *", "America/Havana", "2027-03-13T00:00:00Z", 3) == [
        "2027-03-13T05:30:00Z",
        "2027-03-14T05:00:00Z",  # 01:00 CDT
        "2027-03-15T04:30:00Z",
    ]


def test_results_do_not_depend_on_how_after_is_expressed() -> None:
    in_utc = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    in_berlin = datetime.fromisoformat("2026-10-25T02:10:00+01:00")
    assert next_fire_after("*/30 * * * *", "Europe/Berlin", in_utc) == next_fire_after(
        "*/30 * * * *", "Europe/Berlin", in_berlin
    )


def test_a_skipped_wall_time_is_taken_to_the_first_instant_after_its_gap_as_a_fire_is() -> None:
    berlin = time_zone("Europe/Berlin")
    skipped = datetime(2027, 3, 28, 2, 30)
    assert skipped_until(skipped, berlin) == datetime(2027, 3, 28, 1, 0, tzinfo=UTC)
    assert fires("30 2 * * *", "Europe/Berlin", "2027-03-27T12:00:00+00:00", 1) == ["2027-03-28T01:00:00Z"]
    assert skipped_until(datetime(2027, 10, 31, 2, 30), berlin) is None  # repeated, not skipped
    assert skipped_until(datetime(2027, 6, 1, 2, 30), berlin) is None
    assert skipped_until(datetime(9999, 12, 31, 23, 0), time_zone("America/New_York")) is None
