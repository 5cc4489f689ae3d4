"""Creating and changing schedules: the one path the CLI and the ingestor share.

Each operation runs in the caller's transaction, checks the version it read (optimistic locking),
writes ``audit_log``, and notifies the scanners when it makes something due sooner (create,
trigger, resume) so they wake at once instead of at their next poll.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg

from scheduler.config import Settings
from scheduler.domain.cron import CronSchedule, NoFireTime
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import ScheduleKind, ScheduleState
from scheduler.kafka.transport import TopicAdmin
from scheduler.scan.dispatch import JobDispatcher, lease_expiry
from scheduler.schedule.spec import (
    InvalidSchedule,
    ScheduleSpec,
    spec_columns,
    validate,
    validate_app_name,
)
from scheduler.store import scan, schedules
from scheduler.store.entities import schedule_from_row
from scheduler.store.scan import NewRun
from scheduler.telemetry.tracing import SCHEDULE_CREATE, start_span_from_traceparent, traceparent_of_span

Row = dict[str, Any]


class UnknownApp(InvalidSchedule):
    """The schedule names an app that was never created."""


class ScheduleNotFound(LookupError):
    pass


class InvalidTransition(ValueError):
    """E.g. resuming a cancelled schedule."""


def create_app(
    conn: psycopg.Connection[Row],
    admin: TopicAdmin,
    settings: Settings,
    name: str,
    partitions: int,
    actor: str,
) -> Row:
    """Record the app and create its topic; an existing app is returned as it is (idempotent)."""
    validate_app_name(name)
    if not 1 <= partitions <= 10_000:
        raise InvalidSchedule(f"partitions must be 1 to 10000, got {partitions}")
    with conn.transaction():
        created = schedules.create_app(conn, name, partitions)
        if created is not None:
            schedules.audit(conn, actor, "create", "app", name, None, created)
    app = created or schedules.get_app(conn, name)
    assert app is not None
    # After the row is committed: a crash in between leaves an app whose topic the next create
    # (or `init`) makes, never a topic without an app.
    admin.ensure_topics([settings.jobs_topic(name)], partitions=app["partitions"])
    return app


def first_fire(spec: ScheduleSpec, schedule_id: uuid.UUID, now: datetime) -> datetime | None:
    """When a new schedule is first due; None for immediate (the database's now)."""
    if spec.kind == ScheduleKind.IMMEDIATE:
        return None
    if spec.kind == ScheduleKind.DELAYED:
        return spec.run_at
    assert spec.cron is not None
    # A fire exactly at start_at counts: start_at is inclusive, so look from just before it.
    start = max(now, spec.start_at - timedelta(microseconds=1)) if spec.start_at else now
    try:
        fire = CronSchedule.of(spec.cron, spec.tz, schedule_id=schedule_id).next_fire_after(start)
    except NoFireTime:
        raise InvalidSchedule(
            f"cron expression {spec.cron!r} never fires after {start.isoformat()}"
        ) from None
    if spec.end_at is not None and fire > spec.end_at:
        raise InvalidSchedule(f"cron expression {spec.cron!r} never fires before end_at")
    return fire


def create_schedule(
    conn: psycopg.Connection[Row], spec: ScheduleSpec, actor: str, schedule_id: uuid.UUID | None = None
) -> Row:
    validate(spec)
    schedule_id = schedule_id or uuid.uuid4()
    attributes = {
        "scheduler.app": spec.app,
        "scheduler.schedule_id": str(schedule_id),
        "job.type": spec.handler,
    }
    with start_span_from_traceparent(SCHEDULE_CREATE, None, attributes=attributes) as span:
        return _create(conn, spec, actor, schedule_id, traceparent_of_span(span))


def _create(
    conn: psycopg.Connection[Row], spec: ScheduleSpec, actor: str, schedule_id: uuid.UUID, traceparent: str
) -> Row:
    with conn.transaction():
        if schedules.get_app(conn, spec.app) is None:
            raise UnknownApp(
                f"unknown app {spec.app!r}: create it first with `scheduler apps create {spec.app}`"
            )
        now = schedules.db_now(conn)
        row = schedules.insert_schedule(
            conn,
            spec_columns(spec)
            | {
                "id": schedule_id,
                "name": spec.name or f"{spec.kind}-{str(schedule_id)[:8]}",
                "next_fire_at": first_fire(spec, schedule_id, now),
                "traceparent": traceparent,
            },
        )
        schedules.audit(conn, actor, "create", "schedule", str(schedule_id), None, row)
        schedules.notify_due(conn)
    return row


def current_schedule(
    conn: psycopg.Connection[Row], schedule_id: uuid.UUID, expected_version: int | None
) -> Row:
    row = schedules.get_schedule(conn, schedule_id)
    if row is None:
        raise ScheduleNotFound(f"no schedule {schedule_id}")
    if expected_version is not None and row["version"] != expected_version:
        raise schedules.VersionConflict(
            f"schedule {schedule_id} is at version {row['version']}, not {expected_version}; read it again"
        )
    return row


def _transition(
    conn: psycopg.Connection[Row],
    schedule_id: uuid.UUID,
    action: str,
    target: ScheduleState,
    allowed_from: tuple[ScheduleState, ...],
    actor: str,
    expected_version: int | None,
) -> Row:
    with conn.transaction():
        old = current_schedule(conn, schedule_id, expected_version)
        if old["state"] == target:
            return old  # already there: repeating a pause or cancel is harmless
        if old["state"] not in allowed_from:
            raise InvalidTransition(f"cannot {action} schedule {schedule_id}: it is {old['state']}")
        # A paused schedule keeps its next fire time: on resume the misfire policy judges what was missed.
        next_fire_at = None if target == ScheduleState.CANCELLED else old["next_fire_at"]
        new = schedules.set_schedule_state(conn, schedule_id, old["version"], target, next_fire_at)
        schedules.audit(conn, actor, action, "schedule", str(schedule_id), old, new)
        if target == ScheduleState.ACTIVE:
            schedules.notify_due(conn)
    return new


def pause(
    conn: psycopg.Connection[Row], schedule_id: uuid.UUID, actor: str, expected_version: int | None = None
) -> Row:
    return _transition(
        conn, schedule_id, "pause", ScheduleState.PAUSED, (ScheduleState.ACTIVE,), actor, expected_version
    )


def resume(
    conn: psycopg.Connection[Row], schedule_id: uuid.UUID, actor: str, expected_version: int | None = None
) -> Row:
    return _transition(
        conn, schedule_id, "resume", ScheduleState.ACTIVE, (ScheduleState.PAUSED,), actor, expected_version
    )


def cancel(
    conn: psycopg.Connection[Row], schedule_id: uuid.UUID, actor: str, expected_version: int | None = None
) -> Row:
    return _transition(
        conn,
        schedule_id,
        "cancel",
        ScheduleState.CANCELLED,
        (ScheduleState.ACTIVE, ScheduleState.PAUSED),
        actor,
        expected_version,
    )


def trigger(
    conn: psycopg.Connection[Row],
    settings: Settings,
    schedule_id: uuid.UUID,
    actor: str,
    dispatcher: JobDispatcher | None = None,
) -> uuid.UUID:
    """Fire the schedule now, outside its timetable (also when paused); returns the new run's id."""
    dispatcher = dispatcher or JobDispatcher(settings)
    with conn.transaction():
        schedule = schedule_from_row(current_schedule(conn, schedule_id, None))
        if schedule.state in (ScheduleState.CANCELLED, ScheduleState.COMPLETED):
            raise InvalidTransition(f"cannot trigger schedule {schedule_id}: it is {schedule.state}")
        now = schedules.db_now(conn)
        run_id = uuid.uuid4()
        deadline = lease_expiry(now, schedule.timeout_ms)
        message = dispatcher.message(
            run_id=run_id,
            schedule_id=schedule_id,
            job=schedule.execution,
            scheduled_for=now,
            attempt=1,
            deadline=deadline,
        )
        scan.create_runs(
            conn,
            [
                NewRun(
                    id=run_id,
                    schedule_id=schedule_id,
                    app=schedule.app,
                    scheduled_for=now,
                    state=RunState.PENDING,
                    max_attempts=schedule.max_attempts,
                    lease_expires_at=deadline,
                    message=message,
                )
            ],
        )
        schedules.audit(conn, actor, "trigger", "schedule", str(schedule_id), None, {"run_id": str(run_id)})
        scan.notify_outbox(conn)
    return run_id
