"""The lease sweeper: runs whose lease expired without an outcome get their next attempt, or die.

A lease expires when a worker died, or a message was never picked up within the attempt's
deadline. Swept runs move to ``retry_wait`` with their next attempt due now (the scanner
re-dispatches it), or to ``dead`` when their attempts are spent; a dead run's letter then goes to
``.dlq`` as a worker's would, and the buffer release is woken, since a run that ended may free a
fire that ``buffer_one`` kept waiting. Any number of sweepers may run: SKIP LOCKED keeps them off
each other's runs.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from scheduler.domain.run_state import RunState
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import AttemptSummary, JobDeadLetter
from scheduler.kafka.transport import OutgoingMessage, Producer, TransportError
from scheduler.reconcile import metrics
from scheduler.runtime.service import Check, Service
from scheduler.scan.dispatch import JobDispatcher
from scheduler.store import reconcile as store
from scheduler.store.database import Database, Session
from scheduler.store.entities import execution_from_row

BATCH = 2000
SWEEP_EVERY_S = 1.0
Row = dict[str, Any]
LEASE_EXPIRED = "lease expired: no outcome from a worker within the attempt's timeout"


class LeaseSweeper(Service):
    transient = (psycopg.OperationalError, TransportError)

    def __init__(
        self,
        database: Database,
        producer: Producer,
        dispatcher: JobDispatcher,
        codec: AvroCodec,
        kafka_check: Check,
        dlq_topic: str,
    ) -> None:
        super().__init__("lease-sweeper")
        self.database = database
        self.producer = producer
        self.dispatcher = dispatcher
        self.codec = codec
        self.kafka_check = kafka_check
        self.dlq_topic = dlq_topic
        self.session = Session(database)

    def checks(self) -> Sequence[Check]:
        return (self.database.check(), self.kafka_check)

    def step(self) -> bool:
        return self.sweep(self.session.conn) >= BATCH

    def idle(self, stop: threading.Event) -> None:
        stop.wait(SWEEP_EVERY_S)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self.session.close()
        self.producer.close()

    def sweep(self, conn: psycopg.Connection[Row], now: datetime | None = None) -> int:
        """One batch of expired leases; returns how many runs were swept."""
        with conn.transaction():
            swept = store.sweep_expired_leases(conn, BATCH, now)
            dead = [row for row in swept if row["state"] == RunState.DEAD]
            if dead:
                store.notify_run_finished(conn)
        if dead:
            # After the commit: a dead letter on Kafka for a run PostgreSQL does not call dead would
            # be a lie, while a letter lost here is still in PostgreSQL (`dlq list` reads it there).
            try:
                self.producer.send([self._dead_letter(row) for row in dead])
            except TransportError:
                # Said out loud, not skipped: the runs stay dead with their error in PostgreSQL
                # (`scheduler dlq list` shows them), but no letter for them reaches the topic.
                self.log.error(
                    "%d dead letters of expired leases not published to %s; runs %s",
                    len(dead),
                    self.dlq_topic,
                    ", ".join(str(row["id"]) for row in dead[:20]),
                )
                raise
        for row in swept:
            outcome = "dead" if row["state"] == RunState.DEAD else "retry"
            metrics.LEASE_EXPIRIES.labels(outcome).inc()
        for row in dead:
            metrics.DEAD_LETTERS.labels(row["app"]).inc()
        if swept:
            self.log.info("swept %d expired leases (%d dead)", len(swept), len(dead))
        return len(swept)

    def _dead_letter(self, row: Row) -> OutgoingMessage:
        finished = datetime.now(UTC)
        job = self.dispatcher.message(
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            job=execution_from_row(row),
            scheduled_for=row["scheduled_for"],
            attempt=row["attempt"],
            deadline=finished,
        )
        letter = JobDeadLetter(
            event_id=uuid.uuid4(),
            cause="retries_exhausted",
            app=row["app"],
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            attempt=row["attempt"],
            worker=None,
            started_at=None,
            finished_at=finished,
            error=LEASE_EXPIRED,
            error_class="LeaseExpired",
            attempts=(
                AttemptSummary(
                    attempt=row["attempt"],
                    finished_at=finished,
                    error=LEASE_EXPIRED,
                    error_class="LeaseExpired",
                ),
            ),
            original_bytes=job.value,
            source=None,
        )
        return OutgoingMessage(self.dlq_topic, self.codec.encode(letter), row["id"].bytes)
