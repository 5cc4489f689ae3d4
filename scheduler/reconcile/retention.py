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
stopped, for up to ``SERIES_BATCHES`` batches. When a series ends the look also walks a page of the
schedules cancelled before the horizon (their runs often went while the cancel was recent) and a
page of every schedule, a slow backstop for the rare finished one nothing else leads to. After a
batch that was not whole, or deleted nothing, the next look is a minute later; after a full series
the next starts again at the oldest runs at once. The lease sweeper's loop calls it after each
sweep, on a connection of its own, so every reconciler replica applies it and nothing it meets can
stop the sweep; SKIP LOCKED keeps it from waiting on the replicas, the pipeline and the API.

Poison: when PostgreSQL refuses to delete part of a batch for the rows' sake (the reconciler's
refusal classes, such as a table of the user's own that references a run, or an exception a trigger
of the user's raises), the
part is tried again in halves down to the rows it refuses; those are left out for an hour, with one
warning per look, and the rest goes on. Splitting stops after ``SPLIT_BUDGET_S`` per look, so a
batch full of such rows cannot hold the sweep or its locks for long. Any other error (a lost
connection, a timeout, a missing table) ends the look, which is tried again a minute later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import psycopg

from scheduler.reconcile import metrics
from scheduler.reconcile.reconciler import first_line, refused
from scheduler.store import retention as store
from scheduler.store.database import Database, Session

BATCH = 5000
SERIES_BATCHES = 20
WALK_PAGE = 10_000
LOOK_EVERY_S = 60.0
SPLIT_BUDGET_S = 2.0
REFUSED_FOR_S = 3600.0
MAX_REFUSED = 10_000
DAY_S = 86_400.0
# A trigger's own exception (raise_exception) is about the rows too, besides the data classes.
TRIGGER_REFUSED = "P0001"
Row = dict[str, Any]
T = TypeVar("T")


@dataclass(slots=True)
class Look:
    """What one look deleted; ``whole`` when its batch of runs was, so that more is due now."""

    runs: int = 0
    attempts: int = 0
    schedules: int = 0
    whole: bool = False
    refused: list[UUID] = field(default_factory=list)
    refusal: str = ""


def rows_at_fault(error: psycopg.Error) -> bool:
    """Whether PostgreSQL refused the rows themselves, so that splitting the batch finds them."""
    return refused(error) or error.sqlstate == TRIGGER_REFUSED


