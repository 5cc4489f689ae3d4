"""The worker: executes the jobs of one app from its topic and reports each outcome to Kafka.

Threads and their jobs:
1. The main thread owns the consumer and the commit. It fetches while fewer than ``concurrency``
   jobs run and few outcomes await Kafka's acknowledgement (pausing its partitions when that
   lasts, so the group keeps it as a member), hands each batch to the event loop, settles the
   outcomes' delivery reports, produces failed outcomes again, and commits per-partition
   watermarks once Kafka acknowledged the outcomes below them (:mod:`scheduler.worker.progress`).
   It decodes each job: one whose ``scheduled_for`` is still ahead by this worker's clock (the
   scanner leased it ahead, ``SCHEDULER_LOOKAHEAD_S``) is *held*, in no slot; fetching goes on
   while fewer than :data:`MAX_HELD_JOBS` (and :data:`MAX_HELD_BYTES`) are held.
2. One asyncio loop runs every job: async handlers on the loop, each sync handler in a daemon
   thread of its own (a timed-out one is left behind, never waited for, and never holds up the
   next job), each under its attempt's timeout counted from the moment this worker starts it.
   Every job reports ``started`` and runs its handler only once Kafka acknowledged that start
   (so no execution goes unrecorded), then heartbeats every :data:`HEARTBEAT_EVERY_S`; these move
   the run to ``running`` and renew its lease (a handler's own ``ctx.heartbeat()`` calls add at
   most one a second). A second copy of an attempt this worker already started (a relay's
   republish, offsets re-read after a lost commit) is finished, not run again. Whatever a handler
   raises, ``SystemExit`` and ``KeyboardInterrupt`` included, fails its attempt and never the
   loop; a coroutine a sync handler returns is awaited, as its work. A held job sleeps on the
   loop's timers until just before its instant (:data:`ANNOUNCE_AHEAD`). Then, given a slot that
   is free and that no waiting job wants, it starts as of its instant: its ``started`` event says
   the instant, and once Kafka has it the handler runs at that instant (a timer that fires early
   sleeps the rest: never started early), its timeout counted from the handler's start.
   Otherwise it waits for its instant, then for a slot ahead of the jobs fetched since.
   Kafka's acknowledgements are served by a thread of their own as they come, so that a start
   does not also wait for the main thread's next poll. The workers' clocks are
   assumed synchronised with the database's (NTP): the scanner's "now" is PostgreSQL's, the hold
   is this worker's wall clock.
3. An outcome is produced to ``.results`` (success), ``.retry`` (retryable, attempts left, with
   the backoff delay) or ``.dlq`` (dead, with the error, the attempt history and the original
   bytes), its texts capped so that it always fits (:mod:`scheduler.domain.storable`). It is
   produced until Kafka acknowledges it (:mod:`scheduler.worker.deliveries`); only then does the
   job's offset count as finished. A message that cannot be decoded goes to ``.dlq`` with its raw
   bytes (and with the run and attempt its headers name, so that the run ends dead), and the
   partition moves on.

A consumer that fails for good (fenced by a member with the same ``group.instance.id``, any fatal
error) is rebuilt by the lifecycle; the new one resumes from the committed offsets, so the
watermarks start afresh.

Workers never talk to PostgreSQL. On SIGTERM the worker stops fetching, drops the jobs it has not
started (held until their instant, or waiting for a slot), lets in-flight jobs finish within the
grace period, publishes their outcomes, commits synchronously, and exits; whatever did not finish
or start is re-delivered to another member. On a revoke it drops the revoked partitions' jobs not
started, waits a bounded time for their in-flight jobs, commits what finished and lets go, so
that a rebalance re-runs as little as possible and it never commits past unfinished work it no
longer owns. A dropped or held job's offset is never committed (the watermark stops below it), so
a worker killed while holding jobs loses none: the group redelivers them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import json
import logging
import math
import queue
import random
import threading
import time
import traceback
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, Span, SpanKind, use_span
from prometheus_client import Histogram

from scheduler.domain.ids import new_event_id
from scheduler.domain.retry import RetryPolicy
from scheduler.domain.storable import (
    MAX_ERROR_CHARS,
    MAX_HISTORY_ERROR_CHARS,
    MAX_RESULT_BYTES,
    capped_result,
    capped_text,
)
from scheduler.kafka.avro import AvroCodec, MessageDecodeError
from scheduler.kafka.messages import (
    ATTEMPT_HEADER,
    DUE_AT_HEADER,
    RUN_ID_HEADER,
    AttemptSummary,
    JobDeadLetter,
    JobMessage,
    JobResult,
    JobRetry,
    KafkaSource,
)
from scheduler.kafka.tracing import HEADER, child_traceparent, traceparent_of
from scheduler.kafka.transport import (
    CommitResult,
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
from scheduler.runtime.service import Check, Refusal, Service
from scheduler.telemetry.logs import job_outcomes, log_context
from scheduler.telemetry.redact import PayloadMask, redact_text
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
from scheduler.worker.deliveries import Owed, Redeliveries
from scheduler.worker.handlers import (
    BUILTIN_PREFIX,
    Handler,
    HandlerError,
    HandlerExited,
    HandlerNotFound,
    HandlerRegistry,
    JobContext,
    NonRetryableError,
    classify,
    error_text,
)
from scheduler.worker.progress import Key, Progress

log = logging.getLogger(__name__)

# Well inside the lease window (30 s by default) the reconciler renews on each of them.
HEARTBEAT_EVERY_S = 5.0
# A handler's own ctx.heartbeat() calls are sent at most this often per job: each one is a message
# and an attempts row, and a handler may well call it in a tight loop.
HANDLER_HEARTBEAT_EVERY_S = 1.0
COMMIT_EVERY_S = 0.2
# Outcomes produced and not yet acknowledged, beyond which no new job starts: jobs that ran while
# Kafka could not take their outcomes would be run again by whoever gets their offsets.
MIN_UNACKED_BOUND = 64
PAUSE_AFTER_FULL_S = 5.0
DEFAULT_GRACE_S = 30.0
CANCEL_WAIT_S = 2.0
# On a revoke, the longest wait for the revoked partitions' jobs (never more than the grace).
REVOKE_WAIT_S = 10.0
# After the drain: outcomes acknowledged this late are still committed, by the last commit.
CLOSE_FLUSH_S = 1.0
WARN_EVERY_S = 10.0
# Commit refusals that every rebalance brings (the generation moved on): retried, not worth a warning.
REBALANCING = frozenset({"ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS", "UNKNOWN_MEMBER_ID"})
# Consumer errors after which the consumer never works again (fenced by another member with the
# same group.instance.id, any other fatal error): only a consumer built afresh recovers.
UNRECOVERABLE = frozenset({"_FATAL", "FENCED_INSTANCE_ID"})

MAX_ATTEMPT = 2**31 - 1  # an Avro int

# The compact form of an outcome Kafka refused for its size: far under any message limit.
COMPACT_RESULT_BYTES = 16 * 1024
COMPACT_ERROR_CHARS = 1024
COMPACT_HISTORY_ERROR_CHARS = 256
COMPACT_ORIGINAL_BYTES = 64 * 1024
MAX_ERROR_CLASS_CHARS = 200
# A handler's error is redacted and searched for its payload's values only as far as it can be
# kept, plus a margin: a value of up to that many characters cut where the search ends leaves no
# start behind, since the margin is dropped. The work is the same for a 5 MB error as for 8 KB.
ERROR_MARGIN_CHARS = 256
SCANNED_ERROR_CHARS = MAX_ERROR_CHARS + ERROR_MARGIN_CHARS

# Attempts this worker started, remembered so that a second copy of one is not run again.
REMEMBERED_ATTEMPTS = 100_000
START_RETRY_INITIAL_S = 0.5
START_RETRY_MAX_S = 5.0

METRICS_EVERY_S = 1.0
# Jobs fetched before their instant are held (no slot) until it. At most this many, and this many
# bytes of messages, are held at once; beyond either, fetching pauses. 5,000 covers one worker at
# 5,000 fires/s with the default 1 s look-ahead; the byte bound keeps memory bounded whatever the
# payloads (a 1 MiB payload is valid, and 5,000 of them would not be).
MAX_HELD_JOBS = 5_000
MAX_HELD_BYTES = 64 * 1024 * 1024
# The longest hold: the greatest SCHEDULER_LOOKAHEAD_S allowed (60 s) and a margin for clocks.
MAX_HOLD = timedelta(seconds=65)
# A held job's start event is produced this long before its instant, so that Kafka has
# acknowledged it (the producer's 10 ms linger and a round trip; tens of ms under load) by the time
# the handler is due: the handler runs at its instant rather than that much after it. The event
# says the attempt starts at the instant. Only into a slot that is free and that no waiting job
# wants (see _hold): the job keeps that slot, idle, from the announcement on.
ANNOUNCE_AHEAD = timedelta(milliseconds=50)
# How long the deliveries thread waits for a delivery report at a time (it returns as one comes):
# only how soon it notices the worker stopping.
DELIVERIES_POLL_S = 0.2
# The longest wait for the job loop to drop the held jobs of revoked partitions.
DROP_WAIT_S = 1.0
# The job loop answers the main thread's ping within this, or the worker is not ready: an async
# handler that blocks the loop stops every job's timeout and heartbeats on this worker. Blocked
# past /live's timeout, the worker is not live either (see seconds_since_turn).
LOOP_STALL_S = 10.0
ConsumerFactory = Callable[..., Consumer]
"""Builds the worker's consumer, given its callbacks (``on_assign``, ``on_revoke``, ``on_lost``,
``on_commit``)."""


T = TypeVar("T")


class _TimedOut(Exception):
    """The attempt's timeout passed (raised by the worker, never taken for a handler's own TimeoutError)."""


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
    # The message's headers, read when its body cannot be decoded (see _attempt_of) and for when a
    # first attempt was due (see _due_at).
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(slots=True, eq=False)
class _Fetched:
    """A consumed job as the main thread decoded it: ``job`` is None when its bytes are poison
    (``error`` says why). ``stage``: ``held`` (due after the moment it was fetched: held until
    then, in no slot), ``waiting`` (fetched due) or ``due`` (held until now) while it waits for a
    slot, ``ahead`` in a slot taken just before its instant, its start announced ahead and its
    handler not entered yet, ``running`` in its slot, ``done``. It says what the job's end gives
    back."""

    delivery: Delivery
    job: JobMessage | None
    error: str | None
    stage: str
    # When it may start: its instant, or, for one further ahead than any look-ahead allows (a
    # clock far off, a message not from a scanner), the end of the longest hold; poison at once.
    start_at: datetime
    task: asyncio.Task[None] | None = None
    # Poison that names a run in its headers which is not this app's to end: a job of another app.
    foreign: bool = False

    @property
    def key(self) -> Key:
        return (self.delivery.topic, self.delivery.partition)


@dataclass(slots=True)
class _Beats:
    """When a job's handler last had a heartbeat sent (its thread and the loop may both ask), and
    whether its attempt is over: a handler left behind past its timeout does not go on renewing a
    lease that is no longer its own."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    last: float = -math.inf
    over: bool = False

    def due(self, now: float) -> bool:
        with self.lock:
            if self.over or now - self.last < HANDLER_HEARTBEAT_EVERY_S:
                return False
            self.last = now
            return True

    def end(self) -> None:
        with self.lock:
            self.over = True


