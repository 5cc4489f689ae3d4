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

import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from scheduler import metrics
from scheduler.config import Settings
from scheduler.domain.policies import OverlapAction, fires_of, overlap_action
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import OverlapPolicy, SkipReason
from scheduler.scan.dispatch import JobDispatcher, lease_expiry
from scheduler.store import connect
from scheduler.store import scan as store
from scheduler.store.listen import Wakeup
from scheduler.store.scan import DueRetry, DueSchedule, NewRun, NextAttempt, ScheduleAdvance

log = logging.getLogger(__name__)

CHANNEL = "scheduler_due"
Row = dict[str, Any]


@dataclass(frozen=True)
class ScanReport:
    schedules: int
    retries: int
    created: int
    skipped: int
    queued: int


class Scanner:
    def __init__(self, settings: Settings, dispatcher: JobDispatcher | None = None) -> None:
        self.settings = settings
        self.dispatcher = dispatcher or JobDispatcher(settings)
        self.catchup_window = timedelta(seconds=settings.catchup_window_s)

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
        metrics.SCANNER_RUNS_CREATED.inc(created.created)
        metrics.SCANNER_RUNS_SKIPPED.inc(created.skipped)
        metrics.SCANNER_RETRIES_DISPATCHED.inc(len(attempts))
        for run in runs:
            if run.message is not None:
                metrics.SCANNER_LAG.observe((due[0].now - run.scheduled_for).total_seconds())
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

    def run(self, stop: threading.Event) -> None:
        """Scan until ``stop`` is set, sleeping until the next due time or a NOTIFY."""
        conn: psycopg.Connection[Row] | None = None
        wakeup: Wakeup | None = None
        backoff = 0.2
        while not stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = connect(self.settings.database_url)
                if wakeup is None:
                    wakeup = Wakeup(self.settings.database_url, CHANNEL)
                report = self.scan_once(conn)
                if report.schedules >= self.settings.scan_batch_size or (
                    report.retries >= self.settings.scan_batch_size
                ):
                    continue  # more is due right now
                with conn.transaction():
                    due_in = store.next_due_in(conn)
                sleep = self.settings.max_scan_sleep_s if due_in is None else due_in
                wakeup.wait(min(max(sleep, 0.0), self.settings.max_scan_sleep_s), stop)
                backoff = 0.2
            except psycopg.OperationalError as exc:
                log.warning("database unavailable (%s); retrying in %.1f s", exc, backoff)
                for closable in (conn, wakeup):
                    if closable is not None:
                        closable.close()
                conn, wakeup = None, None
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        for closable in (conn, wakeup):
            if closable is not None:
                closable.close()
