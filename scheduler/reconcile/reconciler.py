"""The reconciler: applies the workers' outcome events to PostgreSQL.

It consumes ``.results``, ``.retry`` and ``.dlq`` together in batches. Each batch is decoded,
applied with one set-based statement (fenced by attempt; a job's plain start and success held by
its run's row, every other event recorded in ``attempts``), committed to PostgreSQL, and only then
are the Kafka offsets committed: a crash re-applies a batch, whose events are then recognised as
counted duplicates (by their event ids, or as what is on record of their execution; a heartbeat
read again only renews the lease again). A failure of
PostgreSQL or Kafka rebuilds the consumer, which then reads again from the committed offsets, so a
batch that was not applied is read again rather than skipped; a consumer error that came with good
messages is raised by the next poll, after those messages were applied and committed.

Poison never stops it. Handler text is made storable (NUL and lone surrogates escaped, capped)
before it reaches PostgreSQL. A message that cannot be decoded, or that PostgreSQL still refuses
(a data or integrity error, as opposed to a lost connection), is found by applying the batch in
halves under savepoints, set aside in the ``quarantine`` table with its bytes, source and reason,
and counted; the rest of the batch is applied and the offsets move on. So is a dead letter without
a worker, which only the lease sweeper writes (for a run it made dead), when PostgreSQL has no
record of the sweeper's death of its run's attempt: the sweeper's own are passed over.

The same process runs the lease sweeper (:mod:`.lease_sweeper`) and the buffer release
(:mod:`.buffer_release`); a batch that ended runs wakes the latter.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
from opentelemetry.trace import Span, SpanKind, use_span

from scheduler.config import Settings
from scheduler.domain.run_state import RunState
from scheduler.domain.storable import MAX_RESULT_BYTES, capped_text, storable_json, storable_text
from scheduler.kafka.avro import AvroCodec, MessageDecodeError
from scheduler.kafka.messages import JobDeadLetter, JobResult, JobRetry
from scheduler.kafka.registry import RegistryUnavailable
from scheduler.kafka.transport import Consumer, ConsumerSlot, Offset, Received, TransportError
from scheduler.reconcile import metrics
from scheduler.runtime.service import Check, Service
from scheduler.store import reconcile as store
from scheduler.store.database import Database, Session
from scheduler.store.reconcile import OutcomeEvent, Quarantined, SweeperLetter, UndecodableLetter
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
# A batch also ends once its events' bytes pass this (always holding one): a dead letter carries
# its job's bytes, a payload of up to 1 MiB among them. A backlog of 600 dead letters of 900 KB jobs
# took the reconciler to 590-740 MiB when batches were bounded by count alone (and librdkafka
# prefetched the whole backlog: see consumer_config), 540 MiB since.
BATCH_BYTES = 16 * 1024 * 1024
POLL_S = 0.1
LAG_EVERY_S = 1.0
COMPONENT = "reconciler"
# A worker's name or an error's class is a short label; anything longer is cut with a marker.
NAME_CHARS = 256
# SQLSTATE classes in which PostgreSQL refuses the data itself (data exception, integrity
# constraint violation, program limit exceeded): the same statement fails again on every retry.
REFUSED_CLASSES = ("22", "23", "54")
Row = dict[str, Any]
Decoded = OutcomeEvent | UndecodableLetter | SweeperLetter | Quarantined
# An event's times are its worker's clock. One later than PostgreSQL's as the event is applied
# says that clock is ahead, and a worker holding a fire leased ahead then starts it early by as
# much: nothing else can see it, since the worker records the instant its clock says. A start is
# announced up to 50 ms before its instant (and may be applied that soon), hence the margin.
CLOCK_AHEAD_TOLERANCE = timedelta(milliseconds=250)
# A worker whose clock is ahead is named at most this often; a batch naming more workers than
# CLOCK_WARNINGS_PER_BATCH is one line, and at most CLOCK_WARNED_WORKERS names are remembered.
CLOCK_WARNING_EVERY_S = 60.0
CLOCK_WARNINGS_PER_BATCH = 20
CLOCK_WARNED_WORKERS = 1000
# A process span's attribute: applied, or stale, duplicate or reexecution (the event moved nothing).
EVENT_OUTCOME = "scheduler.event.outcome"
# The run state each kind of outcome event moves a run to, for the spans' job.status.
OUTCOME_STATES = {
    "started": RunState.RUNNING,
    "heartbeat": RunState.RUNNING,
    "retry": RunState.RETRY_WAIT,
    "succeeded": RunState.SUCCEEDED,
    "dead": RunState.DEAD,
}


def refused(error: psycopg.Error) -> bool:
    """Whether PostgreSQL refused the data (not the connection, not a conflict worth retrying)."""
    return error.sqlstate is not None and error.sqlstate[:2] in REFUSED_CLASSES


def storable_result(text: str | None) -> Any:
    """A handler's JSON result as a value PostgreSQL stores: strings escaped; NaN, Infinity and
    numbers too large for a float as their text (jsonb has no such numbers). Text that is not JSON
    (or nests past any sane depth) is kept as a JSON string: the success still counts, and the
    operator sees what came."""
    if text is None:
        return None
    try:
        return storable_json(json.loads(text, parse_constant=str, parse_float=_finite_or_text))
    except (ValueError, RecursionError):
        return capped_text(text, MAX_RESULT_BYTES)


def first_line(error: BaseException) -> str:
    """An error's first line: a PostgreSQL error's detail lines may quote the rows' keys."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _finite_or_text(text: str) -> float | str:
    number = float(text)
    return number if math.isfinite(number) else text  # 1e400 overflows to inf, which jsonb refuses


