"""The scanner: turns due schedules and due retries into runs and outbox rows.

One batch is one transaction: lease due schedules and due retries with ``FOR UPDATE SKIP LOCKED``
(oldest first), decide each schedule's fires with the domain (misfire and overlap policies, one-shot
completion, end bounds), create the runs and their messages in the outbox, advance
``next_fire_at``, and notify the relays, which see it all when the transaction commits. Any number
of scanners may run: SKIP LOCKED keeps them off each other's schedules, and UNIQUE (schedule_id,
scheduled_for) makes a fire impossible to create twice. Between batches the scanner sleeps until
the earliest due time by the database clock (at most ``max_scan_sleep_s``), and a NOTIFY from a
create, trigger or resume wakes it at once.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from scheduler.config import Settings
from scheduler.domain.policies import OverlapAction, fires_of, overlap_action
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import OverlapPolicy, ScheduleKind, SkipReason
from scheduler.runtime.service import Check, Service
from scheduler.scan import metrics
from scheduler.scan.dispatch import JobDispatcher, lease_expiry
from scheduler.store import scan as store
from scheduler.store.database import Database, Session
from scheduler.store.scan import DueRetry, DueSchedule, NewRun, NextAttempt, ScheduleAdvance

CHANNEL = "scheduler_due"
Row = dict[str, Any]


@dataclass(frozen=True)
class ScanReport:
    schedules: int
    retries: int
    created: int
    skipped: int
    queued: int


class Scanner(Service):
    transient = (psycopg.OperationalError,)

    def __init__(self, settings: Settings, database: Database, dispatcher: JobDispatcher) -> None:
        super().__init__("scanner")
        self.settings = settings
        self.database = database
        self.dispatcher = dispatcher
        self.catchup_window = timedelta(seconds=settings.catchup_window_s)
        self.session = Session(database, CHANNEL)
        self._due_in: float | None = None

    def checks(self) -> Sequence[Check]:
        return (self.database.check(),)

    def step(self) -> bool:
        conn = self.session.conn
        report = self.scan_once(conn)
        batch = self.settings.scan_batch_size
        with conn.transaction():
            self._due_in = store.next_due_in(conn)
        # Negative: the oldest due fire is that late, which is what the scan lag reports.
        metrics.SCAN_LAG.set(0.0 if self._due_in is None else max(0.0, -self._due_in))
        return report.schedules >= batch or report.retries >= batch

    def idle(self, stop: threading.Event) -> None:
        """Until the next due time by the database clock, a NOTIFY, or ``max_scan_sleep_s``."""
        sleep = self.settings.max_scan_sleep_s if self._due_in is None else self._due_in
        self.session.wait(min(max(sleep, 0.0), self.settings.max_scan_sleep_s), stop)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self.session.close()

    def scan_once(self, conn: psycopg.Connection[Row], now: datetime | None = None) -> ScanReport:
        """One batch in one transaction. ``now`` replaces the database clock in tests."""
        with conn.transaction():
            due = store.lease_due_schedules(conn, self.settings.scan_batch_size, now)
            retries = store.lease_due_retries(conn, self.settings.scan_batch_size, now)
            runs, advances = self._plan(conn, due)
            created = store.create_runs(conn, runs)
            store.advance_schedules(conn, advances)
            attempts = [self._next_attempt(retry) for retry in retries]
            store.redispatch_runs(conn, attempts)
            if created.queued or attempts:
                store.notify_outbox(conn)
        kinds: dict[UUID, ScheduleKind] = {d.schedule.id: d.schedule.kind for d in due}
        for run in runs:
            if run.state is RunState.SKIPPED:
                metrics.RUNS_SKIPPED.labels(str(run.skip_reason)).inc()
                continue
            metrics.JOBS_SCHEDULED.labels(run.app, str(kinds[run.schedule_id])).inc()
            if run.message is not None:
                metrics.FIRE_LAG.observe((due[0].now - run.scheduled_for).total_seconds())
        for retry in retries:
            metrics.JOBS_SCHEDULED.labels(retry.run.app, "retry").inc()
        return ScanReport(len(due), len(retries), created.created, created.skipped, created.queued)

    def _plan(
        self, conn: psycopg.Connection[Row], due: list[DueSchedule]
    ) -> tuple[list[NewRun], list[ScheduleAdvance]]:
        guarded = [d.schedule.id for d in due if d.schedule.overlap_policy is not OverlapPolicy.ALLOW]
        open_runs = store.open_runs_of(conn, guarded)
        runs: list[NewRun] = []
        advances: list[ScheduleAdvance] = []
        for leased in due:
            schedule = leased.schedule
            plan = fires_of(schedule, leased.now, self.catchup_window)
            advances.append(ScheduleAdvance(schedule.id, plan.next_fire_at, plan.schedule_state))
            runs.extend(self._skipped(leased, s.scheduled_for, s.reason) for s in plan.skipped)
            active, waiting = open_runs.get(schedule.id, (0, 0))
            for at in plan.fires:
                action = overlap_action(schedule.overlap_policy, active > 0, waiting > 0)
                if action is OverlapAction.SKIP:
                    runs.append(self._skipped(leased, at, SkipReason.OVERLAP))
                    continue
                run_id = uuid.uuid4()
                deadline = lease_expiry(leased.now, schedule.timeout_ms)
                buffered = action is OverlapAction.BUFFER
                message = None
                if not buffered:
                    message = self.dispatcher.message(
                        run_id=run_id,
                        schedule_id=schedule.id,
                        job=schedule.execution,
                        scheduled_for=at,
                        attempt=1,
                        deadline=deadline,
                        # A cron schedule's fires are traces of their own, not its creation's.
                        traceparent=None if schedule.kind is ScheduleKind.CRON else schedule.traceparent,
                    )
                runs.append(
                    NewRun(
                        id=run_id,
                        schedule_id=schedule.id,
                        app=schedule.app,
                        scheduled_for=at,
                        state=RunState.PENDING,
                        max_attempts=schedule.max_attempts,
                        lease_expires_at=None if buffered else deadline,
                        buffered=buffered,
                        message=message,
                    )
                )
                # The run just created is the "previous run" of the next fire in this batch.
                active += 0 if buffered else 1
                waiting += 1 if buffered else 0
        return runs, advances

    def _skipped(self, leased: DueSchedule, at: datetime, reason: SkipReason) -> NewRun:
        return NewRun(
            id=uuid.uuid4(),
            schedule_id=leased.schedule.id,
            app=leased.schedule.app,
            scheduled_for=at,
            state=RunState.SKIPPED,
            max_attempts=leased.schedule.max_attempts,
            skip_reason=reason,
        )

    def _next_attempt(self, retry: DueRetry) -> NextAttempt:
        run = retry.run
        attempt = run.attempt + 1
        deadline = lease_expiry(retry.now, retry.job.timeout_ms)
        message = self.dispatcher.message(
            run_id=run.id,
            schedule_id=run.schedule_id,
            job=retry.job,
            scheduled_for=run.scheduled_for,
            attempt=attempt,
            deadline=deadline,
            previous_attempts=retry.history,
        )
        return NextAttempt(run.id, attempt, deadline, message)
