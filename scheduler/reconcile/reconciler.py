"""The reconciler: applies the workers' outcome events to PostgreSQL.

It consumes ``.results``, ``.retry`` and ``.dlq`` together in batches. Each batch is decoded,
applied with one set-based statement (fenced by attempt, idempotent by event id, every event
recorded in ``attempts``), committed to PostgreSQL, and only then are the Kafka offsets committed:
a crash re-applies a batch, which the event ids turn into counted duplicates. A message on these
topics that cannot be decoded is logged, counted and skipped, never allowed to stall the consumer.
A failure of PostgreSQL or Kafka rebuilds the consumer, which then reads again from the committed
offsets, so a batch that was not applied is read again rather than skipped.

The same process runs the lease sweeper (:mod:`.lease_sweeper`) and the buffer release
(:mod:`.buffer_release`); a batch that ended runs wakes the latter.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from opentelemetry.trace import Span, SpanKind, use_span

from scheduler.config import Settings
from scheduler.domain.run_state import RunState
from scheduler.kafka.avro import AvroCodec, MessageDecodeError
from scheduler.kafka.messages import JobDeadLetter, JobResult, JobRetry
from scheduler.kafka.transport import Consumer, ConsumerSlot, Offset, Received, TransportError
from scheduler.reconcile import metrics
from scheduler.runtime.service import Check, Service
from scheduler.store import reconcile as store
from scheduler.store.database import Database, Session
from scheduler.store.reconcile import OutcomeEvent, UndecodableLetter
from scheduler.telemetry.tracing import (
    ending,
    job_outcome_attributes,
    kafka_attributes,
    message_span,
    messaging_span_name,
    record_failure,
    tracing_exports,
)

BATCH = 2000
POLL_S = 0.1
LAG_EVERY_S = 1.0
Row = dict[str, Any]
# The run state each kind of outcome event moves a run to, for the spans' job.status.
OUTCOME_STATES = {
    "started": RunState.RUNNING,
    "heartbeat": RunState.RUNNING,
    "retry": RunState.RETRY_WAIT,
    "succeeded": RunState.SUCCEEDED,
    "dead": RunState.DEAD,
}


class Reconciler(Service):
    transient = (psycopg.OperationalError, TransportError)

    def __init__(
        self,
        settings: Settings,
        database: Database,
        consumers: Callable[[], Consumer],
        codec: AvroCodec,
        kafka_check: Check,
    ) -> None:
        super().__init__("reconciler")
        self.settings = settings
        self.database = database
        self.codec = codec
        self.kafka_check = kafka_check
        self.group = f"{settings.topic_prefix}.reconciler"
        self.consumer = ConsumerSlot(consumers)
        self.session = Session(database)
        self._last_lag = 0.0
        self._tracing = tracing_exports()

    def checks(self) -> Sequence[Check]:
        return (self.database.check(), self.kafka_check, self.consumer.check())

    def step(self) -> bool:
        consumer, conn = self.consumer.consumer, self.session.conn
        messages = consumer.consume(BATCH, POLL_S)
        if messages:
            self.apply(conn, messages)
            consumer.commit(next_offsets(messages))
        metrics.LAST_BATCH.set(time.time())
        if time.monotonic() - self._last_lag >= LAG_EVERY_S:
            self.consumer.observe_lag(metrics.CONSUMER_LAG)
            self._last_lag = time.monotonic()
        return True  # consuming waits for messages itself

    def reset(self) -> None:
        # A new consumer starts from the committed offsets: the batch that failed is read again.
        self.consumer.close()
        self.session.close()

    def close(self) -> None:
        self.reset()

    def decode(self, message: Received) -> OutcomeEvent | UndecodableLetter | None:
        """The event a message carries, or None for one that is not ours to apply."""
        topic, value = message.topic, message.value
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
            metrics.UNDECODABLE.inc()
            self.log.error(
                "skipping undecodable message at %s[%s]@%s: %s",
                topic,
                message.partition,
                message.offset,
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

    def apply(self, conn: psycopg.Connection[Row], messages: Sequence[Received]) -> store.Applied:
        """Apply one batch in one transaction."""
        decoded = [self.decode(m) for m in messages]
        events = [d for d in decoded if isinstance(d, OutcomeEvent)]
        letters = [d for d in decoded if isinstance(d, UndecodableLetter)]
        with ending(self._trace(messages, decoded) if self._tracing else ()), conn.transaction():
            applied = store.apply_outcomes(conn, events)
            store.record_undecodable(conn, letters)
            if applied.finished:
                store.notify_run_finished(conn)
        metrics.EVENTS.labels("applied").inc(applied.applied)
        metrics.EVENTS.labels("stale").inc(applied.stale)
        metrics.EVENTS.labels("duplicate").inc(applied.duplicate)
        for app in applied.dead_apps:
            metrics.DEAD_LETTERS.labels(app).inc()
        return applied

    def _trace(
        self,
        messages: Sequence[Received],
        decoded: Sequence[OutcomeEvent | UndecodableLetter | None],
    ) -> list[Span]:
        """One ``process`` span per outcome, in its job's trace, ended when the batch is applied."""
        spans = []
        for message, event in zip(messages, decoded, strict=True):
            attributes = kafka_attributes(
                "process",
                message.topic,
                partition=message.partition,
                offset=message.offset,
                consumer_group=self.group,
            )
            if isinstance(event, OutcomeEvent):
                status = OUTCOME_STATES.get(event.kind, event.kind)
                attributes |= {"job.id": str(event.run_id), "job.retry_count": event.attempt - 1}
                attributes |= job_outcome_attributes(str(status))
            span = message_span(
                messaging_span_name("process", message.topic),
                message.header("traceparent"),
                SpanKind.CONSUMER,
                attributes,
            )
            if isinstance(event, OutcomeEvent) and event.kind == "dead":
                with use_span(span, end_on_exit=False):
                    record_failure(event.error_class or "Error", event.error)
            spans.append(span)
        return spans


def next_offsets(messages: Sequence[Received]) -> list[Offset]:
    highest: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (m.topic, m.partition)
        highest[key] = max(highest.get(key, -1), m.offset)
    return [Offset(t, p, o + 1) for (t, p), o in highest.items()]
