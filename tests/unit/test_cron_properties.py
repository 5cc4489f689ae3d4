"""Property-based checks of fire times over many zones and dates (1990-2040).

The oracle is deliberately naive and independent of the code under test: it visits every minute
of a window around a real DST transition, reads the local wall clock there, and applies the
daylight-saving rules of docs/architecture.md directly.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import islice, pairwise, takewhile
from zoneinfo import ZoneInfo, available_timezones

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduler.domain.cron import CronExpression, fire_times

CURATED_ZONES = [
    "UTC",
    "Europe/Berlin",
    "Europe/London",
    "Europe/Dublin",  # negative DST in the tz database
    "Europe/Moscow",
    "America/New_York",
    "America/Santiago",
    "America/Havana",  # midnight transitions
    "America/Sao_Paulo",
    "America/St_Johns",  # -03:30
    "America/Nuuk",
    "Australia/Lord_Howe",  # 30-minute shift
    "Australia/Sydney",
    "Pacific/Chatham",  # +12:45 / +13:45
    "Pacific/Apia",  # skipped a whole day in 2011
    "Asia/Kolkata",
    "Asia/Tehran",
    "Asia/Gaza",
    "Asia/Kathmandu",
    "Africa/Casablanca",
    "Antarctica/Troll",  # two-hour shift
]
ALL_ZONES = sorted(available_timezones())
zones = st.one_of(st.sampled_from(CURATED_ZONES), st.sampled_from(ALL_ZONES))
years = st.integers(min_value=1990, max_value=2040)
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)


def offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    value = instant.astimezone(zone).utcoffset()
    assert value is not None
    return value


def transitions(zone: ZoneInfo, year: int) -> list[datetime]:
    """Instants in ``year`` at which ``zone``'s UTC offset changes (the first instant of the new one)."""
    found = []
    step = timedelta(hours=6)
    current = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    while current < end:
        following = current + step
        if offset(zone, following) != offset(zone, current):
            low, high = current, following
            while high - low > SECOND:
                middle = low + (high - low) / 2
                middle = middle.replace(microsecond=0)
                if offset(zone, middle) == offset(zone, following):
                    high = middle
                else:
                    low = middle
            found.append(high)
        current = following
    return found


