"""Cron expressions and time zones: when a cron schedule fires, as UTC instants.

The scanner asks this module for a schedule's next fire time after the one it just fired, and the
CLI and the ingestor ask it to validate what a user sent. The dialect: five fields (minute
first) or six (seconds first, as in Quartz and Spring), names, ranges, steps, ``L``, ``W``, ``#``,
``?``, the ``@`` aliases, and Jenkins' ``H`` spread by a stable hash of the schedule id. croniter
matches wall-clock times; this module owns everything croniter gets wrong for us: the
seconds-first order, ``H`` and the aliases (croniter hashes ``@daily`` when given an id, and does
so with a CRC correlated across fields), equal ranges such as ``5-5`` (croniter reads them as the
whole field), a day-of-week step from a start such as ``5/1`` (croniter stops it at 6, short of
Sunday as 7), Quartz's ``5L``, ``LW`` and ``L-n``, Vixie's day-of-month/day-of-week rule, and above
all daylight saving time. Wall times are walked naively with croniter and mapped to instants here,
with Vixie cron's two rules for fixed-time schedules and real-time semantics for wildcard ones.
"""

from __future__ import annotations

import calendar
import copy
import functools
import hashlib
import re
import uuid
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from scheduler.domain.storable import quoted

__all__ = [
    "CronExpression",
    "CronSchedule",
    "InvalidCronExpression",
    "NoFireTime",
    "UnknownTimeZone",
    "fire_times",
    "next_fire_after",
    "skipped_until",
    "time_zone",
]


class InvalidCronExpression(ValueError):
    """A cron expression that is not in the dialect, or that matches no date at all."""

    def __init__(self, expression: str, reason: str) -> None:
        super().__init__(f"invalid cron expression {quoted(expression)}: {reason}")
        self.expression = expression
        self.reason = reason


class UnknownTimeZone(ValueError):
    """A time zone name that is not in the IANA database."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"unknown time zone {quoted(name)}: expected an IANA name such as Europe/Berlin or UTC"
        )
        self.name = name


class NoFireTime(LookupError):
    """The expression matches no time within croniter's search horizon (50 years) after a moment."""


_FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
_SECOND, _MINUTE, _HOUR, _DAY_OF_MONTH, _MONTH, _DAY_OF_WEEK = range(6)

_FIELD_SYNTAX = (
    "0-59",
    "0-59",
    "0-23",
    "1-31, L, L-n, nW, LW or ?",
    "1-12 or JAN-DEC",
    "0-7 or SUN-SAT (0 and 7 are Sunday), nL, n#k or ?",
)
_FIELD_RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
# Jenkins spreads H in day-of-month over 1-28 so that every month has the chosen day.
_HASH_RANGES = ((0, 59), (0, 59), (0, 23), (1, 28), (1, 12), (0, 6))

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_WEEKDAY_NUMBERS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}

_HASH_ITEM = re.compile(r"^h(?:\((\d+)-(\d+)\))?(?:/(\d+))?$", re.IGNORECASE | re.ASCII)
_RANDOM_ITEM = re.compile(r"^r(?:\(|/|$)", re.IGNORECASE | re.ASCII)
_EQUAL_RANGE_ITEM = re.compile(r"^([^-/]+)-([^-/]+)(?:/\d+)?$", re.ASCII)
# A day's number may have leading zeros ("05"), as everywhere in a field.
_WEEKDAY = r"(0*[0-7]|sun|mon|tue|wed|thu|fri|sat)"
_LAST_WEEKDAY_OF_MONTH_ITEM = re.compile(rf"^{_WEEKDAY}l$", re.IGNORECASE | re.ASCII)
_WEEKDAY_STEP_ITEM = re.compile(rf"^{_WEEKDAY}/(\d+)$", re.IGNORECASE | re.ASCII)
_LAST_DAY_OFFSET_FIELD = re.compile(r"^l-(\d+)$", re.IGNORECASE | re.ASCII)
_LAST_WORKDAY_FIELD = re.compile(r"^(?:lw|wl)$", re.IGNORECASE | re.ASCII)

