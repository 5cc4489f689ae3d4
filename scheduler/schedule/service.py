"""Creating and changing schedules: the one path the CLI and the ingestor share.

Each operation runs in the caller's transaction, checks the version it read (optimistic locking),
writes ``audit_log``, and notifies the scanners when it makes something due sooner (create,
trigger, resume, update) so they wake at once instead of at their next poll.

A schedule the scanner could not compute is in state ``error`` with its reason. It leaves that
state by ``update`` (a new spec that computes makes it active), ``resume`` (when its stored spec
computes again, e.g. after the zone database was restored; refused with the reason otherwise),
``pause`` or ``cancel``. Resuming it follows its misfire policy for what it missed; an update
computes the next fire afresh from the new spec.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg

from scheduler.config import Settings
from scheduler.domain.cron import CronSchedule, InvalidCronExpression, NoFireTime
from scheduler.domain.ids import new_id
from scheduler.domain.policies import fires_of, next_fire_on_resume
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import OverlapPolicy, ScheduleKind, ScheduleState
from scheduler.kafka.topics import ensure_sized_topics
from scheduler.kafka.transport import TopicAdmin
from scheduler.scan.dispatch import JobDispatcher, attempt_deadline
from scheduler.schedule.spec import (
    InvalidSchedule,
    ScheduleSpec,
    check_declared_handler,
    encoded_payload,
    spec_columns,
    validate,
    validate_app_name,
    validate_handler_refs,
    validate_schedule_key,
)
from scheduler.store import ingest, scan, schedules
from scheduler.store.entities import schedule_from_row
from scheduler.store.ingest import NewKeyedSchedule
from scheduler.store.scan import NewRun
from scheduler.telemetry.tracing import SCHEDULE_CREATE, child_span, traceparent_of_span

Row = dict[str, Any]


class UnknownApp(InvalidSchedule):
    """The schedule names an app that was never created."""


class ScheduleNotFound(LookupError):
    pass


class InvalidTransition(ValueError):
    """E.g. resuming a cancelled schedule."""


class KeyConflict(ValueError):
    """The app already has a schedule of that key (``index``: which item of a batch)."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class AppConflict(ValueError):
    """An app exists already, with other settings than the ones asked for."""


DEFAULT_APP_PARTITIONS = 6


def create_app(
    conn: psycopg.Connection[Row],
    admin: TopicAdmin,
    settings: Settings,
    name: str,
    partitions: int | None,
    actor: str,
    handlers: Sequence[str] | None = None,
) -> Row:
    """Record the app and create its topic; an existing app is returned as it is (idempotent).

    ``partitions``: its topic's (None: :data:`DEFAULT_APP_PARTITIONS` for a new app, whatever an
    existing one has). ``handlers``: what the app's schedules may name (None: not declared).
    Creating an existing app with other partitions or another declaration is refused rather than
    silently ignored.
    """
    validate_app_name(name)
    if partitions is not None and not 1 <= partitions <= 10_000:
        raise InvalidSchedule(f"partitions must be 1 to 10000, got {partitions}")
    declared = None if handlers is None else validate_handler_refs(handlers)
    with conn.transaction():
        created = schedules.create_app(conn, name, partitions or DEFAULT_APP_PARTITIONS, declared)
        if created is not None:
            schedules.audit(conn, actor, "create", "app", name, None, created, app=name)
    app = created or schedules.get_app(conn, name)
    assert app is not None
    if partitions is not None and app["partitions"] != partitions:
        # Kafka adds partitions but never removes any, and adding them moves keys between them.
        raise AppConflict(
            f"app {name} exists with {app['partitions']} partitions; its topic's partitions are not "
            "changed by `apps create`"
        )
    if declared is not None and app["handlers"] != declared:
        raise AppConflict(
            f"app {name} exists and declares {_declaration(app['handlers'])}; change that with "
            f"`scheduler apps handlers {name} ...`"
        )
    # After the row is committed: a crash in between leaves an app whose topic the next create
    # (or `init`) makes, never a topic without an app.
    ensure_sized_topics(admin, [settings.jobs_topic(name)], partitions=app["partitions"])
    return app


