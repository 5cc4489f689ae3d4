"""Dead runs for the operator: list them, and replay them through the normal pipeline; and runs whose
job messages were lost with Kafka's topics, sent again the same way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from scheduler.domain.run import FailedAttempt, Run
from scheduler.domain.schedule import ExecutionSettings
from scheduler.store.entities import execution_from_row, failed_attempts_from_json, run_from_row
from scheduler.store.scan import NextAttempt
from scheduler.store.sql import query

Row = dict[str, Any]


@dataclass(frozen=True)
class DeadRunFilter:
    """Which dead runs an operator means: every field left None (False) filters nothing."""

    app: str | None = None
    schedule_id: UUID | None = None
    error_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    force: bool = False
    """Also runs replayed before."""
    run_ids: tuple[UUID, ...] | None = None
    """Only these runs (each still has to be dead and match the other filters); None: any."""

    def params(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "schedule_id": self.schedule_id,
            "error_class": self.error_class,
            "since": self.since,
            "until": self.until,
            "force": self.force,
            "run_ids": list(self.run_ids) if self.run_ids is not None else None,
        }


@dataclass(frozen=True, slots=True)
class ResendableRun:
    """A run a replay (dead) or a redispatch (lost) may take, locked until its transaction ends."""

    run: Run
    job: ExecutionSettings
    """Its schedule's settings, with the run's own attempt budget."""
    budget: int
    """The schedule's max_attempts: how many more attempts a replay grants."""
    history: tuple[FailedAttempt, ...]
    """The newest 100 attempts that ended so far, oldest first (those that died before a replay
    included): its next job message carries them, for the dead letter's history."""
    now: datetime
    creation_traceparent: str | None = None
    """A one-shot schedule's creation trace, which every attempt of its run continues."""

    @classmethod
    def of(cls, row: Row) -> ResendableRun:
        """From a row of dead_runs_for_replay or lost_runs_for_redispatch."""
        return cls(
            run=run_from_row(row),
            job=execution_from_row(row),
            budget=row["budget"],
            history=failed_attempts_from_json(row["history"]),
            now=row["now"],
            creation_traceparent=row["creation_traceparent"],
        )


def dead_runs_for_replay(
    conn: psycopg.Connection[Row],
    where: DeadRunFilter,
    *,
    limit: int,
    replayed_since: datetime | None = None,
    max_bytes: int | None = None,
) -> list[ResendableRun]:
    """``replayed_since``: leave out runs replayed at or after it, even when forced. ``max_bytes``:
    no more payload bytes after the first run (None: no bound, for a dry run's whole list)."""
    rows = conn.execute(
        query("dead_runs_for_replay"),
        where.params() | {"replayed_since": replayed_since, "max_bytes": max_bytes, "limit": limit},
    ).fetchall()
    return [ResendableRun.of(row) for row in rows]


def count_dead_of_cancelled(conn: psycopg.Connection[Row], where: DeadRunFilter) -> int:
    """How many dead runs matching ``where`` :func:`dead_runs_for_replay` leaves out because their
    schedule is cancelled."""
    row = conn.execute(query("count_dead_of_cancelled"), where.params()).fetchone()
    return int(row["left_out"]) if row else 0


def count_dead_replayed_before(conn: psycopg.Connection[Row], where: DeadRunFilter) -> int:
    """How many dead runs matching ``where`` :func:`dead_runs_for_replay` leaves out because a replay
    took them before (none when ``where.force``)."""
    row = conn.execute(query("count_dead_replayed_before"), where.params()).fetchone()
    return int(row["left_out"]) if row else 0


def lost_runs_for_redispatch(
    conn: psycopg.Connection[Row], *, before: datetime, app: str | None, limit: int
) -> list[ResendableRun]:
    """Dispatched runs never started whose messages may have been lost with Kafka's topics."""
    rows = conn.execute(
        query("lost_runs_for_redispatch"), {"before": before, "app": app, "limit": limit}
    ).fetchall()
    return [ResendableRun.of(row) for row in rows]


def replay_runs(
    conn: psycopg.Connection[Row],
    attempts: Sequence[tuple[NextAttempt, int]],
    actor: str,
    *,
    action: str = "replay",
) -> list[UUID]:
    """Move each (dead or lost) run to its (next attempt, max_attempts), its message in the
    outbox, audited as ``action`` with the state it left; returns the ids of the runs moved."""
    if not attempts:
        return []
    row = conn.execute(
        query("replay_runs"),
        {
            "ids": [a.run_id for a, _ in attempts],
            "attempts": [a.attempt for a, _ in attempts],
            "max_attempts": [budget for _, budget in attempts],
            "lease_expires_at": [a.lease_expires_at for a, _ in attempts],
            "topics": [a.message.topic for a, _ in attempts],
            "keys": [a.message.key for a, _ in attempts],
            "values": [a.message.value for a, _ in attempts],
            "headers": [Jsonb(a.message.headers) for a, _ in attempts],
            "actor": actor,
            "action": action,
        },
    ).fetchone()
    return list(row["run_ids"]) if row else []