class Reconciler(Service):
    transient = (psycopg.OperationalError, TransportError, RegistryUnavailable)

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
        self._clock_warned: dict[str, float] = {}  # worker → when it was last named (monotonic)
        self._clock_unnamed_at = -math.inf  # when workers too many to name were last counted in a line
        # Per partition, the last offset whose event was checked against PostgreSQL's clock since
        # the offsets were last committed: a batch whose commit failed is read again, and checked once.
        self._clock_checked: dict[tuple[str, int], int] = {}
        self._tracing = tracing_exports()

    def checks(self) -> Sequence[Check]:
        return (self.database.check(), self.kafka_check, self.consumer.check())

    def step(self) -> bool:
        consumer, conn = self.consumer.consumer, self.session.conn
        messages = consumer.consume(BATCH, POLL_S, BATCH_BYTES)
        if messages:
            self.apply(conn, messages)
            committed = next_offsets(messages)
            consumer.commit(committed)
            self._forget_checked(committed)
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

    def decode(self, message: Received) -> Decoded:
        """The event a message carries (its text made storable), or the message set aside when it
        cannot be decoded."""
        topic, value = message.topic, message.value
        try:
            if topic == self.settings.results_topic:
                result = self.codec.decode(JobResult, value)
                return OutcomeEvent(
                    event_id=str(result.event_id),
                    run_id=result.run_id,
                    attempt=result.attempt,
                    kind=result.status,
                    worker=capped_text(result.worker, NAME_CHARS),
                    started_at=result.started_at,
                    finished_at=_no_earlier_than_started(result.finished_at, result.started_at),
                    result=storable_result(result.result),
                    app=storable_text(result.app),
                )
            if topic == self.settings.retry_topic:
                retry = self.codec.decode(JobRetry, value)
                return OutcomeEvent(
                    event_id=str(retry.event_id),
                    run_id=retry.run_id,
                    attempt=retry.attempt,
                    kind="retry",
                    worker=capped_text(retry.worker, NAME_CHARS),
                    started_at=retry.started_at,
                    finished_at=_no_earlier_than_started(retry.finished_at, retry.started_at),
                    error=capped_text(retry.error),
                    error_class=capped_text(retry.error_class, NAME_CHARS),
                    not_before=retry.not_before,
                    backoff_ms=retry.backoff_ms,
                    app=storable_text(retry.app),
                )
            dead = self.codec.decode(JobDeadLetter, value)
        # A record the schema accepts may still not build its message (a value out of range).
        except (MessageDecodeError, ValueError, TypeError, KeyError, OverflowError) as exc:
            self.log.error(
                "quarantining an undecodable message at %s[%s]@%s: %s",
                topic,
                message.partition,
                message.offset,
                exc,
            )
            return self._quarantined(message, f"undecodable: {exc}")
        if dead.run_id is None or dead.attempt is None:
            return UndecodableLetter(
                event_id=str(dead.event_id),
                app=capped_text(dead.app, NAME_CHARS),
                cause=dead.cause,
                error=capped_text(dead.error),
                error_class=capped_text(dead.error_class, NAME_CHARS),
                worker=None if dead.worker is None else capped_text(dead.worker, NAME_CHARS),
                original_bytes=dead.original_bytes,
                topic=None if dead.source is None else storable_text(dead.source.topic),
                partition=dead.source.partition if dead.source else None,
                offset=dead.source.offset if dead.source else None,
            )
        if dead.worker is None:
            # The lease sweeper's, whose run is dead in PostgreSQL already: checked, not applied.
            return SweeperLetter(
                event_id=str(dead.event_id),
                run_id=dead.run_id,
                attempt=dead.attempt,
                app=capped_text(dead.app, NAME_CHARS),
            )
        return OutcomeEvent(
            event_id=str(dead.event_id),
            run_id=dead.run_id,
            attempt=dead.attempt,
            kind="dead",
            worker=capped_text(dead.worker, NAME_CHARS),
            started_at=dead.started_at,
            finished_at=_no_earlier_than_started(dead.finished_at, dead.started_at),
            error=capped_text(dead.error),
            error_class=capped_text(dead.error_class, NAME_CHARS),
            app=storable_text(dead.app),
        )

    @staticmethod
    def _quarantined(message: Received, reason: str, event: Decoded | None = None) -> Quarantined:
        run_id = app = None
        if isinstance(event, OutcomeEvent | SweeperLetter):
            run_id, app = event.run_id, event.app
        elif isinstance(event, UndecodableLetter):
            app = event.app
        return Quarantined(
            reason=capped_text(reason),
            original_bytes=message.value,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            run_id=run_id,
            app=app,
        )

    def apply(self, conn: psycopg.Connection[Row], messages: Sequence[Received]) -> store.Applied:
        """Apply one batch in one transaction; what PostgreSQL refuses is quarantined, the rest applied."""
        decoded = [self.decode(m) for m in messages]
        batch = list(zip(messages, decoded, strict=True))
        spans = self._trace(messages, decoded) if self._tracing else []
        refusals: list[Quarantined] = []
        with ending(spans):
            try:
                with conn.transaction():
                    applied = self._apply(conn, batch)
            except psycopg.Error as exc:
                if not refused(exc):
                    raise
                applied = self._apply_isolating(conn, batch, exc, refusals)
            for span, event in zip(spans, decoded, strict=bool(spans)):  # no spans: not traced
                if isinstance(event, OutcomeEvent):
                    # What the event did: a stale or duplicate one claims a status its run never got.
                    span.set_attribute(EVENT_OUTCOME, applied.not_applied.get(event.event_id, "applied"))
        metrics.EVENTS.labels("applied").inc(applied.applied)
        metrics.EVENTS.labels("stale").inc(applied.stale)
        metrics.EVENTS.labels("duplicate").inc(applied.duplicate)
        metrics.EVENTS.labels("reexecution").inc(applied.reexecution)
        undecodable = sum(isinstance(d, Quarantined) for d in decoded)
        if undecodable:
            # Counted once stored: a batch that fails is read again and decoded again.
            metrics.UNDECODABLE.inc(undecodable)
            metrics.QUARANTINED.labels("undecodable").inc(undecodable)
        if applied.appless_letters:
            metrics.QUARANTINED.labels("unknown_app").inc(applied.appless_letters)
            self.log.warning(
                "quarantined %d run-less dead letters naming an app that does not exist",
                applied.appless_letters,
            )
        if applied.unswept_letters:
            metrics.QUARANTINED.labels("no_worker").inc(applied.unswept_letters)
            self.log.warning(
                "quarantined %d dead letters without a worker whose run's lease expiry is not on record",
                applied.unswept_letters,
            )
        for app in applied.dead_apps:
            metrics.DEAD_LETTERS.labels(app).inc()
        unchecked = self._unchecked(batch)
        if applied.db_now is not None:
            self._check_clocks(stored_events(unchecked, refusals, applied), applied.db_now)
        if applied.cross_app:
            # Only junk or a forged message names a run of another app than its sender's.
            self.log.warning(
                "%d outcome events sent as another app's than their run's were not applied", applied.cross_app
            )
        return applied

    def _unchecked(self, batch: Sequence[tuple[Received, Decoded]]) -> list[tuple[Received, Decoded]]:
        """The messages of an applied ``batch`` not checked against the clock before, now marked
        checked: those of a batch applied before whose offsets were not committed were."""
        checked = self._clock_checked
        unchecked = [(m, d) for m, d in batch if m.offset > checked.get((m.topic, m.partition), -1)]
        for message, _ in unchecked:
            partition = (message.topic, message.partition)
            checked[partition] = max(checked.get(partition, -1), message.offset)
        return unchecked

    def _forget_checked(self, committed: Sequence[Offset]) -> None:
        """Forget the marks the commit passed: those are never read again. A mark at or past a
        partition's committed offset stays (a batch whose commit failed reached further there than
        the one read again, which more messages on other partitions cut shorter), and so do the
        marks of partitions this commit did not cover."""
        for offset in committed:
            partition = (offset.topic, offset.partition)
            if self._clock_checked.get(partition, offset.offset) < offset.offset:
                del self._clock_checked[partition]

    def _check_clocks(self, stored: Sequence[OutcomeEvent], db_now: datetime) -> None:
        """Count the events stamped later than PostgreSQL's clock, and name their workers."""
        latest = db_now + CLOCK_AHEAD_TOLERANCE
        ahead: dict[str, timedelta] = {}
        events = 0
        for event in stored:
            stamped = event.finished_at or event.started_at
            if stamped is not None and stamped > latest:
                events += 1
                worker = event.worker or "(unnamed)"
                ahead[worker] = max(ahead.get(worker, timedelta()), stamped - db_now)
        if not events:
            return
        metrics.CLOCK_AHEAD_EVENTS.inc(events)
        now = time.monotonic()
        warned = self._clock_warned
        if len(warned) >= CLOCK_WARNED_WORKERS:
            # Those named over a minute ago may be named again: forgetting them changes nothing.
            self._clock_warned = warned = {
                w: at for w, at in warned.items() if now - at < CLOCK_WARNING_EVERY_S
            }
        unnamed = 0
        for worker, by in ahead.items():
            if now - warned.get(worker, -math.inf) < CLOCK_WARNING_EVERY_S:
                continue
            # Workers are few; names by the thousand are junk or forged events: counted, not each
            # logged, and never more remembered than the bound.
            if len(warned) >= CLOCK_WARNED_WORKERS or len(ahead) > CLOCK_WARNINGS_PER_BATCH:
                unnamed += 1
                continue
            warned[worker] = now
            self.log.warning(
                "worker %s stamps its events %.3f s later than PostgreSQL's clock: its clock is ahead, "
                "and it starts jobs leased ahead (SCHEDULER_LOOKAHEAD_S) early by as much; synchronise it",
                worker,
                by.total_seconds(),
            )
        if unnamed and now - self._clock_unnamed_at >= CLOCK_WARNING_EVERY_S:
            self._clock_unnamed_at = now
            self.log.warning(
                "%d more workers stamp their events later than PostgreSQL's clock (too many to name)", unnamed
            )

    def _apply(
        self, conn: psycopg.Connection[Row], batch: Sequence[tuple[Received, Decoded]]
    ) -> store.Applied:
        """Apply ``batch`` inside the caller's transaction (or savepoint)."""
        events = [d for _, d in batch if isinstance(d, OutcomeEvent)]
        letters = [d for _, d in batch if isinstance(d, UndecodableLetter)]
        quarantined = [d for _, d in batch if isinstance(d, Quarantined)]
        applied = store.apply_outcomes(conn, events, self.settings.lease_window_s)
        if unknown := store.record_undecodable(conn, letters):
            # A worker writes its own app, which exists: a letter naming none is forged or junk.
            appless = [
                self._quarantined(message, f"a dead letter of app {d.app!r}, which does not exist", d)
                for message, d in batch
                if isinstance(d, UndecodableLetter) and d.event_id in unknown
            ]
            quarantined += appless
            # Messages, as the other causes count: a letter sent twice is quarantined twice.
            applied = replace(applied, appless_letters=len(appless))
        swept = [d for _, d in batch if isinstance(d, SweeperLetter)]
        if unswept := store.unswept_letters(conn, swept):
            # Only the sweeper writes a letter without a worker, and records the death it tells of:
            # one that is not its would otherwise be dropped unseen, its run left to its lease.
            workerless = [
                self._quarantined(
                    message,
                    f"a dead letter without a worker for attempt {d.attempt} of run {d.run_id}, whose "
                    "lease expiry is not on record (only the lease sweeper writes one)",
                    d,
                )
                for message, d in batch
                if isinstance(d, SweeperLetter) and d.event_id in unswept
            ]
            quarantined += workerless
            applied = replace(applied, unswept_letters=len(workerless))
        store.quarantine(conn, COMPONENT, quarantined)
        if applied.finished:
            store.notify_run_finished(conn)
        return applied

    def _apply_isolating(
        self,
        conn: psycopg.Connection[Row],
        batch: Sequence[tuple[Received, Decoded]],
        error: psycopg.Error,
        refusals: list[Quarantined],
    ) -> store.Applied:
        """The batch again, in halves under savepoints, until each refused message stands alone;
        those are quarantined (and added to ``refusals``), everything else is applied, in one
        transaction."""
        self.log.warning(
            "PostgreSQL refused a batch of %d outcome messages (%s: %s); finding the refused ones",
            len(batch),
            error.sqlstate,
            first_line(error),
        )
        with conn.transaction():
            applied = self._bisect(conn, batch, refusals)
            store.quarantine(conn, COMPONENT, refusals)
        for item in refusals:
            metrics.QUARANTINED.labels("refused").inc()
            self.log.error(
                "quarantined the outcome message at %s[%s]@%s (run %s): %s",
                item.topic,
                item.partition,
                item.offset,
                item.run_id,
                item.reason,
            )
        return applied

    def _bisect(
        self,
        conn: psycopg.Connection[Row],
        batch: Sequence[tuple[Received, Decoded]],
        refusals: list[Quarantined],
    ) -> store.Applied:
        try:
            with conn.transaction():  # a savepoint: a refused part leaves what was applied before it
                return self._apply(conn, batch)
        except psycopg.Error as exc:
            if not refused(exc):
                raise
            if len(batch) == 1:
                message, event = batch[0]
                reason = f"refused by PostgreSQL ({exc.sqlstate}): {first_line(exc)}"
                refusals.append(self._quarantined(message, reason, event))
                return store.Applied()
            # In order: the first half's events are applied before the second half's, as in a batch.
            middle = len(batch) // 2
            return self._bisect(conn, batch[:middle], refusals) + self._bisect(conn, batch[middle:], refusals)

    def _trace(self, messages: Sequence[Received], decoded: Sequence[Decoded]) -> list[Span]:
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


def stored_events(
    batch: Sequence[tuple[Received, Decoded]], refusals: Sequence[Quarantined], applied: store.Applied
) -> list[OutcomeEvent]:
    """The batch's outcome events PostgreSQL stored: neither refused (quarantined) nor sent as
    another app's than their run's (kept nowhere, junk or forged)."""
    refused_at = {(q.topic, q.partition, q.offset) for q in refusals}
    return [
        event
        for message, event in batch
        if isinstance(event, OutcomeEvent)
        and (message.topic, message.partition, message.offset) not in refused_at
        and event.event_id not in applied.cross_app_events
    ]


def next_offsets(messages: Sequence[Received]) -> list[Offset]:
    highest: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (m.topic, m.partition)
        highest[key] = max(highest.get(key, -1), m.offset)
    return [Offset(t, p, o + 1) for (t, p), o in highest.items()]


def _no_earlier_than_started(finished_at: datetime | None, started_at: datetime | None) -> datetime | None:
    """When an attempt ended, never before it started: a worker's clock stepped back mid-job (or a
    forged event) would store a run that ended before it began, and a negative duration."""
    if finished_at is None or started_at is None:
        return finished_at
    return max(finished_at, started_at)
