"""The reconciler's statements: apply outcome events in batches, quarantine what cannot be applied,
sweep expired leases (queueing their next attempts or dead letters), and dispatch buffered fires.
Each takes a whole batch in one round trip."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from scheduler.store import execute_prepared
from scheduler.store.scan import Message, NewRun
from scheduler.store.sql import query

PREPARED_PLAN_MAX_EVENTS = 500
"""The largest batch ``apply_outcomes`` runs with the server's prepared (generic) plan, which takes
every batch for a few rows; a larger one is planned for its size. The prepared plan joins nothing
by a nested loop over two parts of the batch on the common path, and was as fast up to 2,000
events; the bound keeps a rarer path's (re-executions known by their end) within a few ms."""

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
    backoff_ms: int | None = None
    # The sender's app: an event of another app than its run's is stale, never applied.
    app: str = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class UndecodableLetter:
    event_id: str
    app: str
    cause: str
    error: str
    error_class: str
    worker: str | None
    """The worker that read the job and wrote the letter."""
    original_bytes: bytes
    topic: str | None
    partition: int | None
    offset: int | None


@dataclass(frozen=True, slots=True)
class SweeperLetter:
    """A dead letter naming a run without a worker: the lease sweeper's, whose run is dead in
    PostgreSQL already, if that death is on record."""

    event_id: str
    run_id: UUID
    attempt: int
    app: str


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A message set aside instead of applied, with why, its bytes and where it was read."""

    reason: str
    original_bytes: bytes
    topic: str
    partition: int
    offset: int
    run_id: UUID | None = None
    app: str | None = None


@dataclass(frozen=True, slots=True)
class Applied:
    applied: int = 0
    stale: int = 0
    duplicate: int = 0
    reexecution: int = 0  # starts of an attempt that had been started before
    finished: int = 0
    dead_apps: tuple[str, ...] = ()  # the app of each run this batch made dead
    cross_app: int = 0  # stale events sent as another app's than their run's (not in its attempts)
    appless_letters: int = 0  # run-less dead letters naming no app there is, quarantined instead of kept
    unswept_letters: int = 0  # worker-less dead letters of no expiry the sweeper recorded, quarantined
    cross_app_events: frozenset[str] = field(default_factory=frozenset, compare=False)
    """The ids of the events sent as another app's, which were stored nowhere."""
    not_applied: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Event id → stale, duplicate or reexecution, for each event that did not move its run."""
    db_now: datetime | None = field(default=None, compare=False)
    """PostgreSQL's clock as the events were applied (its transaction's start); None: no event."""

    def __add__(self, other: Applied) -> Applied:
        return Applied(
            self.applied + other.applied,
            self.stale + other.stale,
            self.duplicate + other.duplicate,
            self.reexecution + other.reexecution,
            self.finished + other.finished,
            self.dead_apps + other.dead_apps,
            self.cross_app + other.cross_app,
            self.appless_letters + other.appless_letters,
            unswept_letters=self.unswept_letters + other.unswept_letters,
            cross_app_events=self.cross_app_events | other.cross_app_events,
            not_applied={**self.not_applied, **other.not_applied},
            db_now=max((t for t in (self.db_now, other.db_now) if t is not None), default=None),
        )


def apply_outcomes(
    conn: psycopg.Connection[Row], events: Sequence[OutcomeEvent], lease_window_s: float
) -> Applied:
    """Apply ``events``; a started run's lease ends ``lease_window_s`` after its latest start or
    heartbeat. The events' text must be storable already (see :mod:`scheduler.domain.storable`)."""
    if not events:
        return Applied()
    row = execute_prepared(
        conn,
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
            "backoff_ms": [e.backoff_ms for e in events],
            "apps": [e.app for e in events],
            **batch_ranks(events),
            "lease_window_s": lease_window_s,
        },
        # Planning this statement costs about 3 ms of PostgreSQL's CPU, which a batch of a few events
        # (a reconciler that keeps up) pays in full: a batch up to PREPARED_PLAN_MAX_EVENTS runs the
        # server's prepared plan instead. `python -m bench.reconcile`, 1,000,000 runs in the table:
        # 10 events 1.1 ms a statement (planned for the batch: 3.8), 100 events 4.5 ms (5.1).
        prepare=len(events) <= PREPARED_PLAN_MAX_EVENTS,
    ).fetchone()
    assert row is not None
    return Applied(
        row["applied"],
        row["stale"],
        row["duplicate"],
        row["reexecution"],
        row["finished"],
        tuple(row["dead_apps"]),
        row["cross_app"],
        cross_app_events=frozenset(row["cross_app_events"]),
        not_applied=row["not_applied"],
        db_now=row["db_now"],
    )


