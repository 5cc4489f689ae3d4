"""The store hands out the domain's entities: every column of ``schedules`` and ``runs`` lands in its
field with its domain type, and what the scanner and a replay lease comes back whole."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.domain.run import FailedAttempt, Run
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import (
    ExecutionSettings,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleKind,
    ScheduleState,
    SkipReason,
)
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, dlq, scan, schedules
from scheduler.store.entities import run_from_row, schedule_from_row
from scheduler.store.scan import NewRun

pytestmark = pytest.mark.integration

Row = dict[str, Any]


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Row]]:
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('ent', 1)")
        conn.commit()
        yield conn


def columns(conn: psycopg.Connection[Row], table: str) -> set[str]:
    # A generated column (runs.guard_schedule_id, for an index) is the table's own: nothing sets it.
    rows = conn.execute(
        "select column_name from information_schema.columns "
        " where table_name = %s and is_generated = 'NEVER'",
        (table,),
    ).fetchall()
    return {r["column_name"] for r in rows}


def immediate(conn: psycopg.Connection[Row], **fields: Any) -> Row:
    spec = ScheduleSpec(app="ent", handler="builtin:noop", kind="immediate", **fields)
    return service.create_schedule(conn, spec, "test")


def run_of(conn: psycopg.Connection[Row], schedule_id: uuid.UUID) -> Row:
    row = conn.execute("select * from runs where schedule_id = %s", (schedule_id,)).fetchone()
    assert row is not None
    return row


def test_the_entities_have_a_field_for_every_column(conn: psycopg.Connection[Row]) -> None:
    assert {f.name for f in dataclasses.fields(Schedule)} == columns(conn, "schedules")
    assert {f.name for f in dataclasses.fields(Run)} == columns(conn, "runs")


def test_a_due_schedule_is_leased_as_the_schedule_that_was_stored(conn: psycopg.Connection[Row]) -> None:
    spec = ScheduleSpec(
        app="ent", handler="builtin:noop", kind="cron", cron="*/10 * * * * *", tz="Europe/Berlin",
        payload={"invoice": [1, 2]}, max_attempts=5, misfire_policy="skip", overlap_policy="buffer_one",
    )  # fmt: skip
    row = service.create_schedule(conn, spec, "test")
    stored = schedule_from_row(row)
    assert (stored.kind, stored.state) == (ScheduleKind.CRON, ScheduleState.ACTIVE)
    assert (stored.misfire_policy, stored.overlap_policy) == (MisfirePolicy.SKIP, OverlapPolicy.BUFFER_ONE)
    now = row["next_fire_at"] + timedelta(seconds=1)
    with conn.transaction(force_rollback=True):
        [due] = scan.lease_due_schedules(conn, 10, now)
    assert due.schedule == stored and due.now == now
    assert due.schedule.execution == ExecutionSettings(
        app="ent",
        handler="builtin:noop",
        payload={"invoice": [1, 2]},
        timeout_ms=300_000,
        max_attempts=5,
        backoff_base_ms=1000,
        backoff_max_ms=300_000,
    )


def test_a_due_retry_carries_the_run_its_own_budget_and_its_failed_attempts(
    conn: psycopg.Connection[Row],
) -> None:
    schedule = immediate(conn, max_attempts=2, payload={"k": "v"})
    scan.create_runs(
        conn,
        [NewRun(uuid.uuid4(), schedule["id"], "ent", schedule["next_fire_at"], RunState.PENDING, 2)],
    )
    # Attempt 1 failed; a replay had raised the run's budget above its schedule's.
    failed_at = schedules.db_now(conn)
    run_id = run_of(conn, schedule["id"])["id"]
    conn.execute(
        "update runs set state = 'retry_wait', next_attempt_at = %s, max_attempts = 7 where id = %s",
        (failed_at, run_id),
    )
    conn.execute(
        "insert into attempts (run_id, attempt, kind, outcome, worker, started_at, finished_at, error, "
        "error_class) values (%s, 1, 'retry', 'applied', 'w1', %s, %s, 'boom', 'RuntimeError')",
        (run_id, failed_at - timedelta(seconds=3), failed_at),
    )
    conn.commit()
    with conn.transaction(force_rollback=True):
        [retry] = scan.lease_due_retries(conn, 10, failed_at + timedelta(seconds=1))
    assert retry.run == run_from_row(run_of(conn, schedule["id"]))
    assert retry.run.state is RunState.RETRY_WAIT and retry.run.attempt == 1
    assert retry.now == failed_at + timedelta(seconds=1)
    assert retry.job == ExecutionSettings("ent", "builtin:noop", {"k": "v"}, 300_000, 7, 1000, 300_000)
    assert retry.history == (
        FailedAttempt(1, "w1", failed_at - timedelta(seconds=3), failed_at, "boom", "RuntimeError"),
    )


def test_a_dead_run_for_replay_carries_the_budget_a_replay_grants(conn: psycopg.Connection[Row]) -> None:
    schedule = immediate(conn, max_attempts=4)
    scan.create_runs(
        conn,
        [NewRun(uuid.uuid4(), schedule["id"], "ent", schedule["next_fire_at"], RunState.PENDING, 4)],
    )
    conn.execute(
        "update runs set state = 'dead', attempt = 4, finished_at = now(), error = 'E: x' "
        "where schedule_id = %s",
        (schedule["id"],),
    )
    conn.commit()
    with conn.transaction(force_rollback=True):
        [dead] = dlq.dead_runs_for_replay(conn, dlq.DeadRunFilter(app="ent"), limit=10)
    assert dead.run == run_from_row(run_of(conn, schedule["id"]))
    assert (dead.run.state, dead.run.attempt, dead.budget, dead.job.max_attempts) == (RunState.DEAD, 4, 4, 4)


def test_run_states_and_skip_reasons_bind_and_read_back_as_their_enums(conn: psycopg.Connection[Row]) -> None:
    schedule = immediate(conn)
    fire = schedule["next_fire_at"]
    created = scan.create_runs(
        conn,
        [
            NewRun(
                uuid.uuid4(), schedule["id"], "ent", fire, RunState.SKIPPED, 3, skip_reason=SkipReason.OVERLAP
            )
        ],
    )
    conn.commit()
    assert (created.created, created.skipped, created.queued) == (0, 1, 0)
    run = run_from_row(run_of(conn, schedule["id"]))
    assert run.state is RunState.SKIPPED and run.skip_reason is SkipReason.OVERLAP
    assert run.finished_at is not None and not run.buffered
