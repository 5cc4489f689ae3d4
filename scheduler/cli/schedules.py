"""``scheduler schedules``: create, inspect and change schedules (versioned, audited)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import click
import psycopg

from scheduler.cli.common import (
    ANY_TEXT,
    SCHEDULE,
    DataTable,
    FiniteFloatRange,
    ScheduleKey,
    actor,
    database,
    echo_json,
    fail,
    known_app,
    known_or_named_app,
    parse_instant,
    print_table,
    schedule_id_of,
    shown_within,
    unknown_schedule,
    wiring_or_exit,
)
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleState
from scheduler.schedule import service
from scheduler.schedule.spec import (
    MAX_DELAY_MS,
    MAX_PAYLOAD_BYTES,
    MISFIRE_POLICIES,
    OVERLAP_POLICIES,
    InvalidSchedule,
    ScheduleSpec,
    parse_payload,
    stored_spec,
)
from scheduler.store import schedules as store

SCHEDULE_FIELDS = (
    "id", "app", "name", "description", "kind", "cron", "tz", "run_at", "start_at", "end_at", "handler",
    "payload", "max_attempts", "timeout_ms", "backoff_base_ms", "backoff_max_ms", "jitter_ms",
    "misfire_policy", "overlap_policy", "state", "error", "errored_at", "next_fire_at", "version",
    "created_at", "updated_at",
)  # fmt: skip
F = TypeVar("F", bound=Callable[..., Any])
# The longest timeout, retry wait and jitter a schedule may have, in seconds: the options refuse
# more, and NaN or infinity, before a value becomes milliseconds (which they cannot be).
DAY_S = MAX_DELAY_MS // 1000


SHOWN_FIELDS = (*SCHEDULE_FIELDS[:2], "schedule_key", *SCHEDULE_FIELDS[2:])


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """A schedule as the CLI prints it, always with its key: the name a user gives Kafka commands
    and the next command (APP/KEY). A row that lacks it is a caller's mistake, not a null to print."""
    return {name: row[name] if name == "schedule_key" else row.get(name) for name in SHOWN_FIELDS}