# A fixed reference for validation, so that "does this ever fire" never depends on today's date.
_VALIDATION_START = datetime(2000, 1, 1)
_ONE_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class _LastDayRule:
    """Quartz's ``L-n`` (n days before the month's last) and ``LW`` (its last weekday), which
    croniter lacks: croniter proposes a superset of days and this rule keeps the right one."""

    days_before_last: int
    weekday: bool

    @property
    def candidate_days(self) -> str:
        if self.weekday:
            return "26-31"
        return f"{max(1, 28 - self.days_before_last)}-{31 - self.days_before_last}"

    def matches(self, day: date) -> bool:
        last = calendar.monthrange(day.year, day.month)[1]
        if self.weekday:
            target = date(day.year, day.month, last)
            while target.weekday() >= 5:
                target -= timedelta(days=1)
            return day == target
        return day.day == last - self.days_before_last


@dataclass(frozen=True)
class CronExpression:
    """A validated cron expression, bound to the schedule id its ``H`` fields were hashed with.

    ``fields`` holds the six fields, seconds first, with aliases expanded and ``H`` replaced by its
    values; ``fixed_time`` says which of Vixie cron's daylight-saving rules apply;
    ``schedule_id`` is the id ``H`` was hashed with, None when the expression has no ``H``.
    """

    text: str
    fields: tuple[str, str, str, str, str, str]
    fixed_time: bool
    schedule_id: str | None
    _croniter_text: str = field(repr=False)
    _last_day: _LastDayRule | None = field(repr=False)
    # Both day fields restricted, the day of week with n#k or nL: croniter then ignores the day of
    # month (or finds nothing), so the days are searched as two expressions, one per day field.
    _day_union: tuple[str, str] | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, text: str, schedule_id: str | uuid.UUID | None = None) -> CronExpression:
        """Validate ``text`` (raising :class:`InvalidCronExpression`) and resolve its ``H`` fields."""
        # Parsing and validating cost far more than the fire-time maths, and thousands of schedules
        # share an expression: parse each (text, seed) once. The seed matters only where an H may be.
        if schedule_id is None or "H" not in text.upper():
            return _parse_cached(text, None)
        return _parse_cached(text, _hash_seed(schedule_id))

    @classmethod
    def _parse(cls, text: str, hash_seed: str | None) -> CronExpression:
        source = " ".join(text.split())
        if not source:
            raise InvalidCronExpression(text, "the expression is empty")
        if source.startswith("@"):
            alias = _ALIASES.get(source.lower())
            if alias is None:
                raise InvalidCronExpression(text, f"unknown alias; use one of {', '.join(_ALIASES)}")
            written = ["0", *alias.split()]
        else:
            written = source.split(" ")
            if len(written) == 5:
                written = ["0", *written]
            elif len(written) != 6:
                raise InvalidCronExpression(
                    text,
                    f"expected 5 fields (minute first) or 6 fields (second first), got {len(written)}",
                )

        fields = [
            _resolve_field(text, index, written_field, hash_seed)
            for index, written_field in enumerate(written)
        ]
        hashed = any(_HASH_ITEM.match(item) for written_field in written for item in written_field.split(","))
        shown = (fields[0], fields[1], fields[2], fields[3], fields[4], fields[5])
        last_day = _last_day_rule(text, fields)
        if last_day is not None:
            fields[_DAY_OF_MONTH] = last_day.candidate_days
        resolved = (fields[0], fields[1], fields[2], fields[3], fields[4], fields[5])
        croniter_text = _croniter_order(resolved)
        try:
            croniter.expand(croniter_text)
        except CroniterError as error:
            raise InvalidCronExpression(text, _diagnose(written, resolved, error)) from None
        day_union = _day_union(resolved)

        # Vixie's rule: a schedule is fixed-time unless its second, minute or hour field, as
        # written, begins with "*" (so "*/15" is wildcard, "H/15" and "0-59" are fixed).
        fixed_time = not any(written[index].startswith("*") for index in (_SECOND, _MINUTE, _HOUR))
        expression = cls(
            text=source,
            fields=shown,
            fixed_time=fixed_time,
            schedule_id=hash_seed if hashed else None,
            _croniter_text=croniter_text,
            _last_day=last_day,
            _day_union=day_union,
        )
        try:
            _WallClock(expression).next_after(_VALIDATION_START)
        except CroniterBadDateError:
            raise InvalidCronExpression(text, "it matches no date (such as 30 February)") from None
        return expression

    def __str__(self) -> str:
        return self.text


@functools.lru_cache(maxsize=8192)
def _parse_cached(text: str, hash_seed: str | None) -> CronExpression:
    return CronExpression._parse(text, hash_seed)