def set_app_handlers(
    conn: psycopg.Connection[Row], name: str, handlers: Sequence[str] | None, actor: str
) -> Row:
    """Declare the handlers the app's schedules may name from now on (None: any, as undeclared).

    Existing schedules are left as they are: the workers refuse what they did not register anyway.
    """
    declared = None if handlers is None else validate_handler_refs(handlers)
    with conn.transaction():
        old = schedules.get_app(conn, name)
        if old is None:
            raise unknown_app(name)
        new = schedules.set_app_handlers(conn, name, declared)
        schedules.audit(conn, actor, "handlers", "app", name, old, new, app=name)
    assert new is not None
    return new


def unknown_app(name: str) -> UnknownApp:
    return UnknownApp(f"unknown app {name!r}: create it first with `scheduler apps create {name}`")


def _declaration(handlers: Sequence[str] | None) -> str:
    return "no handlers (any registered one)" if handlers is None else ", ".join(handlers)


def _app_of(conn: psycopg.Connection[Row], spec: ScheduleSpec) -> Row:
    """The spec's app, which must exist and admit the spec's handler."""
    app = schedules.get_app(conn, spec.app)
    if app is None:
        raise unknown_app(spec.app)
    check_declared_handler(spec.handler, spec.app, app["handlers"])
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
    except InvalidCronExpression as exc:
        # Validation checked the form of its H fields; the values they take for this id may still
        # name no date (H(28-31) in February picks the 30th for some ids).
        raise InvalidSchedule(
            f"cron expression {spec.cron!r}, with the values its H fields take for this schedule: "
            f"{exc.reason}; narrow the H range"
        ) from None
    except NoFireTime:
        raise InvalidSchedule(
            f"cron expression {spec.cron!r} never fires after {start.isoformat()}"
        ) from None
    if spec.end_at is not None and fire > spec.end_at:
        raise InvalidSchedule(f"cron expression {spec.cron!r} never fires before end_at")
    return fire


def create_schedule(
    conn: psycopg.Connection[Row],
    spec: ScheduleSpec,
    actor: str,
    schedule_id: uuid.UUID | None = None,
    schedule_key: str | None = None,
    enabled: bool = True,
) -> Row:
    """Create a schedule with its key (the id, when none is given), so that Kafka commands can
    address it; raises :class:`KeyConflict` when the app already has that key. The row returned
    carries ``schedule_key``. A schedule created disabled is paused.

    Its ``schedule.create`` span is a child of the current span: an API caller's, when the call
    came with one (:func:`~scheduler.telemetry.tracing.continuing`), else the root of a new trace.
    The schedule keeps that span's context, which a one-shot's run continues."""
    validate(spec)
    if schedule_key is not None:
        validate_schedule_key(schedule_key)
    schedule_id = schedule_id or new_id()
    attributes = {
        "scheduler.app": spec.app,
        "scheduler.schedule_id": str(schedule_id),
        "job.type": spec.handler,
    }
    with child_span(SCHEDULE_CREATE, attributes=attributes) as span:
        key = schedule_key or str(schedule_id)
        return _create(conn, spec, actor, schedule_id, key, traceparent_of_span(span), enabled)


def _create(
    conn: psycopg.Connection[Row],
    spec: ScheduleSpec,
    actor: str,
    schedule_id: uuid.UUID,
    schedule_key: str,
    traceparent: str,
    enabled: bool,
) -> Row:
    with conn.transaction():
        _app_of(conn, spec)
        now = schedules.db_now(conn)
        row = schedules.insert_schedule(
            conn,
            spec_columns(spec)
            | {
                "id": schedule_id,
                "name": spec.name or _default_name(spec, schedule_id),
                "next_fire_at": first_fire(spec, schedule_id, now),
                "traceparent": traceparent,
                "enabled": enabled,
            },
        )
        if not schedules.insert_schedule_key(conn, spec.app, schedule_key, schedule_id):
            raise KeyConflict(key_taken(conn, spec.app, schedule_key))
        row = row | {"schedule_key": schedule_key}
        schedules.audit(conn, actor, "create", "schedule", str(schedule_id), None, row, app=spec.app)
        schedules.notify_due(conn)
    return row