def batch_ranks(events: Sequence[OutcomeEvent]) -> dict[str, list[Any]]:
    """How ``apply_outcomes`` tells copies and executions apart within a batch, numbered here rather
    than by three sorts of the batch in PostgreSQL, the one part that does not scale out.

    - ``first_copies``: whether the event is its id's first in the batch (a later one is a copy);
    - ``exec_ranks``: among the first copies of one run's attempt and kind, the execution's number
      (by worker and start instant) in the order their first events came;
    - ``copy_ranks``: the event's number among the first copies of its execution.

    A copy's ranks are 0: the statement reads them only of first copies."""
    first_copies: list[bool] = []
    exec_ranks: list[int] = []
    copy_ranks: list[int] = []
    ids: set[str] = set()
    # Per run, attempt, kind and app: each execution's [number, copies so far].
    executions: dict[tuple[UUID, int, str, str], dict[tuple[str | None, datetime | None], list[int]]] = {}
    for event in events:
        if event.event_id in ids:
            first_copies.append(False)
            exec_ranks.append(0)
            copy_ranks.append(0)
            continue
        ids.add(event.event_id)
        # By app too: another app's event (stale) never makes the run's own a second execution.
        numbered = executions.setdefault((event.run_id, event.attempt, event.kind, event.app), {})
        execution = numbered.setdefault((event.worker, event.started_at), [len(numbered) + 1, 0])
        execution[1] += 1
        first_copies.append(True)
        exec_ranks.append(execution[0])
        copy_ranks.append(execution[1])
    return {"first_copies": first_copies, "exec_ranks": exec_ranks, "copy_ranks": copy_ranks}


def notify_run_finished(conn: psycopg.Connection[Row]) -> None:
    conn.execute(query("notify_run_finished"))


def record_undecodable(conn: psycopg.Connection[Row], letters: Sequence[UndecodableLetter]) -> set[str]:
    """Keeps ``letters``; returns the event ids of those naming an app that does not exist, not kept."""
    if not letters:
        return set()
    rows = conn.execute(
        query("record_undecodable_dead_letters"),
        {
            "event_ids": [x.event_id for x in letters],
            "apps": [x.app for x in letters],
            "causes": [x.cause for x in letters],
            "errors": [x.error for x in letters],
            "error_classes": [x.error_class for x in letters],
            "workers": [x.worker for x in letters],
            "original_bytes": [x.original_bytes for x in letters],
            "topics": [x.topic for x in letters],
            "partitions": [x.partition for x in letters],
            "offsets": [x.offset for x in letters],
        },
    ).fetchall()
    return {r["event_id"] for r in rows}


def unswept_letters(conn: psycopg.Connection[Row], letters: Sequence[SweeperLetter]) -> set[str]:
    """The event ids of ``letters`` whose run's attempt the lease sweeper did not make dead."""
    if not letters:
        return set()
    rows = conn.execute(
        query("unswept_dead_letters"),
        {
            "event_ids": [x.event_id for x in letters],
            "run_ids": [x.run_id for x in letters],
            "attempts": [x.attempt for x in letters],
        },
    ).fetchall()
    return {r["event_id"] for r in rows}


def quarantine(conn: psycopg.Connection[Row], component: str, items: Sequence[Quarantined]) -> None:
    if not items:
        return
    conn.execute(
        query("quarantine_messages"),
        {
            "component": component,
            "reasons": [q.reason for q in items],
            "run_ids": [q.run_id for q in items],
            "apps": [q.app for q in items],
            "original_bytes": [q.original_bytes for q in items],
            "topics": [q.topic for q in items],
            "partitions": [q.partition for q in items],
            "offsets": [q.offset for q in items],
        },
    )


@dataclass(frozen=True, slots=True)
class LeasesDue:
    now: datetime
    """The database time (or the injected one) the answer holds for."""
    due: bool
    """Whether any started run's lease had passed by then."""


def expired_leases_due(conn: psycopg.Connection[Row], now: datetime | None = None) -> LeasesDue:
    row = conn.execute(query("expired_leases_due"), {"now": now}).fetchone()
    assert row is not None
    return LeasesDue(row["now"], row["due"])


def sweep_expired_leases(conn: psycopg.Connection[Row], limit: int, now: datetime, error: str) -> list[Row]:
    """Expire up to ``limit`` started runs whose lease passed before ``now``; each swept run comes
    back with its schedule's execution settings, its new state and its earlier failed attempts."""
    return conn.execute(
        query("sweep_expired_leases"), {"limit": limit, "now": now, "error": error}
    ).fetchall()


def queue_dead_letters(conn: psycopg.Connection[Row], letters: Sequence[tuple[UUID, int, Message]]) -> None:
    """Put dead letters, each (run id, attempt, message), in the outbox for the relay to publish."""
    if not letters:
        return
    conn.execute(
        query("queue_dead_letters"),
        {
            "topics": [m.topic for _, _, m in letters],
            "keys": [m.key for _, _, m in letters],
            "values": [m.value for _, _, m in letters],
            "headers": [Jsonb(m.headers) for _, _, m in letters],
            "run_ids": [run_id for run_id, _, _ in letters],
            "attempts": [attempt for _, attempt, _ in letters],
        },
    )


def releasable_buffered_runs(conn: psycopg.Connection[Row]) -> list[Row]:
    # Prepared: the buffer release runs this after every batch that ends a run, and planning it
    # (0.47 ms) cost eight times its usual run over an index of no rows. It takes no parameters,
    # so its one plan is the one it would get each time.
    return execute_prepared(conn, query("release_buffered_runs")).fetchall()


def dispatch_buffered_runs(conn: psycopg.Connection[Row], runs: Sequence[NewRun]) -> None:
    dispatchable = [r for r in runs if r.message is not None]
    if not dispatchable:
        return
    conn.execute(
        query("dispatch_buffered_runs"),
        {
            "ids": [r.id for r in dispatchable],
            "topics": [r.message.topic for r in dispatchable if r.message],
            "keys": [r.message.key for r in dispatchable if r.message],
            "values": [r.message.value for r in dispatchable if r.message],
            "headers": [Jsonb(r.message.headers) for r in dispatchable if r.message],
        },
    )
