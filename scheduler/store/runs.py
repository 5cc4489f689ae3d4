"""Reading runs and their attempts, for the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from scheduler.store.sql import query

Row = dict[str, Any]


def list_runs(
    conn: psycopg.Connection[Row],
    *,
    schedule_id: UUID | None = None,
    app: str | None = None,
    state: str | None = None,
    limit: int = 100,
) -> list[Row]:
    name = "list_runs" if schedule_id is None else "list_runs_of_schedule"
    return conn.execute(
        query(name), {"schedule_id": schedule_id, "app": app, "state": state, "limit": limit}
    ).fetchall()


def get_run(conn: psycopg.Connection[Row], run_id: UUID) -> Row | None:
    run = conn.execute(query("get_run"), {"id": run_id}).fetchone()
    return None if run is None else with_attempts(conn, [run])[0]


def states_of_runs(conn: psycopg.Connection[Row], run_ids: Sequence[UUID]) -> dict[UUID, Row]:
    """The ``app`` and ``state`` of each of the runs that exists, by id; ``state`` is
    ``undecodable`` for an id that names an undecodable dead letter (which has no run)."""
    rows = conn.execute(query("states_of_runs"), {"ids": list(run_ids)}).fetchall()
    return {row["id"]: row for row in rows}


def runs_held(conn: psycopg.Connection[Row], run_ids: Sequence[UUID]) -> set[UUID]:
    """Of ``run_ids``, those another transaction holds locked now (call it in a transaction that
    is rolled back: the others it locks itself)."""
    return {row["id"] for row in conn.execute(query("runs_held"), {"ids": list(run_ids)}).fetchall()}


def with_attempts(conn: psycopg.Connection[Row], rows: list[Row]) -> list[Row]:
    """Each run row with its ``attempts``: what `attempts` recorded and what the run's row holds
    (its applied start and success), in the order they happened."""
    attempts: dict[UUID, list[Row]] = {row["id"]: [] for row in rows}
    if rows:
        for attempt in conn.execute(query("history_of_runs"), {"run_ids": list(attempts)}).fetchall():
            attempts[attempt.pop("run_id")].append(attempt)
    return [row | {"attempts": attempts[row["id"]]} for row in rows]


def list_dead(
    conn: psycopg.Connection[Row],
    *,
    app: str | None = None,
    schedule_id: UUID | None = None,
    error_class: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    apps: Sequence[str] | None = None,
) -> list[Row]:
    """``apps``: only these apps' dead letters (None: any app's)."""
    params = {
        "app": app,
        "schedule_id": schedule_id,
        "error_class": error_class,
        "since": since,
        "until": until,
        "limit": limit,
    }
    return conn.execute(
        query("list_dead"), params | {"apps": None if apps is None else list(apps)}
    ).fetchall()