MAX_BATCH = 1000


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """One schedule of a batch create: its spec, its key (None: its id) and whether it is enabled."""

    spec: ScheduleSpec
    schedule_key: str | None = None
    enabled: bool = True


def key_taken(conn: psycopg.Connection[Row], app: str, schedule_key: str) -> str:
    """Why ``schedule_key`` cannot name a new schedule of ``app``: the schedule it names, and, when
    that one ended (cancelled, completed), that it keeps the key until the history retention
    deletes it, which a user re-creating it would not guess."""
    said = f"app {app!r} already has a schedule with key {schedule_key!r}"
    existing = schedules.schedule_id_by_key(conn, app, schedule_key)
    row = None if existing is None else schedules.get_schedule(conn, existing)
    if row is None:
        return said  # taken by a writer whose transaction has not committed
    if row["state"] in (ScheduleState.CANCELLED, ScheduleState.COMPLETED):
        return (
            f"{said} (schedule {existing}, {row['state']}: an ended schedule keeps its key until the "
            "history retention deletes it; give the new one another key)"
        )
    return f"{said} (schedule {existing}, {row['state']})"


class InvalidBatchItem(InvalidSchedule):
    """One schedule of a batch is invalid; nothing of the batch was created."""

    def __init__(self, index: int, reason: str, field: str | None = None) -> None:
        super().__init__(f"schedules[{index}]: {reason}", field)
        self.index = index


class UnknownBatchApp(InvalidBatchItem, UnknownApp):
    """One schedule of a batch names an app that was never created; nothing of the batch was."""


def create_schedules(conn: psycopg.Connection[Row], batch: Sequence[NewSchedule], actor: str) -> list[Row]:
    """Create every schedule of ``batch`` in one transaction, or none: a bulk load in a few
    statements whatever its size (apps, the inserts of schedules, keys and audit rows, the rows
    created), under one ``schedule.create`` span whose context every schedule keeps. Raises
    :class:`InvalidBatchItem` or :class:`KeyConflict` naming the first refused."""
    if not 1 <= len(batch) <= MAX_BATCH:
        raise InvalidSchedule(f"a batch holds 1 to {MAX_BATCH} schedules, got {len(batch)}")
    keys: dict[tuple[str, str], int] = {}
    ids: list[uuid.UUID] = []
    for index, item in enumerate(batch):
        try:
            validate(item.spec)
            if item.schedule_key is not None:
                validate_schedule_key(item.schedule_key)
        except InvalidSchedule as exc:
            raise InvalidBatchItem(index, str(exc), exc.field) from None
        ids.append(new_id())
        key = (item.spec.app, item.schedule_key or str(ids[-1]))
        if key in keys:
            raise KeyConflict(f"schedules[{index}]: key {key[1]!r} of app {key[0]!r} is given twice", index)
        keys[key] = index
    # One span for the batch, as one call: its context, stored on every schedule of it, is what each
    # one-shot's run continues (a caller's trace when the call carried one, as CreateSchedule's).
    apps = sorted({item.spec.app for item in batch})
    attributes = {"scheduler.app": apps[0]} if len(apps) == 1 else {}
    with (
        child_span(SCHEDULE_CREATE, attributes=attributes | {"scheduler.schedules": len(batch)}) as span,
        conn.transaction(),
    ):
        traceparent = traceparent_of_span(span)
        declared = ingest.known_apps(conn, set(apps))
        now = schedules.db_now(conn)
        new: list[NewKeyedSchedule] = []
        for index, (item, schedule_id) in enumerate(zip(batch, ids, strict=True)):
            spec = item.spec
            if spec.app not in declared:
                raise UnknownBatchApp(index, str(unknown_app(spec.app)))
            try:
                check_declared_handler(spec.handler, spec.app, declared[spec.app])
                next_fire_at = first_fire(spec, schedule_id, now)
                payload = encoded_payload(spec.payload)
            except InvalidSchedule as exc:
                raise InvalidBatchItem(index, str(exc), exc.field) from None
            columns = spec_columns(spec) | {
                "name": spec.name or _default_name(spec, schedule_id),
                "payload": payload,
            }
            new.append(
                NewKeyedSchedule(
                    **columns,
                    id=schedule_id,
                    schedule_key=item.schedule_key or str(schedule_id),
                    next_fire_at=next_fire_at,
                    actor=actor,
                    enabled=item.enabled,
                    traceparent=traceparent,
                )
            )
        created = ingest.create_keyed_schedules(conn, new)
        if len(created) < len(new):
            first = next(n for n in new if n.id not in created)
            index = keys[(first.app, first.schedule_key)]
            raise KeyConflict(f"schedules[{index}]: {key_taken(conn, first.app, first.schedule_key)}", index)
        schedules.notify_due(conn)
        rows = {row["id"]: row for row in schedules.schedules_with_keys(conn, ids)}
    return [rows[schedule_id] for schedule_id in ids]


