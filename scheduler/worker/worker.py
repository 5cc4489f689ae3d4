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
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, SpanKind, use_span

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
from scheduler.kafka.transport import (
    Consumer,
    ConsumerError,
    ConsumerSlot,
    DeliveryError,
    Offset,
    OutgoingMessage,
    Partition,
    Producer,
    TransportError,
)
from scheduler.runtime.service import Check, Service
from scheduler.telemetry.logs import job_outcomes, log_context
from scheduler.telemetry.redact import redact_text
from scheduler.telemetry.tracing import (
    JOB_EXECUTION,
    job_attributes,
    job_outcome_attributes,
    kafka_attributes,
    record_failure,
    span_context_from_traceparent,
    start_span_from_traceparent,
    traceparent_of_span,
    tracing_exports,
)
from scheduler.worker import metrics
from scheduler.worker.handlers import HandlerError, HandlerRegistry, JobContext
from scheduler.worker.progress import Progress

log = logging.getLogger(__name__)

STARTED_AFTER_S = 1.0
HEARTBEAT_EVERY_S = 10.0
COMMIT_EVERY_S = 0.2
MAX_UNACKED = 20_000
PAUSE_AFTER_FULL_S = 5.0
DEFAULT_GRACE_S = 30.0
CANCEL_WAIT_S = 2.0


METRICS_EVERY_S = 1.0
ConsumerFactory = Callable[..., Consumer]
"""Builds the worker's consumer, given its rebalance callbacks (``on_assign``, ``on_revoke``, ``on_lost``)."""


@dataclass(frozen=True, slots=True)
class WorkerTopics:
    """Where a worker reads its app's jobs and writes their outcomes."""

    jobs: str
    group: str
    results: str
    retry: str
    dlq: str


@dataclass(frozen=True, slots=True)
class Delivery:
    """A consumed message: where it came from, for the watermark and for dead letters."""

    topic: str
    partition: int
    offset: int
    value: bytes
    traceparent: str | None
    # The trace context the job's outcome messages carry: the job.execution span once it exists.
    outcome_traceparent: str | None = None


