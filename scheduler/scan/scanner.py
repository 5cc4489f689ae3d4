"""The scanner: turns due schedules and due retries into runs and outbox rows.

One batch is one transaction: lease due schedules and due retries with ``FOR UPDATE SKIP LOCKED``
(oldest first), decide each schedule's fires with the domain (misfire and overlap policies, one-shot
completion, end bounds), create the runs and their messages in the outbox, advance
``next_fire_at``, and notify the relays, which see it all when the transaction commits. Any number
of scanners may run: SKIP LOCKED keeps them off each other's schedules, and UNIQUE (schedule_id,
scheduled_for) makes a fire impossible to create twice. Between batches the scanner sleeps until
the earliest due time by the database clock (at most ``max_scan_sleep_s``), and a NOTIFY from a
create, trigger or resume wakes it at once.

Look-ahead (``lookahead_s``, 1 s by default): a schedule whose overlap policy is ``allow`` is
leased that long before its next fire, and its fires up to now + look-ahead become runs and outbox
rows at once, each run's ``scheduled_for`` its fire instant. The job then reaches a worker before
that instant and waits there for it, so the start lag no longer includes the scan, the relay,
Kafka and the worker's fetch. ``skip`` and ``buffer_one`` decide on the previous run's state, known
only at the fire's instant: those schedules are leased once due, as are retries. The scan takes
every such fire within the whole look-ahead, and the sleep after it ends when the next one is a
*slice* less than the look-ahead away: a steady rate of fires is one scan (one transaction, and one
batch for the relay) per slice, each fire leased between the look-ahead less a slice and the whole
look-ahead ahead of its instant. The slice is the time the next :data:`SLICE_FIRES` allow fires
span, as the schedules table has them (``next_due_in``), held between a tenth and half of the
window: half while fires are sparse, shorter when they are dense, so that each scan's batch stays
about that size. The batch crosses the scanner, PostgreSQL, the relay, Kafka and the workers within
a few milliseconds of each other, and the bigger that burst, the later the fires due while it lasts
start. Read from the table rather than from what this scanner leased before, the slice is the same
for every scanner and after any early wake-up (a NOTIFY). Scanners that wake together for the same
slice do not split it: one leases it, and the others, finding it locked, look again after
:data:`LOCKED_DUE_PAUSE_S`. (The table holds each schedule's next fire only, so a cron that fires
several times within a slice counts once.)
Waking for each fire as it entered the window would scan once per fire (a transaction and several
statements per job) whatever the rate.

A schedule whose fires cannot be computed (a zone the zone database no longer has, an expression
the cron library now refuses, anything that raises while planning it) is quarantined in the same
transaction: state ``error`` with the reason, counted, and the rest of the batch goes on. Without
that, the schedule would stay the oldest due one and stop every scan.

Runs and retries are dispatched without a lease: their attempt's clock starts when a worker starts
the job. A fire of a schedule with jitter has its outbox row held back by a random delay of up to
``jitter_ms`` after the fire's instant (leased ahead or not), which spreads schedules that share a
fire time.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from scheduler.config import Settings
from scheduler.domain.ids import new_id
from scheduler.domain.policies import OverlapAction, fires_of, overlap_action
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import ScheduleKind, SkipReason
from scheduler.domain.storable import capped_text
from scheduler.runtime.service import Check, Service
from scheduler.scan import metrics
from scheduler.scan.dispatch import JobDispatcher, attempt_deadline
from scheduler.store import scan as store
from scheduler.store.database import Database, Session
from scheduler.store.scan import (
    DueRetry,
    DueSchedule,
    NewRun,
    NextAttempt,
    ScheduleAdvance,
    ScheduleError,
)

CHANNEL = "scheduler_due"
Row = dict[str, Any]
# A scan's slice of the look-ahead (see the docstring): about this many fires, at most half the
# window (sparse fires: few scans), at least a tenth of it (each scan has its cost). Measured at
# 1,000 fires/s with a 1 s look-ahead (bench/README.md): 500 fires a scan started p99 5-7 ms late,
# 200 fires 2.5-3 ms, 100 fires 2.4-2.8 ms with 15 % more PostgreSQL CPU per fire than 200.
SLICE_FIRES = 200
MIN_SLICE_SHARE = 0.1
MAX_SLICE_SHARE = 0.5
# How often the gauge of schedules in error is refreshed (a count over the schedules table).
ERROR_GAUGE_EVERY_S = 15.0
# Due work that a scan could not lease is locked by another transaction: another scanner's batch
# (scanners wake together for the same slice, and one of them takes it) or a user's update of the
# schedule. It is looked at again after this pause rather than at once, which spun, two
# transactions at a time, until that transaction ended.
LOCKED_DUE_PAUSE_S = 0.02


@dataclass(frozen=True)
class ScanReport:
    schedules: int
    retries: int
    created: int
    skipped: int
    queued: int
    errored: int = 0


@dataclass
class _Plan:
    runs: list[NewRun]
    advances: list[ScheduleAdvance]
    errors: list[ScheduleError]


class Scanner(Service):
    transient = (psycopg.OperationalError,)

    def __init__(self, settings: Settings, database: Database, dispatcher: JobDispatcher) -> None:
        super().__init__("scanner")
        self.settings = settings
        self.database = database
        self.dispatcher = dispatcher
        self.catchup_window = timedelta(seconds=settings.catchup_window_s)
        self.lookahead = timedelta(seconds=settings.lookahead_s)
        self.session = Session(database, CHANNEL)
        self.random = random.Random()
        self._due_in: float | None = None
        # The last ``_due_in`` and the monotonic time it was read: the scan lag a scrape sees is
        # aged from it, so that it keeps growing while the database cannot be asked (an outage, a
        # stuck step) instead of holding the last value read.
        self._due_at: tuple[float, float] | None = None
        self._leased_nothing = False
        self._error_gauge_at = float("-inf")

    def checks(self) -> Sequence[Check]:
        return (self.database.check(),)

    def step(self) -> bool:
        conn = self.session.conn
        report = self.scan_once(conn)
        self._leased_nothing = report.schedules == 0 and report.retries == 0
        lookahead_s = self.settings.lookahead_s
        batch = self.settings.scan_batch_size
        refresh = report.errored > 0 or time.monotonic() - self._error_gauge_at >= ERROR_GAUGE_EVERY_S
        with conn.transaction():
            self._due_in = store.next_due_in(
                conn,
                lookahead_s=lookahead_s,
                slice_fires=SLICE_FIRES,
                min_slice_s=MIN_SLICE_SHARE * lookahead_s,
                max_slice_s=MAX_SLICE_SHARE * lookahead_s,
            )
            if refresh:
                metrics.SCHEDULES_IN_ERROR.set(store.schedules_in_error(conn))
                self._error_gauge_at = time.monotonic()
        self._due_at = None if self._due_in is None else (time.monotonic(), self._due_in)
        # The process's gauge is the scanner's that last read the database: not one merely built
        # (a one-off scan), which has read nothing.
        metrics.SCAN_LAG.set_function(self.scan_lag_s)
        return report.schedules >= batch or report.retries >= batch

    def scan_lag_s(self) -> float:
        """How far the scanner is behind its own work, at the moment of asking: since when the
        oldest due lease (a fire, or for overlap allow the fire less the look-ahead plus a slice)
        has been due, by the last reading of the database aged by the time since; 0 when nothing
        is due or nothing was scheduled at that reading."""
        due_at = self._due_at
        if due_at is None:
            return 0.0
        read_at, due_in = due_at
        return max(0.0, time.monotonic() - read_at - due_in)

    def idle(self, stop: threading.Event) -> None:
        """Until the next due time by the database clock, a NOTIFY, or ``max_scan_sleep_s``."""
        self.session.wait(self.sleep_s(), stop)

    def sleep_s(self) -> float:
        """How long :meth:`idle` waits after the last step: until the next due time, at most
        ``max_scan_sleep_s``, and :data:`LOCKED_DUE_PAUSE_S` when work is due that the step could not
        lease (another transaction holds it)."""
        sleep = self.settings.max_scan_sleep_s if self._due_in is None else self._due_in
        if sleep <= 0 and self._leased_nothing:
            sleep = LOCKED_DUE_PAUSE_S
        return min(max(sleep, 0.0), self.settings.max_scan_sleep_s)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self._due_at = None  # closed, it is behind on nothing: its last reading no longer ages
        self.session.close()

    def scan_once(self, conn: psycopg.Connection[Row], now: datetime | None = None) -> ScanReport:
        """One batch in one transaction. ``now`` replaces the database clock in tests."""
        with conn.transaction():
            due = store.lease_due_schedules(
                conn, self.settings.scan_batch_size, now, self.settings.lookahead_s
            )
            retries = store.lease_due_retries(conn, self.settings.scan_batch_size, now)
            plan = self._plan(conn, due)
            runs = plan.runs
            created = store.create_runs(conn, runs)
            store.advance_schedules(conn, plan.advances)
            store.set_schedules_error(conn, plan.errors)
            attempts = [self._next_attempt(retry) for retry in retries]
            store.redispatch_runs(conn, attempts)
            if created.queued or attempts:
                store.notify_outbox(conn)
        kinds: dict[UUID, ScheduleKind] = {d.schedule.id: d.schedule.kind for d in due}
        apps: dict[UUID, str] = {d.schedule.id: d.schedule.app for d in due}
        for error in plan.errors:
            metrics.SCHEDULES_ERRORED.labels(apps[error.schedule_id]).inc()
            self.log.warning(
                "schedule %s is now in state error, its fires cannot be computed: %s",
                error.schedule_id,
                error.error,
                extra={"app": apps[error.schedule_id], "schedule_id": str(error.schedule_id)},
            )
        for run in runs:
            if run.id not in created.ids:
                continue  # a fire made before (UNIQUE (schedule_id, scheduled_for)): nothing new
            if run.state is RunState.SKIPPED:
                metrics.RUNS_SKIPPED.labels(str(run.skip_reason)).inc()
                continue
            metrics.JOBS_SCHEDULED.labels(run.app, str(kinds[run.schedule_id])).inc()
            if run.message is not None:
                # A fire leased ahead of its instant is on time: 0, not a negative lag.
                metrics.FIRE_LAG.observe(max(0.0, (due[0].now - run.scheduled_for).total_seconds()))
        for retry in retries:
            metrics.JOBS_SCHEDULED.labels(retry.run.app, "retry").inc()
        return ScanReport(
            len(due), len(retries), created.created, created.skipped, created.queued, len(plan.errors)
        )

    def _plan(self, conn: psycopg.Connection[Row], due: list[DueSchedule]) -> _Plan:
        guarded = [d.schedule.id for d in due if d.schedule.overlap_policy.guards_runs]
        open_runs = store.open_runs_of(conn, guarded)
        plan = _Plan([], [], [])
        for leased in due:
            try:
                runs, advance = self._plan_schedule(leased, open_runs.get(leased.schedule.id, (0, 0)))
            except Exception as exc:
                # Whatever the reason, this schedule must not stop the scan of the others.
                reason = capped_text(f"{type(exc).__name__}: {exc}")
                plan.errors.append(ScheduleError(leased.schedule.id, reason))
                continue
            plan.runs.extend(runs)
            plan.advances.append(advance)
        return plan

    def _plan_schedule(
        self, leased: DueSchedule, open_runs: tuple[int, int]
    ) -> tuple[list[NewRun], ScheduleAdvance]:
        """One schedule's runs (with their messages) and its advance; raises if it cannot be planned."""
        schedule = leased.schedule
        plan = fires_of(schedule, leased.now, self.catchup_window, self.lookahead)
        runs = [self._skipped(leased, s.scheduled_for, s.reason) for s in plan.skipped]
        active, waiting = open_runs
        for at in plan.fires:
            action = overlap_action(schedule.overlap_policy, active > 0, waiting > 0)
            if action is OverlapAction.SKIP:
                runs.append(self._skipped(leased, at, SkipReason.OVERLAP))
                continue
            run_id = new_id()
            buffered = action is OverlapAction.BUFFER
            jitter = self._jitter(leased)
            message = None
            if not buffered:
                message = self.dispatcher.message(
                    run_id=run_id,
                    schedule_id=schedule.id,
                    job=schedule.execution,
                    scheduled_for=at,
                    attempt=1,
                    # Informational: a fire leased ahead is not dispatched before its instant.
                    deadline=attempt_deadline(max(leased.now, at), schedule.timeout_ms),
                    traceparent=schedule.creation_traceparent,
                    due_at=_due_at(leased, at, plan.misfired) + jitter,
                )
            runs.append(
                NewRun(
                    id=run_id,
                    schedule_id=schedule.id,
                    app=schedule.app,
                    scheduled_for=at,
                    state=RunState.PENDING,
                    max_attempts=schedule.max_attempts,
                    buffered=buffered,
                    guarded=schedule.overlap_policy.guards_runs,
                    message=message,
                    delay_ms=self._delay_ms(leased, at, jitter),
                )
            )
            # The run just created is the "previous run" of the next fire in this batch.
            active += 0 if buffered else 1
            waiting += 1 if buffered else 0
        return runs, ScheduleAdvance(schedule.id, plan.next_fire_at, plan.schedule_state)

    def _jitter(self, leased: DueSchedule) -> timedelta:
        """A fire's random delay (0 without jitter)."""
        jitter_ms = leased.schedule.jitter_ms
        return timedelta(milliseconds=self.random.randint(0, jitter_ms)) if jitter_ms > 0 else timedelta(0)

    def _delay_ms(self, leased: DueSchedule, at: datetime, jitter: timedelta) -> int:
        """How long a fire's outbox row is held back: its jitter, counted from its instant. A fire
        leased ahead of it has its row held back until then as well, or the jitter would be spent
        waiting in a worker."""
        if not jitter:
            return 0
        ahead_ms = max(0, math.ceil((at - leased.now).total_seconds() * 1000))
        return ahead_ms + round(jitter.total_seconds() * 1000)

    def _skipped(self, leased: DueSchedule, at: datetime, reason: SkipReason) -> NewRun:
        return NewRun(
            id=new_id(),
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
        message = self.dispatcher.message(
            run_id=run.id,
            schedule_id=run.schedule_id,
            job=retry.job,
            scheduled_for=run.scheduled_for,
            attempt=attempt,
            deadline=attempt_deadline(retry.now, retry.job.timeout_ms),
            previous_attempts=retry.history,
            traceparent=retry.creation_traceparent,
        )
        return NextAttempt(run.id, attempt, None, message)


def _due_at(leased: DueSchedule, at: datetime, misfired: bool) -> datetime:
    """When a fire the scan dispatches is due to start, what the worker's start lag counts from
    (before its jitter): its instant, unless it is late by design. A misfire's catch-up (a fire
    found later than the catch-up window, run by fire_once or fire_all) is due now: the policy runs
    it now. A one-shot created with an instant already past is due from its creation (a cron's
    fires all come after its creation). Not from a schedule's last change (updated_at): a user's
    change of a payload, or the scanner's own advance of a schedule with more fires than one scan
    plans, would hide the scanner's lateness; so a fire a resume made due within the catch-up
    window counts the pause (at most that window) as late."""
    due = leased.now if misfired and at <= leased.now else at
    if leased.schedule.kind is ScheduleKind.CRON:
        return due
    return max(due, leased.schedule.created_at)