@dataclass(frozen=True, slots=True)
class _Failure:
    """How an attempt failed: what its outcome carries (class, masked text) and the handler's
    frames, which only its span and log line carry."""

    error_class: str
    error: str
    stack_trace: str | None = None


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
        metrics.start_series(app)
        self.topics = topics
        self.topic = topics.jobs
        self.concurrency = concurrency
        self.grace_s = grace_s
        self.instance = name  # this process's instance of the service (``self.name`` is its role)
        self.codec = codec
        self.handlers = handlers
        self.progress = Progress()
        self.kafka_check = kafka_check
        # Running: handlers executing (bounded by --concurrency). Unacknowledged: outcomes produced
        # and not yet acknowledged by Kafka (bounded by unacked_bound): while Kafka does not take
        # them, starting more jobs would only pile up executions that may have to run again.
        self.unacked_bound = max(concurrency, MIN_UNACKED_BOUND)
        self._running = 0
        self._unacked = 0
        # Held: fetched before their instant, waiting for it (no slot, bounded by MAX_HELD_JOBS and
        # MAX_HELD_BYTES). Waiting: due (fetched due, or held until now) and waiting for a slot;
        # counted against --concurrency when fetching, so new jobs never overtake them.
        self._held = 0
        self._held_bytes = 0
        self._waiting = 0
        # Ahead: in a slot taken just before their instant (ANNOUNCE_AHEAD), handler not entered.
        # They count against --concurrency, never against fetching: fetching must go on filling the
        # held jobs however many are about to start.
        self._ahead = 0
        self._counts_lock = threading.Lock()
        self._paused = False
        self._full_since: float | None = None
        self._draining = False
        self._slot_freed = threading.Event()
        # Delivery reports may be served on the jobs thread too (a full producer queue polls there),
        # so they only queue; the main thread, which owns the watermarks, settles them.
        self._reports: queue.SimpleQueue[tuple[Owed[Delivery], Exception | None]] = queue.SimpleQueue()
        # Jobs left without an outcome by a fault of the worker's own code: their offsets move on
        # (a started run's lease brings it back), rather than freezing their partitions' commits.
        self._released: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        # Kafka's answers to start events, for the jobs thread: reports come by the hundred in one
        # poll, and waking the loop once for each (a pipe write) cost the worker an eighth of its CPU,
        # so a report only queues, and the first one of a round wakes the loop for all of them.
        self._start_acks: deque[tuple[asyncio.Future[Exception | None], Exception | None]] = deque()
        self._start_acks_lock = threading.Lock()
        self._start_acks_woken = False
        self._redeliveries: Redeliveries[Delivery] = Redeliveries()
        self._producer = producer
        self._slot = ConsumerSlot(
            lambda: consumers(
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
                on_commit=self._on_commit,
            )
        )
        self._assigned: frozenset[Partition] = frozenset()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._run_jobs_loop, name="jobs", daemon=True)
        # Serves the producer's delivery reports as they come, so that a job whose handler waits
        # for Kafka to acknowledge its start is not also waiting for the main thread, which spends
        # up to a fetch's wait (50 ms) in the consumer between two polls of the producer.
        self._deliveries_stop = threading.Event()
        self._deliveries_thread = threading.Thread(
            target=self._serve_deliveries, name="deliveries", daemon=True
        )
        self._tasks: set[asyncio.Task[None]] = set()
        # The jobs thread only. Jobs not started yet (held, or waiting for a slot), by partition: on
        # a revoke, a loss or a stop they are dropped, never run early nor waited for.
        self._unstarted: dict[Key, dict[asyncio.Task[None], _Fetched]] = {}
        # Futures of jobs waiting for a slot: those whose instant came while held go first.
        self._due_waiters: deque[tuple[asyncio.Future[None], _Fetched]] = deque()
        self._fresh_waiters: deque[tuple[asyncio.Future[None], _Fetched]] = deque()
        # (run, attempt) of every job started lately, oldest first, as one int each (_attempt_key);
        # the jobs thread only.
        self._started_attempts: OrderedDict[int, None] = OrderedDict()
        # (topic, partition, offset) of every job whose handler runs now, its start on record in
        # Kafka: written by the jobs thread only, copied whole (atomic) by a drain that finds the job
        # loop blocked (see _commit_past_blocked).
        self._in_handler: dict[tuple[str, int, int], None] = {}
        self._abandoned: list[threading.Thread] = []  # guarded by _counts_lock
        self._last_commit = time.monotonic()
        self._last_metrics = 0.0
        self._ping_sent: float | None = None  # monotonic; set by the main thread, cleared by the loop
        self._warned: dict[str, float] = {}
        self._tracing = tracing_exports()
        # EXECUTION_DURATION's series of this app, by outcome.
        self._durations: dict[str, Histogram] = {}
        self._start_lag = metrics.START_LAG.labels(app)
        metrics.CONCURRENCY.labels(app).set(concurrency)

    # --- main thread: the lifecycle ----------------------------------------------------------

    @property
    def _consumer(self) -> Consumer:
        return self._slot.consumer

    def checks(self) -> Sequence[Check]:
        def group() -> str | None:
            if self._slot.built is None:
                raise ConsumerError("no consumer: it is being rebuilt")
            # The consumer's own assignment, as the main thread last read it (_observe): a consumer
            # that lost its partitions without a callback (fenced) does not claim them still.
            assigned = len(self._assigned)
            return f"{assigned} partitions assigned" if assigned else "joining the group"

        def job_loop() -> str | None:
            stalled = self._loop_stalled_s()
            if stalled >= LOOP_STALL_S:
                raise RuntimeError(
                    f"the job loop has not answered for {stalled:.0f} s: an async handler is blocking it"
                )
            return None

        return (self.kafka_check, Check("consumer_group", group), Check("job_loop", job_loop))

    def seconds_since_turn(self) -> float:
        # Not ready after LOOP_STALL_S (the job loop's check); not live once past /live's timeout,
        # so that a handler blocking the loop for good gets the worker restarted, and its jobs
        # (their offsets uncommitted, their leases lapsing) go to another member.
        return max(super().seconds_since_turn(), self._loop_stalled_s())

    def _loop_stalled_s(self) -> float:
        """How long the job loop has left the main thread's ping unanswered (0 when it answered)."""
        sent = self._ping_sent
        return 0.0 if sent is None else time.monotonic() - sent

    def _ping_loop(self) -> None:
        """Main thread, every second: ask the job loop to answer; warn once when it stalls."""
        if self._ping_sent is None:
            self._ping_sent = time.monotonic()
            with contextlib.suppress(RuntimeError):  # a closed loop: the worker is stopping
                self._loop.call_soon_threadsafe(self._pong)
        elif time.monotonic() - self._ping_sent >= LOOP_STALL_S:
            self._warn(
                "loop",
                "the job loop has not answered for %.0f s: an async handler is blocking it "
                "(every job's timeout and heartbeats on this worker wait)",
                self._loop_stalled_s(),
            )

    def _pong(self) -> None:
        self._ping_sent = None

    def run(self, stop: threading.Event, refusal: Refusal | None = None) -> None:
        self._loop_thread.start()
        self._deliveries_thread.start()
        super().run(stop, refusal)

    def step(self) -> bool:
        self._fetch()
        self._serve_outcomes()
        now = time.monotonic()
        if now - self._last_commit >= COMMIT_EVERY_S:
            self._commit_async()
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
        # It delivers them again from the committed offsets, the unstarted ones among them.
        self._drop_unstarted_soon()
        # Whatever its callbacks said, none of its partitions is ours now, and the next consumer
        # delivers them again from their committed offsets: their watermarks start afresh.
        self._assigned = frozenset()
        self.progress.forget_all()

    def close(self) -> None:
        self._shutdown()

    def _observe(self) -> None:
        self._ping_loop()
        with self._counts_lock:
            running, unacked, held = self._running, self._unacked, self._held
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            abandoned = len(self._abandoned)
        metrics.ACTIVE_JOBS.labels(self.app).set(running)
        metrics.HELD_JOBS.labels(self.app).set(held)
        metrics.OUTCOMES_UNACKNOWLEDGED.labels(self.app).set(unacked)
        metrics.ABANDONED_THREADS_ALIVE.labels(self.app).set(abandoned)
        consumer = self._slot.built
        if consumer is not None:
            self._assigned = frozenset(consumer.assignment())
        waiting = self._slot.observe_lag(metrics.CONSUMER_LAG)
        if waiting is not None:
            metrics.QUEUE_SIZE.labels(self.app).set(waiting)

    def _warn(self, kind: str, message: str, *args: object) -> None:
        """A warning at most every :data:`WARN_EVERY_S` per kind: an outage fails every delivery and
        commit, and one line says it as well as thousands."""
        now = time.monotonic()
        if now - self._warned.get(kind, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned[kind] = now
            log.warning(message, *args)

    def _free_slots(self) -> int:
        """How many jobs to fetch now: the slots neither running nor promised to a waiting job; none
        while outcomes await Kafka or the held jobs are at their bound."""
        with self._counts_lock:
            if self._unacked > self.unacked_bound:
                return 0
            if self._held >= MAX_HELD_JOBS or self._held_bytes >= MAX_HELD_BYTES:
                return 0
            # Never more than the held jobs' room either: every job fetched may be one to hold.
            return min(self.concurrency - self._running - self._waiting, MAX_HELD_JOBS - self._held)

    def _busy(self) -> bool:
        """Whether the drain still waits: jobs running, outcomes unacknowledged, or jobs kept (due
        within the grace's first half) that have yet to start."""
        with self._counts_lock:
            return (
                self._running > 0
                or self._ahead > 0
                or self._unacked > 0
                or self._held > 0
                or self._waiting > 0
            )

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
                # Still poll: it serves rebalances and commit answers, and keeps this member in the group.
                try:
                    self._consumer.poll(0.01)
                except TransportError as exc:
                    self._consumer_error(exc)
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
            self._consumer_error(exc)
            return
        fetched: list[_Fetched] = []
        for message in messages:
            self.progress.started(message.topic, message.partition, message.offset)
            fetched.append(
                self._decoded(
                    Delivery(
                        message.topic,
                        message.partition,
                        message.offset,
                        message.value,
                        traceparent_of(message.headers),
                        headers=message.headers,
                    )
                )
            )
        if fetched:
            held = [f for f in fetched if f.stage == "held"]
            with self._counts_lock:
                self._held += len(held)
                self._held_bytes += sum(len(f.delivery.value) for f in held)
                self._waiting += len(fetched) - len(held)
            # One wake-up of the loop per batch, not per job.
            self._loop.call_soon_threadsafe(self._start_jobs, fetched)

    def _decoded(self, delivery: Delivery) -> _Fetched:
        """The job a delivery carries, and whether it is held: due after this worker's clock now."""
        try:
            job = self.codec.decode(JobMessage, delivery.value)
        except Exception as exc:  # whatever the bytes make the decoder raise, they are poison
            reason = str(exc) if isinstance(exc, MessageDecodeError) else f"{type(exc).__name__}: {exc}"
            return _Fetched(delivery, None, reason, "waiting", datetime.now(UTC))
        if job.app != self.app:
            # Not run: this app's handlers are not the other app's, and its outcome would end the
            # other app's run. Dead-lettered as this app's poison, with its bytes and without its
            # run: kept in this app's dead letters, never applied to that run.
            reason = f"a job of app {job.app[:100]!r} on the topic of app {self.app!r}: not run"
            return _Fetched(delivery, None, reason, "waiting", datetime.now(UTC), foreign=True)
        now = datetime.now(UTC)
        # A job due already may start now. Taking "now" rather than its instant keeps the arithmetic
        # on start_at (announced ANNOUNCE_AHEAD before it) in range for an instant in year 1.
        start_at = max(job.scheduled_for, now)
        if start_at > now + MAX_HOLD:
            # Held to its instant, it would keep its partition's commits behind it for that long.
            # No scanner sends a job this far ahead, so this worker's clock (or the message) is off.
            start_at = now + MAX_HOLD
            metrics.HOLDS_CUT_SHORT.labels(self.app).inc()
            self._warn(
                "hold",
                "job of run %s due %s, further ahead than any look-ahead (%s s): started at %s; "
                "is this worker's clock synchronised?",
                job.run_id,
                job.scheduled_for.isoformat(),
                MAX_HOLD.total_seconds(),
                start_at.isoformat(),
            )
        return _Fetched(delivery, job, None, "held" if start_at > now else "waiting", start_at)

    def _consumer_error(self, exc: TransportError) -> None:
        """A consumer error from consume or poll: librdkafka recovers from most by itself, so they
        are logged; after an unrecoverable one it never would, so it goes to the lifecycle, which
        rebuilds the consumer (see reset)."""
        if exc.code not in UNRECOVERABLE:
            self._warn("consumer", "consumer error: %s", exc)
            return
        now = time.monotonic()
        if "fenced" in str(exc).lower() and now - self._warned.get("fenced", -WARN_EVERY_S) >= WARN_EVERY_S:
            # Two members with one identity fence each other in turn: one line says it.
            self._warned["fenced"] = now
            log.error(
                "another member of group %s uses this worker's group.instance.id "
                "(SCHEDULER_GROUP_INSTANCE_ID): every instance needs its own; rejoining",
                self.topics.group,
            )
        raise exc

    # --- deliveries thread -----------------------------------------------------------------------

    def _serve_deliveries(self) -> None:
        """Wait for the producer's delivery reports and serve each as it comes: start events'
        answers go to the job loop (:meth:`_start_acked`), outcomes' to the main thread's queue."""
        while not self._deliveries_stop.is_set():
            try:
                self._producer.poll(DELIVERIES_POLL_S)
            except Exception as exc:  # never seen: a moment's pause, and the main thread's polls go on
                self._warn("deliveries", "serving the producer's delivery reports failed: %r", exc)
                self._deliveries_stop.wait(DELIVERIES_POLL_S)

    # --- main thread: outcomes and commits ------------------------------------------------------

    def _serve_outcomes(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports, settle them, and produce again the outcomes whose retry is due."""
        self._producer.poll(timeout_s)
        self._settle()
        for owed in self._redeliveries.due(time.monotonic()):
            self._produce_owed(owed)

    def _settle(self) -> None:
        """Main thread only (it owns Progress): acknowledged outcomes finish their offsets, failed
        ones are scheduled to be produced again."""
        settled = False
        while not self._reports.empty():
            owed, error = self._reports.get_nowait()
            if error is None:
                self._finish(owed.delivery)
                with self._counts_lock:
                    self._unacked -= 1
                settled = True
                continue
            metrics.OUTCOME_DELIVERY_FAILURES.labels(self.app).inc()
            too_large = isinstance(error, DeliveryError) and error.too_large
            try:
                owed.failed(time.monotonic(), too_large=too_large)
            except Exception:
                log.exception("the compact outcome of offset %s could not be encoded", owed.delivery.offset)
                metrics.OUTCOMES_UNENCODABLE.labels(self.app).inc()
                self._finish(owed.delivery)
                with self._counts_lock:
                    self._unacked -= 1
                settled = True
                continue
            self._warn(
                "delivery",
                "outcome of %s[%d]@%d not delivered (%s); producing it again in %.1f s "
                "(%d outcomes awaiting Kafka)",
                owed.delivery.topic,
                owed.delivery.partition,
                owed.delivery.offset,
                error,
                max(0.0, owed.due - time.monotonic()),
                len(self._redeliveries) + 1,
            )
            self._redeliveries.add(owed)
        with self._counts_lock:
            waiting = self._waiting
        if settled and waiting:
            # Jobs may wait for the outcome bound rather than for a slot: one wake-up of the loop
            # lets them start, however many outcomes Kafka acknowledged.
            with contextlib.suppress(RuntimeError):  # a closed loop: the worker stopped
                self._loop.call_soon_threadsafe(self._admit)
        while not self._released.empty():
            self._finish(self._released.get_nowait())

    def _finish(self, delivery: Delivery) -> None:
        self.progress.finished(delivery.topic, delivery.partition, delivery.offset)

    def _on_commit(self, results: list[CommitResult]) -> None:
        """Kafka's answer to an asynchronous commit (served inside consume and poll, on this thread)."""
        for result in results:
            o = result.offset
            if result.error is None:
                self.progress.confirmed(o.topic, o.partition, o.offset)
            else:
                self.progress.commit_failed(o.topic, o.partition, o.offset)
                metrics.COMMIT_FAILURES.labels(self.app).inc()
                if result.error.code in REBALANCING:
                    log.debug("commit refused during a rebalance (%s); sent again", result.error)
                else:
                    self._warn(
                        "commit", "commit not confirmed (%s); the next round sends it again", result.error
                    )

    def _commit_async(self) -> None:
        consumer = self._slot.built
        if consumer is None:
            return  # the watermarks stay where they are until a consumer can commit them
        moves = self.progress.to_commit(time.monotonic())
        if not moves:
            return
        try:
            consumer.commit([Offset(t, p, o) for t, p, o in moves], asynchronous=True)
        except Exception as exc:
            for topic, partition, offset in moves:
                self.progress.commit_failed(topic, partition, offset)
            metrics.COMMIT_FAILURES.labels(self.app).inc()
            self._warn("commit", "commit failed (%s); the next round sends it again", exc)

    def _commit_now(self, partitions: Collection[Key] | None = None) -> None:
        """Synchronously commit every partition (of ``partitions``) whose finished work Kafka has not
        confirmed: the last commit before letting go of partitions."""
        consumer = self._slot.built
        if consumer is None:
            return
        behind = self.progress.behind(partitions)
        if not behind:
            return
        try:
            consumer.commit([Offset(t, p, o) for t, p, o in behind], asynchronous=False)
        except Exception as exc:
            metrics.COMMIT_FAILURES.labels(self.app).inc()
            log.warning("commit failed (%s); the jobs above the last commit will be re-delivered", exc)
            return
        for topic, partition, offset in behind:
            self.progress.confirmed(topic, partition, offset)

    # --- main thread: rebalances, drain, stop ---------------------------------------------------

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
        keys = {(p.topic, p.partition) for p in partitions}
        numbers = sorted(p.partition for p in partitions)
        # Jobs not started yet (held until their instant, or waiting for a slot) are dropped unless
        # due within the first half of the wait below (then they run, and are waited for): never run
        # early, and their offsets stay uncommitted for the next owner to run them.
        wait_s = min(self.grace_s, REVOKE_WAIT_S)
        dropped = self._drop_unstarted_now(keys, 0.0 if self._draining else wait_s / 2)
        in_flight = self.progress.in_flight(keys) - dropped
        if in_flight > 0 and not self._draining:
            # Their jobs' next owner would run them again: give them a moment to finish and be
            # acknowledged, so that their offsets are committed before the partitions go.
            began = time.monotonic()
            deadline = began + wait_s
            while self.progress.in_flight(keys) > dropped and time.monotonic() < deadline:
                self._serve_outcomes(0.02)
            log.info(
                "revoked partitions %s: waited %.1f s for %d jobs in flight, %d left unfinished, "
                "%d not started dropped",
                numbers,
                time.monotonic() - began,
                in_flight,
                self.progress.in_flight(keys) - dropped,
                dropped,
            )
        else:
            log.info("revoked partitions %s", numbers)
        self._serve_outcomes()
        self._commit_now(keys)
        for topic, partition in keys:
            self.progress.forget(topic, partition)

    def _on_lost(self, partitions: list[Partition]) -> None:
        self._assigned -= frozenset(partitions)
        # Lost, not revoked: the group moved on without us, so a commit would be refused anyway.
        log.warning("lost partitions %s", sorted(p.partition for p in partitions))
        self._drop_unstarted_soon({(p.topic, p.partition) for p in partitions})
        for p in partitions:
            self.progress.forget(p.topic, p.partition)

    def _drop_unstarted_now(self, keys: Collection[Key] | None = None, keep_within_s: float = 0.0) -> int:
        """Drop the jobs not started yet (of ``keys``, or all) but those due to start within
        ``keep_within_s``, and return how many, waiting a moment for the job loop to do it; 0 if it
        did not answer in time (nothing is then known to be dropped, and the caller waits for those
        jobs as for any). A kept one runs, and the finished jobs after it on its partition can be
        committed: dropping it would hold their offsets back, and the next owner would run them again."""
        if not self._loop_thread.is_alive():
            return 0
        keep_until = datetime.now(UTC) + timedelta(seconds=keep_within_s)
        dropped = self._on_loop(partial(self._drop_unstarted, keys, keep_until))
        try:
            return dropped.result(DROP_WAIT_S)
        except Exception:
            dropped.cancel()  # not to drop them later, when the caller counts on them running
            log.warning("the job loop did not drop the jobs not started in time", exc_info=True)
            return 0

    def _drop_unstarted_soon(self, keys: Collection[Key] | None = None) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the worker stopped
            self._loop.call_soon_threadsafe(self._cancel_unstarted, keys)

    def _drain(self) -> None:
        """Stop fetching; wait for in-flight jobs and their outcomes within the grace period, then
        commit synchronously whatever finished."""
        self._draining = True
        self._paused = True  # partitions assigned from now on are paused too (see _on_assign)
        deadline = time.monotonic() + self.grace_s
        # A job not started yet that would start only in the second half of the grace, or past it,
        # is dropped without an outcome, and its uncommitted offset brings it to another member;
        # one due sooner runs (the finished jobs after it can then be committed).
        dropped = self._drop_unstarted_now(keep_within_s=self.grace_s / 2)
        if dropped:
            log.info("dropped %d jobs not started yet (held until their instant or waiting for a slot)",
                     dropped)  # fmt: skip
        consumer = self._slot.built  # none after a failed rebuild: nothing to pause or commit
        if consumer is not None:
            try:
                consumer.pause(consumer.assignment())
            except TransportError as exc:
                log.warning("pausing for the drain failed: %s", exc)
        # The job loop is asked to answer during the drain too, so that a handler blocking it from
        # just before the stop, or from a job started in the drain, is seen (_commit_past_blocked).
        self._ping_loop()
        last_ping = time.monotonic()
        while self._busy() and time.monotonic() < deadline:
            if time.monotonic() - last_ping >= METRICS_EVERY_S:  # as _observe pings
                self._ping_loop()
                last_ping = time.monotonic()
            self._serve_outcomes(0.05)
            if consumer is not None:
                try:
                    # Stays a member meanwhile, and learns the answers to its commits.
                    consumer.poll(0)
                except TransportError as exc:
                    self._warn("consumer", "consumer error: %s", exc)
            if time.monotonic() - self._last_commit >= COMMIT_EVERY_S:
                self._commit_async()
                self._last_commit = time.monotonic()
        with self._counts_lock:
            running, unacked = self._running + self._ahead, self._unacked
        if running or unacked:
            # Their offsets stay uncommitted, so the group redelivers them to another member.
            log.warning(
                "%d jobs still running and %d outcomes unacknowledged after the %g s grace period "
                "are left to be delivered again",
                running,
                unacked,
                self.grace_s,
            )
        self._serve_outcomes()
        self._commit_past_blocked()
        self._commit_now()

    def _commit_past_blocked(self) -> None:
        """A drain that finds the job loop blocked (an async handler that never lets go) counts the
        jobs whose handlers it started as finished, so that the final commit passes them. Left
        uncommitted, the blocking job would go to the next member with the same attempt (whose
        in-memory record of started attempts is empty) and block it too, for ever, every restart;
        committed past, each started job's lease lapses and the lease sweeper gives the run its next
        attempt or, its attempts spent, its dead letter (``LeaseExpired``): a job that blocks every
        time ends dead. Their starts are on record in Kafka (a handler runs only once its start is
        acknowledged), so none of them is lost."""
        stalled = self._loop_stalled_s()
        if stalled < LOOP_STALL_S:
            return
        blocked = self._in_handler.copy()  # one C call: the jobs thread cannot change it meanwhile
        for topic, partition, offset in blocked:
            self.progress.finished(topic, partition, offset)
        if blocked:
            log.warning(
                "the job loop has not answered for %.0f s: committing past the %d jobs whose handlers "
                "it started (offsets %s); their leases lapse, and the lease sweeper gives each run its "
                "next attempt or its dead letter",
                stalled,
                len(blocked),
                ", ".join(f"{topic}[{partition}]@{offset}" for topic, partition, offset in blocked),
            )

    def _shutdown(self) -> None:
        self._draining = True
        if self._loop_thread.is_alive():
            # Cancelled on the loop and awaited there, so each job's own cleanup runs in its own
            # context rather than when the loop is torn down.
            cancelled = self._on_loop(self._cancel_jobs)
            try:
                cancelled.result(CANCEL_WAIT_S + 1)
            except Exception:  # a job that ignores cancellation, or a blocked loop: stopped regardless
                cancelled.cancel()  # a loop that gets to it only now stops without starting it
                log.debug("cancelling the jobs", exc_info=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(CANCEL_WAIT_S)
        self._deliveries_stop.set()
        if self._deliveries_thread.is_alive():
            self._deliveries_thread.join(DELIVERIES_POLL_S + 1)
        # Threads of sync handlers are daemons: one stuck in a handler never holds up the exit.
        self._producer.close(CLOSE_FLUSH_S)
        self._settle()
        self._commit_now()
        self._slot.close()

    def _on_loop(self, call: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """``call()`` awaited on the job loop, as a future another thread can wait on. Unlike
        ``asyncio.run_coroutine_threadsafe`` the coroutine is made on the loop, when it gets to
        it: a loop a handler blocks never does, and a coroutine made here would be collected
        unawaited, with a warning."""
        answer: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            if answer.set_running_or_notify_cancel():  # False: the caller gave up and cancelled it
                asyncio.ensure_future(call()).add_done_callback(partial(_settle, answer))

        with contextlib.suppress(RuntimeError):  # a closed loop: the future never settles
            self._loop.call_soon_threadsafe(start)
        return answer

    # --- event loop thread --------------------------------------------------------------------

    def _run_jobs_loop(self) -> None:
        """The jobs thread: the loop, until the stop ends it. A task still there then (its handler
        blocked the loop through the stop, or ignored its cancellation) is cancelled and given a
        moment to unwind here, so that it is not destroyed pending when the worker is collected
        (which reported it as a job that failed)."""
        self._loop.run_forever()
        left = asyncio.all_tasks(self._loop)
        for task in left:
            task.cancel()
        if left:
            self._loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_WAIT_S))

    async def _cancel_jobs(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)

    def _start_jobs(self, fetched: list[_Fetched]) -> None:
        for job in fetched:
            task = self._loop.create_task(self._execute(job))
            self._tasks.add(task)
            # Whenever it ends, run or dropped (even before its first step), its count goes and it
            # leaves the set (one callback, not two: each is a handle the loop schedules and runs).
            task.add_done_callback(partial(self._settled, job))
            job.task = task
            self._unstarted.setdefault(job.key, {})[task] = job

    def _settled(self, fetched: _Fetched, task: asyncio.Task[None]) -> None:
        """Jobs thread: a job's task ended; whatever it held (a place among the held or waiting
        jobs, a slot) is given back, and a freed slot goes to the next waiting job."""
        self._tasks.discard(task)
        stage, fetched.stage = fetched.stage, "done"
        self._forget_unstarted(fetched)
        with self._counts_lock:
            if stage == "held":
                self._held -= 1
                self._held_bytes -= len(fetched.delivery.value)
            elif stage in ("waiting", "due"):
                self._waiting -= 1
            elif stage == "ahead":
                self._ahead -= 1
            elif stage == "running":
                self._running -= 1
        if stage in ("ahead", "running"):
            self._slot_freed.set()
            self._admit()

    def _forget_unstarted(self, fetched: _Fetched) -> None:
        tasks = self._unstarted.get(fetched.key)
        if tasks is not None and fetched.task is not None:
            tasks.pop(fetched.task, None)
            if not tasks:
                del self._unstarted[fetched.key]

    async def _drop_unstarted(self, keys: Collection[Key] | None, keep_until: datetime | None) -> int:
        return self._cancel_unstarted(keys, keep_until)

    def _cancel_unstarted(self, keys: Collection[Key] | None, keep_until: datetime | None = None) -> int:
        """Jobs thread: cancel the jobs not started yet (of ``keys``, or all) but those that may
        start by ``keep_until``; returns how many were cancelled."""
        dropped = 0
        for key in list(self._unstarted) if keys is None else keys:
            tasks = self._unstarted.get(key, {})
            for task, fetched in list(tasks.items()):
                if keep_until is not None and fetched.start_at <= keep_until:
                    continue
                del tasks[task]
                task.cancel()
                dropped += 1
            if not tasks:
                self._unstarted.pop(key, None)
        return dropped

    async def _execute(self, fetched: _Fetched) -> None:
        delivery = fetched.delivery
        try:
            if fetched.stage == "held":
                await self._hold(fetched)
            if fetched.stage != "ahead":
                await self._take_slot(fetched)
            # It has its slot: from now on a revoke or a stop lets it finish rather than drop it.
            self._forget_unstarted(fetched)
            await self._execute_job(fetched)
        except asyncio.CancelledError:
            # The worker is stopping, or the job's partition went: the offset stays unfinished
            # and the job is re-delivered.
            raise
        except Exception:
            metrics.INTERNAL_ERRORS.labels(self.app).inc()
            log.exception(
                "the worker failed on the job at %s[%d]@%d; its offset moves on",
                delivery.topic,
                delivery.partition,
                delivery.offset,
            )
            self._released.put(delivery)

    async def _hold(self, fetched: _Fetched) -> None:
        """Until just before the job's instant (:data:`ANNOUNCE_AHEAD`, by this worker's clock: a
        timer of the job loop, re-armed if it fires early). Then, if a slot is free and no job
        waits for one, it takes that slot and its start is announced ahead, so that its handler can
        run at the instant. Otherwise it waits for its instant, then for a slot, ahead of the jobs
        fetched since: a slot idles ahead of an instant only when no job could have used it."""
        await _until(fetched.start_at - ANNOUNCE_AHEAD)
        if not self._due_waiters and not self._fresh_waiters and self._grant_ahead(fetched):
            return
        await _until(fetched.start_at)
        with self._counts_lock:
            self._held -= 1
            self._held_bytes -= len(fetched.delivery.value)
            self._waiting += 1
        fetched.stage = "due"

    def _grant_ahead(self, fetched: _Fetched) -> bool:
        """Give a held job a free slot ahead of its instant, if one is free and outcomes are not
        piling up."""
        with self._counts_lock:
            if self._running + self._ahead >= self.concurrency or self._unacked > self.unacked_bound:
                return False
            self._ahead += 1
            self._held -= 1
            self._held_bytes -= len(fetched.delivery.value)
        fetched.stage = "ahead"
        return True

    def _enter(self, fetched: _Fetched) -> None:
        """Jobs thread: a job's handler is about to run; one that was ahead is now running."""
        if fetched.stage != "ahead":
            return
        with self._counts_lock:
            self._ahead -= 1
            self._running += 1
        fetched.stage = "running"

    async def _take_slot(self, fetched: _Fetched) -> None:
        """Jobs thread: an execution slot for a waiting job. One whose instant came while it was
        held goes before the jobs fetched since."""
        if not self._due_waiters and not self._fresh_waiters and self._grant(fetched):
            return
        granted: asyncio.Future[None] = self._loop.create_future()
        (self._due_waiters if fetched.stage == "due" else self._fresh_waiters).append((granted, fetched))
        self._admit()
        await granted

    def _grant(self, fetched: _Fetched) -> bool:
        """Give a waiting job a slot, if one is free and outcomes are not piling up."""
        with self._counts_lock:
            if self._running + self._ahead >= self.concurrency or self._unacked > self.unacked_bound:
                return False
            self._running += 1
            self._waiting -= 1
        fetched.stage = "running"
        return True

    def _admit(self) -> None:
        """Jobs thread: hand free slots to waiting jobs, those held until their instant first."""
        for waiters in (self._due_waiters, self._fresh_waiters):
            while waiters:
                granted, fetched = waiters[0]
                if granted.done() or fetched.stage == "done":
                    waiters.popleft()  # its job was dropped meanwhile
                    continue
                if not self._grant(fetched):
                    return
                waiters.popleft()
                granted.set_result(None)

    async def _execute_job(self, fetched: _Fetched) -> None:
        delivery, job = fetched.delivery, fetched.job
        if job is None:
            metrics.UNDECODABLE.labels(self.app).inc()
            self._dead_undecodable(delivery, fetched.error or "undecodable", for_run=not fetched.foreign)
            return
        attempt_key = _attempt_key(job)
        if attempt_key in self._started_attempts:
            # The same attempt again: a relay republished it, or this worker read its offsets again
            # after a commit was lost. It ran (or runs) here already, and the run's lease covers it,
            # so the copy is finished without a second execution, and counted.
            metrics.DUPLICATE_DELIVERIES.labels(self.app).inc()
            log.debug("attempt %d of run %s already started here: copy at offset %d not run again",
                      job.attempt, job.run_id, delivery.offset)  # fmt: skip
            self._released.put(delivery)
            return
        self._started_attempts[attempt_key] = None
        if len(self._started_attempts) > REMEMBERED_ATTEMPTS:
            self._started_attempts.popitem(last=False)
        # The attempt's time starts now, whatever the message's deadline says: time spent waiting
        # on the topic, held until its instant or behind a backlog never counts against it; or at
        # its instant when that is at most ANNOUNCE_AHEAD away (its start is announced ahead). A
        # clock stepped back since the hold ended is waited out first, before anything is on record.
        now = await _until(fetched.start_at - ANNOUNCE_AHEAD)
        started = max(now, fetched.start_at)
        # When its handler may run, on the loop's monotonic clock (see _at).
        entry_due = self._loop.time() + (started - now).total_seconds()
        # An operator's handler may log its payload's values; the builtins never do.
        masked = None if job.handler.startswith(BUILTIN_PREFIX) else job.payload
        with log_context(
            app=job.app, schedule_id=job.schedule_id, run_id=job.run_id, attempt=job.attempt, payload=masked
        ):
            if not self._tracing:
                # No span of our own, but the job's trace: log lines still carry its trace id.
                parent = span_context_from_traceparent(delivery.traceparent)
                span: Span = NonRecordingSpan(parent) if parent is not None else INVALID_SPAN
                # The job's start, heartbeats and outcome carry its trace on, read once rather than
                # per message (a job without one gets one new trace for all of them).
                traced = replace(delivery, outcome_traceparent=traceparent_of_span(span))
                with use_span(span):
                    await self._attempt(traced, job, fetched, started, entry_due)
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
                status, failure = await self._attempt(traced, job, fetched, started, entry_due)
                if failure is not None:
                    record_failure(failure.error_class, failure.error, stack_trace=failure.stack_trace)
                duration_ms = (datetime.now(UTC) - started).total_seconds() * 1000
                span.set_attributes(job_outcome_attributes(status, duration_ms))

    async def _attempt(
        self, delivery: Delivery, job: JobMessage, fetched: _Fetched, started: datetime, entry_due: float
    ) -> tuple[str, _Failure | None]:
        """Run the handler and publish the outcome; returns its status and how it failed."""
        # The handler runs only once Kafka holds its start: an execution whose worker dies right
        # after is then on record (the run's lease, a re-execution counted), never a silent effect.
        await self._announce(delivery, job, started)
        # Never before its instant, however early Kafka answered.
        await _at(started, entry_due)
        self._enter(fetched)
        if job.attempt == 1:
            # Later attempts keep the run's scheduled_for: their backoff, or the lease that expired,
            # or the operator's replay, would read as lateness. A first attempt counts from when it
            # was due, which is later than its instant when it is late by design (a buffered fire
            # let go, a misfire's catch-up). A start before that (a hold cut short) counts as 0.
            due = _due_at(delivery.headers, job.scheduled_for)
            self._start_lag.observe(max(0.0, time.time() - due.timestamp()))
        position = (delivery.topic, delivery.partition, delivery.offset)
        self._in_handler[position] = None
        try:
            result = await self._run_handler(delivery, job, started)
        except asyncio.CancelledError:
            if _cancel_requested():
                raise
            # Not the worker's doing: the handler's own work was cancelled under it.
            return self._failed(
                delivery, job, started, "the handler's work was cancelled", "CancelledError", True
            )
        except Exception as exc:
            try:
                # The handler's frames, for its span and outcome line (never its locals: the payload).
                frames = "".join(traceback.format_tb(exc.__traceback__))
                return self._failed_by(delivery, job, started, exc, frames or None)
            finally:
                # Its traceback holds the handler's frames (the job's context and payload) and the
                # task that holds the exception: a cycle only the cycle collector would free, late
                # for a run of failing jobs. Nothing reads the traceback once the outcome is built.
                _drop_tracebacks(exc)
        finally:
            self._in_handler.pop(position, None)
        self._succeeded(delivery, job, started, result)
        return "succeeded", None

    def _failed_by(
        self, delivery: Delivery, job: JobMessage, started: datetime, exc: Exception, frames: str | None
    ) -> tuple[str, _Failure]:
        if isinstance(exc, _TimedOut):
            return self._failed(delivery, job, started, str(exc), "Timeout", True)
        if isinstance(exc, HandlerNotFound):
            metrics.REFUSED_HANDLERS.labels(self.app).inc()
        # The exception is the handler's, its class too: its text and classification are read
        # without letting its code (a __str__ that raises) fail the worker rather than the attempt.
        retryable, error_class = classify(exc)
        text = error_text(exc)
        if not isinstance(exc, HandlerError):
            # Stored as "<class>: <error>", so the class is not repeated in the error itself.
            text = text or type(exc).__name__
        return self._failed(delivery, job, started, text, error_class, retryable, frames)

    async def _run_handler(self, delivery: Delivery, job: JobMessage, started: datetime) -> Any:
        handler = self.handlers.resolve(job.handler)
        timeout = job.timeout_ms / 1000
        try:
            payload = json.loads(job.payload)
        except ValueError as exc:
            raise NonRetryableError(f"the payload is not JSON: {exc}") from None
        except RecursionError:
            # Only a job made by other means than a schedule (whose payload is at most 30 deep) can
            # be "[[[[..." 200,000 deep; it fails the same way every attempt.
            raise NonRetryableError("the payload is nested too deeply to decode") from None
        beats = _Beats()
        context = JobContext(
            run_id=job.run_id,
            schedule_id=job.schedule_id,
            app=job.app,
            attempt=job.attempt,
            max_attempts=job.retry.max_attempts,
            idempotency_key=job.idempotency_key,
            scheduled_for=job.scheduled_for,
            # From the handler's entry, as the timeout is enforced: a start Kafka acknowledged late
            # (after the instant it announced) takes nothing from the handler's time.
            deadline=datetime.now(UTC) + timedelta(seconds=timeout),
            payload=payload,
            heartbeat=partial(self._heartbeat, delivery, job, started, beats),
        )
        thread: threading.Thread | None = None
        if HandlerRegistry.is_async(handler):
            work: asyncio.Future[Any] = self._loop.create_task(_guarded(handler, context))
        elif job.handler == "builtin:noop":
            return handler(context)  # instant: a thread hop would cost more than the job
        else:
            returned, thread = self._in_thread(handler, context, job)
            work = self._loop.create_task(_then_awaited(returned))
        loop = self._loop
        ends_at = loop.time() + timeout
        try:
            while not work.done() and (remaining := ends_at - loop.time()) > 0:
                await asyncio.wait({work}, timeout=min(HEARTBEAT_EVERY_S, remaining))
                if not work.done() and ends_at - loop.time() > 0:
                    self._report(delivery, job, started, "heartbeat")
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            beats.end()
        if work.done():
            return work.result()
        work.cancel()
        if thread is not None and thread.is_alive():
            self._abandon(thread, job)
        raise _TimedOut(f"timed out after {timeout:g} s")

    def _in_thread(
        self, handler: Handler, context: JobContext, job: JobMessage
    ) -> tuple[asyncio.Future[Any], threading.Thread]:
        """Run a sync handler in a daemon thread of its own: a thread per job, so that one stuck
        past its timeout never takes a slot from the next job, and never holds up the process's exit."""
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()
        # The job's log context (and span) for the handler's own log lines.
        job_context = contextvars.copy_context()

        def settle(result: Any, error: Exception | None) -> None:
            if future.done():
                return  # timed out (cancelled) meanwhile: nobody waits for this result
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

        def run() -> None:
            error: Exception | None = None
            result: Any = None
            try:
                result = job_context.run(handler, context)
            except Exception as exc:
                error = exc
            except BaseException as exc:  # SystemExit and the like end this attempt, not the worker
                error = HandlerExited(exc)
            # A closed loop: the worker stopped, and this job was left behind.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, result, error)

        thread = threading.Thread(target=run, name=f"job-{job.run_id}", daemon=True)
        thread.start()
        return future, thread

    def _abandon(self, thread: threading.Thread, job: JobMessage) -> None:
        metrics.ABANDONED_THREADS.labels(self.app).inc()
        with self._counts_lock:
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            self._abandoned.append(thread)
            alive = len(self._abandoned)
        log.warning(
            "handler %s still running at its %g s timeout: its thread is left behind (%d such threads now)",
            job.handler,
            job.timeout_ms / 1000,
            alive,
        )

    def _heartbeat(
        self,
        delivery: Delivery,
        job: JobMessage,
        started: datetime,
        beats: _Beats,
    ) -> None:
        # Called from the handler's own thread or task; the report is produced from the loop.
        if not beats.due(time.monotonic()):
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: the worker stopped
            self._loop.call_soon_threadsafe(self._report, delivery, job, started, "heartbeat")

    # --- outcomes (any thread) ----------------------------------------------------------------

    def _headers(self, delivery: Delivery) -> list[tuple[str, str | bytes | None]]:
        return [(HEADER, delivery.outcome_traceparent or child_traceparent(delivery.traceparent))]

    def _send_outcome(
        self, delivery: Delivery, topic: str, key: uuid.UUID | None, build: Callable[[bool], bytes]
    ) -> None:
        """Produce the outcome ``build(compact)`` encodes until Kafka acknowledges it; only then
        does the job's offset finish. Never raises: the job loop must not stop on an outcome."""
        compact: Callable[[], bytes] | None = None
        try:
            value = build(False)
            compact = partial(build, True)
        except Exception:
            log.warning(
                "the outcome of offset %s could not be encoded; sending its compact form",
                delivery.offset,
                exc_info=True,
            )
            try:
                value = build(True)
            except Exception:
                # No outcome at all: the run's lease (renewed by its start) brings it back.
                log.exception("the outcome of offset %s could not be encoded", delivery.offset)
                metrics.OUTCOMES_UNENCODABLE.labels(self.app).inc()
                self._released.put(delivery)
                return
        owed = Owed(delivery, topic, None if key is None else key.bytes, value, compact)
        with self._counts_lock:
            self._unacked += 1
        self._produce_owed(owed)

    def _produce_owed(self, owed: Owed[Delivery]) -> None:
        message = OutgoingMessage(owed.topic, owed.value, owed.key, self._headers(owed.delivery))

        def on_delivery(error: DeliveryError | None) -> None:
            self._reports.put((owed, error))

        try:
            # On a full queue this serves delivery reports from this thread, which only queue (see
            # _reports); the main thread goes on polling meanwhile, as librdkafka allows.
            self._producer.produce(message, on_delivery)
        except Exception as exc:
            # Refused before it left (too large, say): the same outcome as a failed delivery.
            self._reports.put((owed, exc))

    async def _announce(self, delivery: Delivery, job: JobMessage, started: datetime) -> None:
        """Produce the attempt's start event and wait until Kafka acknowledged it; a refused one is
        produced again with backoff. While Kafka is away the job waits in its slot, so the worker
        starts no job whose execution it could not report."""
        loop = self._loop
        failures = 0
        while True:
            acked: asyncio.Future[Exception | None] = loop.create_future()
            on_delivery = partial(self._start_acked, acked)
            try:
                message = self._event_message(delivery, job, started, "started")
                self._producer.produce(message, on_delivery)
            except Exception as exc:
                on_delivery(exc)
            error = await acked
            if error is None:
                return
            failures += 1
            metrics.START_DELIVERY_FAILURES.labels(self.app).inc()
            self._warn("start", "start of offset %s not delivered (%s); the job waits for Kafka",
                       delivery.offset, error)  # fmt: skip
            ceiling = min(START_RETRY_MAX_S, START_RETRY_INITIAL_S * 2 ** min(failures - 1, 10))
            await asyncio.sleep(random.uniform(ceiling / 2, ceiling))

    def _start_acked(self, acked: asyncio.Future[Exception | None], error: Exception | None) -> None:
        """Any thread (a delivery report): queue Kafka's answer to a start event for the jobs thread,
        waking it unless a wake-up is already on its way."""
        with self._start_acks_lock:
            self._start_acks.append((acked, error))
            if self._start_acks_woken:
                return
            self._start_acks_woken = True
        with contextlib.suppress(RuntimeError):  # a closed loop: the worker stopped
            self._loop.call_soon_threadsafe(self._settle_starts)

    def _settle_starts(self) -> None:
        """Jobs thread: hand every queued answer to its waiting job. The flag is cleared first, so an
        answer queued meanwhile wakes the loop again rather than wait for the next one."""
        with self._start_acks_lock:
            self._start_acks_woken = False
            acks, self._start_acks = self._start_acks, deque()
        for acked, error in acks:
            if not acked.done():
                acked.set_result(error)

    def _event_message(
        self, delivery: Delivery, job: JobMessage, started: datetime, status: str
    ) -> OutgoingMessage:
        event = JobResult(
            event_id=new_event_id(),
            status=status,  # type: ignore[arg-type]
            run_id=job.run_id,
            schedule_id=job.schedule_id,
            app=job.app,
            attempt=job.attempt,
            worker=self.instance,
            started_at=started,
        )
        return OutgoingMessage(
            self.topics.results, self.codec.encode(event), job.run_id.bytes, self._headers(delivery)
        )

    def _report(self, delivery: Delivery, job: JobMessage, started: datetime, status: str) -> None:
        """A heartbeat: renews the run's lease. Not an outcome: a lost one is superseded by the next,
        so it is sent once and never waited for."""
        try:
            self._producer.produce(self._event_message(delivery, job, started, status))
        except Exception as exc:
            log.warning("%s report of offset %s not sent: %s", status, delivery.offset, exc)

    def _succeeded(self, delivery: Delivery, job: JobMessage, started: datetime, result: Any) -> None:
        finished = datetime.now(UTC)
        result_json = _result_json(result)
        event_id = new_event_id()
        self._outcome(job, started, "succeeded")

        def build(compact: bool) -> bytes:
            limit = COMPACT_RESULT_BYTES if compact else MAX_RESULT_BYTES
            event = JobResult(
                event_id=event_id,
                status="succeeded",
                run_id=job.run_id,
                schedule_id=job.schedule_id,
                app=job.app,
                attempt=job.attempt,
                worker=self.instance,
                started_at=started,
                finished_at=finished,
                result=None if result_json is None else capped_result(result_json, limit),
            )
            return self.codec.encode(event)

        self._send_outcome(delivery, self.topics.results, job.run_id, build)

    def _failed(
        self,
        delivery: Delivery,
        job: JobMessage,
        started: datetime,
        error: str,
        error_class: str,
        retryable: bool,
        stack_trace: str | None = None,
    ) -> tuple[str, _Failure]:
        """Publish a failed attempt's outcome; returns its status and how it failed."""
        finished = datetime.now(UTC)
        error = _published_error(error, job)
        error_class = capped_text(error_class, MAX_ERROR_CLASS_CHARS)
        event_id = new_event_id()
        try:
            policy = RetryPolicy(
                max_attempts=job.retry.max_attempts,
                base_seconds=job.retry.backoff_base_ms / 1000,
                max_backoff_seconds=job.retry.backoff_max_ms / 1000,
            )
            retry = policy.should_retry(job.attempt, retryable)
            # The reconciler adds the delay to PostgreSQL's clock; not_before is for v1 readers.
            backoff_s = policy.backoff_seconds(job.attempt) if retry else 0.0
        except ValueError:
            retry = False  # retry settings that make no sense (a hand-made message): not retried
        if retry:

            def build_retry(compact: bool) -> bytes:
                retry = JobRetry(
                    event_id=event_id,
                    run_id=job.run_id,
                    schedule_id=job.schedule_id,
                    app=job.app,
                    attempt=job.attempt,
                    worker=self.instance,
                    started_at=started,
                    finished_at=finished,
                    error=capped_text(error, COMPACT_ERROR_CHARS) if compact else error,
                    error_class=error_class,
                    not_before=finished + timedelta(seconds=backoff_s),
                    backoff_ms=round(backoff_s * 1000),
                )
                return self.codec.encode(retry)

            metrics.RETRIES.labels(self.app).inc()
            self._outcome(job, started, "retry", error_class, error, stack_trace)
            self._send_outcome(delivery, self.topics.retry, job.run_id, build_retry)
            return "retry", _Failure(error_class, error, stack_trace)
        this_attempt = AttemptSummary(
            attempt=job.attempt,
            finished_at=finished,
            error=error,
            error_class=error_class,
            worker=self.instance,
            started_at=started,
        )

        def build_dead(compact: bool) -> bytes:
            limit = COMPACT_HISTORY_ERROR_CHARS if compact else MAX_HISTORY_ERROR_CHARS
            history = tuple(
                replace(
                    a,
                    error=capped_text(a.error, limit),
                    error_class=capped_text(a.error_class, MAX_ERROR_CLASS_CHARS),
                )
                for a in (*job.previous_attempts, this_attempt)
            )
            dead = JobDeadLetter(
                event_id=event_id,
                cause="retries_exhausted" if retryable else "non_retryable",
                app=job.app,
                run_id=job.run_id,
                schedule_id=job.schedule_id,
                attempt=job.attempt,
                worker=self.instance,
                started_at=started,
                finished_at=finished,
                error=capped_text(error, COMPACT_ERROR_CHARS) if compact else error,
                error_class=error_class,
                attempts=history,
                # The job itself is on its topic still (source says where): a letter Kafka refused
                # for its size goes without the copy.
                original_bytes=b"" if compact else delivery.value,
                source=KafkaSource(
                    topic=delivery.topic, partition=delivery.partition, offset=delivery.offset
                ),
            )
            return self.codec.encode(dead)

        self._outcome(job, started, "dead", error_class, error, stack_trace)
        self._send_outcome(delivery, self.topics.dlq, job.run_id, build_dead)
        return "dead", _Failure(error_class, error, stack_trace)

    def _outcome(
        self,
        job: JobMessage,
        started: datetime,
        outcome: str,
        error_class: str | None = None,
        error: str | None = None,
        stack_trace: str | None = None,
    ) -> None:
        """The metrics and the one log line of an attempt's outcome (inside the job's log context)."""
        duration = (datetime.now(UTC) - started).total_seconds()
        durations = self._durations.get(outcome)
        if durations is None:
            # Looked up once per outcome, not per job (the series appears at its first outcome, as before).
            durations = self._durations[outcome] = metrics.EXECUTION_DURATION.labels(self.app, outcome)
        durations.observe(duration)
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
                    # Only a failure's: a success's line stays as short as it was.
                    **({"stack_trace": stack_trace} if stack_trace else {}),
                },
            )

    def _dead_undecodable(self, delivery: Delivery, reason: str, *, for_run: bool = True) -> None:
        reason = capped_text(reason)
        finished = datetime.now(UTC)
        event_id = new_event_id()
        # With its run and attempt (from the headers), the letter makes the reconciler end that
        # attempt's run as dead, rather than leave it dispatched for ever.
        run_id, attempt = (_attempt_of(delivery.headers) if for_run else None) or (None, None)

        def build(compact: bool) -> bytes:
            original = delivery.value[:COMPACT_ORIGINAL_BYTES] if compact else delivery.value
            cut = f" (its first {len(original)} of {len(delivery.value)} bytes kept)" if compact else ""
            dead = JobDeadLetter(
                event_id=event_id,
                cause="undecodable",
                app=self.app,
                run_id=run_id,
                schedule_id=None,
                attempt=attempt,
                worker=self.instance,
                started_at=None,
                finished_at=finished,
                error=capped_text(reason, COMPACT_ERROR_CHARS) + cut if compact else reason,
                error_class="UndecodableMessage",
                attempts=(),
                original_bytes=original,
                source=KafkaSource(
                    topic=delivery.topic, partition=delivery.partition, offset=delivery.offset
                ),
            )
            return self.codec.encode(dead)

        self._send_outcome(delivery, self.topics.dlq, run_id, build)


