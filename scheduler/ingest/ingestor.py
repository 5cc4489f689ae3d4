"""The ingestor process (``scheduler run ingestor``): ``<prefix>.schedules`` into PostgreSQL.

It consumes the commands topic in batches, in a consumer group, so several ingestors share its
partitions. Each batch follows these steps, in this order:

1. decode and validate every message (:mod:`.commands`); a bad one becomes a rejection;
2. apply the batch in one PostgreSQL transaction (:func:`.apply.apply_batch`), which records the
   rejections and, before committing, has them published to ``<prefix>.schedules.rejected`` and
   acknowledged by Kafka;
3. commit the transaction;
4. commit the Kafka offsets past the batch.

A crash between 3 and 4 re-delivers the batch: its commands are then duplicates (their ids are
claimed) and its rejections are already recorded, so nothing is applied or published twice. A
failure of PostgreSQL, Kafka or the schema registry before 3 commits nothing; the ingestor drops its
consumer, backs off, and a new consumer reads the batch again from the committed offsets. A bad
message is never retried: it is rejected and passed, so it cannot stall a partition; and should a
batch fail for a reason nobody foresaw (a bug), its messages are applied one at a time and the one
that fails is rejected, for the same reason.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Producer as _Producer

from scheduler import metrics
from scheduler.config import Settings
from scheduler.ingest.apply import BatchResult, RecordedRejection, apply_batch
from scheduler.ingest.commands import Consumed, ValidCommand, decode_command, rejection
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import KafkaSource, ScheduleCommandRejected
from scheduler.kafka.registry import Framing, RegistryUnavailable, SchemaRegistry, registry_for
from scheduler.kafka.tracing import HEADER, child_traceparent, traceparent_of
from scheduler.kafka.transport import Consumer, DeliveryError, consumer_config, producer_config
from scheduler.scan.dispatch import JobDispatcher
from scheduler.store import connect
from scheduler.store.ingest import Rejection, Source

log = logging.getLogger(__name__)

BATCH = 2000
POLL_S = 0.2
# A rejection carries the command's bytes, and a command may exceed Kafka's default 1 MB where the
# topic allows it; the rejected topic's own limit is then what decides (see RejectionPublisher).
MAX_REJECTION_BYTES = 64 * 1024 * 1024
Row = dict[str, Any]

# Failures of what the ingestor depends on, not of a message: the batch is read again later.
TRANSIENT_FAILURES = (psycopg.OperationalError, KafkaException, DeliveryError, RegistryUnavailable)


def consumed(message: Message) -> Consumed:
    return Consumed(
        source=Source(message.topic() or "", message.partition() or 0, message.offset() or 0),
        value=message.value() or b"",
        key=message.key(),
        traceparent=traceparent_of(message.headers()),
    )


def next_offsets(batch: Sequence[Consumed]) -> list[TopicPartition]:
    """What to commit after ``batch``: per partition, the offset after the highest one consumed."""
    highest: dict[tuple[str, int], int] = {}
    for item in batch:
        key = (item.source.topic, item.source.partition)
        highest[key] = max(highest.get(key, -1), item.source.offset)
    return [TopicPartition(topic, partition, offset + 1) for (topic, partition), offset in highest.items()]


class RejectionPublisher:
    """Publishes rejections and waits for Kafka's acknowledgement of each.

    The transport's producer treats a batch as all-or-nothing; here each message's outcome matters:
    a rejection too large for the rejected topic (its command was, say, a 5 MiB payload on a topic
    that allows it) is published again without the original bytes, which PostgreSQL keeps, instead
    of failing the batch for ever.
    """

    def __init__(self, settings: Settings, client_id: str, registry: SchemaRegistry | None) -> None:
        self.topic = settings.rejected_topic
        self.codec = AvroCodec()
        self.framing = Framing(registry, ScheduleCommandRejected.SCHEMA, self.topic, self.codec.catalog)
        self._producer = _Producer(
            producer_config(settings.kafka_bootstrap, client_id, {"message.max.bytes": MAX_REJECTION_BYTES})
        )

    def encode(self, recorded: RecordedRejection, *, trimmed: bool = False) -> bytes:
        r = recorded.rejection
        reason = r.reason
        if trimmed:
            reason += (
                f" [original_bytes ({len(r.original_bytes)} bytes) left out: too large for {self.topic}; "
                "PostgreSQL keeps them]"
            )
        message = ScheduleCommandRejected(
            rejected_at=recorded.rejected_at,
            code=r.code,  # type: ignore[arg-type]  # one of the codes the table's check admits
            reason=reason,
            command_id=r.command_id,
            schedule_key=r.schedule_key,
            app=r.app,
            original_bytes=b"" if trimmed else r.original_bytes,
            source=KafkaSource(topic=r.source.topic, partition=r.source.partition, offset=r.source.offset),
        )
        return self.codec.encode(message, confluent_schema_id=self.framing.schema_id)

    def publish(
        self,
        rejected: Sequence[RecordedRejection],
        traces: Mapping[Source, str | None] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """Publish and wait; ``traces`` gives each command's trace context, which its rejection continues."""
        traces = traces or {}
        too_large = self._send([(r, self.encode(r)) for r in rejected], traces, timeout_s)
        if too_large:
            still = self._send([(r, self.encode(r, trimmed=True)) for r in too_large], traces, timeout_s)
            if still:
                raise DeliveryError(
                    f"{len(still)} rejections too large for {self.topic} even without their bytes"
                )

    def _send(
        self,
        items: Sequence[tuple[RecordedRejection, bytes]],
        traces: Mapping[Source, str | None],
        timeout_s: float,
    ) -> list[RecordedRejection]:
        """Produce and wait; returns the ones refused as too large, raises on any other failure."""
        outcome: dict[int, KafkaError | None] = {}

        def on_delivery(index: int, err: KafkaError | None, _msg: Message) -> None:
            outcome[index] = err

        for index, (recorded, value) in enumerate(items):
            r = recorded.rejection
            key = f"{r.app}/{r.schedule_key}".encode() if r.app and r.schedule_key else None
            while True:
                try:
                    self._producer.produce(
                        self.topic,
                        value=value,
                        key=key,
                        headers=[(HEADER, child_traceparent(traces.get(r.source)))],
                        on_delivery=partial(on_delivery, index),
                    )
                    break
                except BufferError:
                    self._producer.poll(0.05)
                except KafkaException as exc:
                    error = exc.args[0]
                    if error.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                        raise
                    outcome[index] = error
                    break
        remaining = self._producer.flush(timeout_s)
        too_large = []
        for index, (recorded, _) in enumerate(items):
            err = outcome.get(index)
            if err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                too_large.append(recorded)
            elif err is not None or index not in outcome:
                reason = err if err is not None else f"{remaining} unacknowledged after {timeout_s:.0f} s"
                raise DeliveryError(f"rejection not acknowledged by {self.topic}: {reason}")
        return too_large

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)