def _default_name(spec: ScheduleSpec, schedule_id: uuid.UUID) -> str:
    # The id's random end: its first digits are the time it was made (UUIDv7), the same for every
    # schedule made within a minute.
    return f"{spec.kind}-{schedule_id.hex[-8:]}"


UPDATABLE = (ScheduleState.ACTIVE, ScheduleState.PAUSED, ScheduleState.ERROR)
# The spec's fields that decide when a schedule fires.
TIMETABLE = ("kind", "cron", "tz", "run_at", "start_at", "end_at")


def update_schedule(
    conn: psycopg.Connection[Row],
    schedule_id: uuid.UUID,
    spec: ScheduleSpec,
    actor: str,
    expected_version: int | None = None,
) -> Row:
    """Replace the whole spec, versioned and audited like the other operations.

    A new timetable (kind, cron, zone, run_at, start_at or end_at) computes the next fire afresh
    (also while paused, so that resuming judges misfires against the new timetable). One that
    stays as it was keeps the next fire: changing a payload or a name must not drop the fires a
    paused schedule missed, which its misfire policy judges on resume, nor a due one the scanner
    has not leased yet. A schedule in error whose new spec computes is active again; cancelled and
    completed schedules cannot be updated.
    """
    validate(spec)
    payload = encoded_payload(spec.payload)
    with conn.transaction():
        # Locked: the next fire it keeps is the one a scanner leaves, not one read before it advanced.
        old = current_schedule(conn, schedule_id, expected_version, lock="update")
        # The app first: a caller naming another app's schedule learns nothing of its state or runs.
        if old["app"] != spec.app:
            raise InvalidSchedule(f"schedule {schedule_id} belongs to app {old['app']!r}, not {spec.app!r}")
        if old["state"] not in UPDATABLE:
            raise _refusal(conn, old, "update")
        _app_of(conn, spec)
        columns = spec_columns(spec)
        # A run_at an earlier release stored on another kind than delayed was never read (and
        # stored_spec leaves it behind): not a timetable of its own to compare with.
        seen = old if old["kind"] == ScheduleKind.DELAYED else old | {"run_at": None}
        kept = (
            old["state"] != ScheduleState.ERROR
            and old["next_fire_at"] is not None
            and all(columns[name] == seen[name] for name in TIMETABLE)
        )
        if kept and _changes_nothing(seen, columns | {"name": spec.name or old["name"]}):
            # No new version and no audit entry: a client that sends what it read (a PATCH of a
            # form's every field) must not fail a concurrent writer's expected version for nothing.
            return old
        next_fire_at = old["next_fire_at"] if kept else first_fire(spec, schedule_id, schedules.db_now(conn))
        new = schedules.replace_schedule_spec(
            conn,
            columns
            | {
                "id": schedule_id,
                "version": old["version"],
                "name": spec.name or old["name"],
                "payload": payload,
                "next_fire_at": next_fire_at,
            },
        )
        if new is None:
            raise schedules.VersionConflict(
                f"schedule {schedule_id} was changed by someone else (expected version {old['version']})"
            )
        # Runs made while its policy guarded none are not guarded; now they decide its next fires.
        if (
            OverlapPolicy(new["overlap_policy"]).guards_runs
            and not OverlapPolicy(old["overlap_policy"]).guards_runs
        ):
            schedules.guard_open_runs(conn, schedule_id)
        schedules.audit(conn, actor, "update", "schedule", str(schedule_id), old, new, app=old["app"])
        if new["state"] == ScheduleState.ACTIVE:
            schedules.notify_due(conn)
    return new


