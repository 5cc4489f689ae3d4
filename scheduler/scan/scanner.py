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
from scheduler.domain.cron import CronSchedule
from scheduler.domain.policies import OverlapAction, overlap_action, plan_fires
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleState, SkipReason
from scheduler.scan.dispatch import JobDispatcher, attempt_history, lease_expiry
from scheduler.store import connect
from scheduler.store import scan as store
from scheduler.store.listen import Wakeup
from scheduler.store.scan import NewRun, NextAttempt

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


@dataclass(frozen=True)
class _Fires:
    fires: tuple[datetime, ...]
    misfire_skips: tuple[datetime, ...]
    next_fire_at: datetime | None


class Scanner:
    def __init__(self, settings: Settings, dispatcher: JobDispatcher | None = None) -> None:
        self.settings = settings
        self.dispatcher = dispatcher or JobDispatcher(settings)
        self.catchup_window = timedelta(seconds=settings.catchup_window_s)

    def scan_once(self, conn: psycopg.Connection[Row], now: datetime | None = None) -> ScanReport:
        """One batch in one transaction. ``now`` replaces the database clock in tests."""
        with conn.transaction():
            schedules = store.lease_due_schedules(conn, self.settings.scan_batch_size, now)
            retries = store.lease_due_retries(conn, self.settings.scan_batch_size, now)
            runs, updates = self._plan(conn, schedules)
            created = store.create_runs(conn, runs)
            store.advance_schedules(conn, updates)
            attempts = [self._next_attempt(row) for row in retries]
            store.redispatch_runs(conn, attempts)
            if created.queued or attempts:
                store.notify_outbox(conn)
        metrics.SCANNER_RUNS_CREATED.inc(created.created)
        metrics.SCANNER_RUNS_SKIPPED.inc(created.skipped)
        metrics.SCANNER_RETRIES_DISPATCHED.inc(len(attempts))
        for run in runs:
            if run.message is not None:
                metrics.SCANNER_LAG.observe((schedules[0]["scan_now"] - run.scheduled_for).total_seconds())
        return ScanReport(len(schedules), len(retries), created.created, created.skipped, created.queued)

    def _plan(
        self, conn: psycopg.Connection[Row], schedules: list[Row]
    ) -> tuple[list[NewRun], list[tuple[uuid.UUID, datetime | None, str]]]:
        guarded = [s["id"] for s in schedules if s["overlap_policy"] != OverlapPolicy.ALLOW]
        open_runs = store.open_runs_of(conn, guarded)
        runs: list[NewRun] = []
        updates: list[tuple[uuid.UUID, datetime | None, str]] = []
        for schedule in schedules:
            fires = self._fires(schedule)
            state = ScheduleState.ACTIVE if fires.next_fire_at is not None else ScheduleState.COMPLETED
            updates.append((schedule["id"], fires.next_fire_at, state))
            runs.extend(self._skipped(schedule, at, SkipReason.MISFIRE) for at in fires.misfire_skips)
            active, waiting = open_runs.get(schedule["id"], (0, 0))
            for at in fires.fires:
                action = overlap_action(OverlapPolicy(schedule["overlap_policy"]), active > 0, waiting > 0)
                if action is OverlapAction.SKIP:
                    runs.append(self._skipped(schedule, at, SkipReason.OVERLAP))
                    continue
                run_id = uuid.uuid4()
                deadline = lease_expiry(schedule["scan_now"], schedule["timeout_ms"])
                buffered = action is OverlapAction.BUFFER
                message = None
                if not buffered:
                    message = self.dispatcher.message(
                        run_id=run_id,
                        schedule_id=schedule["id"],
                        job=schedule,
                        scheduled_for=at,
                        attempt=1,
                        deadline=deadline,
                    )
                runs.append(
                    NewRun(
                        id=run_id,
                        schedule_id=schedule["id"],
                        app=schedule["app"],
                        scheduled_for=at,
                        state="pending",
                        max_attempts=schedule["max_attempts"],
                        lease_expires_at=None if buffered else deadline,
                        buffered=buffered,
                        message=message,
                    )
                )
                # The run just created is the "previous run" of the next fire in this batch.
                active += 0 if buffered else 1
                waiting += 1 if buffered else 0
        return runs, updates

    def _fires(self, schedule: Row) -> _Fires:
        now: datetime = schedule["scan_now"]
        due: datetime = schedule["next_fire_at"]
        policy = MisfirePolicy(schedule["misfire_policy"])
        end_at: datetime | None = schedule["end_at"]
        if schedule["kind"] != ScheduleKind.CRON:
            # One-shot: fires once, unless found later than the catch-up window under `skip`.
            late = now - due > self.catchup_window
            if late and policy is MisfirePolicy.SKIP:
                return _Fires((), (due,), None)
            return _Fires((due,), (), None)
        cron = CronSchedule.of(schedule["cron"], schedule["tz"], schedule_id=schedule["id"])
        plan = plan_fires(cron, due, now, policy, self.catchup_window)
        fires = plan.fires
        skips = tuple(s.scheduled_for for s in plan.skipped)
        following = plan.next_fire_at
        if end_at is not None:
            fires = tuple(at for at in fires if at <= end_at)
            skips = tuple(at for at in skips if at <= end_at)
            if following is not None and following > end_at:
                following = None
        return _Fires(fires, skips, following)

    def _skipped(self, schedule: Row, at: datetime, reason: SkipReason) -> NewRun:
        return NewRun(
            id=uuid.uuid4(),
            schedule_id=schedule["id"],
            app=schedule["app"],
            scheduled_for=at,
            state="skipped",
            max_attempts=schedule["max_attempts"],
            skip_reason=str(reason),
        )

    def _next_attempt(self, run: Row) -> NextAttempt:
        attempt = run["attempt"] + 1
        deadline = lease_expiry(run["scan_now"], run["timeout_ms"])
        message = self.dispatcher.message(
            run_id=run["id"],
            schedule_id=run["schedule_id"],
            job=run,
            scheduled_for=run["scheduled_for"],
            attempt=attempt,
            deadline=deadline,
            previous_attempts=attempt_history(run["history"]),
        )
        return NextAttempt(run["id"], attempt, deadline, message)

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