@functools.cache
def _iana_names() -> frozenset[str]:
    # ZoneInfo also opens any file under the zone directories: `right/*` (leap seconds counted, so
    # its summer time is wrong from 2027 on), `posix/*`, `posixrules`, and `localtime` (this
    # machine's zone, another on the next machine). Only the IANA database's names mean the same
    # on every host a schedule is read on.
    return frozenset(zoneinfo.available_timezones()) - {"localtime"}


def time_zone(name: str) -> ZoneInfo:
    """The IANA zone called ``name``, or :class:`UnknownTimeZone`."""
    if not name or name != name.strip() or name not in _iana_names():
        raise UnknownTimeZone(name)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise UnknownTimeZone(name) from None


@dataclass(frozen=True)
class CronSchedule:
    """A cron expression in a time zone: the fire times of one cron schedule, as UTC instants."""

    expression: CronExpression
    zone: ZoneInfo

    @classmethod
    def of(
        cls,
        expression: CronExpression | str,
        tz: ZoneInfo | str,
        schedule_id: str | uuid.UUID | None = None,
    ) -> CronSchedule:
        """Validate and bind; raises :class:`InvalidCronExpression` or :class:`UnknownTimeZone`."""
        if isinstance(expression, str):
            expression = CronExpression.parse(expression, schedule_id)
        elif schedule_id is not None and expression.schedule_id not in (None, _hash_seed(schedule_id)):
            raise ValueError("the expression's H fields were hashed for a different schedule id")
        zone = tz if isinstance(tz, ZoneInfo) else time_zone(tz)
        return cls(expression, zone)

    def next_fire_after(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after`` (timezone-aware), as a UTC datetime.

        Raises :class:`NoFireTime` when the expression matches nothing in the next 50 years.
        """
        return _next_fire_cached(self, _utc(after))

    def fire_times(self, after: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``after``, strictly increasing, for as long as there are any."""
        clock = _WallClock(self.expression)
        current = _utc(after)
        while True:
            try:
                current = self._next(clock, current)
            except NoFireTime:
                return
            yield current

    def _next(self, clock: _WallClock, after: datetime) -> datetime:
        try:
            if self.expression.fixed_time:
                return self._next_fixed_time(clock, after)
            return self._next_real_time(clock, after)
        except CroniterBadDateError:
            raise NoFireTime(
                f"{quoted(self.expression.text)} does not fire within 50 years after {after}"
            ) from None
        except (OverflowError, ValueError) as exc:
            # The next fire would be past the year 9999 (or the start before the year 1), where
            # Python's dates end (dateutil says so with a ValueError): there is none.
            if isinstance(exc, ValueError) and "out of range" not in str(exc):
                raise
            raise NoFireTime(
                f"{quoted(self.expression.text)} has no fire time after {after} before the year 10000"
            ) from None

    def _next_fixed_time(self, clock: _WallClock, after: datetime) -> datetime:
        # Vixie's rules: every matching wall time fires once, at its first occurrence; one that a
        # spring-forward gap skips fires at the first instant after the gap. Mapping wall times to
        # instants this way never goes backwards, so walking wall times in order is enough.
        local = after.astimezone(self.zone)
        wall = _naive(local)
        first, second = _occurrences(wall, self.zone)
        if local.fold == 1 and first < second:
            # `after` is in the second pass of a repeated hour, whose wall times fired in the first.
            wall = _naive((_transition(self.zone, first, second) - _ONE_SECOND).astimezone(self.zone))
        while True:
            candidate = clock.next_after(wall)
            first, second = _occurrences(candidate, self.zone)
            fire = first if first <= second else _transition(self.zone, second, first)
            if fire > after:
                return fire
            wall = candidate

    def _next_real_time(self, clock: _WallClock, after: datetime) -> datetime:
        # Wildcard schedules fire at every instant whose local time matches: nothing for wall times
        # a gap skips, twice for wall times a fall-back repeats. The only ordering subtlety is a
        # repeated hour: all of its first pass comes before any of its second pass.
        local = after.astimezone(self.zone)
        wall = _naive(local)
        first, second = _occurrences(wall, self.zone)
        if first < second:
            transition = _transition(self.zone, first, second)
            last_repeated = _naive((transition - _ONE_SECOND).astimezone(self.zone))
            if local.fold == 0:
                candidate = clock.next_after(wall)
                if candidate <= last_repeated:
                    return _occurrences(candidate, self.zone)[0]
                second_pass_start = _naive(transition.astimezone(self.zone))
                candidate = clock.next_after(second_pass_start - _ONE_SECOND)
            else:
                candidate = clock.next_after(wall)
            if candidate <= last_repeated:
                return _occurrences(candidate, self.zone)[1]
            wall = last_repeated
        while True:
            candidate = clock.next_after(wall)
            first, second = _occurrences(candidate, self.zone)
            if first <= second:
                return first
            # A wall time in a gap: no instant has it, so carry on from the end of the gap.
            wall = _naive(_transition(self.zone, second, first).astimezone(self.zone)) - _ONE_SECOND


@functools.lru_cache(maxsize=8192)
def _next_fire_cached(schedule: CronSchedule, after: datetime) -> datetime:
    # A pure function of its arguments, asked the same question many times over: a bulk create
    # asks it for every schedule of one expression at the batch's one "now", and the scanner for
    # every schedule of one expression that fired at the same instant.
    return schedule._next(_WallClock(schedule.expression), after)


def next_fire_after(
    expression: CronExpression | str,
    tz: ZoneInfo | str,
    after: datetime,
    schedule_id: str | uuid.UUID | None = None,
) -> datetime:
    """The first fire time of ``expression`` in zone ``tz`` strictly after ``after``, in UTC."""
    return CronSchedule.of(expression, tz, schedule_id).next_fire_after(after)


def fire_times(
    expression: CronExpression | str,
    tz: ZoneInfo | str,
    after: datetime,
    schedule_id: str | uuid.UUID | None = None,
) -> Iterator[datetime]:
    """Fire times of ``expression`` in zone ``tz`` strictly after ``after``, in UTC, increasing."""
    return CronSchedule.of(expression, tz, schedule_id).fire_times(after)


class _WallClock:
    """croniter over naive wall times, at whole seconds, plus the ``L-n``/``LW`` day filter."""

    def __init__(self, expression: CronExpression) -> None:
        self._last_day = expression._last_day
        # A croniter's expansion of its expression costs far more than a next-time search. Each
        # clock gets its own shallow copy of a shared one: the copy's position (the only state a
        # search changes, and every search sets it first) is its own, so clocks in different
        # threads never interfere, while the expanded fields, which searches only read, are shared.
        texts = expression._day_union or (expression._croniter_text,)
        self._croniters = [copy.copy(_expanded_croniter(text)) for text in texts]

    def next_after(self, wall: datetime) -> datetime:
        if len(self._croniters) == 1:
            return self._next_after(self._croniters[0], wall)
        # A day matching either field: the earliest of the two searches that find one.
        candidates = []
        for searcher in self._croniters:
            try:
                candidates.append(self._next_after(searcher, wall))
            except CroniterBadDateError:
                continue
        if not candidates:
            raise CroniterBadDateError("failed to find next date")
        return min(candidates)

    def _next_after(self, searcher: croniter[datetime], wall: datetime) -> datetime:
        candidate = searcher.get_next(datetime, start_time=wall)
        while self._last_day is not None and not self._last_day.matches(candidate.date()):
            # Every month long enough has its L-n day, and the months repeat each year (February's
            # 29th within 8): nothing in the 9 years after the start means never.
            if candidate.year - wall.year > 8:
                raise CroniterBadDateError("failed to find next date")
            end_of_day = candidate.replace(hour=23, minute=59, second=59)
            candidate = searcher.get_next(datetime, start_time=end_of_day)
        return candidate


@functools.lru_cache(maxsize=8192)
def _expanded_croniter(croniter_text: str) -> croniter[datetime]:
    """A croniter of ``croniter_text``, to copy (never to search with itself).

    Keyed by the text croniter reads, in which the expression's ``H`` fields are already resolved
    with their hash seed: everything a search depends on besides its start (the zone plays no part
    in croniter's naive wall times)."""
    return croniter(
        croniter_text,
        _VALIDATION_START,
        ret_type=datetime,
        # Vixie and Kubernetes (robfig/cron) AND the two day fields when either begins with
        # "*" (as in "*/2"); croniter alone would OR them.
        implement_cron_bug=True,
    )


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"expected a timezone-aware datetime, got {moment!r}")
    return moment.astimezone(UTC)


