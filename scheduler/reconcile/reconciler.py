"""The reconciler: applies the workers' outcome events to PostgreSQL, and sweeps expired leases.

It consumes ``.results``, ``.retry`` and ``.dlq`` together in batches. Each batch is decoded,
applied with one set-based statement (fenced by attempt, idempotent by event id, every event
recorded in ``attempts``), committed to PostgreSQL, and only then are the Kafka offsets committed:
a crash re-applies a batch, which the event ids turn into counted duplicates. A message on these
topics that cannot be decoded is logged, counted and skipped, never allowed to stall the consumer.

Between batches it sweeps runs whose lease expired without an outcome (a worker died, or a message
was never picked up): the next attempt becomes due at once, or the run is dead when its attempts
are spent, and then its dead letter goes to ``.dlq`` as a worker's would. When a run ends it also
dispatches the fire that ``buffer_one`` kept waiting for it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import KafkaException, Message, TopicPartition

from scheduler import metrics
from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec, MessageDecodeError
from scheduler.kafka.messages import AttemptSummary, JobDeadLetter, JobResult, JobRetry
from scheduler.kafka.transport import Consumer, OutgoingMessage, Producer, consumer_config, producer_config
from scheduler.scan.dispatch import JobDispatcher, lease_expiry
from scheduler.store import connect
from scheduler.store import reconcile as store
from scheduler.store.reconcile import OutcomeEvent, UndecodableLetter
from scheduler.store.scan import NewRun

log = logging.getLogger(__name__)

BATCH = 2000
SWEEP_EVERY_S = 1.0
Row = dict[str, Any]


class Reconciler:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = f"reconciler-{socket.gethostname()}-{os.getpid()}"
        self.codec = AvroCodec()
        self.dispatcher = JobDispatcher(settings, self.codec)
        self.topics = [settings.results_topic, settings.retry_topic, settings.dlq_topic]
        self._consumer: Consumer | None = None
        self._producer = Producer(producer_config(settings.kafka_bootstrap, self.name))

    def decode(self, message: Message) -> OutcomeEvent | UndecodableLetter | None:
        """The event a message carries, or None for one that is not ours to apply."""
        topic, value = message.topic(), message.value() or b""
        try:
            if topic == self.settings.results_topic:
                result = self.codec.decode(JobResult, value)
                return OutcomeEvent(
                    event_id=str(result.event_id),
                    run_id=result.run_id,
                    attempt=result.attempt,
                    kind=result.status,
                    worker=result.worker,
                    started_at=result.started_at,
                    finished_at=result.finished_at,
                    result=None if result.result is None else json.loads(result.result),
                )
            if topic == self.settings.retry_topic:
                retry = self.codec.decode(JobRetry, value)
                return OutcomeEvent(
                    event_id=str(retry.event_id),
                    run_id=retry.run_id,
                    attempt=retry.attempt,
                    kind="retry",
                    worker=retry.worker,
                    started_at=retry.started_at,
                    finished_at=retry.finished_at,
                    error=retry.error,
                    error_class=retry.error_class,
                    not_before=retry.not_before,
                )
            dead = self.codec.decode(JobDeadLetter, value)
        except (MessageDecodeError, ValueError) as exc:
            metrics.RECONCILER_UNDECODABLE.inc()
            log.error(
                "skipping undecodable message at %s[%s]@%s: %s",
                topic,
                message.partition(),
                message.offset(),
                exc,
            )
            return None
        if dead.run_id is None or dead.attempt is None:
            return UndecodableLetter(
                event_id=str(dead.event_id),
                app=dead.app,
                cause=dead.cause,
                error=dead.error,
                original_bytes=dead.original_bytes,
                topic=dead.source.topic if dead.source else None,
                partition=dead.source.partition if dead.source else None,
                offset=dead.source.offset if dead.source else None,
            )
        if dead.worker is None:
            return None  # written by a sweeper: the run is dead in PostgreSQL already
        return OutcomeEvent(
            event_id=str(dead.event_id),
            run_id=dead.run_id,
            attempt=dead.attempt,
            kind="dead",
            worker=dead.worker,
            started_at=dead.started_at,
            finished_at=dead.finished_at,
            error=dead.error,
            error_class=dead.error_class,
        )

    def apply(self, conn: psycopg.Connection[Row], messages: list[Message]) -> store.Applied:
        """Apply one batch in one transaction."""
        decoded = [self.decode(m) for m in messages]
        events = [d for d in decoded if isinstance(d, OutcomeEvent)]
        letters = [d for d in decoded if isinstance(d, UndecodableLetter)]
        with conn.transaction():
            applied = store.apply_outcomes(conn, events)
            store.record_undecodable(conn, letters)
            if applied.finished:
                self._release_buffered(conn)
        metrics.RECONCILER_EVENTS.labels("applied").inc(applied.applied)
        metrics.RECONCILER_EVENTS.labels("stale").inc(applied.stale)
        metrics.RECONCILER_EVENTS.labels("duplicate").inc(applied.duplicate)
        return applied

    def _release_buffered(self, conn: psycopg.Connection[Row]) -> None:
        released = []
        for row in store.releasable_buffered_runs(conn):
            deadline = lease_expiry(row["now"], row["timeout_ms"])
            message = self.dispatcher.message(
                run_id=row["id"],
                schedule_id=row["schedule_id"],
                job=row,
                scheduled_for=row["scheduled_for"],
                attempt=1,
                deadline=deadline,
            )
            released.append(
                NewRun(
                    id=row["id"],
                    schedule_id=row["schedule_id"],
                    app=row["app"],
                    scheduled_for=row["scheduled_for"],
                    state="pending",
                    max_attempts=row["max_attempts"],
                    lease_expires_at=deadline,
                    message=message,
                )
            )
        store.dispatch_buffered_runs(conn, released)

    def sweep(self, conn: psycopg.Connection[Row], now: datetime | None = None) -> int:
        """Expired leases into their next attempt or dead; returns how many runs were swept."""
        with conn.transaction():
            swept = store.sweep_expired_leases(conn, BATCH, now)
            if any(row["state"] == "dead" for row in swept):
                self._release_buffered(conn)
        dead = [row for row in swept if row["state"] == "dead"]
        if dead:
            self._producer.send([self._dead_letter(row) for row in dead])
        metrics.RECONCILER_SWEPT.inc(len(swept))
        return len(swept)

    def _dead_letter(self, row: Row) -> OutgoingMessage:
        finished = datetime.now(UTC)
        error = "lease expired: no outcome from a worker within the attempt's timeout"
        job = self.dispatcher.message(
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            job=row,
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
            error=error,
            error_class="LeaseExpired",
            attempts=(
                AttemptSummary(
                    attempt=row["attempt"], finished_at=finished, error=error, error_class="LeaseExpired"
                ),
            ),
            original_bytes=job.value,
            source=None,
        )
        return OutgoingMessage(self.settings.dlq_topic, self.codec.encode(letter), row["id"].bytes)

    def run(self, stop: threading.Event) -> None:
        consumer = Consumer(
            consumer_config(
                self.settings.kafka_bootstrap, f"{self.settings.topic_prefix}.reconciler", self.name
            ),
            self.topics,
        )
        conn: psycopg.Connection[Row] | None = None
        last_sweep = 0.0
        backoff = 0.2
        # A batch that failed to apply is applied again before anything else is read: the consumer's
        # position has moved past it, so reading on would skip it, and committing would lose it.
        pending: list[Message] = []
        try:
            while not stop.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = connect(self.settings.database_url)
                    if not pending:
                        pending = consumer.poll_batch(BATCH, 0.1)
                    if pending:
                        self.apply(conn, pending)
                        applied, pending = pending, []
                        consumer.commit(_next_offsets(applied))
                    if time.monotonic() - last_sweep >= SWEEP_EVERY_S:
                        self.sweep(conn)
                        last_sweep = time.monotonic()
                    backoff = 0.2
                except (psycopg.OperationalError, KafkaException) as exc:
                    log.warning("reconcile failed (%s); retrying in %.1f s", exc, backoff)
                    if conn is not None:
                        conn.close()
                    conn = None
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            consumer.close()
            if conn is not None:
                conn.close()
            self._producer.close()


def _next_offsets(messages: list[Message]) -> list[TopicPartition]:
    highest: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (m.topic() or "", m.partition() or 0)
        highest[key] = max(highest.get(key, -1), m.offset() or 0)
    return [TopicPartition(t, p, o + 1) for (t, p), o in highest.items()]
