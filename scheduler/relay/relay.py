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

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaException
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_when_event_set,
    wait_exponential_jitter,
)

from scheduler import metrics
from scheduler.config import Settings
from scheduler.kafka.transport import DeliveryError, OutgoingMessage, Producer, producer_config
from scheduler.store import connect, outbox
from scheduler.store.listen import Wakeup

log = logging.getLogger(__name__)

CHANNEL = "scheduler_outbox"
# Rows of a relay that died become claimable again after this; a live relay finishes well within it.
DEFAULT_CLAIM_SECONDS = 60.0
IDLE_WAKE_S = 1.0


@dataclass(frozen=True)
class BatchReport:
    claimed: int
    published: int
    republished: int
    dispatched: int


class Relay:
    def __init__(self, settings: Settings, name: str | None = None) -> None:
        self.settings = settings
        self.name = name or f"relay-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.claim_seconds = settings.relay_claim_s
        # The producer gives up on a message well before the claim lapses, so a slow Kafka makes a
        # batch fail and be released rather than be published twice by two relays.
        timeout_ms = int(min(30.0, self.claim_seconds / 2) * 1000)
        self.producer = Producer(
            producer_config(settings.kafka_bootstrap, self.name, {"message.timeout.ms": timeout_ms})
        )
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.settings.database_url)
        return self._conn

    def relay_once(self) -> BatchReport:
        """Claim, publish and complete one batch; raises if Kafka or PostgreSQL failed."""
        conn = self._connection()
        try:
            with conn.transaction():
                rows = outbox.claim(conn, self.name, self.settings.relay_batch_size, self.claim_seconds)
            if not rows:
                return BatchReport(0, 0, 0, 0)
            ids = [row.id for row in rows]
            try:
                self.producer.send(
                    [
                        OutgoingMessage(row.topic, row.value, row.key, list(row.headers.items()))
                        for row in rows
                    ],
                    timeout_s=self.claim_seconds * 0.75,
                )
            except (DeliveryError, KafkaException):
                metrics.RELAY_FAILURES.inc()
                with conn.transaction():
                    outbox.release(conn, self.name, ids)
                raise
            with conn.transaction():
                done = outbox.complete(conn, self.name, ids)
        except psycopg.OperationalError:
            # The connection is gone; the next attempt opens a new one.
            conn.close()
            raise
        metrics.RELAY_PUBLISHED.inc(done.published)
        metrics.RELAY_REPUBLISHED.inc(done.republished)
        return BatchReport(len(rows), done.published, done.republished, done.dispatched)

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set; woken by NOTIFY, never idle longer than a second."""
        wakeup: Wakeup | None = None
        retrying = Retrying(
            retry=retry_if_exception_type((DeliveryError, KafkaException, psycopg.OperationalError)),
            wait=wait_exponential_jitter(initial=0.2, max=5.0),
            stop=stop_when_event_set(stop),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        try:
            while not stop.is_set():
                report = BatchReport(0, 0, 0, 0)
                try:
                    for attempt in retrying:
                        with attempt:
                            if wakeup is None:
                                wakeup = Wakeup(self.settings.database_url, CHANNEL)
                            report = self.relay_once()
                except (DeliveryError, KafkaException, psycopg.OperationalError):
                    if stop.is_set():
                        break
                    raise
                if report.claimed < self.settings.relay_batch_size and wakeup is not None:
                    try:
                        wakeup.wait(IDLE_WAKE_S, stop)
                    except psycopg.OperationalError:
                        wakeup = None  # reopened by the next batch, with its backoff

        finally:
            if wakeup is not None:
                wakeup.close()
            if self._conn is not None:
                self._conn.close()
            self.producer.close()