class HistoryRetention:
    """See the module docstring; ``step`` is called by a service's loop, as often as it likes, and
    never raises for PostgreSQL's sake."""

    def __init__(
        self,
        database: Database,
        retention_days: float,
        log: logging.Logger,
        batch: int = BATCH,
        walk_page: int = WALK_PAGE,
        every_s: float = LOOK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = Session(database)
        self.retention_s = retention_days * DAY_S
        self.log = log
        self.batch = batch
        self.walk_page = walk_page
        self.every_s = every_s
        self.clock = clock
        self._next_look = clock()
        self._after: datetime | None = None  # where a series of whole batches stands
        self._series = 0
        self._cancelled_walk = store.WALK_START
        self._backstop_walk = store.FIRST_ID
        self._refused: dict[UUID, float] = {}  # run or schedule id: until when it is left out

    def step(self) -> bool:
        """A look if one is due; True when its batch was whole, so that more is due right now."""
        if self.retention_s <= 0 or self.clock() < self._next_look:
            return False
        try:
            whole = self.look().whole
        except psycopg.Error as error:
            self.session.close()
            self._after, self._series = None, 0
            self._next_look = self.clock() + self.every_s
            self.log.warning(
                "history retention: look failed, tried again in %.0f s: %s", self.every_s, first_line(error)
            )
            return False
        self._next_look = self.clock() + (0.0 if whole else self.every_s)
        return whole

    def look(self) -> Look:
        conn = self.session.conn
        now = self.clock()
        self._refused = {key: until for key, until in self._refused.items() if until > now}
        look = Look()
        deadline = now + SPLIT_BUDGET_S
        with conn.transaction():
            # A deferred constraint of the user's would refuse the whole look at commit, where no
            # split can find the row at fault: checked at each statement instead.
            conn.execute("set constraints all immediate")
            expired = store.expired_runs(conn, self.retention_s, self.batch, self._after, self._refused)
            touched: set[UUID] = set()
            for deleted in self._apart(
                conn, [run.id for run in expired], lambda ids: store.delete_runs(conn, ids), look, deadline
            ):
                look.runs, look.attempts = look.runs + deleted.runs, look.attempts + deleted.attempts
                touched.update(deleted.schedule_ids)
            look.schedules += self._delete_schedules(conn, touched, look, deadline)
        self._count(look)
        # A whole batch means more is due now, unless the batch deleted nothing (all of it refused,
        # or splitting ran out of time): then the next look waits its minute like any other.
        look.whole = len(expired) >= self.batch and look.runs > 0
        self._series = self._series + 1 if look.whole else 0
        series_over = not look.whole or self._series >= SERIES_BATCHES
        self._after = expired[-1].scheduled_for if not series_over else None
        if series_over:
            # The next series starts again at the oldest runs, so that runs passed over (locked
            # then, or finished since) are not left behind for good.
            self._series = 0
            walked = Look()
            with conn.transaction():
                conn.execute("set constraints all immediate")
                walked.schedules = self._walk(conn, walked, self.clock() + SPLIT_BUDGET_S)
            self._count(walked)
            look.schedules += walked.schedules
        return look

    def close(self) -> None:
        self.session.close()

    def _walk(self, conn: psycopg.Connection[Row], look: Look, deadline: float) -> int:
        """A page of the schedules cancelled before the horizon and a page of every schedule."""
        cancelled = store.cancelled_schedules_after(
            conn, self.retention_s, self._cancelled_walk, self.walk_page
        )
        self._cancelled_walk = cancelled[-1] if len(cancelled) >= self.walk_page else store.WALK_START
        every = store.schedules_after(conn, self._backstop_walk, self.walk_page)
        self._backstop_walk = every[-1] if len(every) >= self.walk_page else store.FIRST_ID
        ids = {schedule_id for _, schedule_id in cancelled} | set(every)
        return self._delete_schedules(conn, ids, look, deadline)

    def _delete_schedules(
        self, conn: psycopg.Connection[Row], ids: set[UUID], look: Look, deadline: float
    ) -> int:
        wanted = sorted(ids - self._refused.keys())
        return sum(
            self._apart(
                conn,
                wanted,
                lambda part: store.delete_finished_schedules(conn, part, self.retention_s),
                look,
                deadline,
            )
        )

    def _apart(
        self,
        conn: psycopg.Connection[Row],
        ids: Sequence[UUID],
        delete: Callable[[Sequence[UUID]], T],
        look: Look,
        deadline: float,
    ) -> list[T]:
        """``delete(ids)`` in a savepoint; if PostgreSQL refuses it for the rows' sake, each half
        apart, down to the rows it refuses, which are left out for a while. Past ``deadline`` what
        is left waits for a later look."""
        if not ids:
            return []
        try:
            with conn.transaction():
                return [delete(ids)]
        except psycopg.Error as error:
            if not rows_at_fault(error):
                raise
            if len(ids) == 1:
                if len(self._refused) < MAX_REFUSED:
                    self._refused[ids[0]] = self.clock() + REFUSED_FOR_S
                look.refused.append(ids[0])
                look.refusal = look.refusal or first_line(error)
                return []
        if self.clock() > deadline:
            return []
        half = len(ids) // 2
        return self._apart(conn, ids[:half], delete, look, deadline) + self._apart(
            conn, ids[half:], delete, look, deadline
        )

    def _count(self, look: Look) -> None:
        """Once its transaction has committed: the metrics and one line for what it deleted, one
        warning for what it could not."""
        for table, count in (("runs", look.runs), ("attempts", look.attempts), ("schedules", look.schedules)):
            if count:
                metrics.HISTORY_DELETED.labels(table).inc(count)
        if look.runs or look.schedules:
            self.log.info(
                "history retention: %d runs, %d attempts and %d schedules past %g days deleted",
                look.runs,
                look.attempts,
                look.schedules,
                self.retention_s / DAY_S,
            )
        if look.refused:
            left_out = (
                f"left out for {REFUSED_FOR_S / 60:.0f} minutes"
                if len(self._refused) < MAX_REFUSED
                else f"tried again at each look ({MAX_REFUSED} rows are left out already)"
            )
            self.log.warning(
                "history retention: %d rows could not be deleted and are %s (the first: %s): %s",
                len(look.refused),
                left_out,
                look.refused[0],
                look.refusal,
            )