def with_key(conn: psycopg.Connection[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (as a change returns it, without the key) with its schedule's key."""
    return row | {"schedule_key": store.schedule_key(conn, row["id"])}


# How a command names the schedule it acts on: the id, or APP/KEY as Kafka commands name it.
schedule_argument = click.argument("schedule", type=SCHEDULE, metavar="ID|APP/KEY")


# What a payload file may hold, blanks and indentation included: 16 times a payload's limit. More
# (or an endless file, /dev/zero) is refused once that much is read, rather than read to the end.
MAX_PAYLOAD_FILE_BYTES = 16 * MAX_PAYLOAD_BYTES


def _payload(text: str) -> Any:
    """``--payload``: JSON text, or @FILE; one line (exit 2) for anything that is not a payload."""
    if text.startswith("@"):
        name = text[1:]
        if not name:
            fail("--payload: @ takes a file name (@payload.json), or give the JSON itself", code=2)
        try:
            with Path(name).open("rb") as file:
                raw = file.read(MAX_PAYLOAD_FILE_BYTES + 1)
        except OSError as exc:
            fail(f"--payload: cannot read {name}: {exc.strerror}", code=2)
        if len(raw) > MAX_PAYLOAD_FILE_BYTES:
            fail(
                f"--payload: {name} is over {MAX_PAYLOAD_FILE_BYTES // (1024 * 1024)} MiB; "
                f"a payload is at most {MAX_PAYLOAD_BYTES // (1024 * 1024)} MiB encoded",
                code=2,
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail(f"--payload: {name} is not UTF-8 text ({exc.reason})", code=2)
    try:
        return parse_payload(text)
    except InvalidSchedule as exc:
        fail(f"--payload: {exc}", code=2)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def _empty_is_utc(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return "UTC" if value == "" else value


def _spec_options(creating: bool) -> Callable[[F], F]:
    """The options ``create`` and ``update`` share; on update, each one left out keeps its value."""

    def option(*names: str, value: Any = None, **attrs: Any) -> Callable[[F], F]:
        return click.option(*names, default=value if creating else None, show_default=creating, **attrs)

    options = [
        click.option("--name"),
        click.option("--description", help="What the schedule is for (at most 2,000 characters)."),
        # An empty zone is UTC, as over the API and in schedule commands.
        option("--tz", value="UTC", help="IANA time zone of the cron expression.", callback=_empty_is_utc),
        click.option(
            "--handler",
            required=creating,
            help="builtin:noop|sleep|fail|http or package.module:function (one its app declares, if any).",
        ),
        # ANY_TEXT: @FILE is a file name, in the file system's bytes; JSON text is checked as read.
        option("--payload", value="{}", type=ANY_TEXT, help="JSON argument of the handler, or @FILE."),
        option("--max-attempts", value=3, type=int),
        option("--timeout", value=300.0, type=FiniteFloatRange(0.001, DAY_S), help="Seconds per attempt."),
        option(
            "--backoff-base",
            value=1.0,
            type=FiniteFloatRange(0, DAY_S),
            help="Seconds: after attempt n fails, wait at random up to min(max, base * 2^(n-1)).",
        ),
        option(
            "--backoff-max",
            value=300.0,
            type=FiniteFloatRange(0, DAY_S),
            help="Seconds: the longest wait between attempts.",
        ),
        option(
            "--jitter",
            value=0.0,
            type=FiniteFloatRange(0, DAY_S),
            help="Seconds: each fire's job is published after a random delay of up to this.",
        ),
        option("--misfire", value=str(MisfirePolicy.FIRE_ONCE), type=click.Choice(MISFIRE_POLICIES)),
        option("--overlap", value=str(OverlapPolicy.ALLOW), type=click.Choice(OVERLAP_POLICIES)),
        click.option(
            "--start",
            "start",
            help="Cron: not before this ISO 8601 time (see --at for offsets)"
            + ("." if creating else "; '' removes the bound."),
        ),
        click.option(
            "--end",
            "end",
            help="Cron: not after this ISO 8601 time (see --at for offsets)"
            + ("." if creating else "; '' removes the bound."),
        ),
    ]

    def decorate(command: F) -> F:
        for add in reversed(options):
            command = add(command)
        return command

    return decorate


@click.group()
def schedules() -> None:
    """Schedules: immediate, delayed or cron, in any time zone."""


# These commands print JSON and nothing else: --json is accepted so that every command that prints
# data takes it, and scripts need not know which ones would print a table.
json_only = click.option("--json", "as_json", is_flag=True, help="Print JSON only (as without it).")


@schedules.command("create")
@click.option("--app", required=True)
@click.option("--now", "now_", is_flag=True, help="Fire once, now.")
@click.option(
    "--at", "at", help="Fire once at this ISO 8601 time (without an offset: UTC, refused with another --tz)."
)
@click.option("--cron", "cron", help="Fire on this cron expression (5 or 6 fields, seconds first).")
@click.option(
    "--key",
    "schedule_key",
    help="The schedule's key in its app, by which Kafka commands address it [default: its id].",
)
@_spec_options(creating=True)
@json_only
def create(
    app: str,
    now_: bool,
    at: str | None,
    cron: str | None,
    payload: str,
    timeout: float,
    backoff_base: float,
    backoff_max: float,
    jitter: float,
    start: str | None,
    end: str | None,
    as_json: bool,
    schedule_key: str | None,
    **options: Any,
) -> None:
    """Create a schedule and print it as JSON."""
    if sum((now_, at is not None, cron is not None)) != 1:
        raise click.UsageError("give exactly one of --now, --at or --cron")
    kind = ScheduleKind.IMMEDIATE if now_ else ScheduleKind.DELAYED if at is not None else ScheduleKind.CRON
    spec = ScheduleSpec(
        app=app,
        name=options["name"],
        description=options["description"],
        kind=kind,
        cron=cron,
        tz=options["tz"],
        run_at=parse_instant(at, "--at", options["tz"]) if at is not None else None,
        start_at=parse_instant(start, "--start", options["tz"]) if start else None,
        end_at=parse_instant(end, "--end", options["tz"]) if end else None,
        handler=options["handler"],
        payload=_payload(payload),
        max_attempts=options["max_attempts"],
        timeout_ms=round(timeout * 1000),
        backoff_base_ms=round(backoff_base * 1000),
        backoff_max_ms=round(backoff_max * 1000),
        jitter_ms=round(jitter * 1000),
        misfire_policy=options["misfire"],
        overlap_policy=options["overlap"],
    )
    with database(wiring_or_exit()) as conn:
        echo_json(shown(service.create_schedule(conn, spec, actor(), schedule_key=schedule_key)))


@schedules.command("update")
@schedule_argument
@click.option(
    "--at",
    "at",
    help="Make it a one-shot at this ISO 8601 time (without an offset: UTC, if the schedule's zone is).",
)
@click.option("--cron", "cron", help="Make it a cron schedule on this expression.")
@_spec_options(creating=False)
@click.option("--expect-version", type=int, help="Fail unless the schedule is at this version.")
@json_only
def update(
    schedule: UUID | ScheduleKey,
    at: str | None,
    cron: str | None,
    payload: str | None,
    timeout: float | None,
    backoff_base: float | None,
    backoff_max: float | None,
    jitter: float | None,
    start: str | None,
    end: str | None,
    expect_version: int | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Change a schedule: the options given replace their values, the others stay; prints it as JSON.

    A schedule in state error (its fires could not be computed) whose new settings compute is
    active again.
    """
    if at is not None and cron is not None:
        raise click.UsageError("give at most one of --at or --cron")
    # An empty --start or --end removes that bound: a change too.
    changing = (at, cron, payload, timeout, backoff_base, backoff_max, jitter, start, end)
    if all(value is None for value in (*changing, *options.values())):
        # It would still be a new version, failing a concurrent --expect-version for nothing; and
        # `resume` is what makes a schedule in error active again.
        raise click.UsageError(
            "nothing to change: give the settings to change (--expect-version only guards them)"
        )
    with database(wiring_or_exit()) as conn:
        schedule_id = schedule_id_of(conn, schedule)
        row = store.schedule_with_key(conn, schedule_id)
        if row is None:  # deleted since it was named
            unknown_schedule(schedule_id)
        spec = stored_spec(row)
        zone = options["tz"] or spec.tz
        changes: dict[str, Any] = {
            "name": options["name"],
            "description": options["description"],
            "tz": options["tz"],
            "handler": options["handler"],
            "payload": None if payload is None else _payload(payload),
            "max_attempts": options["max_attempts"],
            "timeout_ms": _ms(timeout),
            "backoff_base_ms": _ms(backoff_base),
            "backoff_max_ms": _ms(backoff_max),
            "jitter_ms": _ms(jitter),
            "misfire_policy": options["misfire"],
            "overlap_policy": options["overlap"],
            "start_at": parse_instant(start, "--start", zone) if start else None,
            "end_at": parse_instant(end, "--end", zone) if end else None,
        }
        given = {k: v for k, v in changes.items() if v is not None}
        given |= {bound: None for bound, text in (("start_at", start), ("end_at", end)) if text == ""}
        # A change of kind clears what the old kind had (a one-shot has no cron, a cron no run_at):
        # these Nones are values, not options left out.
        if cron is not None:
            given |= {"kind": ScheduleKind.CRON, "cron": cron, "run_at": None}
        elif at is not None:
            given |= {"kind": ScheduleKind.DELAYED, "cron": None, "run_at": parse_instant(at, "--at", zone)}
        if given.get("kind", spec.kind) != ScheduleKind.CRON:
            # A one-shot has no bounds: a cron schedule's go with its expression (and a one-shot
            # stored with them before they were refused loses them), unless given (then refused).
            given |= {"start_at": given.get("start_at"), "end_at": given.get("end_at")}
        spec = dataclasses.replace(spec, **given)
        new = service.update_schedule(conn, schedule_id, spec, actor(), expect_version)
        echo_json(shown(new | {"schedule_key": row["schedule_key"]}))


@schedules.command("get")
@schedule_argument
@json_only
def get(schedule: UUID | ScheduleKey, as_json: bool) -> None:
    """Print one schedule as JSON, with its key; name it by id or by its app and key."""
    with database(wiring_or_exit()) as conn:
        schedule_id = schedule_id_of(conn, schedule)
        row = store.schedule_with_key(conn, schedule_id)
        if row is None:  # deleted since it was named
            unknown_schedule(schedule_id)
    echo_json(shown(row))


@schedules.command("list")
@click.option("--app")
@click.option("--state", type=click.Choice([str(s) for s in ScheduleState]))
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(app: str | None, state: str | None, limit: int, as_json: bool) -> None:
    """List schedules."""
    with database(wiring_or_exit()) as conn:
        known_app(conn, app)
        # One more than shown: whether the listing is whole.
        rows = shown_within(
            store.list_schedules(conn, app, state, limit + 1), limit, "schedules (oldest first)"
        )
    if as_json:
        echo_json([shown(r) for r in rows])
        return
    errors = any(r["error"] for r in rows)
    table = DataTable(
        "id", "app", "name", "kind", "when", "state", "next fire (UTC)", "v", *(["error"] if errors else [])
    )
    for r in rows:
        when = (r["cron"] and f"{r['cron']} {r['tz']}") or (r["run_at"] and r["run_at"].isoformat()) or "now"
        next_fire = r["next_fire_at"].isoformat() if r["next_fire_at"] else "-"
        cells = [str(r["id"]), r["app"], r["name"], r["kind"], when, r["state"], next_fire, str(r["version"])]
        table.add_row(*cells, *([r["error"] or ""] if errors else []))
    print_table(table)


def _versioned(name: str, operation: Any, help_text: str) -> click.Command:
    @click.command(name, help=help_text)
    @schedule_argument
    @click.option("--expect-version", type=int, help="Fail unless the schedule is at this version.")
    @json_only
    def command(schedule: UUID | ScheduleKey, expect_version: int | None, as_json: bool) -> None:
        with database(wiring_or_exit()) as conn:
            schedule_id = schedule_id_of(conn, schedule)
            echo_json(shown(with_key(conn, operation(conn, schedule_id, actor(), expect_version))))

    return command


schedules.add_command(_versioned("pause", service.pause, "Stop a schedule firing until resumed."))
schedules.add_command(
    _versioned(
        "resume",
        service.resume,
        "Resume a paused schedule, or one in error whose fires compute again (its misfire policy applies).",
    )
)
schedules.add_command(_versioned("cancel", service.cancel, "Cancel a schedule for good."))


@schedules.command("trigger")
@schedule_argument
@click.option(
    "--expect-version",
    type=int,
    help="Fail unless the schedule is at this version (a trigger leaves it as it is).",
)
@json_only
def trigger(schedule: UUID | ScheduleKey, expect_version: int | None, as_json: bool) -> None:
    """Fire a schedule now, outside its timetable; prints the new run id."""
    wiring = wiring_or_exit()
    with database(wiring) as conn:
        schedule_id = schedule_id_of(conn, schedule)
        run_id = service.trigger(
            conn, wiring.settings, schedule_id, actor(), wiring.dispatcher, expected_version=expect_version
        )
    echo_json({"schedule_id": schedule_id, "run_id": run_id})


@schedules.command("rejected")
@click.option("--app", help="Only commands for this app.")
@click.option("--code", type=click.Choice(["undecodable", "invalid", "not_found", "conflict"]))
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def rejected(app: str | None, code: str | None, limit: int, as_json: bool) -> None:
    """List schedule commands the ingestor rejected, newest first (also on <prefix>.schedules.rejected)."""
    from scheduler.store import ingest

    with database(wiring_or_exit()) as conn:
        # A command for an app that does not exist is rejected (invalid) under that app's name.
        known_or_named_app(
            conn,
            app,
            lambda name: bool(ingest.list_rejections(conn, code=None, app=name, limit=1)),
            "rejected command",
        )
        rows = ingest.list_rejections(conn, code=code, app=app, limit=limit + 1)  # one more: whole?
        rows = shown_within(rows, limit, "rejected commands (newest first)")
    if as_json:
        echo_json(rows)
        return
    table = DataTable("rejected at (UTC)", "code", "command id", "app/key", "source", "reason")
    table.columns[1].no_wrap = True
    for r in rows:
        table.add_row(
            r["rejected_at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"), r["code"], r["command_id"] or "-",
            f"{r['app']}/{r['schedule_key']}" if r["app"] else "-",
            f"{r['source_partition']}@{r['source_offset']}", r["reason"],
        )  # fmt: skip
    print_table(table)
