"""The history's retention: finished runs, their attempts, and the finished schedules they leave,
deleted once they are older than the retention (``SCHEDULER_HISTORY_RETENTION_DAYS``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from scheduler.store.sql import query

Row = dict[str, Any]
# Where a walk over schedules starts: before every (time, id).
FIRST_ID = UUID(int=0)  # where a walk in id order starts
WALK_START = (datetime.fromisoformat("0001-01-01T00:00:00+00:00"), FIRST_ID)


@dataclass(frozen=True, slots=True)
class ExpiredRun:
    id: UUID
    scheduled_for: datetime


@dataclass(frozen=True, slots=True)
class DeletedRuns:
    runs: int
    attempts: int
    schedule_ids: list[UUID]


def expired_runs(
    conn: psycopg.Connection[Row],
    retention_s: float,
    limit: int,
    after: datetime | None = None,
    skip: Collection[UUID] = (),
) -> list[ExpiredRun]:
    """Up to ``limit`` of the oldest finished runs past the retention, locked until the
    transaction ends; from ``after`` on, and never those in ``skip``."""
    params = {"retention_s": retention_s, "limit": limit, "after": after, "skip": list(skip)}
    return [ExpiredRun(r["id"], r["scheduled_for"]) for r in conn.execute(query("expired_runs"), params)]


def delete_runs(conn: psycopg.Connection[Row], ids: Sequence[UUID]) -> DeletedRuns:
    row = conn.execute(query("delete_runs"), {"ids": list(ids)}).fetchone()
    assert row is not None  # aggregates always answer
    return DeletedRuns(row["runs"], row["attempts"], list(row["schedule_ids"]))


def cancelled_schedules_after(
    conn: psycopg.Connection[Row], retention_s: float, position: tuple[datetime, UUID], limit: int
) -> list[tuple[datetime, UUID]]:
    """The next ``limit`` schedules cancelled before the horizon, after ``position`` (the cancel's
    time and the id), as positions."""
    params = {"retention_s": retention_s, "updated_at": position[0], "id": position[1], "limit": limit}
    return [(r["updated_at"], r["id"]) for r in conn.execute(query("cancelled_schedules_after"), params)]


def schedules_after(conn: psycopg.Connection[Row], position: UUID, limit: int) -> list[UUID]:
    """The ids of the next ``limit`` schedules in id order after ``position``."""
    params = {"id": position, "limit": limit}
    return [r["id"] for r in conn.execute(query("schedules_after"), params)]


def delete_finished_schedules(conn: psycopg.Connection[Row], ids: Sequence[UUID], retention_s: float) -> int:
    """Those of ``ids`` that are finished, unchanged within the retention and without runs, with
    their keys; how many schedules went."""
    row = conn.execute(
        query("delete_finished_schedules"), {"ids": list(ids), "retention_s": retention_s}
    ).fetchone()
    assert row is not None
    return int(row["schedules"])
