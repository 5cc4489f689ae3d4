"""``scheduler schedules``: create, inspect and change schedules (versioned, audited)."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any
from uuid import UUID

import click
from rich.console import Console
from rich.table import Table

from scheduler.cli.common import actor, database, echo_json, fail, parse_instant, uuid_arg, wiring_or_exit
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleState
from scheduler.schedule import service
from scheduler.schedule.spec import MISFIRE_POLICIES, OVERLAP_POLICIES, ScheduleSpec
from scheduler.store import schedules as store

SCHEDULE_FIELDS = (
    "id", "app", "name", "kind", "cron", "tz", "run_at", "start_at", "end_at", "handler", "payload",
    "max_attempts", "timeout_ms", "misfire_policy", "overlap_policy", "state", "next_fire_at", "version",
    "created_at", "updated_at",
)  # fmt: skip


def shown(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row.get(name) for name in SCHEDULE_FIELDS}


@click.group()
def schedules() -> None:
    """Schedules: immediate, delayed or cron, in any time zone."""


@schedules.command("create")
@click.option("--app", required=True)
@click.option("--name")
@click.option("--now", "now_", is_flag=True, help="Fire once, now.")
@click.option("--at", "at", help="Fire once at this ISO 8601 time.")
@click.option("--cron", "cron", help="Fire on this cron expression (5 or 6 fields, seconds first).")
@click.option("--tz", default="UTC", show_default=True, help="IANA time zone of the cron expression.")
@click.option("--handler", required=True, help="builtin:noop|sleep|fail|http or package.module:function")
@click.option("--payload", default="{}", show_default=True, help="JSON argument of the handler, or @FILE.")
@click.option("--max-attempts", type=int, default=3, show_default=True)
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds per attempt.")
@click.option(
    "--misfire", type=click.Choice(MISFIRE_POLICIES), default=str(MisfirePolicy.FIRE_ONCE), show_default=True
)
@click.option(
    "--overlap", type=click.Choice(OVERLAP_POLICIES), default=str(OverlapPolicy.ALLOW), show_default=True
)
@click.option("--start", "start", help="Cron: not before this ISO 8601 time.")
@click.option("--end", "end", help="Cron: not after this ISO 8601 time.")
def create(
    app: str,
    name: str | None,
    now_: bool,
    at: str | None,
    cron: str | None,
    tz: str,
    handler: str,
    payload: str,
    max_attempts: int,
    timeout: float,
    misfire: str,
    overlap: str,
    start: str | None,
    end: str | None,
) -> None:
    """Create a schedule and print it as JSON."""
    if sum((now_, at is not None, cron is not None)) != 1:
        raise click.UsageError("give exactly one of --now, --at or --cron")
    if payload.startswith("@"):
        try:
            payload = Path(payload[1:]).read_text()
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {payload[1:]}: {exc.strerror}", param_hint="--payload"
            ) from None
    try:
        payload_value = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    kind = ScheduleKind.IMMEDIATE if now_ else ScheduleKind.DELAYED if at is not None else ScheduleKind.CRON
    spec = ScheduleSpec(
        app=app,
        name=name,
        kind=kind,
        cron=cron,
        tz=tz,
        run_at=parse_instant(at, "--at") if at is not None else None,
        start_at=parse_instant(start, "--start") if start else None,
        end_at=parse_instant(end, "--end") if end else None,
        handler=handler,
        payload=payload_value,
        max_attempts=max_attempts,
        timeout_ms=round(timeout * 1000),
        misfire_policy=misfire,
        overlap_policy=overlap,
    )
    with database(wiring_or_exit()) as conn:
        echo_json(shown(service.create_schedule(conn, spec, actor())))


@schedules.command("get")
@click.argument("schedule_id", type=uuid_arg)
def get(schedule_id: UUID) -> None:
    """Print one schedule as JSON."""
    with database(wiring_or_exit()) as conn:
        row = store.get_schedule(conn, schedule_id)
    if row is None:
        fail(f"no schedule {schedule_id}")
    echo_json(shown(row))


@schedules.command("list")
@click.option("--app")
@click.option("--state", type=click.Choice([str(s) for s in ScheduleState]))
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(app: str | None, state: str | None, limit: int, as_json: bool) -> None:
    """List schedules."""
    with database(wiring_or_exit()) as conn:
        rows = store.list_schedules(conn, app, state, limit)
    if as_json:
        echo_json([shown(r) for r in rows])
        return
    table = Table("id", "app", "name", "kind", "when", "state", "next fire (UTC)", "v")
    for r in rows:
        when = (r["cron"] and f"{r['cron']} {r['tz']}") or (r["run_at"] and r["run_at"].isoformat()) or "now"
        next_fire = r["next_fire_at"].isoformat() if r["next_fire_at"] else "-"
        table.add_row(
            str(r["id"]), r["app"], r["name"], r["kind"], when, r["state"], next_fire, str(r["version"])
        )
    Console().print(table)


def _versioned(name: str, operation: Any, help_text: str) -> click.Command:
    @click.command(name, help=help_text)
    @click.argument("schedule_id", type=uuid_arg)
    @click.option("--expect-version", type=int, help="Fail unless the schedule is at this version.")
    def command(schedule_id: UUID, expect_version: int | None) -> None:
        with database(wiring_or_exit()) as conn:
            echo_json(shown(operation(conn, schedule_id, actor(), expect_version)))

    return command


schedules.add_command(_versioned("pause", service.pause, "Stop a schedule firing until resumed."))
schedules.add_command(
    _versioned("resume", service.resume, "Resume a paused schedule (its misfire policy applies).")
)
schedules.add_command(_versioned("cancel", service.cancel, "Cancel a schedule for good."))


@schedules.command("trigger")
@click.argument("schedule_id", type=uuid_arg)
def trigger(schedule_id: UUID) -> None:
    """Fire a schedule now, outside its timetable; prints the new run id."""
    wiring = wiring_or_exit()
    with database(wiring) as conn:
        run_id = service.trigger(conn, wiring.settings, schedule_id, actor(), wiring.dispatcher)
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
        rows = ingest.list_rejections(conn, code=code, app=app, limit=limit)
    if as_json:
        echo_json(rows)
        return
    table = Table("rejected at (UTC)", "code", "command id", "app/key", "source", "reason")
    table.columns[1].no_wrap = True
    for r in rows:
        table.add_row(
            r["rejected_at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"), r["code"], r["command_id"] or "-",
            f"{r['app']}/{r['schedule_key']}" if r["app"] else "-",
            f"{r['source_partition']}@{r['source_offset']}", r["reason"],
        )  # fmt: skip
    Console().print(table)