def _settle(answer: concurrent.futures.Future[T], task: asyncio.Future[T]) -> None:
    """Hands a task's outcome on the job loop to the future another thread waits on."""
    if task.cancelled():
        answer.set_exception(concurrent.futures.CancelledError())
    elif (error := task.exception()) is not None:
        answer.set_exception(error)
    else:
        answer.set_result(task.result())


def _attempt_key(job: JobMessage) -> int:
    """A job's (run, attempt) as one int: the cycle collector never walks ints, while the 100,000
    (UUID, int) tuples it used to keep (REMEMBERED_ATTEMPTS) made each full collection walk 200,000
    objects more, a pause of 70-90 ms of the job loop, and the start-lag p99 at 1,000 fires/s."""
    # An attempt is an Avro int: its 32 bits, negative or not, keep every key distinct.
    return job.run_id.int << 32 | job.attempt & 0xFFFFFFFF


def _attempt_of(headers: Sequence[tuple[str, bytes | None]]) -> tuple[uuid.UUID, int] | None:
    """The (run, attempt) a job message's headers name, or None unless both are there and valid."""
    found: dict[str, bytes | None] = {}
    for name, value in headers:
        found.setdefault(name, value)  # the first of a repeated header, as Received.header reads it
    raw_run, raw_attempt = found.get(RUN_ID_HEADER), found.get(ATTEMPT_HEADER)
    if raw_run is None or raw_attempt is None:
        return None
    try:
        run_id = uuid.UUID(raw_run.decode("ascii"))
        text = raw_attempt.decode("ascii")
    except (UnicodeDecodeError, ValueError):
        return None
    if not text.isdigit() or len(text) > 10 or not 1 <= int(text) <= MAX_ATTEMPT:
        return None
    return run_id, int(text)