def _changes_nothing(old: Row, columns: Mapping[str, Any]) -> bool:
    """Whether a spec's columns are those stored. Payloads compare as JSON text, where Python's
    equality would take ``true`` for ``1`` and ``1.0`` for ``1``."""
    if _json_text(columns["payload"]) != _json_text(old["payload"]):
        return False
    return all(value == old[name] for name, value in columns.items() if name != "payload")


def _json_text(value: Any) -> str:
    return json.dumps(_as_stored(value), sort_keys=True, ensure_ascii=False)


def _as_stored(value: Any) -> Any:
    """A payload as PostgreSQL gives it back: a whole number past a double's exact integers, sent
    as a float (1e16), is stored in full and read back as an integer. Smaller floats stay floats:
    1.0 is stored as 1.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) >= 2**53:
        return int(Decimal(repr(value)))  # its text as JSON carries it, as PostgreSQL reads it
    if isinstance(value, float) and value == 0:
        return 0.0  # -0.0 is stored as 0.0
    if isinstance(value, dict):
        return {key: _as_stored(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_stored(item) for item in value]
    return value


def current_schedule(
    conn: psycopg.Connection[Row],
    schedule_id: uuid.UUID,
    expected_version: int | None,
    *,
    lock: schedules.RowLock | None = None,
) -> Row:
    """``lock``: how the row is held until the transaction ends (see :func:`schedules.get_schedule`)."""
    row = schedules.get_schedule(conn, schedule_id, lock=lock)
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
            raise _refusal(conn, old, action)
        if old["state"] == ScheduleState.ERROR and target == ScheduleState.ACTIVE:
            _check_computes(conn, old, action)
        # A paused schedule keeps its next fire time; on resume its misfire policy judges what was
        # missed meanwhile, before the scanner sees it, and a fire still ahead is computed again
        # under the zone rules loaded now (a tzdata update may have moved its wall time).
        next_fire_at = None if target == ScheduleState.CANCELLED else old["next_fire_at"]
        if old["state"] == ScheduleState.PAUSED and target == ScheduleState.ACTIVE:
            fired = schedules.latest_fire(conn, schedule_id) if old["kind"] == ScheduleKind.CRON else None
            next_fire_at = next_fire_on_resume(
                schedule_from_row(old), schedules.db_now(conn), fired["scheduled_for"] if fired else None
            )
            if next_fire_at is None:  # skipped what it missed, and has nothing more to fire
                target = ScheduleState.COMPLETED
        new = schedules.set_schedule_state(conn, schedule_id, old["version"], target, next_fire_at)
        schedules.audit(conn, actor, action, "schedule", str(schedule_id), old, new, app=old["app"])
        if target == ScheduleState.ACTIVE:
            schedules.notify_due(conn)
    return new


def _refusal(conn: psycopg.Connection[Row], old: Row, action: str) -> InvalidTransition:
    """Why ``action`` cannot apply to the schedule in its state. A one-shot is completed once its
    fire is leased, up to the look-ahead before its instant, so the refusal says where that run is:
    "completed" alone would read as "it ran" to someone a second early."""
    reason = f"cannot {action} schedule {old['id']}: it is {old['state']}"
    if old["state"] == ScheduleState.COMPLETED and old["kind"] != ScheduleKind.CRON:
        run = schedules.latest_fire(conn, old["id"])
        if run is not None:
            reason += (
                f"; its fire is run {run['id']}, {run['state']}, due {run['scheduled_for'].isoformat()}"
                " (a fire leased already runs whatever its schedule does)"
            )
    return InvalidTransition(reason)


def _check_computes(conn: psycopg.Connection[Row], row: Row, action: str) -> None:
    """Refuse to make a schedule in error active while the scanner would fail on it again."""
    try:
        fires_of(schedule_from_row(row), schedules.db_now(conn))
    except Exception as exc:
        # The reason in words, never an exception's class: the API answers this text to clients.
        raise InvalidTransition(
            f"cannot {action} schedule {row['id']}: its fires still cannot be computed "
            f"({str(exc) or 'no reason given'}); fix it with `scheduler schedules update`"
        ) from None


def pause(
    conn: psycopg.Connection[Row], schedule_id: uuid.UUID, actor: str, expected_version: int | None = None
) -> Row:
    return _transition(
        conn,
        schedule_id,
        "pause",
        ScheduleState.PAUSED,
        (ScheduleState.ACTIVE, ScheduleState.ERROR),
        actor,
        expected_version,
    )


def resume(
    conn: psycopg.Connection[Row], schedule_id: uuid.UUID, actor: str, expected_version: int | None = None
) -> Row:
    """Paused or in error to active; from error only once its fires compute again."""
    return _transition(
        conn,
        schedule_id,
        "resume",
        ScheduleState.ACTIVE,
        (ScheduleState.PAUSED, ScheduleState.ERROR),
        actor,
        expected_version,
    )


def cancel(
    conn: psycopg.Connection[Row], schedule_id: uuid.UUID, actor: str, expected_version: int | None = None
) -> Row:
    return _transition(
        conn,
        schedule_id,
        "cancel",
        ScheduleState.CANCELLED,
        (ScheduleState.ACTIVE, ScheduleState.PAUSED, ScheduleState.ERROR),
        actor,
        expected_version,
    )


def trigger(
    conn: psycopg.Connection[Row],
    settings: Settings,
    schedule_id: uuid.UUID,
    actor: str,
    dispatcher: JobDispatcher | None = None,
    *,
    expected_version: int | None = None,
) -> uuid.UUID:
    """Fire the schedule now, outside its timetable (also when paused or in error: it needs no fire
    time); returns the new run's id. Like every new run it has no lease until a worker starts it.

    Versioned as the other operations: refused with :class:`~scheduler.store.schedules.VersionConflict`
    when ``expected_version`` is given and the schedule is at another. A trigger changes nothing of the
    schedule, so its version stays."""
    dispatcher = dispatcher or JobDispatcher(settings)
    with conn.transaction():
        # Locked: an update of its overlap policy (or any change of its version) waits until this
        # run is made under the one read.
        row = current_schedule(conn, schedule_id, expected_version, lock="share")
        schedule = schedule_from_row(row)
        if schedule.state in (ScheduleState.CANCELLED, ScheduleState.COMPLETED):
            raise InvalidTransition(f"cannot trigger schedule {schedule_id}: it is {schedule.state}")
        now = schedules.db_now(conn)
        run_id = new_id()
        while True:
            message = dispatcher.message(
                run_id=run_id,
                schedule_id=schedule_id,
                job=schedule.execution,
                scheduled_for=now,
                attempt=1,
                deadline=attempt_deadline(now, schedule.timeout_ms),
                traceparent=schedule.creation_traceparent,  # as the scanner's fires
            )
            run = NewRun(
                id=run_id,
                schedule_id=schedule_id,
                app=schedule.app,
                scheduled_for=now,
                state=RunState.PENDING,
                max_attempts=schedule.max_attempts,
                guarded=schedule.overlap_policy.guards_runs,
                message=message,
            )
            if run_id in scan.create_runs(conn, [run]).ids:
                break
            # A run of the schedule holds this instant already (a fire, or a trigger whose
            # transaction began in the same microsecond): a run is one per schedule and instant,
            # so this one takes the next, rather than answer the id of a run never made.
            now += timedelta(microseconds=1)
        schedules.audit(
            conn,
            actor,
            "trigger",
            "schedule",
            str(schedule_id),
            None,
            {"run_id": str(run_id)},
            app=schedule.app,
        )
        scan.notify_outbox(conn)
    return run_id
