"""Applying one batch of decoded commands to PostgreSQL, in one transaction.

The second step of the ingestor. The steps, in the batch's transaction:

1. Drop messages rejected before at the same position with the same bytes and Kafka timestamp (a
   batch replayed after a crash between the database commit and the Kafka offset commit): their
   decision stands.
2. Claim the command ids (one statement); an id applied before is a duplicate and is ignored,
   counted. A batch that holds an id twice (a producer's resend) is applied in runs without one,
   steps 2 to 5 for each run in turn, so that a copy is judged as it would be in a batch of its
   own: a duplicate when an earlier copy applied, afresh when that one was rejected.
3. Look up the keys the batch names and the apps it uses (two statements, keys locked), then decide
   every command in the batch's order against that view: a create of a key that exists is a
   conflict, any other operation on a key that does not is not found, and a create naming a
   handler its app does not declare is invalid.
4. Insert every accepted create in one multi-row statement (schedules, keys, audit rows).
5. Run the other operations in order, each through :mod:`scheduler.schedule.service` (update,
   pause, resume, cancel, trigger), in a savepoint of its own, so that versions, states and audit
   rows follow exactly the rules of the CLI.
6. Record the rejections (one statement), release the claims of commands rejected after being
   claimed, and hand the newly recorded rejections to ``before_commit`` (the ingestor publishes
   them there, so a rejection is on Kafka whenever it is in PostgreSQL).

Creates run before the other operations, yet the outcome is the one of applying the batch in
order: step 3 already decided, in order, which key each operation finds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from scheduler.config import Settings
from scheduler.domain.ids import new_id
from scheduler.ingest.commands import ValidCommand, rejection
from scheduler.scan.dispatch import JobDispatcher
from scheduler.schedule import service
from scheduler.schedule.service import InvalidTransition, ScheduleNotFound
from scheduler.schedule.spec import InvalidSchedule, check_declared_handler
from scheduler.store import ingest as store
from scheduler.store import schedules
from scheduler.store.ingest import CommandClaim, NewKeyedSchedule, Rejection
from scheduler.store.schedules import VersionConflict

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RecordedRejection:
    rejection: Rejection
    rejected_at: datetime


@dataclass
class BatchResult:
    applied: int = 0
    duplicates: int = 0
    replayed: int = 0
    """Messages skipped because they were decided (rejected) before: a replayed batch."""
    rejected: list[RecordedRejection] = field(default_factory=list)
    """The rejections recorded by this batch (each also handed to ``before_commit``)."""


@dataclass(frozen=True, slots=True)
class _Step:
    """A non-create command and the schedule it was decided to act on."""

    command: ValidCommand
    schedule_id: uuid.UUID


def _new_schedule(command: ValidCommand, schedule_id: uuid.UUID, now: datetime) -> NewKeyedSchedule:
    spec = command.spec
    assert spec is not None and command.payload is not None
    return NewKeyedSchedule(
        id=schedule_id,
        app=spec.app,
        schedule_key=command.command.schedule_key,
        name=spec.name or command.command.schedule_key,
        kind=spec.kind,
        cron=spec.cron,
        tz=spec.tz,
        run_at=spec.run_at,
        start_at=spec.start_at,
        end_at=spec.end_at,
        handler=spec.handler,
        payload=command.payload,
        max_attempts=spec.max_attempts,
        backoff_base_ms=spec.backoff_base_ms,
        backoff_max_ms=spec.backoff_max_ms,
        timeout_ms=spec.timeout_ms,
        misfire_policy=spec.misfire_policy,
        overlap_policy=spec.overlap_policy,
        jitter_ms=spec.jitter_ms,
        next_fire_at=service.first_fire(spec, schedule_id, now),
        actor=command.actor,
        traceparent=command.consumed.traceparent,
        description=spec.description,
    )


def _run_step(
    conn: psycopg.Connection[Row], settings: Settings, dispatcher: JobDispatcher, step: _Step
) -> None:
    command = step.command.command
    version = command.expected_version
    actor = step.command.actor
    match command.operation:
        case "update":
            assert step.command.spec is not None
            service.update_schedule(conn, step.schedule_id, step.command.spec, actor, version)
        case "pause":
            service.pause(conn, step.schedule_id, actor, version)
        case "resume":
            service.resume(conn, step.schedule_id, actor, version)
        case "cancel":
            service.cancel(conn, step.schedule_id, actor, version)
        case "trigger":
            service.trigger(conn, settings, step.schedule_id, actor, dispatcher, expected_version=version)
        case other:  # pragma: no cover - the Avro enum admits no other symbol
            raise InvalidSchedule(f"unknown operation {other!r}")


def _outcome(exc: Exception) -> tuple[str, str]:
    """The rejection code and reason of an operation that failed on its merits."""
    if isinstance(exc, ScheduleNotFound):
        return "not_found", str(exc)
    if isinstance(exc, VersionConflict | InvalidTransition):
        return "conflict", str(exc)
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return "invalid", first_line


# What a single command can cause without anything being wrong with the database or the network:
# such a failure rejects that command and leaves the rest of the batch alone.
_COMMAND_FAILURES = (
    ScheduleNotFound,
    VersionConflict,
    InvalidTransition,
    InvalidSchedule,
    psycopg.errors.IntegrityError,
    psycopg.errors.DataError,
)


class _Batch:
    def __init__(self, conn: psycopg.Connection[Row], settings: Settings, dispatcher: JobDispatcher) -> None:
        self.conn = conn
        self.settings = settings
        self.dispatcher = dispatcher
        self.rejections: list[Rejection] = []
        self.unclaim: list[str] = []
        self.applied = 0
        # The creates the plan counted on and the insert refused (a constraint, or another writer
        # that took the key while the batch waited for it): the id each would have had, and its key.
        self.uncreated: dict[uuid.UUID, tuple[str, str]] = {}

    def reject(self, command: ValidCommand, code: str, reason: str) -> None:
        self.rejections.append(rejection(code, reason, command.consumed, command.command))
        self.unclaim.append(command.command.command_id)

    def plan(
        self, commands: Sequence[ValidCommand]
    ) -> tuple[list[tuple[NewKeyedSchedule, ValidCommand]], list[_Step]]:
        """Step 3: decide, in order, what every command acts on: the creates (with their commands)
        and the other operations."""
        view = store.schedules_by_key(self.conn, (c.key for c in commands))
        apps = store.known_apps(self.conn, (c.command.app for c in commands))
        now = schedules.db_now(self.conn)
        creates: list[tuple[NewKeyedSchedule, ValidCommand]] = []
        steps: list[_Step] = []
        for command in commands:
            app, key = command.key
            if app not in apps:
                self.reject(
                    command,
                    "invalid",
                    f"unknown app {app!r}: create it first with `scheduler apps create {app}`",
                )
                continue
            existing = view.get(command.key)
            if command.command.operation == "create" and command.spec is not None:
                try:
                    check_declared_handler(command.spec.handler, app, apps[app])
                except InvalidSchedule as exc:
                    self.reject(command, "invalid", str(exc))
                    continue
            if command.command.operation != "create":
                if existing is None:
                    self.reject(command, "not_found", f"no schedule with key {key!r} in app {app!r}")
                else:
                    steps.append(_Step(command, existing))
                continue
            if existing is not None:
                self.reject(
                    command,
                    "conflict",
                    f"schedule key {key!r} already exists in app {app!r} (schedule {existing})",
                )
                continue
            schedule_id = new_id()
            try:
                creates.append((_new_schedule(command, schedule_id, now), command))
            except InvalidSchedule as exc:
                self.reject(command, "invalid", str(exc))
                continue
            view[command.key] = schedule_id
        return creates, steps

    def create(self, creates: list[tuple[NewKeyedSchedule, ValidCommand]]) -> None:
        """Step 4: one statement for every create; row by row only if that statement fails."""
        if not creates:
            return
        refused: set[uuid.UUID] = set()
        try:
            with self.conn.transaction():
                created = store.create_keyed_schedules(self.conn, [new for new, _ in creates])
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError):
            # A row the validation let through but a constraint refuses. Rare enough that finding it
            # one savepoint at a time costs nothing on the common path.
            created = set()
            for new, command in creates:
                try:
                    with self.conn.transaction():
                        created |= store.create_keyed_schedules(self.conn, [new])
                except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as exc:
                    self.reject(command, *_outcome(exc))
                    refused.add(new.id)
        for new, command in creates:
            if new.id in created:
                self.applied += 1
                continue
            self.uncreated[new.id] = (new.app, new.schedule_key)
            if new.id not in refused:
                # The key was taken by a concurrent transaction after our look-up.
                self.reject(
                    command,
                    "conflict",
                    f"schedule key {new.schedule_key!r} already exists in app {new.app!r}",
                )
        if created:
            schedules.notify_due(self.conn)

    def run(self, steps: list[_Step]) -> None:
        """Step 5: the other operations, in order, each in its own savepoint. One the plan aimed at a
        create the insert refused acts on what its key names now (another writer's schedule), or is
        not found, as it would be in a batch after that create's."""
        found = store.schedules_by_key(self.conn, set(self.uncreated.values())) if self.uncreated else {}
        for step in steps:
            key = self.uncreated.get(step.schedule_id)
            if key is not None:
                schedule_id = found.get(key)
                if schedule_id is None:
                    app, schedule_key = key
                    self.reject(
                        step.command, "not_found", f"no schedule with key {schedule_key!r} in app {app!r}"
                    )
                    continue
                step = _Step(step.command, schedule_id)
            try:
                _run_step(self.conn, self.settings, self.dispatcher, step)
            except _COMMAND_FAILURES as exc:
                self.reject(step.command, *_outcome(exc))
            else:
                self.applied += 1


def apply_batch(
    conn: psycopg.Connection[Row],
    settings: Settings,
    decoded: Sequence[ValidCommand | Rejection],
    *,
    dispatcher: JobDispatcher | None = None,
    before_commit: Callable[[list[RecordedRejection]], None] | None = None,
) -> BatchResult:
    """Apply a decoded batch (in consumption order) in one transaction; see the module's steps.

    ``before_commit`` runs inside the transaction with the rejections it records; if it raises,
    nothing of the batch is committed.
    """
    dispatcher = dispatcher or JobDispatcher(settings)
    result = BatchResult()
    with conn.transaction():
        decided = store.decided_sources(conn, {d.source: _identity_of(d) for d in decoded})
        pending = [d for d in decoded if d.source not in decided]
        result.replayed = len(decoded) - len(pending)
        rejections = [d for d in pending if isinstance(d, Rejection)]
        for segment in _segments([d for d in pending if isinstance(d, ValidCommand)]):
            claimed = store.claim_commands(
                conn,
                [
                    CommandClaim(
                        c.command.command_id,
                        c.command.app,
                        c.command.schedule_key,
                        c.command.operation,
                        c.source,
                    )
                    for c in segment
                ],
            )
            fresh = [c for c in segment if c.command.command_id in claimed]
            result.duplicates += len(segment) - len(fresh)
            batch = _Batch(conn, settings, dispatcher)
            creates, steps = batch.plan(fresh)
            batch.create(creates)
            batch.run(steps)
            store.unclaim_commands(conn, batch.unclaim)
            rejections += batch.rejections
            result.applied += batch.applied
        recorded = store.record_rejections(conn, rejections)
        result.rejected = [
            RecordedRejection(r, recorded[r.source])
            for r in _in_source_order(rejections)
            if r.source in recorded
        ]
        if before_commit is not None and result.rejected:
            before_commit(result.rejected)
    return result


def _segments(commands: Sequence[ValidCommand]) -> list[list[ValidCommand]]:
    """The batch's commands in runs in which no command id comes twice, each applied after the one
    before (steps 2 to 5): a copy of a command (a producer's resend) is then judged as it would be
    in a batch of its own, a duplicate when an earlier copy applied and afresh when it was rejected
    (its claim released), whatever the batch's bounds. Nearly every batch is one run."""
    segments: list[list[ValidCommand]] = [[]]
    ids: set[str] = set()
    for command in commands:
        if command.command.command_id in ids:
            segments.append([])
            ids.clear()
        ids.add(command.command.command_id)
        segments[-1].append(command)
    return segments if segments[0] else []


def _identity_of(decoded: ValidCommand | Rejection) -> tuple[bytes, int | None]:
    """What tells this message from another at its position: its bytes and Kafka timestamp."""
    if isinstance(decoded, ValidCommand):
        return decoded.consumed.value, decoded.consumed.timestamp_ms
    return decoded.original_bytes, decoded.source_timestamp_ms


def _in_source_order(rejections: Sequence[Rejection]) -> list[Rejection]:
    return sorted(rejections, key=lambda r: r.source)
