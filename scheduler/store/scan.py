"""The scanner's statements: lease due work, create runs with their outbox rows, advance schedules.

Every function takes a whole batch and makes one round trip, whatever the batch size. What is
leased comes back as domain entities, each with the scan's clock (``now``): the database's, or the
one a test injected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from scheduler.domain.run import FailedAttempt, Run
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import ExecutionSettings, Schedule, ScheduleState, SkipReason
from scheduler.store.entities import (
    execution_from_row,
    failed_attempts_from_json,
    run_from_row,
    schedule_from_row,
)
from scheduler.store.sql import query

Row = dict[str, Any]

MAX_BATCH_PAYLOAD_BYTES = 16 * 1024 * 1024
"""Payload bytes a scan batch takes after its first schedule: a batch's memory is a few times its
payloads (read, the job message, the outbox row), and a scanner's limit is a few hundred MB."""


@dataclass(frozen=True, slots=True)
class Message:
    """An outbox row to be: where it goes and the bytes the relay publishes."""

    topic: str
    key: bytes
    value: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to create. It has no lease: a worker's start event gives it one."""

    id: UUID
    schedule_id: UUID
    app: str
    scheduled_for: datetime
    state: RunState  # one of INITIAL: pending or skipped
    max_attempts: int
    skip_reason: SkipReason | None = None
    buffered: bool = False
    guarded: bool = False
    """Its schedule's overlap policy is not allow: while open, it counts for the next fires."""
    message: Message | None = None  # None: nothing to dispatch now (skipped or buffered)
    delay_ms: int = 0
    """The fire's jitter: its message is not published before this many ms after the commit."""


@dataclass(frozen=True, slots=True)
class NextAttempt:
    run_id: UUID
    attempt: int
    lease_expires_at: datetime | None
    """Always None: an attempt has no lease until a worker starts it. :func:`redispatch_runs`
    ignores it; DLQ replay (``store.dlq.replay_runs``) still writes it, as None."""
    message: Message


@dataclass(frozen=True, slots=True)
class ScheduleError:
    """A leased schedule whose fires could not be computed, and why."""

    schedule_id: UUID
    error: str


@dataclass(frozen=True, slots=True)
class CreatedRuns:
    created: int
    skipped: int
    queued: int
    ids: frozenset[UUID] = frozenset()  # the runs really inserted (a fire made before is not)


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A due schedule, leased (row-locked) until the scan's transaction ends."""

    schedule: Schedule
    now: datetime


@dataclass(frozen=True, slots=True)
class DueRetry:
    """A run in ``retry_wait`` whose next attempt is due, leased until the scan's transaction ends."""

    run: Run
    job: ExecutionSettings
    """Its schedule's settings, with the run's own attempt budget."""
    history: tuple[FailedAttempt, ...]
    """The newest 100 attempts that failed so far, oldest first."""
    now: datetime
    creation_traceparent: str | None = None
    """A one-shot schedule's creation trace, which every attempt of its run continues."""


@dataclass(frozen=True, slots=True)
class ScheduleAdvance:
    """A scanned schedule's new next fire time, and its state (completed once it fires no more)."""

    schedule_id: UUID
    next_fire_at: datetime | None
    state: ScheduleState


def lease_schedules_params(
    limit: int,
    now: datetime | None = None,
    lookahead_s: float = 0.0,
    max_bytes: int = MAX_BATCH_PAYLOAD_BYTES,
) -> dict[str, Any]:
    """The parameters of ``lease_due_schedules`` (its plan is also timed by the benchmarks)."""
    return {"limit": limit, "now": now, "lookahead_s": lookahead_s, "max_bytes": max_bytes}


def lease_retries_params(
    limit: int, now: datetime | None = None, max_bytes: int = MAX_BATCH_PAYLOAD_BYTES
) -> dict[str, Any]:
    """The parameters of ``lease_due_retries`` (its plan is also timed by the benchmarks)."""
    return {"limit": limit, "now": now, "max_bytes": max_bytes}


def lease_due_schedules(
    conn: psycopg.Connection[Row],
    limit: int,
    now: datetime | None = None,
    lookahead_s: float = 0.0,
    max_bytes: int = MAX_BATCH_PAYLOAD_BYTES,
) -> list[DueSchedule]:
    """Due schedules, and those (overlap allow) whose next fire comes within ``lookahead_s``: at most
    ``limit``, and no more than ``max_bytes`` of payload after the first."""
    params = lease_schedules_params(limit, now, lookahead_s, max_bytes)
    rows = conn.execute(query("lease_due_schedules"), params).fetchall()
    return [DueSchedule(schedule_from_row(row), row["scan_now"]) for row in rows]


