"""The history's retention: what the pipeline has finished with is deleted once it is older than
``SCHEDULER_HISTORY_RETENTION_DAYS`` (30; 0 keeps everything).

Every job leaves a run, its attempts and, for a one-shot, a completed schedule: at 1,000 jobs/s
that is 86 million runs a day, so without a retention the tables, their indexes and every vacuum
grow without end. What goes: runs that succeeded, were skipped or cancelled and ended before the
horizon (the database's now() less the retention), their attempts, and finished schedules
(completed, cancelled) that have no run left and have not changed since before the horizon, with
their keys. Dead runs stay: they are the dead-letter queue, and go only once a replay has run them
to an end. Open runs, active and paused schedules, the audit log and the quarantine are never
touched.

A look deletes a batch of the oldest expired runs and judges the schedules they belonged to, in one
transaction; while batches come back whole they follow one another, each from where the last one
stopped. When a series ends, the look also judges a page of every schedule in creation order (a
crawl that comes round again at the end), for the finished schedules no deleted run led to; then
the next look is a minute later. The lease sweeper's loop calls it, on a connection of its own, so
every reconciler replica applies it and nothing it meets can stop the sweep; SKIP LOCKED keeps the
replicas, the pipeline and the API apart from it.

Poison: when PostgreSQL refuses to delete a piece of a batch (a table of the user's own that
references a run, a statement timeout), the piece is tried again in halves down to the one row it
refuses, which is left out, with a warning, until the process restarts; the rest goes on. A lost
connection ends the look, which is tried again at the next one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import psycopg

from scheduler.reconcile import metrics
from scheduler.store import retention as store
from scheduler.store.database import Database, Session

BATCH = 5000
CRAWL_PAGE = 10_000
LOOK_EVERY_S = 60.0
DAY_S = 86_400.0
Row = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Look:
    """What one look deleted; ``whole`` when its batch of runs was, so that more is due now."""

    runs: int
    attempts: int
    schedules: int
    whole: bool


def reason_of(error: psycopg.Error) -> str:
    """The server's one-line reason: its detail lines may quote the rows' keys."""
    return error.diag.message_primary or type(error).__name__


class HistoryRetention:
    """See the module docstring; ``step`` is called by a service's loop, as often as it likes, and
    never raises for PostgreSQL's sake."""

    def __init__(
        self,
        database: Database,
        retention_days: float,
        log: logging.Logger,
        batch: int = BATCH,
        crawl_page: int = CRAWL_PAGE,
        every_s: float = LOOK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = Session(database)
        self.retention_s = retention_days * DAY_S
        self.log = log
        self.batch = batch
        self.crawl_page = crawl_page
        self.every_s = every_s
        self.clock = clock
        self._next_look = clock()
        self._after: datetime | None = None  # where a series of whole batches stands
        self._crawled = store.CRAWL_START
        self._refused_runs: set[UUID] = set()
        self._refused_schedules: set[UUID] = set()

    def step(self) -> bool:
        """A look if one is due; True when its batch was whole, so that more is due right now."""
        if self.retention_s <= 0 or self.clock() < self._next_look:
            return False
        try:
            more = self.look().whole
        except psycopg.Error as error:
            self.session.close()
            self._after = None
            self._next_look = self.clock() + self.every_s
            self.log.warning(
                "history retention: look failed, tried again in %.0f s: %s", self.every_s, reason_of(error)
            )
            return False
        self._next_look = self.clock() + (0.0 if more else self.every_s)
        return more

    def look(self) -> Look:
        conn = self.session.conn
        runs = attempts = schedules = 0
        with conn.transaction():
            expired = store.expired_runs(conn, self.retention_s, self.batch, self._after, self._refused_runs)
            touched: set[UUID] = set()
            for deleted in self._apart(
                conn,
                [run.id for run in expired],
                lambda ids: store.delete_runs(conn, ids),
                self._refused_runs,
                "run",
            ):
                runs, attempts = runs + deleted.runs, attempts + deleted.attempts
                touched.update(deleted.schedule_ids)
            schedules += self._delete_schedules(conn, touched)
        whole = len(expired) >= self.batch
        self._after = expired[-1].scheduled_for if whole else None
        if not whole:
            with conn.transaction():
                schedules += self._crawl(conn)
        self._count(runs, attempts, schedules)
        return Look(runs, attempts, schedules, whole)

    def close(self) -> None:
        self.session.close()

    def _crawl(self, conn: psycopg.Connection[Row]) -> int:
        page = store.schedules_after(conn, self._crawled, self.crawl_page)
        self._crawled = page[-1] if len(page) >= self.crawl_page else store.CRAWL_START
        return self._delete_schedules(conn, {schedule_id for _, schedule_id in page})

    def _delete_schedules(self, conn: psycopg.Connection[Row], ids: set[UUID]) -> int:
        wanted = sorted(ids - self._refused_schedules)
        return sum(
            self._apart(
                conn,
                wanted,
                lambda part: store.delete_finished_schedules(conn, part, self.retention_s),
                self._refused_schedules,
                "schedule",
            )
        )

    def _apart(
        self,
        conn: psycopg.Connection[Row],
        ids: Sequence[UUID],
        delete: Callable[[Sequence[UUID]], T],
        refused: set[UUID],
        what: str,
    ) -> list[T]:
        """``delete(ids)`` in a savepoint; if PostgreSQL refuses it, each half apart, down to the
        one row it refuses, which is added to ``refused`` and left as it is."""
        if not ids:
            return []
        try:
            with conn.transaction():
                return [delete(ids)]
        except psycopg.Error as error:
            if conn.broken or conn.closed:
                raise
            if len(ids) == 1:
                refused.add(ids[0])
                self.log.warning(
                    "history retention: %s %s cannot be deleted and is kept until a restart: %s",
                    what,
                    ids[0],
                    reason_of(error),
                )
                return []
        half = len(ids) // 2
        return self._apart(conn, ids[:half], delete, refused, what) + self._apart(
            conn, ids[half:], delete, refused, what
        )

    def _count(self, runs: int, attempts: int, schedules: int) -> None:
        for table, count in (("runs", runs), ("attempts", attempts), ("schedules", schedules)):
            if count:
                metrics.HISTORY_DELETED.labels(table).inc(count)
        if runs or schedules:
            self.log.info(
                "history retention: %d runs, %d attempts and %d schedules past %g days deleted",
                runs,
                attempts,
                schedules,
                self.retention_s / DAY_S,
            )