class Worker(Service):
    # Consumer errors are logged where they happen (librdkafka reconnects by itself); what reaches
    # the lifecycle is a failure of the client itself, which is then rebuilt.
    transient = (TransportError,)

    def __init__(
        self,
        app: str,
        topics: WorkerTopics,
        *,
        codec: AvroCodec,
        handlers: HandlerRegistry,
        producer: Producer,
        consumers: ConsumerFactory,
        kafka_check: Check,
        concurrency: int = 16,
        grace_s: float = DEFAULT_GRACE_S,
        name: str,
    ) -> None:
        super().__init__("worker")
        self.app = app
        self.topics = topics
        self.topic = topics.jobs
        self.concurrency = concurrency
        self.grace_s = grace_s
        self.instance = name  # this process's instance of the service (``self.name`` is its role)
        self.codec = codec
        self.handlers = handlers
        self.progress = Progress()
        self.kafka_check = kafka_check
        # Running: handlers executing (bounded by --concurrency). Unacknowledged: fetched jobs whose
        # outcome Kafka has not acknowledged yet; it bounds memory, not execution, so that waiting
        # for acks (a few ms each) never idles the handlers.
        self._running = 0
        self._unacked = 0
        self._counts_lock = threading.Lock()
        self._paused = False
        self._full_since: float | None = None
        self._slot_freed = threading.Event()
        # Jobs that need nothing more from this worker, and whether their offset counts as finished:
        # skipped ones, and outcomes once Kafka answered. Delivery reports may be served on the jobs
        # thread too (a full producer queue polls there), so they only queue; the main thread settles.
        self._done: queue.SimpleQueue[tuple[Delivery, bool]] = queue.SimpleQueue()
        self._producer = producer
        self._slot = ConsumerSlot(
            lambda: consumers(on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        )
        self._assigned: frozenset[Partition] = frozenset()
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="job")
        self._loop.set_default_executor(self._pool)
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="jobs", daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_commit = time.monotonic()
        self._last_metrics = 0.0
        self._tracing = tracing_exports()
        metrics.CONCURRENCY.labels(app).set(concurrency)

    # --- main thread: the lifecycle ----------------------------------------------------------

    @property
    def _consumer(self) -> Consumer:
        return self._slot.consumer

    def checks(self) -> Sequence[Check]:
        def group() -> str | None:
            if self._slot.built is None:
                raise ConsumerError("no consumer: it is being rebuilt")
            assigned = len(self._assigned)
            return f"{assigned} partitions assigned" if assigned else "joining the group"

        return (self.kafka_check, Check("consumer_group", group))

    def run(self, stop: threading.Event) -> None:
        self._loop_thread.start()
        super().run(stop)

    def step(self) -> bool:
        self._fetch()
        self._producer.poll(0)
        self._settle_done()
        now = time.monotonic()
        if now - self._last_commit >= COMMIT_EVERY_S:
            self._commit(asynchronous=True)
            self._last_commit = now
        if now - self._last_metrics >= METRICS_EVERY_S:
            self._observe()
            self._last_metrics = now
        return True  # fetching waits for messages itself

    def drain(self) -> None:
        self._drain()

    def reset(self) -> None:
        # A rebuilt consumer joins the group afresh; closing this one revokes (and commits) first.
        self._slot.close()

    def close(self) -> None:
        self._shutdown()

    def _observe(self) -> None:
        with self._counts_lock:
            running = self._running
        metrics.ACTIVE_JOBS.labels(self.app).set(running)
        waiting = self._slot.observe_lag(metrics.CONSUMER_LAG)
        if waiting is not None:
            metrics.QUEUE_SIZE.labels(self.app).set(waiting)

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
                try:
                    self._consumer.poll(0.01)
                except TransportError as exc:
                    log.warning("consumer error: %s", exc)
            self._slot_freed.wait(0.01)
            self._slot_freed.clear()
            return
        self._full_since = None
        if self._paused:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False
        try:
            messages = self._consumer.consume(min(free, 500), 0.05)
        except TransportError as exc:
            log.warning("consumer error: %s", exc)
            return
        deliveries: list[Delivery] = []
        for message in messages:
            self.progress.started(message.topic, message.partition, message.offset)
            deliveries.append(
                Delivery(
                    message.topic,
                    message.partition,
                    message.offset,
                    message.value,
                    traceparent_of(message.headers),
                )
            )
        if deliveries:
            with self._counts_lock:
                self._running += len(deliveries)
                self._unacked += len(deliveries)
            # One wake-up of the loop per batch, not per job.
            self._loop.call_soon_threadsafe(self._start_jobs, deliveries)

    def _commit(self, asynchronous: bool) -> None:
        consumer = self._slot.built
        if consumer is None:
            return  # the watermarks stay where they are until a consumer can commit them
        moves = self.progress.to_commit()
        if not moves:
            return
        try:
            consumer.commit([Offset(t, p, o) for t, p, o in moves], asynchronous=asynchronous)
        except Exception as exc:
            log.warning("commit failed (%s); the jobs above the last commit will be re-delivered", exc)

    def _on_assign(self, partitions: list[Partition]) -> None:
        self._assigned |= frozenset(partitions)
        log.info("assigned partitions %s", sorted(p.partition for p in partitions))
        # librdkafka keeps a partition's pause flag across a revoke and a later re-assignment, so a
        # partition given back to us must be set to our current state explicitly, after assigning
        # (which the consumer has done before calling us).
        if self._paused:
            self._consumer.pause(partitions)
        else:
            self._consumer.resume(partitions)

    def _on_revoke(self, partitions: list[Partition]) -> None:
        self._assigned -= frozenset(partitions)
        log.info("revoked partitions %s", sorted(p.partition for p in partitions))
        # Serve delivery reports first: whatever finished counts, then commit it and let go.
        self._producer.poll(0)
        self._settle_done()
        self._commit(asynchronous=False)
        for p in partitions:
            self.progress.forget(p.topic, p.partition)

    def _on_lost(self, partitions: list[Partition]) -> None:
        self._assigned -= frozenset(partitions)
        # Lost, not revoked: the group moved on without us, so a commit would be refused anyway.
        log.warning("lost partitions %s", sorted(p.partition for p in partitions))
        for p in partitions:
            self.progress.forget(p.topic, p.partition)

    def _finished(self, delivery: Delivery) -> Callable[[DeliveryError | None], None]:
        def on_delivery(error: DeliveryError | None) -> None:
            if error is not None:
                # The outcome is not on Kafka: leave the offset unfinished so the job is re-delivered.
                log.error("outcome of offset %s not delivered: %s", delivery.offset, error)
            self._done.put((delivery, error is None))

        return on_delivery

    def _settle(self, delivery: Delivery, finished: bool) -> None:
        """A fetched job needs nothing more from this worker; main thread only (it owns Progress)."""
        if finished:
            self.progress.finished(delivery.topic, delivery.partition, delivery.offset)
        with self._counts_lock:
            self._unacked -= 1

    def _settle_done(self) -> None:
        while not self._done.empty():
            delivery, finished = self._done.get_nowait()
            self._settle(delivery, finished)

    def _drain(self) -> None:
        """Stop fetching; wait for in-flight jobs within the grace period, then publish and commit."""
        deadline = time.monotonic() + self.grace_s
        consumer = self._slot.built  # none after a failed rebuild: nothing to pause or commit
        if consumer is not None:
            consumer.pause(consumer.assignment())
        while self._unacked > 0 and time.monotonic() < deadline:
            self._producer.poll(0.05)
            self._settle_done()
        self._producer.flush(max(1.0, deadline - time.monotonic()))
        self._producer.poll(0)
        self._settle_done()
        self._commit(asynchronous=False)

    def _shutdown(self) -> None:
        if self._tasks:
            # Their offsets stay uncommitted, so the group redelivers them to another member.
            log.warning("%d jobs still running after the grace period are abandoned", len(self._tasks))
        if self._loop_thread.is_alive():
            try:
                # Cancelled on the loop and awaited there, so each job's own cleanup runs in its
                # own context rather than when the loop is torn down.
                asyncio.run_coroutine_threadsafe(self._cancel_jobs(), self._loop).result(CANCEL_WAIT_S + 1)
            except Exception:  # a job that ignores cancellation: the loop is stopped regardless
                log.debug("cancelling the jobs", exc_info=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._producer.close(5)
        self._slot.close()

    # --- event loop thread --------------------------------------------------------------------

    async def _cancel_jobs(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)

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
            metrics.UNDECODABLE.labels(self.app).inc()
            self._dead_undecodable(delivery, str(exc))
            return
        started = datetime.now(UTC)
        if started > job.deadline:
            # The lease is over: the sweeper dispatches the next attempt; running this one too
            # would only add a duplicate. Settled by the main thread, which owns the watermarks.
            self._done.put((delivery, True))
            return
        with log_context(app=job.app, schedule_id=job.schedule_id, run_id=job.run_id, attempt=job.attempt):
            if not self._tracing:
                # No span of our own, but the job's trace: log lines still carry its trace id.
                parent = span_context_from_traceparent(delivery.traceparent)
                with use_span(NonRecordingSpan(parent) if parent is not None else INVALID_SPAN):
                    await self._attempt(delivery, job, started)
                return
            attributes = job_attributes(
                job.run_id,
                job.handler,
                job.attempt,
                job.scheduled_for,
                app=job.app,
                schedule_id=job.schedule_id,
            ) | kafka_attributes(
                "process",
                delivery.topic,
                partition=delivery.partition,
                offset=delivery.offset,
                consumer_group=self.topics.group,
            )
            with start_span_from_traceparent(
                JOB_EXECUTION, delivery.traceparent, SpanKind.CONSUMER, attributes
            ) as span:
                # Outcomes are produced from other threads, where this span is not current.
                traced = replace(delivery, outcome_traceparent=traceparent_of_span(span))
                status, error = await self._attempt(traced, job, started)
                if error is not None:
                    record_failure(error[0], error[1])
                duration_ms = (datetime.now(UTC) - started).total_seconds() * 1000
                span.set_attributes(job_outcome_attributes(status, duration_ms))

    async def _attempt(
        self, delivery: Delivery, job: JobMessage, started: datetime
    ) -> tuple[str, tuple[str, str] | None]:
        """Run the handler and publish the outcome; returns its status and (error class, error)."""
        try:
            result = await self._run_handler(delivery, job, started)
        except HandlerError as exc:
            return self._failed(delivery, job, started, str(exc), exc.error_class, exc.retryable)
        except TimeoutError:
            error = f"timed out after {job.timeout_ms / 1000:g} s"
            return self._failed(delivery, job, started, error, "Timeout", True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Stored as "<class>: <error>", so the class is not repeated in the error itself.
            return self._failed(
                delivery, job, started, str(exc) or type(exc).__name__, type(exc).__name__, True
            )
        self._succeeded(delivery, job, started, result)
        return "succeeded", None

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
        message = OutgoingMessage(
            topic,
            value,
            None if key is None else key.bytes,
            [(HEADER, delivery.outcome_traceparent or child_traceparent(delivery.traceparent))],
        )
        try:
            # On a full queue this serves delivery reports from this thread, which only queue (see
            # _done); the main thread goes on polling meanwhile, as librdkafka allows.
            self._producer.produce(message, callback)
        except DeliveryError as exc:
            # Refused before it left (too large, say): the same outcome as a failed delivery.
            if callback is not None:
                callback(exc)
            else:
                log.warning("report for offset %s not sent: %s", delivery.offset, exc)

    def _report(self, delivery: Delivery, job: JobMessage, started: datetime, status: str) -> None:
        event = JobResult(
            event_id=uuid.uuid4(),
            status=status,  # type: ignore[arg-type]
            run_id=job.run_id,
            schedule_id=job.schedule_id,
            app=job.app,
            attempt=job.attempt,
            worker=self.instance,
            started_at=started,
        )
        self._produce(self.topics.results, job.run_id, self.codec.encode(event), delivery, outcome=False)

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
            worker=self.instance,
            started_at=started,
            finished_at=datetime.now(UTC),
            result=result_json,
        )
        self._produce(self.topics.results, job.run_id, self.codec.encode(event), delivery)
        self._outcome(job, started, "succeeded")

    def _failed(
        self,
        delivery: Delivery,
        job: JobMessage,
        started: datetime,
        error: str,
        error_class: str,
        retryable: bool,
    ) -> tuple[str, tuple[str, str]]:
        """Publish a failed attempt's outcome; returns its status and (error class, error)."""
        finished = datetime.now(UTC)
        # Stored in PostgreSQL and shown to operators: secrets in a handler's error text are masked.
        error = redact_text(error)
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
                worker=self.instance,
                started_at=started,
                finished_at=finished,
                error=error,
                error_class=error_class,
                not_before=policy.next_attempt_at(finished, job.attempt),
            )
            self._produce(self.topics.retry, job.run_id, self.codec.encode(retry), delivery)
            metrics.RETRIES.labels(self.app).inc()
            self._outcome(job, started, "retry", error_class, error)
            return "retry", (error_class, error)
        this_attempt = AttemptSummary(
            attempt=job.attempt,
            finished_at=finished,
            error=error,
            error_class=error_class,
            worker=self.instance,
            started_at=started,
        )
        dead = JobDeadLetter(
            event_id=uuid.uuid4(),
            cause="retries_exhausted" if retryable else "non_retryable",
            app=job.app,
            run_id=job.run_id,
            schedule_id=job.schedule_id,
            attempt=job.attempt,
            worker=self.instance,
            started_at=started,
            finished_at=finished,
            error=error,
            error_class=error_class,
            attempts=(*job.previous_attempts, this_attempt),
            original_bytes=delivery.value,
            source=KafkaSource(topic=delivery.topic, partition=delivery.partition, offset=delivery.offset),
        )
        self._produce(self.topics.dlq, job.run_id, self.codec.encode(dead), delivery)
        self._outcome(job, started, "dead", error_class, error)
        return "dead", (error_class, error)

    def _outcome(
        self,
        job: JobMessage,
        started: datetime,
        outcome: str,
        error_class: str | None = None,
        error: str | None = None,
    ) -> None:
        """The metrics and the one log line of an attempt's outcome (inside the job's log context)."""
        duration = (datetime.now(UTC) - started).total_seconds()
        metrics.EXECUTION_DURATION.labels(self.app, outcome).observe(duration)
        if error_class is not None:
            metrics.EXECUTION_ERRORS.labels(self.app, metrics.ERROR_CLASS(error_class)).inc()
        if job_outcomes.isEnabledFor(logging.INFO):
            job_outcomes.info(
                "job %s",
                outcome,
                extra={
                    "handler": job.handler,
                    "outcome": outcome,
                    "duration_ms": round(duration * 1000, 3),
                    "error_class": error_class,
                    "error": error,
                },
            )

    def _dead_undecodable(self, delivery: Delivery, reason: str) -> None:
        dead = JobDeadLetter(
            event_id=uuid.uuid4(),
            cause="undecodable",
            app=self.app,
            run_id=None,
            schedule_id=None,
            attempt=None,
            worker=self.instance,
            started_at=None,
            finished_at=datetime.now(UTC),
            error=reason,
            error_class="UndecodableMessage",
            attempts=(),
            original_bytes=delivery.value,
            source=KafkaSource(topic=delivery.topic, partition=delivery.partition, offset=delivery.offset),
        )
        self._produce(self.topics.dlq, None, self.codec.encode(dead), delivery)