def open_runs_of(conn: psycopg.Connection[Row], schedule_ids: Sequence[UUID]) -> dict[UUID, tuple[int, int]]:
    """Per schedule: (unfinished runs, buffered runs). Schedules without either are absent."""
    if not schedule_ids:
        return {}
    rows = conn.execute(query("open_runs_of"), {"schedule_ids": list(schedule_ids)}).fetchall()
    return {row["schedule_id"]: (row["open_runs"], row["buffered_runs"]) for row in rows}


def create_runs(conn: psycopg.Connection[Row], runs: Sequence[NewRun]) -> CreatedRuns:
    if not runs:
        return CreatedRuns(0, 0, 0)
    row = conn.execute(
        query("create_runs"),
        {
            "ids": [r.id for r in runs],
            "schedule_ids": [r.schedule_id for r in runs],
            "apps": [r.app for r in runs],
            "scheduled_for": [r.scheduled_for for r in runs],
            "states": [r.state for r in runs],
            "max_attempts": [r.max_attempts for r in runs],
            "skip_reasons": [r.skip_reason for r in runs],
            "buffered": [r.buffered for r in runs],
            "guarded": [r.guarded for r in runs],
            "delay_ms": [r.delay_ms for r in runs],
            "topics": [r.message.topic if r.message else None for r in runs],
            "keys": [r.message.key if r.message else None for r in runs],
            "values": [r.message.value if r.message else None for r in runs],
            "headers": [Jsonb(r.message.headers) if r.message else None for r in runs],
        },
    ).fetchone()
    assert row is not None
    return CreatedRuns(row["created"], row["skipped"], row["queued"], frozenset(row["ids"]))


def advance_schedules(conn: psycopg.Connection[Row], advances: Sequence[ScheduleAdvance]) -> None:
    if not advances:
        return
    conn.execute(
        query("advance_schedules"),
        {
            "ids": [a.schedule_id for a in advances],
            "next_fire_at": [a.next_fire_at for a in advances],
            "states": [a.state for a in advances],
        },
    )


def set_schedules_error(conn: psycopg.Connection[Row], errors: Sequence[ScheduleError]) -> None:
    if not errors:
        return
    conn.execute(
        query("set_schedules_error"),
        {"ids": [e.schedule_id for e in errors], "errors": [e.error for e in errors]},
    )


def schedules_in_error(conn: psycopg.Connection[Row]) -> int:
    row = conn.execute(query("schedules_in_error")).fetchone()
    return 0 if row is None else int(row["n"])


def lease_due_retries(
    conn: psycopg.Connection[Row],
    limit: int,
    now: datetime | None = None,
    max_bytes: int = MAX_BATCH_PAYLOAD_BYTES,
) -> list[DueRetry]:
    """Due retries: at most ``limit``, and no more than ``max_bytes`` of payload after the first."""
    rows = conn.execute(query("lease_due_retries"), lease_retries_params(limit, now, max_bytes)).fetchall()
    return [
        DueRetry(
            run=run_from_row(row),
            job=execution_from_row(row),
            history=failed_attempts_from_json(row["history"]),
            now=row["scan_now"],
            creation_traceparent=row["creation_traceparent"],
        )
        for row in rows
    ]


def redispatch_runs(conn: psycopg.Connection[Row], attempts: Sequence[NextAttempt]) -> None:
    if not attempts:
        return
    conn.execute(
        query("redispatch_runs"),
        {
            "ids": [a.run_id for a in attempts],
            "attempts": [a.attempt for a in attempts],
            "topics": [a.message.topic for a in attempts],
            "keys": [a.message.key for a in attempts],
            "values": [a.message.value for a in attempts],
            "headers": [Jsonb(a.message.headers) for a in attempts],
        },
    )


def next_due_in(
    conn: psycopg.Connection[Row],
    now: datetime | None = None,
    lookahead_s: float = 0.0,
    *,
    slice_fires: int = 1,
    min_slice_s: float = 0.0,
    max_slice_s: float = 0.0,
) -> float | None:
    """Seconds until the scanner has work, by the database clock: the earliest retry, or the
    earliest schedule's lease time; None if nothing is scheduled. For overlap allow that is
    ``lookahead_s`` before its fire, plus the time it and the next ``slice_fires - 1`` allow fires
    span, held between ``min_slice_s`` and ``max_slice_s`` (by default no slice: ``lookahead_s``
    before the fire)."""
    params = {
        "now": now,
        "lookahead_s": lookahead_s,
        "slice_fires": slice_fires,
        "min_slice_s": min_slice_s,
        "max_slice_s": max_slice_s,
    }
    row = conn.execute(query("next_due_in"), params).fetchone()
    return None if row is None or row["seconds"] is None else float(row["seconds"])


def notify_outbox(conn: psycopg.Connection[Row]) -> None:
    conn.execute(query("notify_outbox"))
