"""The cron dialect: fields, names, L/W/#, aliases, H, and clear errors."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo

import pytest

from scheduler.domain.cron import (
    CronExpression,
    CronSchedule,
    InvalidCronExpression,
    UnknownTimeZone,
    fire_times,
    next_fire_after,
    time_zone,
)

START = datetime(2027, 1, 1, tzinfo=UTC)  # a Friday


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def upcoming(expression: str, count: int = 3, tz: str = "UTC", schedule_id: str | None = None) -> list[str]:
    fires = islice(fire_times(expression, tz, START, schedule_id), count)
    return [fire.strftime("%Y-%m-%dT%H:%M:%S") for fire in fires]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("*/15 * * * *", ["2027-01-01T00:15:00", "2027-01-01T00:30:00", "2027-01-01T00:45:00"]),
        ("0 9-17/4 * * mon-fri", ["2027-01-01T09:00:00", "2027-01-01T13:00:00", "2027-01-01T17:00:00"]),
        ("0 12 * JAN,mar SUN", ["2027-01-03T12:00:00", "2027-01-10T12:00:00", "2027-01-17T12:00:00"]),
        ("0 0 * * 7", ["2027-01-03T00:00:00", "2027-01-10T00:00:00", "2027-01-17T00:00:00"]),
        ("0 0 L * *", ["2027-01-31T00:00:00", "2027-02-28T00:00:00", "2027-03-31T00:00:00"]),
        ("0 0 15W * *", ["2027-01-15T00:00:00", "2027-02-15T00:00:00", "2027-03-15T00:00:00"]),
        # 2027-05-15 is a Saturday: the nearest weekday is Friday the 14th.
        ("0 0 15W 5 *", ["2027-05-14T00:00:00", "2028-05-15T00:00:00", "2029-05-15T00:00:00"]),
        ("0 0 * * FRI#2", ["2027-01-08T00:00:00", "2027-02-12T00:00:00", "2027-03-12T00:00:00"]),
        ("0 0 * * 5#2", ["2027-01-08T00:00:00", "2027-02-12T00:00:00", "2027-03-12T00:00:00"]),
        ("0 0 ? * MON", ["2027-01-04T00:00:00", "2027-01-11T00:00:00", "2027-01-18T00:00:00"]),
    ],
)
def test_five_field_dialect(expression: str, expected: list[str]) -> None:
    assert upcoming(expression) == expected


def test_six_fields_put_seconds_first_as_in_quartz_and_spring() -> None:
    assert upcoming("30 15 10 * * *") == [
        "2027-01-01T10:15:30",
        "2027-01-02T10:15:30",
        "2027-01-03T10:15:30",
    ]
    assert upcoming("*/20 * * * * *") == ["2027-01-01T00:00:20", "2027-01-01T00:00:40", "2027-01-01T00:01:00"]
    assert CronExpression.parse("30 15 10 * * *").fields == ("30", "15", "10", "*", "*", "*")
    assert CronExpression.parse("15 10 * * *").fields == ("0", "15", "10", "*", "*", "*")


@pytest.mark.parametrize(
    ("alias", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_aliases_are_their_plain_expressions_even_with_a_schedule_id(alias: str, equivalent: str) -> None:
    # croniter turns @daily into a hashed time when given an id; an alias means what it says.
    assert upcoming(alias, 4, schedule_id="a3b4") == upcoming(equivalent, 4)


def test_equal_ranges_mean_one_value_not_the_whole_field() -> None:
    assert upcoming("5-5 * * * *") == ["2027-01-01T00:05:00", "2027-01-01T01:05:00", "2027-01-01T02:05:00"]
    assert upcoming("5-5/10 * * * *") == ["2027-01-01T00:05:00", "2027-01-01T01:05:00", "2027-01-01T02:05:00"]
    assert upcoming("0 0 * jan-jan *", 2) == ["2027-01-02T00:00:00", "2027-01-03T00:00:00"]


def test_quartz_last_weekday_of_month_forms() -> None:
    last_fridays = ["2027-01-29T00:00:00", "2027-02-26T00:00:00", "2027-03-26T00:00:00"]
    assert upcoming("0 0 * * 5L") == last_fridays
    assert upcoming("0 0 * * FRIL") == last_fridays
    assert upcoming("0 0 * * L5") == last_fridays


def test_last_weekday_and_days_before_the_last_day_of_the_month() -> None:
    # 2027-01-31 is a Sunday, so January's last weekday is Friday the 29th.
    assert upcoming("0 0 LW * ?") == ["2027-01-29T00:00:00", "2027-02-26T00:00:00", "2027-03-31T00:00:00"]
    assert upcoming("0 0 L-3 * *") == ["2027-01-28T00:00:00", "2027-02-25T00:00:00", "2027-03-28T00:00:00"]
    assert upcoming("0 0 L-0 * *", 2) == upcoming("0 0 L * *", 2)


def test_both_day_fields_restricted_means_either_as_in_vixie_cron() -> None:
    # The 13th or any Friday.
    assert upcoming("0 0 13 * 5", 4) == [
        "2027-01-08T00:00:00",
        "2027-01-13T00:00:00",
        "2027-01-15T00:00:00",
        "2027-01-22T00:00:00",
    ]


def test_a_day_field_beginning_with_star_means_both_as_in_vixie_and_kubernetes() -> None:
    # Mondays that fall on an odd day of the month; croniter alone would OR the two fields.
    assert upcoming("0 0 */2 * 1") == ["2027-01-11T00:00:00", "2027-01-25T00:00:00", "2027-02-01T00:00:00"]


def test_fixed_time_and_wildcard_classification() -> None:
    fixed = ["30 2 * * *", "0 0 * * *", "@daily", "0-59 2 * * *", "5 H/15 3 * * *", "H H * * *"]
    wildcard = ["*/15 * * * *", "0 * * * *", "@hourly", "* 2 * * *", "*/5 30 2 * * *", "0 0 */2 * * *"]
    for text in fixed:
        assert CronExpression.parse(text, "id").fixed_time, text
    for text in wildcard:
        assert not CronExpression.parse(text, "id").fixed_time, text


class TestHashedFields:
    ID = "2f1d0c3e-8a4b-4c5d-9e6f-7a8b9c0d1e2f"

    def test_h_is_replaced_by_values_from_a_stable_hash_of_the_schedule_id(self) -> None:
        # Pinned: changing the hash would move every deployed H schedule.
        assert CronExpression.parse("H H * * *", self.ID).fields == ("0", "5", "15", "*", "*", "*")
        assert CronExpression.parse("H H H * *", self.ID).fields[3] == "26"

    def test_the_same_uuid_hashes_the_same_however_it_is_spelled(self) -> None:
        spellings: list[str | uuid.UUID] = [self.ID, self.ID.upper(), f"{{{self.ID}}}", uuid.UUID(self.ID)]
        assert len({CronExpression.parse("H H * * * H", s).fields for s in spellings}) == 1

    def test_step_and_range_forms(self) -> None:
        fields = CronExpression.parse("H/15 H(0-5) H(1-7) * *", self.ID).fields
        minutes = [int(m) for m in fields[1].split(",")]
        assert len(minutes) == 4
        assert minutes[0] < 15
        assert [b - a for a, b in pairwise(minutes)] == [15, 15, 15]
        assert 0 <= int(fields[2]) <= 5
        assert 1 <= int(fields[3]) <= 7
        stepped_range = [
            int(m) for m in CronExpression.parse("H(30-59)/10 * * * *", self.ID).fields[1].split(",")
        ]
        assert 30 <= stepped_range[0] < 40
        assert stepped_range == list(range(stepped_range[0], 60, 10))

    def test_h_counts_as_fixed_time(self) -> None:
        assert CronExpression.parse("H/15 H * * *", self.ID).fixed_time

    def test_h_needs_a_schedule_id(self) -> None:
        with pytest.raises(InvalidCronExpression, match="'H' needs a schedule id"):
            CronExpression.parse("H * * * *")

    def test_an_expression_cannot_be_reused_for_another_schedule(self) -> None:
        expression = CronExpression.parse("H * * * *", self.ID)
        assert CronSchedule.of(expression, "UTC", self.ID.upper()).expression is expression
        assert CronSchedule.of(expression, "UTC").expression is expression
        with pytest.raises(ValueError, match="different schedule id"):
            CronSchedule.of(expression, "UTC", "another")
        # Without H, the id plays no part.
        assert CronExpression.parse("0 * * * *", self.ID).schedule_id is None
        assert CronSchedule.of(CronExpression.parse("0 * * * *"), "UTC", "another")


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "the expression is empty"),
        ("* * * *", "expected 5 fields (minute first) or 6 fields (second first), got 4"),
        ("0 0 0 * * * 2027", "got 7"),
        ("@often", "unknown alias"),
        ("61 * * * *", "minute field '61' is not valid (expected 0-59"),
        ("60 * * * * *", "second field '60' is not valid"),
        ("0 24 * * *", "hour field '24' is not valid"),
        ("0 0 32 * *", "day-of-month field '32' is not valid"),
        ("0 0 * 13 *", "month field '13' is not valid"),
        ("0 0 * foo *", "month field 'foo' is not valid"),
        ("0 0 * * 8", "day-of-week field '8' is not valid"),
        ("0 0 * * 1#6", "day-of-week field '1#6' is not valid"),
        ("*/0 * * * *", "minute field '*/0' is not valid"),
        ("0 0 31 2 *", "it matches no date"),
        ("0 0 LW * MON", "needs '*' or '?' in the day-of-week field"),
        # croniter would fire on the 1W days only, never on the Mondays Vixie's either-field rule adds.
        ("0 0 1W * 1", "needs '*' or '?' in the day-of-week field"),
        ("0 0 15w 2 SUN", "needs '*' or '?' in the day-of-week field"),
        ("R * * * *", "'R' (random) is not supported"),
        ("H(0-99) * * * *", "H(a-b) needs 0 <= a <= b <= 59"),
    ],
)
def test_invalid_expressions_raise_one_clear_message(expression: str, message: str) -> None:
    with pytest.raises(InvalidCronExpression) as caught:
        CronExpression.parse(expression, "some-schedule")
    text = str(caught.value)
    assert text.startswith(f"invalid cron expression {expression!r}: ")
    assert message in text
    assert "\n" not in text
    assert isinstance(caught.value, ValueError)


def test_time_zones_are_validated() -> None:
    assert time_zone("Europe/Berlin") == ZoneInfo("Europe/Berlin")
    assert time_zone("US/Eastern") == ZoneInfo("US/Eastern")  # an IANA link
    # Files ZoneInfo opens that are no IANA name: leap-second zones (summer time wrong from 2027),
    # POSIX copies, and this machine's own zone, which means another on the next machine.
    not_iana = ("right/America/New_York", "posix/Europe/London", "posixrules", "localtime")
    for name in ("Mars/Olympus_Mons", "", " UTC", "../../etc/passwd", "/etc/localtime", *not_iana):
        with pytest.raises(UnknownTimeZone, match="unknown time zone"):
            time_zone(name)
    with pytest.raises(UnknownTimeZone):
        next_fire_after("* * * * *", "Not/AZone", START)


def test_next_fire_after_is_strictly_after_and_utc_aware() -> None:
    fire = next_fire_after("0 * * * *", "Asia/Kolkata", utc("2027-01-01T00:30:00"))
    assert fire == utc("2027-01-01T00:30:00") + timedelta(hours=1)
    assert fire.tzinfo is UTC
    # Strictly after, also when `after` is itself a fire time or carries microseconds.
    assert next_fire_after("*/10 * * * * *", "UTC", utc("2027-01-01T00:00:10")) == utc("2027-01-01T00:00:20")
    assert next_fire_after("*/10 * * * * *", "UTC", utc("2027-01-01T00:00:10.5")) == utc(
        "2027-01-01T00:00:20"
    )
    with_offset = datetime.fromisoformat("2027-01-01T01:30:00+01:00")
    assert next_fire_after("0 * * * *", "UTC", with_offset) == utc("2027-01-01T01:00:00")


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire_after("* * * * *", "UTC", datetime(2027, 1, 1))


def test_no_fire_time_past_the_year_9999_ends_the_fire_times() -> None:
    late = datetime(9999, 12, 30, tzinfo=UTC)
    assert list(fire_times("0 0 31 12 *", "UTC", late)) == [datetime(9999, 12, 31, tzinfo=UTC)]
    assert list(fire_times("0 0 29 2 *", "Pacific/Kiritimati", late)) == []
