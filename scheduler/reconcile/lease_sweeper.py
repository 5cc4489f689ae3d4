"""The lease sweeper: started runs whose worker went silent get their next attempt, or die.

Only a started run holds a lease: the reconciler sets it to now + the lease window
(``SCHEDULER_LEASE_WINDOW_S``) on the worker's start event and on each heartbeat, which the worker
sends every few seconds while the job runs. A run whose lease passed lost its worker (killed,
frozen, cut off from Kafka). Pending and dispatched runs hold none, so time in the outbox, on the
topic or behind a backlog never expires an attempt.

Silence is judged only on what the reconciler has read. Before it sweeps, the sweeper notes the
database time, takes the end offsets of the outcome topics, and waits until the reconciler's group
has committed up to them; then it expires only the leases that had passed by that time. A success
still unread in ``.results`` (the reconciler down, restarting or behind) is therefore never taken
for silence. While it waits it says why once a minute and exports how long and how far behind.

A swept run with attempts left gets its next attempt dispatched in the same transaction
(``retry_wait`` → ``pending`` with attempt + 1 and its job message in the outbox, as the scanner
re-dispatches a retry), so recovery needs no scanner. A run on its last attempt becomes ``dead``
and its dead letter goes to the outbox in the same transaction, for the relay to publish like any
other row: a letter Kafka refuses now is published later, never lost. Any number of sweepers may
run: SKIP LOCKED keeps them off each other's runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from scheduler.domain.ids import new_event_id
from scheduler.domain.run import FailedAttempt
from scheduler.domain.run_state import RunState
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobDeadLetter
from scheduler.kafka.positions import GroupPositions
from scheduler.kafka.transport import Partition, TransportError
from scheduler.reconcile import metrics
from scheduler.reconcile.retention import HistoryRetention
from scheduler.runtime.service import Check, Service
from scheduler.scan.dispatch import JobDispatcher, attempt_deadline, attempt_summary
from scheduler.store import reconcile as store
from scheduler.store import scan
from scheduler.store.database import Database, Session
from scheduler.store.entities import execution_from_row, failed_attempts_from_json
from scheduler.store.scan import Message, NextAttempt

BATCH = 2000
SWEEP_EVERY_S = 1.0
HELD_LOG_EVERY_S = 60.0
HELD_QUIET_S = 5.0
# After Kafka was unreachable, workers' producers reconnect and deliver the heartbeats and outcomes
# they queued meanwhile only after a while (librdkafka's reconnect backoff, the outcome retries):
# until Kafka has answered this much longer than a lease window, silence proves nothing.
KAFKA_SETTLE_GRACE_S = 15.0
Row = dict[str, Any]
LEASE_EXPIRED = "lease expired: the worker that started the attempt went silent (no heartbeat or outcome)"


@dataclass(frozen=True, slots=True)
class Sweep:
    """What one sweep did."""

    swept: int = 0
    dead: int = 0
    unread: int = 0
    """Outcome messages the reconciler had not read yet; while there are any, nothing is swept."""


@dataclass(frozen=True, slots=True)
class _Barrier:
    """The point the reconciler must reach before leases that expired by ``now`` may be swept."""

    now: datetime
    ends: Mapping[Partition, int]


class LeaseSweeper(Service):
    transient = (psycopg.OperationalError,)

    def __init__(
        self,
        database: Database,
        positions: GroupPositions,
        dispatcher: JobDispatcher,
        codec: AvroCodec,
        kafka_check: Check,
        dlq_topic: str,
        lease_window_s: float = 30.0,
        retention_days: float = 0.0,
    ) -> None:
        super().__init__("lease-sweeper")
        self.database = database
        self.positions = positions
        self.dispatcher = dispatcher
        self.codec = codec
        self.kafka_check = kafka_check
        self.dlq_topic = dlq_topic
        self.session = Session(database)
        self._barrier: _Barrier | None = None
        self._held_since: float | None = None  # monotonic
        self._held_logged = -HELD_LOG_EVERY_S
        self.settle_s = lease_window_s + KAFKA_SETTLE_GRACE_S
        self._kafka_answering_since: float | None = None  # monotonic
        # The other janitor of runs, in this loop so that the component keeps its shape; on a
        # connection of its own, and it never raises, so nothing it meets can stop the sweep.
        self.retention = HistoryRetention(database, retention_days, self.log)

    def checks(self) -> Sequence[Check]:
        return (self.database.check(), self.kafka_check)

    def step(self) -> bool:
        more = self._sweep_once_settled()
        # The history's retention judges nothing by Kafka: it runs whether Kafka answers or not.
        return self.retention.step() or more

    def _sweep_once_settled(self) -> bool:
        """One sweep when Kafka has settled; otherwise leases that passed are held (and said to
        be), and with none passed there is nothing held to speak of. Whether a batch is left."""
        unsettled = self._kafka_unsettled()
        if unsettled is None:
            return self.sweep(self.session.conn).swept >= BATCH
        conn = self.session.conn
        with conn.transaction():
            due = store.expired_leases_due(conn).due
        if due:
            self._held(unsettled)
        else:
            self._not_held("none has passed")
        return False

    def _kafka_unsettled(self) -> str | None:
        """Why Kafka has not settled, or None once it has answered without a break for longer than
        a lease window (and a grace): only then can a lease that passed mean a silent worker rather
        than one cut off from Kafka, whose heartbeats are still queued in its producer."""
        now = time.monotonic()
        try:
            self.kafka_check.probe()
        except Exception as exc:
            self._kafka_answering_since = None
            return f"Kafka does not answer ({exc})"
        if self._kafka_answering_since is None:
            self._kafka_answering_since = now
        answering_s = now - self._kafka_answering_since
        if answering_s < self.settle_s:
            return f"Kafka has answered for {answering_s:.0f} s only; workers' heartbeats may be queued"
        return None

    def idle(self, stop: threading.Event) -> None:
        stop.wait(SWEEP_EVERY_S)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self.session.close()
        self.retention.close()

    def sweep(self, conn: psycopg.Connection[Row], now: datetime | None = None) -> Sweep:
        """One batch of expired leases, once the reconciler has read the outcome topics up to
        the present; ``now`` replaces the database clock (tests)."""
        barrier = self._barrier
        if barrier is None or (now is not None and now != barrier.now):
            with conn.transaction():
                due = store.expired_leases_due(conn, now)
            if not due.due:
                self._barrier = None
                self._not_held("none has passed")
                return Sweep()
            try:
                barrier = _Barrier(due.now, self.positions.ends())
            except TransportError as exc:
                self._held(f"the outcome topics' end offsets cannot be read ({exc})")
                return Sweep()
            self._barrier = barrier
        try:
            unread = self.positions.unread(barrier.ends)
        except TransportError as exc:
            self._held(f"the reconciler's committed offsets cannot be read ({exc})")
            return Sweep()
        if unread:
            behind = sum(unread.values())
            listed = ", ".join(f"{p.topic}[{p.partition}]: {n}" for p, n in sorted(unread.items())[:6])
            self._held(f"the reconciler has not read {behind} outcome messages yet ({listed})", behind)
            return Sweep(unread=behind)
        result = self._sweep(conn, barrier.now)
        if result.swept < BATCH:
            self._barrier = None  # all that had expired by then is swept: the next sweep looks anew
            self._not_held()
        return result

    def _held(self, why: str, unread: int = 0) -> None:
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        held_s = now - self._held_since
        metrics.SWEEP_HELD.set(held_s)
        metrics.SWEEP_UNREAD.set(unread)
        # A reconciler a batch behind is the normal case under load: said only when it lasts.
        if held_s >= HELD_QUIET_S and now - self._held_logged >= HELD_LOG_EVERY_S:
            self._held_logged = now
            self.log.warning("holding expired leases for %.0f s: %s", held_s, why)

    def _not_held(self, why: str = "the reconciler has read the outcome topics") -> None:
        if self._held_logged >= 0:
            self.log.info("expired leases no longer held: %s", why)
        self._held_since = None
        self._held_logged = -HELD_LOG_EVERY_S
        metrics.SWEEP_HELD.set(0)
        metrics.SWEEP_UNREAD.set(0)

    def _sweep(self, conn: psycopg.Connection[Row], now: datetime) -> Sweep:
        with conn.transaction():
            swept = store.sweep_expired_leases(conn, BATCH, now, LEASE_EXPIRED)
            retried = [row for row in swept if row["state"] == RunState.RETRY_WAIT]
            dead = [row for row in swept if row["state"] == RunState.DEAD]
            scan.redispatch_runs(conn, [self._next_attempt(row) for row in retried])
            store.queue_dead_letters(conn, [self._dead_letter(row) for row in dead])
            if swept:
                scan.notify_outbox(conn)
            if dead:
                store.notify_run_finished(conn)
        for row in swept:
            outcome = "dead" if row["state"] == RunState.DEAD else "retry"
            metrics.LEASE_EXPIRIES.labels(outcome).inc()
        for row in dead:
            metrics.DEAD_LETTERS.labels(row["app"]).inc()
        if swept:
            self.log.info(
                "swept %d expired leases: %d dispatched again, %d dead", len(swept), len(retried), len(dead)
            )
        return Sweep(swept=len(swept), dead=len(dead))

    @staticmethod
    def _history(row: Row) -> tuple[FailedAttempt, ...]:
        """The run's failed attempts, this one's expiry last."""
        expired = FailedAttempt(
            attempt=row["attempt"],
            worker=row["worker"],
            started_at=row["started_at"],
            finished_at=row["now"],
            error=LEASE_EXPIRED,
            error_class="LeaseExpired",
        )
        return (*failed_attempts_from_json(row["history"]), expired)

    def _next_attempt(self, row: Row) -> NextAttempt:
        attempt = row["attempt"] + 1
        message = self.dispatcher.message(
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            job=execution_from_row(row),
            scheduled_for=row["scheduled_for"],
            attempt=attempt,
            deadline=attempt_deadline(row["now"], row["timeout_ms"]),
            previous_attempts=self._history(row),
            traceparent=row["creation_traceparent"],
        )
        return NextAttempt(row["id"], attempt, None, message)

    def _dead_letter(self, row: Row) -> tuple[UUID, int, Message]:
        history = self._history(row)
        finished: datetime = row["now"]
        job = self.dispatcher.message(
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            job=execution_from_row(row),
            scheduled_for=row["scheduled_for"],
            attempt=row["attempt"],
            deadline=attempt_deadline(finished, row["timeout_ms"]),
            previous_attempts=history[:-1],
            traceparent=row["creation_traceparent"],
        )
        letter = JobDeadLetter(
            event_id=new_event_id(),
            cause="retries_exhausted",
            app=row["app"],
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            attempt=row["attempt"],
            worker=None,  # the sweeper's, which the reconciler knows to be applied already
            started_at=row["started_at"],
            finished_at=finished,
            error=LEASE_EXPIRED,
            error_class="LeaseExpired",
            attempts=tuple(attempt_summary(a, finished) for a in history),
            original_bytes=job.value,
            source=None,
        )
        value = self.codec.encode(letter)
        return row["id"], row["attempt"], Message(self.dlq_topic, row["id"].bytes, value, job.headers)
