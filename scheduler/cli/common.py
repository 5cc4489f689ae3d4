"""What every CLI command shares: settings and the composition root built from them, and the
one-line error with a non-zero exit."""

from __future__ import annotations

import getpass
import json
import math
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import Any, NoReturn
from uuid import UUID

import click
import psycopg
from rich.console import Console
from rich.table import Table

from scheduler.config import Settings, load_settings
from scheduler.domain.cron import UnknownTimeZone, skipped_until, time_zone
from scheduler.kafka.transport import KafkaUnavailable
from scheduler.schedule.service import AppConflict, InvalidTransition, KeyConflict, ScheduleNotFound
from scheduler.schedule.spec import InvalidSchedule
from scheduler.store.refusals import first_line
from scheduler.store.schedules import VersionConflict, get_app, get_schedule, schedule_id_by_key
from scheduler.telemetry.logs import check_environment as check_logging_environment
from scheduler.telemetry.terminal import json_shown, shown
from scheduler.wiring import Wiring


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange without NaN, which compares false with both bounds and so passes them.
    Every float option has one with both bounds, so infinity is out of range too: unbounded, a
    value would reach the code as NaN or infinity, or overflow where it becomes milliseconds."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{number} is not in the range {self._describe_range()}.", param, ctx)
        return number


class Utf8Text(click.types.StringParamType):
    """Text that is valid UTF-8, as PostgreSQL, Kafka and JSON need it. Python reads an argument's
    bytes that are not UTF-8 as lone surrogates, which fail only where the text is encoded (a
    query, a message), with a traceback; here they are one line naming the parameter. The root
    group gives every text parameter this type (:func:`scheduler.cli.text_is_utf8`)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = super().convert(value, param, ctx)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            self.fail(f"{_as_typed(text)} is not valid UTF-8", param, ctx)
        return text


def _as_typed(text: str) -> str:
    """``text`` quoted, its bytes that are not UTF-8 shown as ``\\xff`` escapes."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that stands for no byte
        return ascii(text)
    return "'" + raw.decode("utf-8", "backslashreplace") + "'"


UTF8_TEXT = Utf8Text()
# Any text, bytes that are not UTF-8 included: the type of a parameter that may name a file (whose
# name is the file system's bytes), which the root group leaves to its command to read.
ANY_TEXT = click.types.StringParamType()


