"""The ingestor process (``scheduler run ingestor``): ``<prefix>.schedules`` into PostgreSQL.

It consumes the commands topic in batches, in a consumer group, so several ingestors share its
partitions. Each batch follows these steps, in this order:

1. decode and validate every message (:mod:`.commands`); a bad one becomes a rejection;
2. apply the batch in one PostgreSQL transaction (:func:`.apply.apply_batch`), which records the
   rejections and, before committing, has them published to ``<prefix>.schedules.rejected`` and
   acknowledged by Kafka;
3. commit the transaction;
4. commit the Kafka offsets past the batch.

Steps 2 and 3 of one batch run in a thread of their own while the loop reads and decodes the next
batch (step 1 needs no database), so the decoding's Python work overlaps PostgreSQL's work on the
batch before; the loop then waits for that batch and commits its offsets (step 4) before it hands
over the next one, so batches are still applied one after the other, in the order consumed.

A crash between 3 and 4 re-delivers the batch: its commands are then duplicates (their ids are
claimed) and its rejections are already recorded, so nothing is applied or published twice. A
failure of PostgreSQL, Kafka or the schema registry before 3 commits nothing; the ingestor drops its
consumer, backs off, and a new consumer reads the batch again from the committed offsets. A bad
message is never retried: it is rejected and passed, so it cannot stall a partition; and should a
batch fail for a reason nobody foresaw (a bug), its messages are applied one at a time and the one
that fails is rejected, for the same reason.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg

from scheduler.config import Settings
from scheduler.ingest import metrics
from scheduler.ingest.apply import BatchResult, RecordedRejection, apply_batch
from scheduler.ingest.commands import Consumed, ValidCommand, decode_command, rejection
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import KafkaSource, ScheduleCommandRejected
from scheduler.kafka.registry import Framing, RegistryUnavailable, SchemaRegistry
from scheduler.kafka.tracing import HEADER, child_traceparent, traceparent_of
from scheduler.kafka.transport import (
    Consumer,
    ConsumerSlot,
    DeliveryError,
    Offset,
    OutgoingMessage,
    Producer,
    Received,
    TransportError,
)
from scheduler.runtime.service import Check, Refusal, Service
from scheduler.scan.dispatch import JobDispatcher
from scheduler.store.database import Database, Session
from scheduler.store.ingest import Rejection, Source

log = logging.getLogger(__name__)

BATCH = 2000
# A batch also ends once its commands' bytes pass this (always holding one), as the scanner's and
# the relay's do: a command may carry a 1 MiB payload, held several times over as it is decoded,
# validated and sent, and one batch is applied while the next is decoded. 100 commands of 900 KB
# took the ingestor to 560 MiB, past its container's 384Mi, when batches were bounded by count alone.
BATCH_BYTES = 16 * 1024 * 1024
POLL_S = 0.2
GC_YOUNG_THRESHOLD = 50_000
# A rejection carries the command's bytes, and a command may exceed Kafka's default 1 MB where the
# topic allows it; the rejected topic's own limit is then what decides (see RejectionPublisher).
MAX_REJECTION_BYTES = 64 * 1024 * 1024
Row = dict[str, Any]

# Failures of what the ingestor depends on, not of a message: the batch is read again later.
TRANSIENT_FAILURES = (psycopg.OperationalError, TransportError, RegistryUnavailable)


def consumed(message: Received) -> Consumed:
    return Consumed(
        source=Source(message.topic, message.partition, message.offset),
        value=message.value,
        key=message.key,
        traceparent=traceparent_of(message.headers),
        timestamp_ms=message.timestamp_ms,
    )


def next_offsets(batch: Sequence[Consumed]) -> list[Offset]:
    """What to commit after ``batch``: per partition, the offset after the highest one consumed."""
    highest: dict[tuple[str, int], int] = {}
    for item in batch:
        key = (item.source.topic, item.source.partition)
        highest[key] = max(highest.get(key, -1), item.source.offset)
    return [Offset(topic, partition, offset + 1) for (topic, partition), offset in highest.items()]


class RejectionPublisher:
    """Publishes rejections and waits for Kafka's acknowledgement of each.

    The producer's ``send`` treats a batch as all-or-nothing; here each message's outcome matters:
    a rejection too large for the rejected topic (its command was, say, a 5 MiB payload on a topic
    that allows it) is published again without the original bytes, which PostgreSQL keeps, instead
    of failing the batch for ever.
    """

    def __init__(
        self, topic: str, codec: AvroCodec, registry: SchemaRegistry | None, producer: Producer
    ) -> None:
        """``producer`` allows messages of up to :data:`MAX_REJECTION_BYTES`."""
        self.topic = topic
        self.codec = codec
        self.framing = Framing(registry, ScheduleCommandRejected.SCHEMA, self.topic, self.codec.catalog)
        self._producer = producer

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
        outcome: dict[int, DeliveryError | None] = {}

        def on_delivery(index: int, error: DeliveryError | None) -> None:
            outcome[index] = error

        for index, (recorded, value) in enumerate(items):
            r = recorded.rejection
            key = f"{r.app}/{r.schedule_key}".encode() if r.app and r.schedule_key else None
            message = OutgoingMessage(
                self.topic, value, key, [(HEADER, child_traceparent(traces.get(r.source)))]
            )
            try:
                self._producer.produce(message, partial(on_delivery, index))
            except DeliveryError as exc:
                if not exc.too_large:
                    raise
                outcome[index] = exc
        remaining = self._producer.flush(timeout_s)
        too_large = []
        for index, (recorded, _) in enumerate(items):
            err = outcome.get(index)
            if err is not None and err.too_large:
                too_large.append(recorded)
            elif err is not None or index not in outcome:
                reason = err if err is not None else f"{remaining} unacknowledged after {timeout_s:.0f} s"
                raise DeliveryError(f"rejection not acknowledged by {self.topic}: {reason}")
        return too_large

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.close(timeout_s)


@dataclass(frozen=True, slots=True)
class _Applying:
    """A batch handed to the applying thread, and what becomes of it."""

    batch: Sequence[Consumed]
    outcome: Future[BatchResult]


class Ingestor(Service):
    transient = TRANSIENT_FAILURES

    def __init__(
        self,
        settings: Settings,
        database: Database,
        consumers: Callable[[], Consumer],
        publisher: RejectionPublisher,
        codec: AvroCodec,
        dispatcher: JobDispatcher,
        kafka_check: Check,
        *,
        name: str,
        batch_size: int = BATCH,
    ) -> None:
        super().__init__("ingestor")
        self.settings = settings
        self.database = database
        self.batch_size = batch_size
        self.instance = name  # this process's instance of the service (``self.name`` is its role)
        self.codec = codec
        self.dispatcher = dispatcher
        self.publisher = publisher
        self.kafka_check = kafka_check
        self.consumer = ConsumerSlot(consumers)
        self.session = Session(database)
        self._last_lag = 0.0
        self._applier = ThreadPoolExecutor(1, thread_name_prefix="ingestor-apply")
        self._applying: _Applying | None = None

    def checks(self) -> Sequence[Check]:
        return (self.database.check(), self.kafka_check, self.consumer.check())

    def run(self, stop: threading.Event, refusal: Refusal | None = None) -> None:
        # The cycle collector took a sixth of the ingestor's CPU on a bulk create: every batch holds
        # tens of thousands of objects for its duration, each of which the young collections (one
        # per 700 net allocations) walked again and again. The ingestor makes next to no cycles
        # (its objects go by reference counting), so collect only every GC_YOUNG_THRESHOLD net
        # allocations. (What start-up built is out of the collector's reach: see run_component.)
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        super().run(stop, refusal)

    def step(self) -> bool:
        # Connected before anything is read: PostgreSQL down, nothing is read only to be read
        # again, and a URL it refuses for good is said at start, not at the first command.
        conn = self.session.conn
        consumer = self.consumer.consumer
        messages = consumer.consume(self.batch_size, POLL_S, BATCH_BYTES)
        if messages:
            started = time.perf_counter()
            batch = [consumed(m) for m in messages]
            decoded = self.decode(batch)
            decode_s = time.perf_counter() - started
            self._settle(consumer)
            applied = self._applier.submit(self.apply, conn, batch, decoded, decode_s)
            self._applying = _Applying(batch, applied)
        else:
            self._settle(consumer)
        if time.monotonic() - self._last_lag >= 1.0:
            self.consumer.observe_lag(metrics.CONSUMER_LAG)
            self._last_lag = time.monotonic()
        return True  # consuming waits for messages itself

    def _settle(self, consumer: Consumer) -> None:
        """Wait for the batch being applied, then commit its offsets (step 4); raises what applying
        it raised (a transient failure: the batch is read again from the committed offsets)."""
        applying, self._applying = self._applying, None
        if applying is not None:
            applying.outcome.result()
            _commit(consumer, applying.batch)

    def _abandon(self) -> None:
        """Let the batch being applied end, committing no offsets: its connection is about to close."""
        applying, self._applying = self._applying, None
        if applying is not None:
            concurrent.futures.wait([applying.outcome])

    def reset(self) -> None:
        # The consumer's position is past a batch that was not committed: a new consumer starts
        # from the committed offsets and so reads that batch again.
        self._abandon()
        self.consumer.close()
        self.session.close()

    def drain(self) -> None:
        consumer = self.consumer.built
        if consumer is None:
            self._abandon()
            return
        try:
            self._settle(consumer)
        except TRANSIENT_FAILURES as exc:
            log.info("the last batch was not applied (%s); the next ingestor reads it again", exc)

    def close(self) -> None:
        self.reset()
        self._applier.shutdown()
        self.publisher.close()

    def decode(self, batch: Sequence[Consumed]) -> list[ValidCommand | Rejection]:
        """Step 1 for one batch."""
        return [decode_command(self.codec, item) for item in batch]

    def ingest(self, conn: psycopg.Connection[Row], batch: Sequence[Consumed]) -> BatchResult:
        """Steps 1 to 3 for one batch; raises (having committed nothing) if a dependency failed."""
        started = time.perf_counter()
        decoded = self.decode(batch)
        return self.apply(conn, batch, decoded, time.perf_counter() - started)

    def apply(
        self,
        conn: psycopg.Connection[Row],
        batch: Sequence[Consumed],
        decoded: Sequence[ValidCommand | Rejection],
        decode_s: float = 0.0,
    ) -> BatchResult:
        """Steps 2 and 3 for one decoded batch (``decode_s``: the seconds its decoding took)."""
        started = time.perf_counter() - decode_s
        try:
            result = self._apply(conn, batch, decoded)
        except TRANSIENT_FAILURES:
            raise
        except Exception:
            log.exception(
                "a batch of %d failed unexpectedly; applying its commands one at a time", len(batch)
            )
            result = self._isolate(conn, batch, decoded)
        metrics.BATCH_SECONDS.observe(time.perf_counter() - started)
        metrics.COMMANDS.labels("applied").inc(result.applied)
        metrics.COMMANDS.labels("duplicate").inc(result.duplicates)
        metrics.COMMANDS.labels("rejected").inc(len(result.rejected))
        for recorded in result.rejected:
            metrics.REJECTED.labels(recorded.rejection.code).inc()
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


def _commit(consumer: Consumer, batch: Sequence[Consumed]) -> None:
    """Step 4. Its failure is harmless: the batch is in PostgreSQL, and whoever reads it again (this
    consumer after a reconnect, or another after a rebalance took the partition) finds its commands
    applied and its rejections recorded. Treating it as harmless also keeps a rebalance from making
    every member drop its consumer and trigger the next rebalance."""
    try:
        consumer.commit(next_offsets(batch))
    except TransportError as exc:
        log.info("offset commit failed (%s); the batch is applied and a re-read finds it so", exc)
