"""The reconciler's statements: apply outcome events in batches, sweep expired leases, and
dispatch buffered fires. Each takes a whole batch in one round trip."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from scheduler.store.scan import NewRun
from scheduler.store.sql import query

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class OutcomeEvent:
    event_id: str
    run_id: UUID
    attempt: int
    kind: str  # started | heartbeat | succeeded | retry | dead
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None = None
    error_class: str | None = None
    result: Any = None
    not_before: datetime | None = None


@dataclass(frozen=True, slots=True)
class UndecodableLetter:
    event_id: str
    app: str
    cause: str
    error: str
    original_bytes: bytes
    topic: str | None
    partition: int | None
    offset: int | None


@dataclass(frozen=True, slots=True)
class Applied:
    applied: int = 0
    stale: int = 0
    duplicate: int = 0
    finished: int = 0
    dead_apps: tuple[str, ...] = ()  # the app of each run this batch made dead


def apply_outcomes(conn: psycopg.Connection[Row], events: Sequence[OutcomeEvent]) -> Applied:
    if not events:
        return Applied()
    row = conn.execute(
        query("apply_outcomes"),
        {
            "event_ids": [e.event_id for e in events],
            "run_ids": [e.run_id for e in events],
            "attempts": [e.attempt for e in events],
            "kinds": [e.kind for e in events],
            "workers": [e.worker for e in events],
            "started_at": [e.started_at for e in events],
            "finished_at": [e.finished_at for e in events],
            "errors": [e.error for e in events],
            "error_classes": [e.error_class for e in events],
            "results": [None if e.result is None else Jsonb(e.result) for e in events],
            "not_before": [e.not_before for e in events],
        },
    ).fetchone()
    assert row is not None
    return Applied(row["applied"], row["stale"], row["duplicate"], row["finished"], tuple(row["dead_apps"]))


def notify_run_finished(conn: psycopg.Connection[Row]) -> None:
    conn.execute(query("notify_run_finished"))


def record_undecodable(conn: psycopg.Connection[Row], letters: Sequence[UndecodableLetter]) -> None:
    if not letters:
        return
    conn.execute(
        query("record_undecodable_dead_letters"),
        {
            "event_ids": [x.event_id for x in letters],
            "apps": [x.app for x in letters],
            "causes": [x.cause for x in letters],
            "errors": [x.error for x in letters],
            "original_bytes": [x.original_bytes for x in letters],
            "topics": [x.topic for x in letters],
            "partitions": [x.partition for x in letters],
            "offsets": [x.offset for x in letters],
        },
    )


def sweep_expired_leases(conn: psycopg.Connection[Row], limit: int, now: datetime | None = None) -> list[Row]:
    return conn.execute(query("sweep_expired_leases"), {"limit": limit, "now": now}).fetchall()


def releasable_buffered_runs(conn: psycopg.Connection[Row]) -> list[Row]:
    return conn.execute(query("release_buffered_runs")).fetchall()


def dispatch_buffered_runs(conn: psycopg.Connection[Row], runs: Sequence[NewRun]) -> None:
    dispatchable = [r for r in runs if r.message is not None]
    if not dispatchable:
        return
    conn.execute(
        query("dispatch_buffered_runs"),
        {
            "ids": [r.id for r in dispatchable],
            "lease_expires_at": [r.lease_expires_at for r in dispatchable],
            "topics": [r.message.topic for r in dispatchable if r.message],
            "keys": [r.message.key for r in dispatchable if r.message],
            "values": [r.message.value for r in dispatchable if r.message],
            "headers": [Jsonb(r.message.headers) for r in dispatchable if r.message],
        },
    )