def fail(message: str, code: int = 1) -> NoReturn:
    """The one error line (it may quote a name or a reason someone else wrote: see :func:`shown`)."""
    click.echo(f"error: {shown(message)}", err=True)
    raise SystemExit(code)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a supervisor, `timeout`, `kill`), taken as Ctrl-C within :func:`sigterm_as_interrupt`."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signal.Signals(signum).name)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated`, a KeyboardInterrupt: what unwinds on
    Ctrl-C (a summary, the clean-up of what was started) unwinds on it too, where Python's default
    would end the process at once. The handler before it is back once the block is left."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_exit_code(stop: KeyboardInterrupt) -> int:
    """128 plus the signal's number, as a shell reports a process the signal ended: 143 for SIGTERM
    (:class:`Terminated`), 130 for Ctrl-C."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def shown_within(rows: list[dict[str, Any]], limit: int, what: str) -> list[dict[str, Any]]:
    """The first ``limit`` of ``rows``, read one more than that: when there is more, a note on stderr
    says so (stdout stays the data, ``--json`` too). ``what`` names the rows and their order."""
    if len(rows) <= limit:
        return rows
    click.echo(f"note: showing the first {limit} {what}; more exist: raise --limit or filter", err=True)
    return rows[:limit]


def known_app(conn: psycopg.Connection[dict[str, Any]], app: str | None) -> None:
    """Refuse a filter on an app that does not exist (exit 2, as the API's NOT_FOUND): an empty
    answer would read as an app with nothing in it, and a typo would go unseen."""
    if app is not None and not app_exists(conn, app):
        unknown_app(app)


def app_exists(conn: psycopg.Connection[dict[str, Any]], app: str) -> bool:
    # A transaction of its own: a read outside one would open one that every later block of the
    # command (a replay's chunks) nests in as a savepoint, committing nothing until the end.
    with conn.transaction():
        return get_app(conn, app) is not None


def known_or_named_app(
    conn: psycopg.Connection[dict[str, Any]], app: str | None, named: Callable[[str], bool], row: str
) -> None:
    """:func:`known_app` for a listing whose rows (each a ``row``) may name apps never created (a
    message that named one was set aside for it): such an app, which ``named`` finds, is no typo."""
    if app is not None and not app_exists(conn, app) and not named(app):
        unknown_app(app, f", and no {row} names it")


def unknown_app(app: str, why: str = "") -> NoReturn:
    fail(f"unknown app {app!r}{why} (`scheduler apps list` shows the apps)", code=2)


@dataclass(frozen=True, slots=True)
class ScheduleKey:
    """A schedule named as Kafka commands name it: its app, and its key in that app."""

    app: str
    key: str

    def __str__(self) -> str:
        return f"{self.app}/{self.key}"


class ScheduleNamed(Utf8Text):
    """A click parameter type for a schedule: its id, or ``APP/KEY`` (the key may itself hold a
    ``/``). Text that is neither is one line, exit 2; which schedule a key names is asked of the
    database by :func:`schedule_id_of`, once the command has a connection."""

    name = "id|app/key"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, UUID | ScheduleKey):
            return value
        text = super().convert(value, param, ctx)
        try:
            return UUID(text)
        except ValueError:
            pass
        app, slash, key = text.partition("/")
        if not slash or not app or not key:
            self.fail(f"{_as_typed(text)} is neither an id (a UUID) nor APP/KEY", param, ctx)
        return ScheduleKey(app, key)


SCHEDULE = ScheduleNamed()


def schedule_id_of(conn: psycopg.Connection[dict[str, Any]], named: UUID | ScheduleKey) -> UUID:
    """The id of the schedule ``named``, by its id or its APP/KEY; one that names no schedule is
    refused (exit 2), as an unknown app is, whether the command acts on it or filters by it."""
    with conn.transaction():  # of its own, as in app_exists
        if isinstance(named, UUID):
            if get_schedule(conn, named) is None:
                unknown_schedule(named)
            return named
        schedule_id = schedule_id_by_key(conn, named.app, named.key)
        app_found = schedule_id is not None or get_app(conn, named.app) is not None
    if not app_found:
        unknown_app(named.app)
    if schedule_id is None:
        # Quoted, as a key may hold a line break, and said once, as it may be long.
        fail(
            f"unknown schedule {str(named)!r}: app {named.app!r} has no schedule with that key "
            f"(`scheduler schedules list --app {named.app}` shows its schedules)",
            code=2,
        )
    return schedule_id


def unknown_schedule(schedule_id: UUID) -> NoReturn:
    fail(f"unknown schedule {schedule_id} (`scheduler schedules list` shows the schedules)", code=2)


def known_schedule(conn: psycopg.Connection[dict[str, Any]], named: UUID | ScheduleKey | None) -> UUID | None:
    """The id of the schedule a filter names, if it names one (see :func:`schedule_id_of`)."""
    return None if named is None else schedule_id_of(conn, named)


def time_range(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    """``--since`` and ``--until`` read as instants, refused (exit 2) when they hold no time at all."""
    start = parse_instant(since, "--since") if since else None
    end = parse_instant(until, "--until") if until else None
    if start is not None and end is not None and start >= end:
        fail(f"--since {start.isoformat()} is not before --until {end.isoformat()}", code=2)
    return start, end


def settings_or_exit() -> Settings:
    try:
        settings = load_settings()
        check_logging_environment()
    except ValueError as exc:  # a ConfigError, or a logging variable's
        fail(str(exc), code=2)
    return settings


def wiring_or_exit() -> Wiring:
    """What a command builds its clients with: the composition root for the configured settings."""
    return Wiring(settings_or_exit())


def to_jsonable(value: Any) -> Any:
    """Rows as JSON: times ISO 8601 with their offset, ids as strings."""
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    return value


def uuid_arg(value: str) -> UUID:
    """A click parameter type for ids: one clear line (exit 2) when the text is not a UUID."""
    try:
        return UUID(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an id (a UUID)") from None


class DataTable(Table):
    """A table whose text cells are data: their terminal controls are shown, not sent (:func:`shown`)."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*(shown(r) if isinstance(r, str) else r for r in renderables), **kwargs)


# Columns of ids a user copies into the next command (`schedules get ID`, `dlq replay --run ID`).
WHOLE_COLUMNS = frozenset({"id", "run", "command id"})


def print_table(table: Table) -> None:
    """``table`` on stdout. Its cells are data (names, error texts, a Kafka command's own text), not
    rich markup: a ``[/]`` in a handler's error must print as written, not end the command. Ids are
    never cut short: on a narrow terminal one folds onto a second line rather than lose its end, and
    output that is not a terminal (a pipe, a file) is as wide as the table needs."""
    console = Console(markup=False, highlight=False)
    for column in table.columns:
        if str(column.header) in WHOLE_COLUMNS:
            column.overflow = "fold"
    if not console.is_terminal:
        unbounded = console.options.update_width(100_000)
        console.width = max(console.width, console.measure(table, options=unbounded).maximum)
    console.print(table)


def echo_json(value: Any) -> None:
    click.echo(json_shown(json.dumps(to_jsonable(value), ensure_ascii=False)))


def actor() -> str:
    """Who the audit log names for a CLI change."""
    return f"cli:{getpass.getuser()}@{socket.gethostname()}"


# The IANA names of UTC itself: a time without an offset means the same in each of them.
UTC_NAMES = frozenset(
    {"UTC", "Etc/UTC", "UCT", "Etc/UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu", "GMT",
     "Etc/GMT", "GMT0", "Etc/GMT0", "GMT+0", "Etc/GMT+0", "GMT-0", "Etc/GMT-0", "Greenwich", "Etc/Greenwich"}
)  # fmt: skip


def parse_instant(text: str, what: str, zone: str = "UTC") -> datetime:
    """An ISO 8601 instant; `Z` accepted, a naive time taken as UTC, but refused for a schedule in
    another ``zone`` (whose reader would take 02:30 for 02:30 there)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        # Python names what is wrong with a well-formed time (a 30 February, a 60th second), but
        # words an offset of a day or more in its own terms (timedelta).
        message = str(exc)
        why = (
            ""
            if message.startswith("Invalid isoformat")
            else ": its UTC offset must be less than 24 hours"
            if "offset must be a timedelta" in message
            else f": {exc}"
        )
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 time{why} (e.g. 2027-01-01T09:00:00Z)", param_hint=what
        ) from None
    if moment.tzinfo is None and zone not in UTC_NAMES:
        example = in_zone(moment, zone)
        # An unknown zone is refused with its own error once the schedule is checked: saying
        # first that this time lacks an offset "in" it would only send its writer the wrong way.
        if example is not None:
            after_gap = first_after_gap(moment, zone)
            skipped = (
                ""
                if after_gap is None
                else f", where the clocks skip {moment.strftime('%H:%M')} that day (its first instant "
                f"after the gap is {after_gap})"
            )
            raise click.BadParameter(
                f"{text!r} has no offset, and the schedule's zone is {zone}{skipped}: give one "
                f"(e.g. {after_gap or example}, or {text}Z for UTC)",
                param_hint=what,
            )
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def first_after_gap(moment: datetime, zone: str) -> str | None:
    """When the naive ``moment`` is a wall time ``zone`` skips (a spring-forward gap), the first
    instant after the gap in that zone's time, as a cron schedule fires then; else None."""
    try:
        tz = time_zone(zone)
    except UnknownTimeZone:
        return None
    after = skipped_until(moment, tz)
    return None if after is None else after.astimezone(tz).isoformat()


def in_zone(moment: datetime, zone: str) -> str | None:
    """``moment``'s wall time with the offset ``zone`` has then (the example a user can copy);
    None for a zone that does not exist."""
    try:
        return moment.replace(tzinfo=time_zone(zone)).isoformat()
    except UnknownTimeZone:
        return None


@contextmanager
def database(wiring: Wiring) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A connection to the wiring's database, with the usual failures turned into one line each."""
    try:
        with wiring.database.connect() as conn:
            yield conn
    except psycopg.OperationalError as exc:
        # A URL PostgreSQL refuses (a wrong password, a database that does not exist) is a setting
        # to fix; anything else, a server that does not answer (the local stack not started).
        wrong = wiring.database.refusal(exc)
        if wrong is not None:
            fail(wrong)
        where = wiring.database.display
        fail(f"cannot reach PostgreSQL at {where}: {first_line(exc)} (is `scheduler dev up` running?)")
    except psycopg.errors.UndefinedTable:
        fail("the database has no scheduler schema: run `scheduler init` first")
    except (InvalidSchedule, ScheduleNotFound) as exc:
        # ScheduleNotFound: a schedule deleted (by the history retention) after it was named.
        fail(str(exc), code=2)
    except (VersionConflict, InvalidTransition, AppConflict, KeyConflict) as exc:
        fail(str(exc))
    except KafkaUnavailable as exc:
        fail(f"cannot reach Kafka at {wiring.settings.kafka_bootstrap}: {exc}")