@dataclass(frozen=True)
class Spec:
    """A five-field expression and the sets it denotes, for the oracle."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_restricted: bool
    weekdays_restricted: bool
    fixed: bool

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours or wall.month not in self.months:
            return False
        day = wall.day in self.days
        weekday = (wall.weekday() + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return day or weekday
        return day and weekday


@st.composite
def field(
    draw: st.DrawFn, low: int, high: int, star_weight: int = 1, step_end: int | None = None
) -> tuple[str, frozenset[int]]:
    """A field's text and its values; ``step_end``: where a step from a start ends when not at
    ``high`` (the day of week's ``n/k`` runs to 7, Sunday again), its values folded into the field."""
    kind = draw(st.sampled_from(["star"] * star_weight + ["star_step", "one", "list", "range", "start_step"]))
    full = range(low, high + 1)
    if kind == "star":
        return "*", frozenset(full)
    if kind == "star_step":
        step = draw(st.integers(2, max(2, (high - low) // 2)))
        return f"*/{step}", frozenset(range(low, high + 1, step))
    if kind == "one":
        value = draw(st.integers(low, high))
        return str(value), frozenset({value})
    if kind == "list":
        values = sorted(draw(st.sets(st.integers(low, high), min_size=2, max_size=4)))
        return ",".join(map(str, values)), frozenset(values)
    if kind == "range":
        first = draw(st.integers(low, high - 1))
        last = draw(st.integers(first + 1, min(high, first + 5)))
        return f"{first}-{last}", frozenset(range(first, last + 1))
    start = draw(st.integers(low, high))
    step = draw(st.integers(2, max(2, (high - low) // 2)))
    end = high if step_end is None else step_end
    return f"{start}/{step}", frozenset(value % (high + 1) for value in range(start, end + 1, step))


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    minute_text, minutes = draw(field(0, 59))
    hour_text, hours = draw(field(0, 23))
    day_text, days = draw(field(1, 31, star_weight=12))
    month_text, months = draw(field(1, 12, star_weight=12))
    weekday_text, weekdays = draw(field(0, 6, star_weight=12, step_end=7))
    text = " ".join([minute_text, hour_text, day_text, month_text, weekday_text])
    return Spec(
        text=text,
        minutes=minutes,
        hours=hours,
        days=days,
        months=months,
        weekdays=weekdays,
        days_restricted=not day_text.startswith("*"),
        weekdays_restricted=not weekday_text.startswith("*"),
        fixed=not minute_text.startswith("*") and not hour_text.startswith("*"),
    )


def oracle(spec: Spec, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """Fire times in (start, end], by looking at the wall clock every minute."""
    expected = set()
    instant = start + MINUTE
    while instant <= end:
        local = instant.astimezone(zone)
        # Fixed-time schedules fire at a repeated wall time's first occurrence only.
        if spec.matches(local.replace(tzinfo=None)) and (not spec.fixed or local.fold == 0):
            expected.add(instant)
        instant += MINUTE
    if spec.fixed:
        for year in range(start.year, end.year + 1):
            for transition in transitions(zone, year):
                before, after = (transition - SECOND).astimezone(zone), transition.astimezone(zone)
                if not start < transition <= end or offset(zone, transition) <= offset(
                    zone, transition - SECOND
                ):
                    continue
                # A gap: any matching wall time inside it fires once, at the transition.
                wall = before.replace(tzinfo=None, second=0) + MINUTE
                while wall < after.replace(tzinfo=None):
                    if spec.matches(wall):
                        expected.add(transition)
                        break
                    wall += MINUTE
    return sorted(expected)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), zone_name=zones, year=years, data=st.data())
def test_fire_times_match_a_minute_by_minute_oracle_around_transitions(
    spec: Spec, zone_name: str, year: int, data: st.DataObject
) -> None:
    zone = ZoneInfo(zone_name)
    changes = transitions(zone, year)
    if changes:
        centre = data.draw(st.sampled_from(changes))
    else:
        centre = datetime(year, 1, 1, tzinfo=UTC) + timedelta(minutes=data.draw(st.integers(0, 525_000)))
    start = (centre - timedelta(hours=20)).replace(second=0, microsecond=0)
    end = centre + timedelta(hours=20)
    # Sub-minute offsets (local mean time) predate 1990 almost everywhere; the oracle needs none.
    assume(offset(zone, start).seconds % 60 == 0 and offset(zone, end).seconds % 60 == 0)

    actual = list(takewhile(lambda fire: fire <= end, fire_times(spec.text, zone, start)))

    assert actual == oracle(spec, zone, start, end)


RICH_EXPRESSIONS = [
    "30 2 * * *",
    "0 0 * * *",
    "*/7 * * * *",
    "15 */3 * * *",
    "0 9-17 * * mon-fri",
    "0 0 L * *",
    "0 12 LW * ?",
    "0 6 15W * *",
    "0 3 * * 5L",
    "0 4 * * sun#2",
    "0 0 29 2 *",
    "30 30 2 * * *",
    "*/20 * 2 * * *",
    "H H(0-5) * * *",
    "H/10 H * * * *",
    "@hourly",
    "@weekly",
    "0 0 1 jan *",
]


@settings(max_examples=150, deadline=None)
@given(
    expression=st.sampled_from(RICH_EXPRESSIONS),
    zone_name=zones,
    start=st.datetimes(datetime(1990, 1, 1), datetime(2040, 12, 31), timezones=st.just(UTC)),
    schedule_id=st.uuids(),
)
def test_fire_times_strictly_increase_and_exist_locally(
    expression: str, zone_name: str, start: datetime, schedule_id: uuid.UUID
) -> None:
    zone = ZoneInfo(zone_name)
    fires = list(islice(fire_times(expression, zone, start, schedule_id), 25))
    assert len(fires) == 25
    assert fires[0] > start
    assert all(a < b for a, b in pairwise(fires))
    for fire in fires:
        assert fire.tzinfo is UTC
        local = fire.astimezone(zone)
        # The local wall time exists: reading it back in the zone gives the same instant.
        wall = local.replace(tzinfo=None)
        assert wall.replace(tzinfo=zone, fold=local.fold).astimezone(UTC) == fire


@settings(max_examples=100, deadline=None)
@given(
    zone_name=zones,
    year=years,
    second=st.integers(0, 59),
    minute=st.integers(0, 59),
    hour=st.integers(0, 23),
    five_fields=st.booleans(),
    data=st.data(),
)
def test_a_daily_fixed_time_fires_once_on_a_fall_back_day(
    zone_name: str, year: int, second: int, minute: int, hour: int, five_fields: bool, data: st.DataObject
) -> None:
    zone = ZoneInfo(zone_name)
    fall_backs = [t for t in transitions(zone, year) if offset(zone, t) < offset(zone, t - SECOND)]
    assume(fall_backs)
    fall_back = data.draw(st.sampled_from(fall_backs))
    expression = f"{minute} {hour} * * *" if five_fields else f"{second} {minute} {hour} * * *"
    start = fall_back - timedelta(days=2)
    fires = list(takewhile(lambda f: f < fall_back + timedelta(days=2), fire_times(expression, zone, start)))

    per_day = Counter(fire.astimezone(zone).date() for fire in fires)
    fall_back_days = {(fall_back - SECOND).astimezone(zone).date(), fall_back.astimezone(zone).date()}
    for day in fall_back_days:
        assert per_day[day] <= 1, (expression, day, fires)
    walls = [fire.astimezone(zone).replace(tzinfo=None) for fire in fires]
    assert len(walls) == len(set(walls)), "a fixed-time schedule fired twice at one wall time"


def schedule_ids(count: int) -> list[str]:
    rng = random.Random(20270328)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


def chi_square(counts: Counter[int], buckets: range) -> float:
    expected = sum(counts.values()) / len(buckets)
    return sum((counts[b] - expected) ** 2 / expected for b in buckets)


def test_h_spreads_schedules_evenly() -> None:
    ids = schedule_ids(6000)
    parsed = [CronExpression.parse("H H H H * H", schedule_id).fields for schedule_id in ids]
    minutes = Counter(int(fields[1]) for fields in parsed)
    hours = Counter(int(fields[2]) for fields in parsed)
    days = Counter(int(fields[3]) for fields in parsed)
    weekdays = Counter(int(fields[5]) for fields in parsed)
    # Critical values at p = 0.001: 99.6 (59 degrees of freedom), 49.7 (23), 55.5 (27), 22.5 (6).
    assert chi_square(minutes, range(60)) < 99.6
    assert chi_square(hours, range(24)) < 49.7
    assert chi_square(days, range(1, 29)) < 55.5
    assert chi_square(weekdays, range(7)) < 22.5
    assert min(minutes.values()) > 60 and max(minutes.values()) < 140
    # Fields hash independently: the minute says nothing about the hour.
    same_bucket = sum(1 for fields in parsed if int(fields[1]) % 24 == int(fields[2]))
    assert same_bucket < 6000 / 24 * 1.5


def test_h_step_offsets_spread_over_the_whole_step() -> None:
    offsets = Counter(
        int(CronExpression.parse("H/15 * * * *", schedule_id).fields[1].split(",")[0])
        for schedule_id in schedule_ids(6000)
    )
    assert set(offsets) == set(range(15))
    assert chi_square(offsets, range(15)) < 37.7  # p = 0.001, 14 degrees of freedom


@given(
    schedule_id=st.text(min_size=1, max_size=40),
    expression=st.sampled_from(["H H * * *", "H(0-29)/5 * * * *"]),
)
def test_h_is_stable_per_schedule_id(schedule_id: str, expression: str) -> None:
    first = CronExpression.parse(expression, schedule_id)
    again = CronExpression.parse(expression, schedule_id)
    assert first.fields == again.fields
    assert 0 <= min(int(v) for v in first.fields[1].split(",")) <= 59


def test_the_oracle_itself_sees_the_berlin_example() -> None:
    spec = Spec(
        text="30 2 * * *",
        minutes=frozenset({30}),
        hours=frozenset({2}),
        days=frozenset(range(1, 32)),
        months=frozenset(range(1, 13)),
        weekdays=frozenset(range(7)),
        days_restricted=False,
        weekdays_restricted=False,
        fixed=True,
    )
    zone = ZoneInfo("Europe/Berlin")
    start = datetime(2027, 3, 27, tzinfo=UTC)
    assert oracle(spec, zone, start, start + timedelta(days=2, hours=6)) == [
        datetime(2027, 3, 27, 1, 30, tzinfo=UTC),
        datetime(2027, 3, 28, 1, 0, tzinfo=UTC),
        datetime(2027, 3, 29, 0, 30, tzinfo=UTC),
    ]
    assert date(2027, 3, 28) == datetime(2027, 3, 28, 1, 0, tzinfo=UTC).astimezone(zone).date()