def _due_at(headers: Sequence[tuple[str, bytes | None]], scheduled_for: datetime) -> datetime:
    """When a job was due to start, as its headers say (``DUE_AT_HEADER``), never before its
    instant; its instant when they do not say (a message from an older scanner) or say nothing valid."""
    for name, value in headers:
        if name != DUE_AT_HEADER:
            continue
        if value is None or len(value) > 64:
            break
        try:
            due = datetime.fromisoformat(value.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            break
        if due.tzinfo is None:
            break
        return max(due, scheduled_for)
    return scheduled_for


async def _until(instant: datetime) -> datetime:
    """Sleep on the running loop's timers until the wall clock reaches ``instant``; returns the
    wall clock then. A timer that fires early (the loop's clock is monotonic, the wall clock is
    not) sleeps the rest."""
    while (now := datetime.now(UTC)) < instant:
        await asyncio.sleep((instant - now).total_seconds())
    return now


async def _at(started: datetime, due: float) -> None:
    """Until ``due`` on the running loop's monotonic clock, then until ``started`` by the wall
    clock (microseconds, the two clocks' drift), for at most :data:`ANNOUNCE_AHEAD` more. The start
    is on record by then: a wall clock stepped back meanwhile is not waited out, since the job would
    sit silent in its slot, no heartbeat renewing its lease."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, due - loop.time()))
    give_up = due + ANNOUNCE_AHEAD.total_seconds()
    while (now := datetime.now(UTC)) < started and (left := give_up - loop.time()) > 0:
        await asyncio.sleep(min((started - now).total_seconds(), left))


def _cancel_requested() -> bool:
    """Whether the running task was cancelled by the worker (a timeout or the stop), rather than
    raising CancelledError of its own accord."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _published_error(error: str, job: JobMessage) -> str:
    """A failed attempt's error as it is stored in PostgreSQL, published and shown to operators:
    secrets redacted, the job's payload values it quotes masked, and of any size or content."""
    # An operator's handler may quote its payload in its error; the builtins never do (they name
    # the field or the origin that failed, which is what an operator needs). The payload is parsed
    # again rather than taken from the handler's context: the handler may have changed or emptied
    # what it was given, and its error may quote what it removed.
    mask = None if job.handler.startswith(BUILTIN_PREFIX) else PayloadMask(job.payload)
    # A long error is kept cut short; a payload value quoted across the cut is read whole (so the
    # scan goes on by the longest value), or the part of it before the cut would be kept unmasked.
    text = redact_text(error[: SCANNED_ERROR_CHARS + (mask.longest if mask is not None else 0)])
    if mask is not None:
        text = mask.mask(text)
    if len(error) <= SCANNED_ERROR_CHARS:
        return capped_text(text)
    marker = f" [truncated: the error had {len(error)} characters]"
    kept = max(0, min(len(text) - ERROR_MARGIN_CHARS, MAX_ERROR_CHARS - len(marker)))
    return capped_text(text[:kept] + marker)


def _drop_tracebacks(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and of the exceptions chained to it."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [current.__cause__, current.__context__]


async def _guarded(handler: Handler, context: JobContext) -> Any:
    """An async handler whose BaseExceptions cannot escape: asyncio re-raises SystemExit and
    KeyboardInterrupt out of the event loop, which would end every job at once."""
    return await _awaited(lambda: handler(context))


async def _then_awaited(returned: Awaitable[Any]) -> Any:
    """A sync handler's result. One that is itself awaitable (a coroutine handed back by a sync
    wrapper of async code) is the handler's real work: it runs on the loop, under the same timeout,
    rather than being reported as a success it never was."""
    result = await returned
    if inspect.isawaitable(result):
        return await _awaited(lambda: result)
    return result


async def _awaited(work: Callable[[], Awaitable[Any]]) -> Any:
    """``await work()``, its BaseExceptions (but the worker's own cancellation) made handler errors."""
    try:
        return await work()
    except Exception:
        raise
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError) and _cancel_requested():
            raise
        raise HandlerExited(exc) from exc


def _result_json(result: Any) -> str | None:
    """A handler's result as JSON text (what PostgreSQL's jsonb takes: no NaN), each value JSON has
    no form for as its text, or its repr when it is not JSON-able at all."""
    if result is None:
        return None
    try:
        return json.dumps(result, default=str, allow_nan=False)
    except ValueError:
        # NaN or an infinity somewhere (or a cycle, which fails here again): each such number
        # becomes its text ("NaN", "Infinity", "-Infinity"), as a datetime does, the rest of the
        # result kept. Read back as the reconciler reads a result's JSON; only such results pay.
        with contextlib.suppress(Exception):
            return json.dumps(json.loads(json.dumps(result, default=str), parse_constant=str))
    except Exception:
        pass
    try:
        return json.dumps(repr(result))
    except Exception:
        return json.dumps(f"<a {type(result).__name__} that cannot be shown>")
