"""The relay: publishes the transactional outbox to Kafka and marks the runs dispatched.

Each batch follows three steps, in this order, so that nothing is lost and nothing is marked sent
before it is: (1) claim rows by status with SKIP LOCKED and commit the claim; (2) produce them with
the idempotent producer and wait until Kafka acknowledged every one (acks=all); (3) delete the rows
and mark their runs ``dispatched`` in one transaction. A relay that dies between (2) and (3) leaves
its claim to lapse, another relay publishes the rows again, and ``publish_count`` counts the
duplicate. While Kafka or PostgreSQL is down the relay backs off and retries; rows wait in the
outbox, which is the point of having one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from opentelemetry.trace import Span, SpanKind

from scheduler.config import Settings
from scheduler.kafka.tracing import HEADER
from scheduler.kafka.transport import OutgoingMessage, Producer, TransportError
from scheduler.relay import metrics
from scheduler.runtime.service import Check, Service
from scheduler.store import outbox
from scheduler.store.database import Database, Session
from scheduler.store.outbox import OutboxRow
from scheduler.telemetry.tracing import (
    JOB_SCHEDULING,
    ending,
    kafka_attributes,
    message_span,
    traceparent_of_span,
    tracing_exports,
)

CHANNEL = "scheduler_outbox"
# Rows of a relay that died become claimable again after this; a live relay finishes well within it.
DEFAULT_CLAIM_SECONDS = 60.0
IDLE_WAKE_S = 1.0
STATS_EVERY_S = 5.0


@dataclass(frozen=True)
class BatchReport:
    claimed: int
    published: int
    republished: int
    dispatched: int


class Relay(Service):
    transient = (TransportError, psycopg.OperationalError)

    def __init__(
        self, settings: Settings, database: Database, producer: Producer, kafka_check: Check, *, name: str
    ) -> None:
        super().__init__("relay")
        self.settings = settings
        self.database = database
        self.producer = producer
        self.kafka_check = kafka_check
        self.instance = name  # this process's instance of the service (``self.name`` is its role)
        self.claim_seconds = settings.relay_claim_s
        self.session = Session(database, CHANNEL)
        self._last_stats = 0.0
        self._tracing = tracing_exports()

    def checks(self) -> Sequence[Check]:
        return (self.database.check(), self.kafka_check)

    def step(self) -> bool:
        report = self.relay_once()
        if time.monotonic() - self._last_stats >= STATS_EVERY_S:
            conn = self.session.conn
            with conn.transaction():
                stats = outbox.stats(conn)
            metrics.OUTBOX_DEPTH.set(stats.depth)
            metrics.OUTBOX_OLDEST_AGE.set(stats.oldest_age_s)
            self._last_stats = time.monotonic()
        return report.claimed >= self.settings.relay_batch_size

    def idle(self, stop: threading.Event) -> None:
        """Woken by the scanner's NOTIFY; never idle longer than a second (a lapsed claim)."""
        self.session.wait(IDLE_WAKE_S, stop)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self.session.close()
        self.producer.close()

    def relay_once(self) -> BatchReport:
        """Claim, publish and complete one batch; raises if Kafka or PostgreSQL failed."""
        conn = self.session.conn
        with conn.transaction():
            rows = outbox.claim(conn, self.instance, self.settings.relay_batch_size, self.claim_seconds)
        if not rows:
            return BatchReport(0, 0, 0, 0)
        ids = [row.id for row in rows]
        started = time.monotonic()
        messages, spans = self._messages(rows)
        try:
            with ending(spans):
                self.producer.send(messages, timeout_s=self.claim_seconds * 0.75)
        except TransportError:
            metrics.FAILURES.inc()
            with conn.transaction():
                outbox.release(conn, self.instance, ids)
            raise
        publish_s = time.monotonic() - started
        with conn.transaction():
            done = outbox.complete(conn, self.instance, ids)
        metrics.PUBLISHED.inc(done.published)
        metrics.REPUBLISHED.inc(done.republished)
        for row in rows:
            metrics.DISPATCH_LAG.observe(row.age_s + publish_s)
        return BatchReport(len(rows), done.published, done.republished, done.dispatched)

    def _messages(self, rows: Sequence[OutboxRow]) -> tuple[list[OutgoingMessage], list[Span]]:
        """The batch's messages; when traces are exported, each with a ``job.scheduling`` span
        that runs from the outbox row's creation to Kafka's acknowledgement (the caller ends it)."""
        if not self._tracing:
            return [OutgoingMessage(r.topic, r.value, r.key, list(r.headers.items())) for r in rows], []
        now_ns = time.time_ns()
        messages, spans = [], []
        for row in rows:
            span = message_span(
                JOB_SCHEDULING,
                row.headers.get(HEADER),
                SpanKind.PRODUCER,
                kafka_attributes("send", row.topic, key=row.key) | _job_of(row),
                start_time=now_ns - int(row.age_s * 1e9),
            )
            spans.append(span)
            headers = dict(row.headers) | {HEADER: traceparent_of_span(span)}
            messages.append(OutgoingMessage(row.topic, row.value, row.key, list(headers.items())))
        return messages, spans


def _job_of(row: OutboxRow) -> dict[str, str | int]:
    # The relay publishes bytes it never decodes: the run id and attempt are the outbox row's own.
    if row.run_id is None or row.attempt is None:
        return {}
    return {"job.id": str(row.run_id), "job.retry_count": row.attempt - 1}
