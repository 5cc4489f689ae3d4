"""The worker: executes the jobs of one app from its topic and reports each outcome to Kafka.

Threads and their jobs:
1. The main thread owns the consumer and the commit. It fetches while fewer than ``concurrency``
   jobs are in flight (pausing its partitions otherwise, so the group keeps it as a member), hands
   each batch to the event loop, serves the producer's delivery reports, and commits per-partition
   watermarks (:mod:`scheduler.worker.progress`).
2. One asyncio loop runs every job: async handlers directly, sync handlers in a thread pool, each
   under its attempt's timeout. A job still running after a second reports ``started``, then
   heartbeats; these move the run to ``running`` and extend its lease.
3. An outcome is produced to ``.results`` (success), ``.retry`` (retryable, attempts left, with
   ``not_before`` from the backoff) or ``.dlq`` (dead, with the error, the attempt history and the
   original bytes). Only when Kafka acknowledged it does the job's offset count as finished.
   A message that cannot be decoded goes to ``.dlq`` with its raw bytes, and the partition moves on.

Workers never talk to PostgreSQL. On SIGTERM the worker stops fetching, lets in-flight jobs finish
within the grace period, publishes their outcomes, commits, and exits; whatever did not finish is
re-delivered to another member. On a rebalance it commits what is finished of the revoked
partitions and forgets them, so it never commits past unfinished work it no longer owns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from scheduler.config import Settings
from scheduler.domain.retry import RetryPolicy
from scheduler.kafka.avro import AvroCodec, MessageDecodeError
from scheduler.kafka.messages import (
    AttemptSummary,
    JobDeadLetter,
    JobMessage,
    JobResult,
    JobRetry,
    KafkaSource,
)
from scheduler.kafka.tracing import HEADER, child_traceparent, traceparent_of
from scheduler.kafka.transport import consumer_config, producer_config
from scheduler.worker.handlers import HandlerError, HandlerRegistry, JobContext
from scheduler.worker.progress import Progress

log = logging.getLogger(__name__)

STARTED_AFTER_S = 1.0
HEARTBEAT_EVERY_S = 10.0
COMMIT_EVERY_S = 0.2
MAX_UNACKED = 20_000
PAUSE_AFTER_FULL_S = 5.0
DEFAULT_GRACE_S = 30.0


def worker_group(settings: Settings, app: str) -> str:
    return f"{settings.topic_prefix}.workers.{app}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """A consumed message: where it came from, for the watermark and for dead letters."""

    topic: str
    partition: int
    offset: int
    value: bytes
    traceparent: str | None


class Worker:
    def __init__(
        self,
        settings: Settings,
        app: str,
        concurrency: int = 16,
        grace_s: float = DEFAULT_GRACE_S,
        name: str | None = None,
    ) -> None:
        self.settings = settings
        self.app = app
        self.topic = settings.jobs_topic(app)
        self.concurrency = concurrency
        self.grace_s = grace_s
        self.name = name or f"worker-{socket.gethostname()}-{os.getpid()}"
        self.codec = AvroCodec()
        self.handlers = HandlerRegistry(settings.http_allowlist)
        self.progress = Progress()
        # Running: handlers executing (bounded by --concurrency). Unacknowledged: fetched jobs whose
        # outcome Kafka has not acknowledged yet; it bounds memory, not execution, so that waiting
        # for acks (a few ms each) never idles the handlers.
        self._running = 0
        self._unacked = 0
        self._counts_lock = threading.Lock()
        self._paused = False
        self._full_since: float | None = None
        self._slot_freed = threading.Event()
        self._skipped: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self._consumer = Consumer(
            consumer_config(
                settings.kafka_bootstrap,
                worker_group(settings, app),
                self.name,
                # A member that stops polling for this long leaves the group; jobs run in other threads.
                {"max.poll.interval.ms": 300_000},
            )
        )
        # Outcomes must not be lost: librdkafka retries a delivery for as long as this allows.
        self._producer = Producer(
            producer_config(settings.kafka_bootstrap, self.name, {"message.timeout.ms": 300_000})
        )
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="job")
        self._loop.set_default_executor(self._pool)
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="jobs", daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()

    # --- main thread -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        self._loop_thread.start()
        self._consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        last_commit = time.monotonic()
        try:
            while not stop.is_set():
                self._fetch()
                self._producer.poll(0)
                self._settle_skipped()
                if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                    self._commit(asynchronous=True)
                    last_commit = time.monotonic()
            self._drain()
        finally:
            self._shutdown()

    def _free_slots(self) -> int:
        with self._counts_lock:
            return min(self.concurrency - self._running, MAX_UNACKED - self._unacked)

    def _job_done(self) -> None:
        with self._counts_lock:
            self._running -= 1
        self._slot_freed.set()

    def _fetch(self) -> None:
        free = self._free_slots()
        if free <= 0:
            if self._full_since is None:
                self._full_since = time.monotonic()
            if not self._paused and time.monotonic() - self._full_since > PAUSE_AFTER_FULL_S:
                # Pausing drops librdkafka's prefetched messages, so it is only worth it when the
                # slots stay taken (long jobs); a brief full house just waits for a slot.
                self._consumer.pause(self._consumer.assignment())
                self._paused = True
            if self._paused:
                # Still poll: it serves rebalances and keeps this member in the group.
                self._consumer.poll(0.01)
            self._slot_freed.wait(0.01)
            self._slot_freed.clear()
            return
        self._full_since = None
        if self._paused:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False
        messages = self._consumer.consume(min(free, 500), 0.05)
        deliveries: list[Delivery] = []
        for message in messages:
            err = message.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", err)
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None
            self.progress.started(topic, partition, offset)
            deliveries.append(
                Delivery(topic, partition, offset, message.value() or b"", traceparent_of(message.headers()))
            )
        if deliveries:
            with self._counts_lock:
                self._running += len(deliveries)
                self._unacked += len(deliveries)
            # One wake-up of the loop per batch, not per job.
            self._loop.call_soon_threadsafe(self._start_jobs, deliveries)

    def _commit(self, asynchronous: bool) -> None:
        moves = self.progress.to_commit()
        if not moves:
            return
        offsets = [TopicPartition(t, p, o) for t, p, o in moves]
        try:
            if asynchronous:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            else:
                self._consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:
            log.warning("commit failed (%s); the jobs above the last commit will be re-delivered", exc)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned partitions %s", sorted(tp.partition for tp in partitions))
        # librdkafka keeps a partition's pause flag across a revoke and a later re-assignment, so a
        # partition given back to us must be set to our current state explicitly, after assigning.
        consumer.incremental_assign(partitions)
        if self._paused:
            consumer.pause(partitions)
        else:
            consumer.resume(partitions)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("revoked partitions %s", sorted(tp.partition for tp in partitions))
        # Serve delivery reports first: whatever finished counts, then commit it and let go.
        self._producer.poll(0)
        self._commit(asynchronous=False)
        for tp in partitions:
            self.progress.forget(tp.topic, tp.partition)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost, not revoked: the group moved on without us, so a commit would be refused anyway.
        log.warning("lost partitions %s", sorted(tp.partition for tp in partitions))
        for tp in partitions:
            self.progress.forget(tp.topic, tp.partition)

    def _finished(self, delivery: Delivery) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                # The outcome is not on Kafka: leave the offset unfinished so the job is re-delivered.
                log.error("outcome of offset %s not delivered: %s", delivery.offset, err)
            self._settle(delivery, finished=err is None)

        return on_delivery

    def _settle(self, delivery: Delivery, finished: bool) -> None:
        """A fetched job needs nothing more from this worker; main thread only (it owns Progress)."""
        if finished:
            self.progress.finished(delivery.topic, delivery.partition, delivery.offset)
        with self._counts_lock:
            self._unacked -= 1

    def _settle_skipped(self) -> None:
        while not self._skipped.empty():
            self._settle(self._skipped.get_nowait(), finished=True)

    def _drain(self) -> None:
        """Stop fetching; wait for in-flight jobs within the grace period, then publish and commit."""
        deadline = time.monotonic() + self.grace_s
        self._consumer.pause(self._consumer.assignment())
        while self._unacked > 0 and time.monotonic() < deadline:
            self._producer.poll(0.05)
            self._settle_skipped()
        self._producer.flush(max(1.0, deadline - time.monotonic()))
        self._producer.poll(0)
        self._settle_skipped()
        self._commit(asynchronous=False)

    def _shutdown(self) -> None:
        for task in list(self._tasks):
            self._loop.call_soon_threadsafe(task.cancel)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._producer.flush(5)
        self._consumer.close()

    # --- event loop thread --------------------------------------------------------------------

    def _start_jobs(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            task = self._loop.create_task(self._execute(delivery))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _execute(self, delivery: Delivery) -> None:
        try:
            await self._execute_job(delivery)
        finally:
            self._job_done()

    async def _execute_job(self, delivery: Delivery) -> None:
        try:
            job = self.codec.decode(JobMessage, delivery.value)
        except MessageDecodeError as exc:
            self._dead_undecodable(delivery, str(exc))
            return
        started = datetime.now(UTC)
        if started > job.deadline:
            # The lease is over: the sweeper dispatches the next attempt; running this one too
            # would only add a duplicate. Settled by the main thread, which owns the watermarks.
            self._skipped.put(delivery)
            return
        try:
            result = await self._run_handler(delivery, job, started)
        except HandlerError as exc:
            self._failed(delivery, job, started, str(exc), exc.error_class, exc.retryable)
        except TimeoutError:
            self._failed(
                delivery, job, started, f"timed out after {job.timeout_ms / 1000:g} s", "Timeout", True
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(delivery, job, started, f"{type(exc).__name__}: {exc}", type(exc).__name__, True)
        else:
            self._succeeded(delivery, job, started, result)

    async def _run_handler(self, delivery: Delivery, job: JobMessage, started: datetime) -> Any:
        handler = self.handlers.resolve(job.handler)
        context = JobContext(
            run_id=job.run_id,
            schedule_id=job.schedule_id,
            app=job.app,
            attempt=job.attempt,
            max_attempts=job.retry.max_attempts,
            idempotency_key=job.idempotency_key,
            scheduled_for=job.scheduled_for,
            deadline=job.deadline,
            payload=json.loads(job.payload),
            heartbeat=lambda: self._heartbeat(delivery, job, started),
        )
        if HandlerRegistry.is_async(handler):
            work: asyncio.Future[Any] = asyncio.ensure_future(handler(context))
        elif job.handler == "builtin:noop":
            return handler(context)  # instant: a thread hop would cost more than the job
        else:
            work = self._loop.run_in_executor(None, handler, context)
        timeout = job.timeout_ms / 1000
        if timeout > STARTED_AFTER_S:
            done, _ = await asyncio.wait({work}, timeout=STARTED_AFTER_S)
            if not done:
                self._report(delivery, job, started, "started")
        remaining = timeout - (datetime.now(UTC) - started).total_seconds()
        while True:
            wait = min(HEARTBEAT_EVERY_S, remaining)
            try:
                return await asyncio.wait_for(asyncio.shield(work), max(wait, 0.0))
            except TimeoutError:
                remaining -= wait
                if remaining <= 0:
                    work.cancel()  # a thread cannot be stopped; its result will be ignored
                    raise
                self._report(delivery, job, started, "heartbeat")

    def _heartbeat(self, delivery: Delivery, job: JobMessage, started: datetime) -> None:
        # Called from the handler's own thread or task; the report is produced from the loop.
        self._loop.call_soon_threadsafe(self._report, delivery, job, started, "heartbeat")

    # --- outcomes (any thread) ----------------------------------------------------------------

    def _produce(
        self, topic: str, key: uuid.UUID | None, value: bytes, delivery: Delivery, *, outcome: bool = True
    ) -> None:
        """Produce a message caused by ``delivery``; an ``outcome`` finishes the job's offset once acked."""
        callback = self._finished(delivery) if outcome else None
        headers: list[tuple[str, str | bytes | None]] = [(HEADER, child_traceparent(delivery.traceparent))]
        while True:
            try:
                self._producer.produce(
                    topic,
                    value=value,
                    key=None if key is None else key.bytes,
                    headers=headers,
                    on_delivery=callback,
                )
                return
            except BufferError:
                time.sleep(0.01)

    def _report(self, delivery: Delivery, job: JobMessage, started: datetime, status: str) -> None:
        event = JobResult(
            event_id=uuid.uuid4(),
            status=status,  # type: ignore[arg-type]
            run_id=job.run_id,
            schedule_id=job.schedule_id,
            app=job.app,
            attempt=job.attempt,
            worker=self.name,
            started_at=started,
        )
        self._produce(
            self.settings.results_topic, job.run_id, self.codec.encode(event), delivery, outcome=False
        )

    def _succeeded(self, delivery: Delivery, job: JobMessage, started: datetime, result: Any) -> None:
        try:
            result_json = None if result is None else json.dumps(result, default=str)
        except (TypeError, ValueError):
            result_json = json.dumps(repr(result))
        event = JobResult(
            event_id=uuid.uuid4(),
            status="succeeded",
            run_id=job.run_id,
            schedule_id=job.schedule_id,
            app=job.app,
            attempt=job.attempt,
            worker=self.name,
            started_at=started,
            finished_at=datetime.now(UTC),
            result=result_json,
        )
        self._produce(self.settings.results_topic, job.run_id, self.codec.encode(event), delivery)

    def _failed(
        self,
        delivery: Delivery,
        job: JobMessage,
        started: datetime,
        error: str,
        error_class: str,
        retryable: bool,
    ) -> None:
        finished = datetime.now(UTC)
        policy = RetryPolicy(
            max_attempts=job.retry.max_attempts,
            base_seconds=job.retry.backoff_base_ms / 1000,
            max_backoff_seconds=job.retry.backoff_max_ms / 1000,
        )
        if policy.should_retry(job.attempt, retryable):
            retry = JobRetry(
                event_id=uuid.uuid4(),
                run_id=job.run_id,
                schedule_id=job.schedule_id,
                app=job.app,
                attempt=job.attempt,
                worker=self.name,
                started_at=started,
                finished_at=finished,
                error=error,
                error_class=error_class,
                not_before=policy.next_attempt_at(finished, job.attempt),
            )
            self._produce(self.settings.retry_topic, job.run_id, self.codec.encode(retry), delivery)
            return
        this_attempt = AttemptSummary(
            attempt=job.attempt,
            finished_at=finished,
            error=error,
            error_class=error_class,
            worker=self.name,
            started_at=started,
        )
        dead = JobDeadLetter(
            event_id=uuid.uuid4(),
            cause="retries_exhausted" if retryable else "non_retryable",
            app=job.app,
            run_id=job.run_id,
            schedule_id=job.schedule_id,
            attempt=job.attempt,
            worker=self.name,
            started_at=started,
            finished_at=finished,
            error=error,
            error_class=error_class,
            attempts=(*job.previous_attempts, this_attempt),
            original_bytes=delivery.value,
            source=KafkaSource(topic=delivery.topic, partition=delivery.partition, offset=delivery.offset),
        )
        self._produce(self.settings.dlq_topic, job.run_id, self.codec.encode(dead), delivery)

    def _dead_undecodable(self, delivery: Delivery, reason: str) -> None:
        dead = JobDeadLetter(
            event_id=uuid.uuid4(),
            cause="undecodable",
            app=self.app,
            run_id=None,
            schedule_id=None,
            attempt=None,
            worker=self.name,
            started_at=None,
            finished_at=datetime.now(UTC),
            error=reason,
            error_class="UndecodableMessage",
            attempts=(),
            original_bytes=delivery.value,
            source=KafkaSource(topic=delivery.topic, partition=delivery.partition, offset=delivery.offset),
        )
        self._produce(self.settings.dlq_topic, None, self.codec.encode(dead), delivery)