class Ingestor:
    def __init__(self, settings: Settings, *, batch_size: int = BATCH, name: str | None = None) -> None:
        self.settings = settings
        self.batch_size = batch_size
        self.name = name or f"ingestor-{socket.gethostname()}-{os.getpid()}"
        registry = registry_for(settings.schema_registry_url)
        self.codec = AvroCodec(schema_for_id=None if registry is None else registry.schema_for_id)
        self.dispatcher = JobDispatcher(settings)
        self.publisher = RejectionPublisher(settings, self.name, registry)

    def ingest(self, conn: psycopg.Connection[Row], batch: Sequence[Consumed]) -> BatchResult:
        """Steps 1 to 3 for one batch; raises (having committed nothing) if a dependency failed."""
        started = time.perf_counter()
        decoded = [decode_command(self.codec, item) for item in batch]
        try:
            result = self._apply(conn, batch, decoded)
        except TRANSIENT_FAILURES:
            raise
        except Exception:
            log.exception(
                "a batch of %d failed unexpectedly; applying its commands one at a time", len(batch)
            )
            result = self._isolate(conn, batch, decoded)
        metrics.INGESTOR_BATCH_SECONDS.observe(time.perf_counter() - started)
        metrics.INGESTOR_COMMANDS.labels("applied").inc(result.applied)
        metrics.INGESTOR_COMMANDS.labels("duplicate").inc(result.duplicates)
        metrics.INGESTOR_COMMANDS.labels("rejected").inc(len(result.rejected))
        for recorded in result.rejected:
            metrics.INGESTOR_REJECTED.labels(recorded.rejection.code).inc()
        if result.rejected:
            first = result.rejected[0].rejection
            log.info(
                "batch of %d: %d applied, %d duplicates, %d rejected (first: %s at %s[%d]@%d: %s)",
                len(batch), result.applied, result.duplicates, len(result.rejected), first.code,
                first.source.topic, first.source.partition, first.source.offset, first.reason,
            )  # fmt: skip
        else:
            log.debug("batch of %d: %d applied, %d duplicates", len(batch), result.applied, result.duplicates)
        return result

    def _apply(
        self,
        conn: psycopg.Connection[Row],
        batch: Sequence[Consumed],
        decoded: Sequence[ValidCommand | Rejection],
    ) -> BatchResult:
        traces = {item.source: item.traceparent for item in batch}
        return apply_batch(
            conn,
            self.settings,
            decoded,
            dispatcher=self.dispatcher,
            before_commit=lambda rejected: self.publisher.publish(rejected, traces),
        )

    def _isolate(
        self,
        conn: psycopg.Connection[Row],
        batch: Sequence[Consumed],
        decoded: Sequence[ValidCommand | Rejection],
    ) -> BatchResult:
        """A batch that failed for a reason nobody foresaw (a bug) is applied one message at a time;
        the message that fails on its own is rejected, so that it cannot stall its partition."""
        total = BatchResult()
        for item, one in zip(batch, decoded, strict=True):
            try:
                result = self._apply(conn, [item], [one])
            except TRANSIENT_FAILURES:
                raise
            except Exception as exc:
                log.exception(
                    "rejecting %s[%d]@%d", item.source.topic, item.source.partition, item.source.offset
                )
                reason = f"the ingestor failed on this command ({type(exc).__name__}: {exc})"
                command = one.command if isinstance(one, ValidCommand) else None
                result = self._apply(conn, [item], [rejection("invalid", reason, item, command)])
            total.applied += result.applied
            total.duplicates += result.duplicates
            total.replayed += result.replayed
            total.rejected += result.rejected
        return total

    def _consumer(self) -> Consumer:
        group = f"{self.settings.topic_prefix}.ingestor"
        return Consumer(
            consumer_config(self.settings.kafka_bootstrap, group, self.name), [self.settings.schedules_topic]
        )

    def run(self, stop: threading.Event) -> None:
        consumer: Consumer | None = None
        conn: psycopg.Connection[Row] | None = None
        backoff = 0.2
        log.info("consuming %s", self.settings.schedules_topic)
        try:
            while not stop.is_set():
                try:
                    if consumer is None:
                        consumer = self._consumer()
                    if conn is None or conn.closed:
                        conn = connect(self.settings.database_url)
                    messages = consumer.poll_batch(self.batch_size, POLL_S)
                    if messages:
                        batch = [consumed(m) for m in messages]
                        self.ingest(conn, batch)
                        _commit(consumer, batch)
                    backoff = 0.2
                except TRANSIENT_FAILURES as exc:
                    log.warning("ingest failed (%s); retrying in %.1f s", exc, backoff)
                    # The consumer's position is past a batch that was not committed: a new consumer
                    # starts from the committed offsets and so reads that batch again.
                    if consumer is not None:
                        _close_quietly(consumer)
                    consumer = None
                    if conn is not None:
                        conn.close()
                    conn = None
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            if consumer is not None:
                _close_quietly(consumer)
            if conn is not None:
                conn.close()
            self.publisher.close()
        log.info("stopped")


def _commit(consumer: Consumer, batch: Sequence[Consumed]) -> None:
    """Step 4. Its failure is harmless: the batch is in PostgreSQL, and whoever reads it again (this
    consumer after a reconnect, or another after a rebalance took the partition) finds its commands
    applied and its rejections recorded. Treating it as harmless also keeps a rebalance from making
    every member drop its consumer and trigger the next rebalance."""
    try:
        consumer.commit(next_offsets(batch))
    except KafkaException as exc:
        log.info("offset commit failed (%s); the batch is applied and a re-read finds it so", exc)


def _close_quietly(consumer: Consumer) -> None:
    try:
        consumer.close()
    except (KafkaException, RuntimeError) as exc:
        log.debug("closing the consumer: %s", exc)
