"""``scheduler cron``: preview when a cron expression fires, in UTC and in its time zone.

The same domain code the scanner uses computes the times, so what a user previews here is what
the scheduler will do, daylight-saving rules and ``H`` spreading included.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from itertools import islice, takewhile
from uuid import UUID

import click

from scheduler.cli.common import UTC_NAMES, fail, first_after_gap, in_zone, uuid_arg
from scheduler.domain.cron import CronSchedule, InvalidCronExpression, UnknownTimeZone
from scheduler.schedule.spec import EARLIEST, LATEST, MAX_CRON_LENGTH


@click.group()
def cron() -> None:
    """Cron expressions: preview fire times."""


@cron.command("next")
@click.argument("expression", metavar="EXPR")
@click.option("--tz", "tz", default="UTC", show_default=True, help="IANA time zone, e.g. Europe/Berlin.")
@click.option(
    "--after",
    help="Start after this ISO 8601 time (Z or an offset; none only with a UTC --tz). [default: now]",
)
@click.option(
    "--count", type=click.IntRange(1, 1000), default=5, show_default=True, help="How many fire times."
)
@click.option(
    "--schedule-id",
    type=uuid_arg,
    help="The schedule id (a UUID, as `schedules list` shows) that H fields are hashed with.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only a JSON list of {utc, local}.")
def next_fire_times(
    expression: str, tz: str, after: str | None, count: int, schedule_id: UUID | None, as_json: bool
) -> None:
    """Print the next fire times of EXPR (5 fields, minute first; or 6, second first; at most 200
    characters, as a schedule's)."""
    if len(expression) > MAX_CRON_LENGTH:
        # What no schedule can hold is not previewed as if it could.
        fail(f"cron expression must be at most {MAX_CRON_LENGTH} characters, got {len(expression)}", code=2)
    try:
        schedule = CronSchedule.of(expression, tz or "UTC", schedule_id)  # an empty zone is UTC
    except (InvalidCronExpression, UnknownTimeZone) as error:
        fail(str(error), code=2)
    start = datetime.now(UTC).replace(microsecond=0) if after is None else _parse_after(after, tz or "UTC")
    # Only what a schedule can hold: its times end where --at's and start_at's do.
    fires = islice(takewhile(lambda fire: fire < LATEST, schedule.fire_times(start)), count)
    times = [(fire, fire.astimezone(schedule.zone)) for fire in fires]

    if as_json:
        click.echo(json.dumps([{"utc": utc.isoformat(), "local": local.isoformat()} for utc, local in times]))
        return
    click.echo(f"{'UTC':<27}LOCAL ({schedule.zone.key})")
    for utc, local in times:
        click.echo(f"{utc.isoformat():<27}{local.isoformat()}  {local:%a} {local.tzname()}")
    if len(times) < count:
        click.echo(f"(no further fire times within 50 years, nor before {LATEST.year})")


def _parse_after(text: str, zone: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        fail(f"--after {text!r} is not an ISO 8601 time such as 2027-03-28T00:00:00Z", code=2)
    if moment.tzinfo is None and zone not in UTC_NAMES:
        # Read as UTC it would be an hour or more off what its reader meant (02:30 in that zone),
        # as `schedules create --at` refuses it too.
        # A wall time the zone skips that day has no offset of its own: the example is the first
        # instant after the gap, as `schedules create --start` suggests, never 02:30 at the old offset.
        after_gap = first_after_gap(moment, zone)
        skipped = "" if after_gap is None else f" (the clocks skip {moment.strftime('%H:%M')} that day)"
        fail(
            f"--after {text!r} has no UTC offset; with --tz {zone} give one{skipped} "
            f"(e.g. {after_gap or in_zone(moment, zone)}, or Z for UTC)",
            code=2,
        )
    # A time without an offset is read as UTC, not as this machine's local time.
    try:
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
        in_range = EARLIEST <= moment < LATEST
    except OverflowError:  # an offset that takes it before the year 1 or past 9999
        in_range = False
    if not in_range:
        fail(f"--after must be between 1970 and 9000, as a schedule's times are; got {text!r}", code=2)
    return moment
