"""The relay: publishes the transactional outbox to Kafka.

Each batch is one transaction, so that nothing is lost, nothing is marked sent before it is, and a
batch costs PostgreSQL no write but the rows' delete:

1. Lock the rows that are due (``available_at`` passed), oldest first, with SKIP LOCKED: other
   relays take the rows after them. The locks hold while the batch is published; the transaction
   is bounded (``idle_in_transaction_session_timeout`` = ``SCHEDULER_RELAY_CLAIM_SECONDS``), so a
   relay that stops answering loses its session and its rows go to another relay.
2. Make sure every row's topic exists (checked against the cluster's metadata). A missing job
   topic whose app exists in PostgreSQL is created, sized as ``apps create`` sizes it: the app may
   have been committed while Kafka was down, or its topic deleted by mistake. A row whose topic
   still does not exist is held, never quarantined: its runs did nothing wrong.
3. Produce every other row with its own delivery outcome (idempotent producer, acks=all) and wait
   for all of them, within three quarters of that bound. The broker refuses a record batch as a
   whole, so when several messages come back refused for good, each is produced again alone: only
   alone does a refusal say which row it is.
4. Still in the transaction: delete the acknowledged rows; move the rows Kafka refused for a fault
   of the message itself (:data:`MESSAGE_REFUSED`: too large, invalid) to ``quarantine``, their
   runs ``dead`` with ``RelayRefused``; hand back every other row (Kafka down, a timeout, a missing
   topic, rights), each produced one counted in ``publish_count`` and, when the rest of the batch
   went through, with a growing delay, and the held rows always with a delay that grows with
   their age. Then commit.

The runs are not touched: a run stays ``pending`` until its worker's start event, so the relay never
waits on the reconciler's run locks. A relay that dies between (3) and the commit leaves its rows
to the next relay, which publishes them again; the copies are harmless (the worker and the
reconciler fence by attempt) and the reconciler counts a second execution. While Kafka or
PostgreSQL is down the relay backs off and retries; rows wait in the outbox, which is the point of
having one. A relay in doubt about Kafka (not reached yet, or its last batch taken by nobody)
asks the cluster before it locks any row, so that one cut off from Kafka leaves the rows to the
relays that are not.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from opentelemetry.trace import Span, SpanKind

from scheduler.config import Settings
from scheduler.kafka.topics import ensure_sized_topics
from scheduler.kafka.tracing import HEADER
from scheduler.kafka.transport import (
    DeliveryError,
    KafkaUnavailable,
    OutgoingMessage,
    Producer,
    TopicAdmin,
    TransportError,
)
from scheduler.relay import metrics
from scheduler.runtime.service import Check, Service
from scheduler.store import outbox
from scheduler.store.database import Database, Session
from scheduler.store.outbox import OutboxRow
from scheduler.telemetry.tracing import (
    JOB_SCHEDULING,
    ending,
    kafka_attributes,
    mark_span_failed,
    message_span,
    traceparent_of_span,
    tracing_exports,
)

CHANNEL = "scheduler_outbox"
# Publishing, retries of refused messages included, ends within this share of the transaction's
# bound (SCHEDULER_RELAY_CLAIM_SECONDS), so the server never ends a live relay's session mid-batch.
PUBLISH_SHARE_OF_CLAIM = 0.75
IDLE_WAKE_S = 1.0
MIN_IDLE_S = 0.01
STATS_EVERY_S = 5.0
TOPIC_CHECK_TIMEOUT_S = 10.0

HELD_LOG_EVERY_S = 60.0

# The only refusals that quarantine a row: they say the message itself cannot be written, so
# producing it again cannot help. An allowlist, because librdkafka marks no delivery-report error
# retriable (a timeout neither): anything else (the connection, the relay's rights, the producer's
# state, a missing topic) is handed back, never turned into dead runs that did nothing wrong.
MESSAGE_REFUSED = frozenset(
    {
        "MSG_SIZE_TOO_LARGE",  # over the producer's or the topic's max.message.bytes
        "INVALID_MSG",  # CORRUPT_MESSAGE: the record fails its CRC
        "INVALID_MSG_SIZE",
        "INVALID_RECORD",  # the broker's record validation
        "RECORD_LIST_TOO_LARGE",  # larger than a log segment
        "INVALID_TIMESTAMP",  # outside the topic's message.timestamp.*.ms bounds
    }
)
# Errors about the topic rather than the message: the row is handed back, and the next batch asks
# the cluster whether its topic exists (and creates it when its app exists).
TOPIC_UNKNOWN = frozenset(
    {"_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART", "UNKNOWN_TOPIC_ID", "_UNKNOWN_PARTITION", "TOPIC_EXCEPTION"}
)


def refused_for_good(error: DeliveryError) -> bool:
    """Kafka will never take this message as it is: it is quarantined, not retried."""
    return error.code in MESSAGE_REFUSED


def _cause(error: DeliveryError) -> str:
    """A bounded label for the quarantine counter."""
    return "too_large" if error.too_large else "invalid"


@dataclass(frozen=True, slots=True)
class _Hold:
    """Why the rows of a topic that does not exist wait: a bounded ``cause`` and a line for operators."""

    cause: str  # no_app, core_topic, create_failed, not_ready
    reason: str


@dataclass(frozen=True)
class BatchReport:
    taken: int  # rows locked for the batch
    published: int
    republished: int
    quarantined: int = 0
    released: int = 0
    held: int = 0  # rows whose topic does not exist, handed back to wait for it
    full: bool = False  # the batch reached its bound in rows or bytes: more may be waiting


@dataclass
class _Settled:
    """What one committed batch did, for its metrics and log lines and the back-off decision."""

    report: BatchReport
    dropped: int = 0  # obsolete republishes deleted
    acked: list[OutboxRow] = field(default_factory=list)
    failed: list[tuple[OutboxRow, DeliveryError]] = field(default_factory=list)
    refused: list[tuple[OutboxRow, str]] = field(default_factory=list)  # quarantined, with the reason
    causes: list[str] = field(default_factory=list)  # a quarantine counter label per refused row
    waiting: list[OutboxRow] = field(default_factory=list)  # held: their topic does not exist
    holds: dict[str, _Hold] = field(default_factory=dict)
    publish_s: float = 0.0


@dataclass
class _Outcomes:
    """What Kafka answered for one batch, by outbox row id; a row without an entry got no answer."""

    errors: dict[int, DeliveryError | None]
    # Refused by the producer itself, or refused alone: the refusal is certainly this row's own.
    certain: set[int]


class Relay(Service):
    # The server ends a session that idled in its batch past the bound (a relay that was stopped,
    # or starved): the rows went to another relay, and this one starts afresh.
    transient = (TransportError, psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)

    def __init__(
        self,
        settings: Settings,
        database: Database,
        producers: Callable[[], Producer],
        admin: TopicAdmin,
        kafka_check: Check,
        *,
        name: str,
    ) -> None:
        super().__init__("relay")
        self.settings = settings
        self.database = database
        self._producers = producers
        self._producer: Producer | None = None
        self.admin = admin
        self.kafka_check = kafka_check
        self.instance = name  # this process's instance of the service (``self.name`` is its role)
        self.claim_seconds = settings.relay_claim_s
        self.session = Session(database, CHANNEL)
        self._last_stats = 0.0
        self._tracing = tracing_exports()
        self._topics: set[str] = set()  # topics known to exist, refreshed when a row names another
        self._held_logged: dict[str, float] = {}  # topic -> when its held rows were last logged (monotonic)
        self._jobs_prefix = settings.jobs_topic("")  # "<prefix>.jobs.": the topics of job messages
        self._next_available_s: float | None = None
        # The oldest row's age at the last look, and when that was (monotonic); whether a batch is
        # in hand. Read by the metrics endpoint's thread.
        self._oldest_seen = (0.0, time.monotonic())
        self._in_batch = False
        # Until Kafka has answered this relay, and again after a batch it took nothing of: the
        # next batch asks the cluster first, before it locks any row (see relay_once).
        self._kafka_doubtful = True
        metrics.OUTBOX_OLDEST_AGE.set_function(self._oldest_age)

    @property
    def producer(self) -> Producer:
        """Built on first use, and again after a fatal producer error dropped it."""
        if self._producer is None:
            self._producer = self._producers()
        return self._producer

    def checks(self) -> Sequence[Check]:
        return (self.database.check(), self.kafka_check)

    def step(self) -> bool:
        try:
            report = self.relay_once()
        except psycopg.Error:
            raise  # PostgreSQL failed: no look at the outbox, nor a reconnect, before the retry
        except Exception:
            # Kafka took nothing: the outbox grows, and its gauges must say so (the oldest row's
            # age is what the outbox alert watches). The batch's own failure is the one raised.
            with contextlib.suppress(psycopg.Error):
                self._observe_outbox()
            raise
        self._observe_outbox()
        more = report.full
        if not more:
            conn = self.session.conn
            with conn.transaction():
                self._next_available_s = outbox.next_available_in(conn)
        return more

    def _observe_outbox(self) -> None:
        """The outbox gauges, at most every :data:`STATS_EVERY_S`."""
        if time.monotonic() - self._last_stats < STATS_EVERY_S:
            return
        conn = self.session.conn
        with conn.transaction():
            stats = outbox.stats(conn)
        metrics.OUTBOX_DEPTH.set(stats.depth)
        self._last_stats = time.monotonic()
        self._oldest_seen = (stats.oldest_age_s, self._last_stats)

    def _oldest_age(self) -> float:
        """The oldest row's age when scraped. The outbox is looked at between batches; while one
        waits on a Kafka that does not answer (up to the claim, 45 s by default), the rows it holds
        go on waiting, and the age the outbox alert watches grows with them rather than in steps."""
        age, seen_at = self._oldest_seen
        if age <= 0 or not self._in_batch:
            return age
        return age + time.monotonic() - seen_at

    def idle(self, stop: threading.Event) -> None:
        """Woken by the scanner's NOTIFY or when the first held-back row becomes due; never idle
        longer than a second (rows an older relay's lapsed claim frees)."""
        wait = IDLE_WAKE_S
        if self._next_available_s is not None:
            wait = max(MIN_IDLE_S, min(wait, self._next_available_s))
        if self._producer is not None:
            # librdkafka reports a lost broker through the producer's callbacks, which only a poll
            # serves: an idle relay would log an outage only at its next batch, after it ended.
            self._producer.poll(0)
        self.session.wait(wait, stop)

    def reset(self) -> None:
        self.session.close()

    def close(self) -> None:
        self.session.close()
        if self._producer is not None:
            self._producer.close()

    def relay_once(self) -> BatchReport:
        """Lock, publish and settle one batch in one transaction; raises when Kafka took none of it
        (after handing it back) or PostgreSQL failed (the rollback hands it back)."""
        if self._kafka_doubtful:
            # Asked before any row is locked: a relay that cannot reach Kafka (cut off from it,
            # misconfigured) would otherwise lock the oldest rows batch after batch, for as long as
            # each waits on Kafka, while a relay that can reach it skips them; and a step with
            # nothing to publish would read as recovered. Only while in doubt: one metadata
            # request after each batch Kafka took nothing of, none on the way of a healthy relay.
            try:
                self._topics = self.admin.topics(min(TOPIC_CHECK_TIMEOUT_S, self.claim_seconds / 4))
            except TransportError:
                metrics.FAILURES.inc()  # a batch Kafka took nothing of, as the alert on it counts
                raise
            self._kafka_doubtful = False
        conn = self.session.conn
        try:
            self._in_batch = True
            try:
                with conn.transaction():
                    outbox.bound_transaction(conn, self.claim_seconds)
                    batch = self._relay_locked(conn)
            finally:
                self._in_batch = False
            # Counted once committed: a batch rolled back is published again, and counted then.
            self._count(batch)
            self._raise_if_stuck(batch.acked, batch.failed)
        except TransportError:  # a DeliveryError too: Kafka took nothing, or the producer broke
            self._kafka_doubtful = True
            raise
        return batch.report

    def _relay_locked(self, conn: psycopg.Connection[Any]) -> _Settled:
        rows = outbox.lock(conn, self.settings.relay_batch_size)
        # Cut by its row or byte bound, the batch leaves rows behind: the next one goes at once.
        size = sum(len(row.value) for row in rows)
        full = len(rows) >= self.settings.relay_batch_size or size >= outbox.MAX_BATCH_BYTES
        # Rows that may be on the topic already: Kafka's answer to an earlier publish was lost, or
        # the row is old enough to have been in the batch of a relay that stopped answering and
        # whose session the server ended (its rollback left no trace). Rare: only then is the runs
        # table read.
        again = [row.id for row in rows if row.publish_count > 0 or row.age_s >= self.claim_seconds]
        dropped = outbox.drop_obsolete_republishes(conn, again, self._jobs_prefix) if again else set()
        rows = [row for row in rows if row.id not in dropped]
        if not rows:
            return _Settled(BatchReport(0, 0, 0, full=full), dropped=len(dropped))
        started = time.monotonic()
        deadline = started + self.claim_seconds * PUBLISH_SHARE_OF_CLAIM
        try:
            missing = self._missing_topics({row.topic for row in rows})
            holds = self._create_app_topics(missing) if missing else {}
        except TransportError:
            metrics.FAILURES.inc()
            raise  # the rollback hands the batch back
        waiting = [row for row in rows if row.topic in holds]
        sending = [row for row in rows if row.topic not in holds]
        outcomes = self._publish(sending, deadline)
        publish_s = time.monotonic() - started

        acked: list[OutboxRow] = []
        refusals: dict[int, str] = {}
        causes: list[str] = []
        failed: list[tuple[OutboxRow, DeliveryError]] = []
        for row in sending:
            error = outcomes.errors.get(row.id, _NO_ANSWER)
            if error is None:
                acked.append(row)
            elif row.id in outcomes.certain and refused_for_good(error):
                refusals[row.id] = f"{error} ({error.code}); the message is {len(row.value)} bytes"
                causes.append(_cause(error))
            else:
                failed.append((row, error))
                if error.code in TOPIC_UNKNOWN or error.code == "_MSG_TIMED_OUT":
                    # A topic deleted since we looked times out like an unreachable broker: ask again.
                    self._topics.discard(row.topic)

        done = outbox.complete(conn, [row.id for row in acked]) if acked else _NOTHING_DONE
        held = outbox.quarantine(conn, refusals) if refusals else None
        if failed:
            # Kafka took the rest of the batch: these wait a little, so the rows behind them go first.
            outbox.release(conn, [row.id for row, _ in failed], produced=True, back_off=bool(acked))
        if waiting:
            # Always with a delay: a missing topic is not a reason to stop the relay, and its rows
            # must not be taken first by every batch.
            outbox.release(conn, [row.id for row in waiting], produced=False, back_off=True)

        report = BatchReport(
            len(rows),
            done.published,
            done.republished,
            quarantined=0 if held is None else held.quarantined,
            released=len(failed),
            held=len(waiting),
            full=full,
        )
        return _Settled(
            report,
            dropped=len(dropped),
            acked=acked,
            failed=failed,
            refused=[(row, refusals[row.id]) for row in rows if row.id in refusals],
            causes=causes,
            waiting=waiting,
            holds=holds,
            publish_s=publish_s,
        )

    def _count(self, batch: _Settled) -> None:
        """The metrics and log lines of a committed batch."""
        metrics.OBSOLETE_DROPPED.inc(batch.dropped)
        metrics.PUBLISHED.inc(batch.report.published)
        metrics.REPUBLISHED.inc(batch.report.republished)
        for row in batch.acked:
            metrics.DISPATCH_LAG.observe(row.age_s + batch.publish_s)
        for cause in batch.causes:
            metrics.QUARANTINED.labels(cause).inc()
        for row, reason in batch.refused:
            self.log.warning(
                "outbox row %d (run %s, attempt %s) quarantined: %s", row.id, row.run_id, row.attempt, reason
            )
        metrics.RELEASED.inc(len(batch.failed))
        self._report_held(batch.waiting, batch.holds)

    def _report_held(self, waiting: Sequence[OutboxRow], holds: dict[str, _Hold]) -> None:
        """Count the held rows, and say so once a minute per topic; forget topics that exist now."""
        for topic in [t for t in self._held_logged if t in self._topics]:
            del self._held_logged[topic]
            self.log.info("topic %s exists: its outbox rows are published again", topic)
        per_topic = Counter(row.topic for row in waiting)
        now = time.monotonic()
        for topic, count in per_topic.items():
            hold = holds[topic]
            metrics.HELD.labels(hold.cause).inc(count)
            if now - self._held_logged.get(topic, -HELD_LOG_EVERY_S) >= HELD_LOG_EVERY_S:
                self._held_logged[topic] = now
                self.log.warning("holding %d outbox rows for topic %s: %s", count, topic, hold.reason)
        metrics.HELD_TOPICS.set(len(self._held_logged))

    def _raise_if_stuck(
        self, acked: Sequence[OutboxRow], failed: Sequence[tuple[OutboxRow, DeliveryError]]
    ) -> None:
        """Back off (the service's retry) when Kafka took nothing, or when the producer is broken."""
        errors = [error for _, error in failed]
        fatal = next((e for e in errors if e.code == "_FATAL"), None)
        if fatal is not None and self._producer is not None:
            # An idempotent producer's fatal error is final for that producer: build another.
            producer, self._producer = self._producer, None
            producer.close(timeout_s=1.0)
        if failed and (not acked or fatal is not None):
            metrics.FAILURES.inc()
            first = errors[0]
            raise DeliveryError(
                f"{len(failed)} outbox messages not acknowledged, handed back: {first} ({first.code})",
                code=first.code,
                retriable=True,
            )

    def _missing_topics(self, topics: Iterable[str]) -> set[str]:
        """The topics among ``topics`` the cluster does not have (asked only about unknown ones)."""
        unknown = set(topics) - self._topics
        if unknown:
            self._topics = self.admin.topics(min(TOPIC_CHECK_TIMEOUT_S, self.claim_seconds / 4))
        return unknown - self._topics

    def _create_app_topics(self, missing: set[str]) -> dict[str, _Hold]:
        """Create the missing job topics whose app exists; returns why each other topic waits."""
        jobs = sorted(t for t in missing if t.startswith(self._jobs_prefix))
        conn = self.session.conn
        with conn.transaction():
            partitions = outbox.topic_apps(conn, self._jobs_prefix, jobs) if jobs else {}
        holds: dict[str, _Hold] = {}
        for topic in sorted(missing - set(partitions)):
            if topic in jobs:
                app = topic.removeprefix(self._jobs_prefix)
                why = f"it does not exist and no app {app!r} does (`scheduler apps create {app}` makes both)"
                holds[topic] = _Hold("no_app", why)
            else:
                holds[topic] = _Hold("core_topic", "it does not exist (`scheduler init` creates it)")
        timeout_s = min(TOPIC_CHECK_TIMEOUT_S, self.claim_seconds / 4)
        for topic, count in sorted(partitions.items()):
            try:
                ensure_sized_topics(self.admin, [topic], count, timeout_s)
            except KafkaUnavailable as exc:
                # Created (or being created) but without a leader yet, or Kafka did not answer: the
                # next batch looks again, and finds it ready or missing.
                holds[topic] = _Hold("not_ready", f"it did not exist and is not ready yet: {exc}")
                continue
            except TransportError as exc:
                holds[topic] = _Hold("create_failed", f"it does not exist and creating it failed: {exc}")
                continue
            self._topics.add(topic)
            self.log.warning("topic %s did not exist: created it for its app (%d partitions)", topic, count)
        return holds

    def _publish(self, rows: Sequence[OutboxRow], deadline: float) -> _Outcomes:
        outcomes = _Outcomes({}, set())
        if not rows:
            return outcomes
        messages, spans = self._messages(rows)
        with ending(spans):
            self._produce(zip(rows, messages, strict=True), outcomes, deadline)
            suspects = [
                (row, message)
                for row, message in zip(rows, messages, strict=True)
                if row.id not in outcomes.certain
                and (error := outcomes.errors.get(row.id)) is not None
                and refused_for_good(error)
            ]
            if len(suspects) == 1:
                outcomes.certain.add(suspects[0][0].id)  # refused with no other message: its own
            elif suspects:
                # A refused record batch: each of its messages again, alone, so that a refusal
                # is the message's own. Those not retried in time stay uncertain: handed back.
                for row, message in suspects:
                    if time.monotonic() >= deadline:
                        break
                    del outcomes.errors[row.id]
                    self._produce([(row, message)], outcomes, deadline)
                    if row.id not in outcomes.errors:
                        break  # unanswered: the next message could share its record batch
                    outcomes.certain.add(row.id)
            if spans:
                for row, span in zip(rows, spans, strict=True):
                    error = outcomes.errors.get(row.id, _NO_ANSWER)
                    if error is not None:
                        mark_span_failed(span, error)
        return outcomes

    def _produce(
        self, pairs: Iterable[tuple[OutboxRow, OutgoingMessage]], outcomes: _Outcomes, deadline: float
    ) -> None:
        """Produce each message with its own outcome, then wait for every answer until ``deadline``."""
        producer = self.producer
        for row, message in pairs:
            try:
                producer.produce(message, functools.partial(outcomes.errors.__setitem__, row.id))
            except DeliveryError as exc:
                outcomes.errors[row.id] = exc
                outcomes.certain.add(row.id)
        producer.flush(max(0.1, deadline - time.monotonic()))

    def _messages(self, rows: Sequence[OutboxRow]) -> tuple[list[OutgoingMessage], list[Span]]:
        """The batch's messages; when traces are exported, each with a ``job.scheduling`` span
        that runs from the outbox row's creation to Kafka's answer (the caller ends it)."""
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
                root_of=_root_of(row),
            )
            spans.append(span)
            headers = dict(row.headers) | {HEADER: traceparent_of_span(span)}
            messages.append(OutgoingMessage(row.topic, row.value, row.key, list(headers.items())))
        return messages, spans


def _root_of(row: OutboxRow) -> UUID | None:
    """The run whose trace root this row's ``job.scheduling`` span is: a first attempt's, the first
    time it is produced. Produced again (Kafka did not answer, or refused it for a while), its span
    is a child of that root, not a second span with the root's ids."""
    return row.run_id if row.attempt == 1 and row.publish_count == 0 else None


# The outcome of a message Kafka did not answer in time (neither acknowledged nor refused).
_NO_ANSWER = DeliveryError("no delivery report in time", code=None, retriable=True)
_NOTHING_DONE = outbox.Completion(0, 0)


def _job_of(row: OutboxRow) -> dict[str, str | int]:
    # The relay publishes bytes it never decodes: the run id and attempt are the outbox row's own.
    if row.run_id is None or row.attempt is None:
        return {}
    return {"job.id": str(row.run_id), "job.retry_count": row.attempt - 1}
