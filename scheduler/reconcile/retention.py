"""The history's retention: what the pipeline has finished with is deleted once it is older than
``SCHEDULER_HISTORY_RETENTION_DAYS`` (30; 0 keeps everything).

Every job leaves a run, its attempts and, for a one-shot, a completed schedule: at 1,000 jobs/s
that is 86 million runs a day, so without a retention the tables, their indexes and every vacuum
grow without end. What goes: runs that succeeded, were skipped or cancelled and ended before the
horizon (the database's now() less the retention), their attempts, and the finished schedules
(completed one-shots, deleted schedules) those runs leave with no run at all, with their keys.
Dead runs stay: they are the dead-letter queue, and go only once a replay has run them to an end.
Open runs, active and paused schedules, the audit log and the quarantine are never touched.

It is one statement a batch (``delete_expired_history``), a bounded number of runs each, so that
it never holds many locks for long; batches follow one another while a whole batch was due, then
it looks again a minute later. The lease sweeper's loop runs it, the reconciler process's other
janitor of runs, so every reconciler replica applies it; SKIP LOCKED keeps them apart. A batch
PostgreSQL refuses is rolled back and tried again at the next look, and never stops the sweeper.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from scheduler.reconcile import metrics
from scheduler.store import retention as store
from scheduler.store.retention import Deleted

BATCH = 5000
LOOK_EVERY_S = 60.0
DAY_S = 86_400.0
Row = dict[str, Any]


class HistoryRetention:
    """See the module docstring; ``step`` is called by a service's loop, as often as it likes."""

    def __init__(
        self,
        retention_days: float,
        log: logging.Logger,
        batch: int = BATCH,
        every_s: float = LOOK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retention_s = retention_days * DAY_S
        self.log = log
        self.batch = batch
        self.every_s = every_s
        self.clock = clock
        self._next_look = clock()

    def step(self, conn: psycopg.Connection[Row]) -> bool:
        """A batch if one is due; True when it was whole, so that more may be due right now. A
        lost connection is raised (the caller's service rebuilds it); any other refusal is logged,
        and waits for the next look."""
        if self.retention_s <= 0 or self.clock() < self._next_look:
            return False
        try:
            deleted = self.delete_batch(conn)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as error:
            self._next_look = self.clock() + self.every_s
            self.log.warning(
                "history retention: batch refused, tried again in %.0f s: %s", self.every_s, error
            )
            return False
        more = deleted.runs >= self.batch
        self._next_look = self.clock() + (0.0 if more else self.every_s)
        return more

    def delete_batch(self, conn: psycopg.Connection[Row]) -> Deleted:
        with conn.transaction():
            deleted = store.delete_expired_history(conn, self.retention_s, self.batch)
        for table, count in (
            ("runs", deleted.runs),
            ("attempts", deleted.attempts),
            ("schedules", deleted.schedules),
        ):
            if count:
                metrics.HISTORY_DELETED.labels(table).inc(count)
        if deleted.runs:
            self.log.info(
                "history retention: %d runs, %d attempts and %d schedules past %g days deleted",
                deleted.runs,
                deleted.attempts,
                deleted.schedules,
                self.retention_s / DAY_S,
            )
        return deleted