def _naive(local: datetime) -> datetime:
    return local.replace(tzinfo=None, microsecond=0, fold=0)


def _occurrences(wall: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The instants of a wall time under its two readings (PEP 495 fold 0 and 1).

    Equal: the wall time exists once. first < second: it is repeated by a fall-back. first >
    second: it lies in a spring-forward gap and exists not at all.
    """
    return (
        wall.replace(tzinfo=zone, fold=0).astimezone(UTC),
        wall.replace(tzinfo=zone, fold=1).astimezone(UTC),
    )


def _transition(zone: ZoneInfo, earlier: datetime, later: datetime) -> datetime:
    """The first instant in (earlier, later] already at ``later``'s UTC offset.

    Transitions fall on whole seconds and are hours apart at most in the span searched, so a
    bisection over seconds finds the one in between.
    """
    target = later.astimezone(zone).utcoffset()
    low, high = int(earlier.timestamp()), int(later.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == target:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def skipped_until(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """When the naive wall time ``wall`` is one a spring-forward gap of ``zone`` skips, the first
    instant after the gap (UTC): where a fixed-time schedule at that wall time fires that day
    (Vixie's rule, as :meth:`CronSchedule.next_fire_after` applies it). None when it exists, and at
    the ends of the calendar, where no zone changes its offset."""
    try:
        first, second = _occurrences(wall, zone)
    except OverflowError:
        return None
    return _transition(zone, second, first) if first > second else None


def _hash_seed(schedule_id: str | uuid.UUID) -> str:
    # A UUID hashes the same however it is spelled (case, braces, urn: prefix).
    try:
        return str(uuid.UUID(str(schedule_id)))
    except ValueError:
        return str(schedule_id)


def _hashed(seed: str, index: int, size: int) -> int:
    # sha256, not hash(): the value must be the same in every process and every release.
    digest = hashlib.sha256(f"{seed}\x00{_FIELD_NAMES[index]}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % size


def _resolve_field(text: str, index: int, field: str, hash_seed: str | None) -> str:
    """Rewrite one field into what croniter reads as the dialect means it."""
    items = []
    for item in field.split(","):
        if _RANDOM_ITEM.match(item):
            raise InvalidCronExpression(
                text, f"{_FIELD_NAMES[index]} field {quoted(field)}: 'R' (random) is not supported; use 'H'"
            )
        hashed = _HASH_ITEM.match(item)
        if hashed:
            items.append(_resolve_hash(text, index, field, hashed, hash_seed))
            continue
        equal_range = _EQUAL_RANGE_ITEM.match(item)
        if equal_range and equal_range[1].lower() == equal_range[2].lower():
            # croniter widens "5-5" and "5-5/10" to the whole field; cron means just 5.
            items.append(equal_range[1])
            continue
        weekday_step = _WEEKDAY_STEP_ITEM.match(item) if index == _DAY_OF_WEEK else None
        if weekday_step:
            items.append(_resolve_weekday_step(text, field, weekday_step))
            continue
        last_weekday = _LAST_WEEKDAY_OF_MONTH_ITEM.match(item) if index == _DAY_OF_WEEK else None
        if last_weekday:
            # Quartz writes the last Friday "5L" or "FRIL"; croniter only knows "L5".
            day = last_weekday[1].lower()
            items.append(f"L{int(day) % 7 if day.isdigit() else _WEEKDAY_NUMBERS[day]}")
            continue
        items.append(item)
    return ",".join(items)


def _resolve_weekday_step(text: str, field: str, step_item: re.Match[str]) -> str:
    """A day-of-week step from a start, ``n/k``, as the values of ``n-7/k`` with 7 read as Sunday.

    The field runs 0-7, both ends Sunday (Vixie cron and cronie read ``*`` as 0-7 and set Sunday for
    either), so a start with a step runs to 7 as ``n-7/k`` does: ``5/1`` is Friday to Sunday, ``1/3``
    Monday, Thursday and Sunday, ``6/1`` Saturday and Sunday, ``7/1`` Sunday alone, ``0/1`` every
    day; ``*/2`` is unchanged (0-7/2: Sunday, Tuesday, Thursday, Saturday). Vixie cron and cronie
    refuse a bare start with a step, so theirs is the range form; croniter stops such a step at 6
    (``5/1`` misses Sunday) and reads ``7/1`` as every day.
    """
    day = step_item[1].lower()
    start = int(day) if day.isdigit() else _WEEKDAY_NUMBERS[day]
    step = int(step_item[2])
    if step == 0:
        raise InvalidCronExpression(text, f"day-of-week field {quoted(field)}: a step must be at least 1")
    # Explicit values: croniter's own step and range handling is what we are working around.
    return ",".join(str(value) for value in sorted({value % 7 for value in range(start, 8, step)}))


def _resolve_hash(text: str, index: int, field: str, hashed: re.Match[str], hash_seed: str | None) -> str:
    name = _FIELD_NAMES[index]
    if hash_seed is None:
        raise InvalidCronExpression(text, f"{name} field {quoted(field)}: 'H' needs a schedule id to hash")
    low, high = _HASH_RANGES[index]
    if hashed[1] is not None:
        low, high = int(hashed[1]), int(hashed[2])
        field_low, field_high = _FIELD_RANGES[index]
        if not field_low <= low <= high <= field_high:
            raise InvalidCronExpression(
                text, f"{name} field {quoted(field)}: H(a-b) needs {field_low} <= a <= b <= {field_high}"
            )
    step = int(hashed[3]) if hashed[3] is not None else None
    if step is None:
        return str(low + _hashed(hash_seed, index, high - low + 1))
    if step == 0:
        raise InvalidCronExpression(text, f"{name} field {quoted(field)}: a step must be at least 1")
    start = low + _hashed(hash_seed, index, min(step, high - low + 1))
    # Explicit values: croniter's own step and range handling is what we are working around.
    return ",".join(str(value) for value in range(start, high + 1, step))


def _last_day_rule(text: str, fields: list[str]) -> _LastDayRule | None:
    day_of_month = fields[_DAY_OF_MONTH]
    offset = _LAST_DAY_OFFSET_FIELD.match(day_of_month)
    weekday = _LAST_WORKDAY_FIELD.match(day_of_month)
    # Quartz's day-of-month forms that name one day by its weekdays (nW, LW, L-n) take no
    # day-of-week beside them, as in Quartz: croniter would fire on the nW days only, not on
    # either field's days as Vixie's rule has it for every other pair.
    if (offset or weekday or "w" in day_of_month.lower()) and fields[_DAY_OF_WEEK] not in ("*", "?"):
        raise InvalidCronExpression(
            text, f"day-of-month field {quoted(day_of_month)} needs '*' or '?' in the day-of-week field"
        )
    if not offset and not weekday:
        return None
    if offset:
        days_before_last = int(offset[1])
        if days_before_last > 30:
            raise InvalidCronExpression(text, f"day-of-month field {quoted(day_of_month)}: L-n needs n <= 30")
        return _LastDayRule(days_before_last=days_before_last, weekday=False)
    return _LastDayRule(days_before_last=0, weekday=True)


def _day_union(fields: tuple[str, str, str, str, str, str]) -> tuple[str, str] | None:
    """The two expressions to search, one per day field, when both are restricted (Vixie's "either
    fires") and the day of week uses ``n#k`` or ``nL``, which croniter cannot OR with a day of month."""
    day_of_month, day_of_week = fields[_DAY_OF_MONTH], fields[_DAY_OF_WEEK]
    restricted = all(f not in ("*", "?") and not f.startswith("*") for f in (day_of_month, day_of_week))
    if not restricted or not any(c in day_of_week.lower() for c in "#l"):
        return None
    by_month_day = (*fields[:_DAY_OF_WEEK], "*")
    by_weekday = (*fields[:_DAY_OF_MONTH], "*", fields[_MONTH], day_of_week)
    return _croniter_order(by_month_day), _croniter_order(by_weekday)


def _croniter_order(fields: tuple[str, ...]) -> str:
    # croniter's six-field form puts seconds last.
    return " ".join((*fields[1:], fields[0]))


def _diagnose(written: list[str], resolved: tuple[str, ...], error: CroniterError) -> str:
    """One clear sentence: the first field that is wrong on its own, else croniter's complaint."""
    for index in range(6):
        probe = ["0", "0", "0", "*", "*", "*"]
        probe[index] = resolved[index]
        try:
            croniter.expand(_croniter_order((probe[0], probe[1], probe[2], probe[3], probe[4], probe[5])))
        except CroniterError:
            return (
                f"{_FIELD_NAMES[index]} field {quoted(written[index])} is not valid "
                f"(expected {_FIELD_SYNTAX[index]}; with lists, ranges, steps and H)"
            )
    message = str(error).strip().splitlines()[0] if str(error).strip() else "it is not valid"
    message = re.sub(r"^\[[^\]]*\]\s*", "", message)
    return message.split("  ")[0].rstrip(".")
