"""Poison never stops the reconciler, and the lease sweeper expires only what is really lost.

Against the real PostgreSQL and Kafka: outcome events carrying NUL characters, invalid UTF-8 and
values PostgreSQL refuses; a consumer error in the middle of a batch; a second start of the same
attempt; the database's clock for retries; the sweeper with a reconciler that has not read the
outcome topics; and a buffered fire inserted while the run before it ends.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
import pytest
from confluent_kafka import KafkaError, Message

from scheduler.config import Settings
from scheduler.domain.storable import MAX_ERROR_CHARS
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobDeadLetter, JobMessage, JobResult, JobRetry
from scheduler.kafka.transport import (
    Consumer,
    KafkaUnavailable,
    Offset,
    OutgoingMessage,
    Producer,
    Received,
    TopicAdmin,
    consumer_config,
    producer_config,
)
from scheduler.reconcile import metrics
from scheduler.reconcile.buffer_release import BufferRelease
from scheduler.reconcile.lease_sweeper import Sweep
from scheduler.reconcile.reconciler import Reconciler
from scheduler.runtime.service import Service
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import _prepared as store_prepared
from scheduler.store import connect, reconcile
from scheduler.store import runs as runs_store
from scheduler.store.reconcile import OutcomeEvent
from scheduler.wiring import Wiring
from tests.support import settling, wait_for

pytestmark = pytest.mark.integration

APP = "rob"
Row = dict[str, Any]


# --- the pipeline's ends, as a worker and the reconciler would see them --------------------------


@dataclass(frozen=True)
class Run:
    id: uuid.UUID
    schedule_id: uuid.UUID
    attempt: int = 1


def dispatched_runs(settings: Settings, count: int, max_attempts: int = 3) -> list[Run]:
    """``count`` runs created by the scanner, as the relay leaves them (dispatched)."""
    TopicAdmin(settings.kafka).ensure_topics(settings.core_topics, partitions=3)
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1) on conflict do nothing", (APP,))
        conn.execute(
            "insert into schedules (id, app, name, kind, handler, max_attempts, next_fire_at) "
            "select gen_random_uuid(), %s, 'n' || gen_random_uuid(), 'immediate', 'builtin:noop', %s, now() "
            "from generate_series(1, %s)",
            (APP, max_attempts, count),
        )
        conn.commit()
        scanner = Wiring(settings).scanner()
        while scanner.scan_once(conn).schedules:
            pass
        conn.execute("update runs set state = 'dispatched', dispatched_at = now() where state = 'pending'")
        conn.commit()
    created = rows(
        settings,
        "select id, schedule_id from runs where max_attempts = %s order by created_at desc limit %s",
        max_attempts,
        count,
    )
    return [Run(r["id"], r["schedule_id"]) for r in created]


def result(run: Run, status: str = "succeeded", worker: str = "w", **fields: Any) -> JobResult:
    now = datetime.now(UTC)
    return JobResult(
        event_id=fields.pop("event_id", None) or uuid.uuid4(),
        status=status,  # type: ignore[arg-type]
        run_id=run.id,
        schedule_id=run.schedule_id,
        app=fields.pop("app", APP),
        attempt=fields.pop("attempt", run.attempt),
        worker=worker,
        started_at=fields.pop("started_at", now),
        finished_at=now if status == "succeeded" else None,
        **fields,
    )


def retry(run: Run, error: str = "boom", **fields: Any) -> JobRetry:
    now = datetime.now(UTC)
    return JobRetry(
        event_id=uuid.uuid4(),
        run_id=run.id,
        schedule_id=run.schedule_id,
        app=APP,
        attempt=run.attempt,
        worker=fields.pop("worker", "w"),
        started_at=fields.pop("started_at", now),
        finished_at=now,
        error=error,
        error_class=fields.pop("error_class", "Boom"),
        not_before=fields.pop("not_before", now + timedelta(seconds=1)),
        **fields,
    )


def outgoing(settings: Settings, event: JobResult | JobRetry) -> OutgoingMessage:
    topic = settings.results_topic if isinstance(event, JobResult) else settings.retry_topic
    return OutgoingMessage(topic, AvroCodec().encode(event), event.run_id.bytes)


def publish(settings: Settings, messages: Sequence[OutgoingMessage | JobResult | JobRetry]) -> None:
    Producer(producer_config(settings.kafka, "test")).send(
        [m if isinstance(m, OutgoingMessage) else outgoing(settings, m) for m in messages]
    )


@contextmanager
def running(*services: Service) -> Iterator[None]:
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,)) for s in services]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


def rows(settings: Settings, sql: str, *params: Any) -> list[Row]:
    with connect(settings.database_url) as conn:
        return conn.execute(sql, params).fetchall()


def run_row(settings: Settings, run: Run) -> Row:
    [row] = rows(settings, "select * from runs where id = %s", run.id)
    return row


def reconciled(settings: Settings) -> int:
    """Runs the reconciler applied an event to (their rows hold a plain start and success)."""
    return len(rows(settings, "select 1 from runs where reconciled_at is not null"))


def history(settings: Settings, run: Run) -> list[tuple[str, str, str | None]]:
    """(kind, outcome, worker) of a run's attempts as a user reads them (``scheduler runs get``)."""
    with connect(settings.database_url) as conn:
        found = runs_store.get_run(conn, run.id)
    assert found is not None
    return [(a["kind"], a["outcome"], a["worker"]) for a in found["attempts"]]


def counter(metric: Any, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())


def group_at_the_end(settings: Settings) -> Callable[[], bool]:
    """Whether the reconciler's group has committed every outcome topic up to its end. Not yet while
    a partition of those new topics cannot answer for its end (NOT_LEADER_FOR_PARTITION just after
    they were made): the sweeper, which asks the same, holds its sweep and asks again too."""
    positions = Wiring(settings).lease_sweeper().positions

    def at_the_end() -> bool:
        try:
            return not positions.unread(positions.ends())
        except KafkaUnavailable as exc:
            if not settling(exc.code):
                raise
            return False

    return at_the_end


# --- path 1: text PostgreSQL cannot store, and events it refuses ---------------------------------


def test_nul_and_invalid_text_in_results_and_errors_is_stored_escaped_and_the_reconciler_goes_on(
    settings: Settings,
) -> None:
    json_with_escapes, not_json, retried, long_error, after = dispatched_runs(settings, 5)
    publish(
        settings,
        [
            # JSON whose strings decode to NUL and a lone surrogate, with numbers jsonb has no room for.
            result(
                json_with_escapes,
                worker="w\x001",
                result=r'{"body": "a\u0000b", "\u0000k": ["\ud800", 1e400, NaN]}',
            ),
            # Not JSON at all (a raw NUL in it): still a success, its text kept.
            result(not_json, result="half a body \x00 and no closing brace {"),
            retry(retried, error="boom\x00here", error_class="Err\x00", backoff_ms=60_000),
            retry(long_error, error="x" * (MAX_ERROR_CHARS * 3)),
        ],
    )
    with running(Wiring(settings).reconciler_service()):
        wait_for(lambda: reconciled(settings) == 4, 60, "the four events applied")
        publish(settings, [result(after)])
        wait_for(lambda: run_row(settings, after)["state"] == "succeeded", 60, "the next event applied")
        wait_for(group_at_the_end(settings), 30, "the offsets committed past all of them")

    first = run_row(settings, json_with_escapes)
    assert first["state"] == "succeeded" and first["worker"] == "w\\u00001"
    assert first["result"] == {"body": "a\\u0000b", "\\u0000k": ["\\ud800", "1e400", "NaN"]}
    second = run_row(settings, not_json)
    assert second["state"] == "succeeded"
    assert second["result"] == "half a body \\u0000 and no closing brace {"
    third = run_row(settings, retried)
    assert third["state"] == "retry_wait" and third["error"] == "Err\\u0000: boom\\u0000here"
    fourth = run_row(settings, long_error)
    assert fourth["state"] == "retry_wait"
    assert len(fourth["error"]) < MAX_ERROR_CHARS + 100 and "[truncated" in fourth["error"]
    [attempt] = rows(settings, "select error, error_class from attempts where run_id = %s", retried.id)
    assert attempt == {"error": "boom\\u0000here", "error_class": "Err\\u0000"}
    assert rows(settings, "select * from quarantine") == []


def test_an_event_postgresql_refuses_is_quarantined_and_the_events_around_it_are_applied(
    settings: Settings,
) -> None:
    runs = dispatched_runs(settings, 30)
    # PostgreSQL itself refuses one event: a constraint its row breaks, as a value it cannot take would.
    with connect(settings.database_url) as conn:
        conn.execute("alter table runs add constraint no_poison check (worker is distinct from 'poison')")
        conn.commit()
    poison_run = runs[12]
    events = [result(run, worker="poison" if run == poison_run else "w") for run in runs[:20]]
    poison = outgoing(settings, events[12])
    publish(settings, [poison if i == 12 else e for i, e in enumerate(events)])
    refused_before = counter(metrics.QUARANTINED, "refused")

    with running(Wiring(settings).reconciler_service()):
        wait_for(lambda: reconciled(settings) == 19, 60, "every other event of the batch applied")
        publish(settings, [result(run) for run in runs[20:]])
        wait_for(lambda: reconciled(settings) == 29, 60, "the events behind it applied too")
        wait_for(group_at_the_end(settings), 30, "the offsets committed past the poison")

    states = rows(settings, "select state, count(*) as n from runs group by state order by state")
    assert states == [{"state": "dispatched", "n": 1}, {"state": "succeeded", "n": 29}]
    assert run_row(settings, poison_run)["state"] == "dispatched"
    [kept] = rows(settings, "select * from quarantine")
    assert kept["component"] == "reconciler" and kept["run_id"] == poison_run.id and kept["app"] == APP
    assert kept["original_bytes"] == poison.value and kept["source_topic"] == settings.results_topic
    assert kept["source_offset"] is not None and kept["source_partition"] is not None
    assert "refused by PostgreSQL (23514)" in kept["reason"] and "no_poison" in kept["reason"]
    assert counter(metrics.QUARANTINED, "refused") == refused_before + 1


def test_undecodable_messages_are_quarantined_with_their_bytes_and_the_partition_moves_on(
    settings: Settings,
) -> None:
    garbled, after = dispatched_runs(settings, 2)
    garbage = b"\xc3\x01 not an avro record at all"
    # A retry whose error text is not UTF-8 (a lone surrogate written raw): Avro cannot decode it.
    marked = AvroCodec().encode(retry(garbled, error="MARKERS"))
    invalid_utf8 = marked.replace(b"MARKERS", "\ud800".encode("utf-8", "surrogatepass") + b"ABCD")
    assert invalid_utf8 != marked
    publish(
        settings,
        [
            OutgoingMessage(settings.results_topic, garbage),
            OutgoingMessage(settings.retry_topic, invalid_utf8, garbled.id.bytes),
            result(after),
        ],
    )
    undecodable_before = counter(metrics.QUARANTINED, "undecodable")
    with running(Wiring(settings).reconciler_service()):
        wait_for(
            lambda: run_row(settings, after)["state"] == "succeeded", 60, "the event behind them applied"
        )
        wait_for(group_at_the_end(settings), 30, "the offsets committed past them")
    kept = rows(settings, "select * from quarantine order by source_topic")
    assert [(k["source_topic"], k["original_bytes"]) for k in kept] == [
        (settings.results_topic, garbage),
        (settings.retry_topic, invalid_utf8),
    ]
    assert all(k["component"] == "reconciler" and k["reason"].startswith("undecodable: ") for k in kept)
    assert counter(metrics.QUARANTINED, "undecodable") == undecodable_before + 2


def test_a_runless_dead_letter_of_no_app_there_is_quarantined_and_its_apps_letter_kept(
    settings: Settings,
) -> None:
    """A worker writes its own app into a letter for a job it could not decode; one naming an app
    that does not exist (forged, or junk), however long its name, is quarantined, not listed."""
    (after,) = dispatched_runs(settings, 1)
    now = datetime.now(UTC)
    unknown_before = counter(metrics.QUARANTINED, "unknown_app")

    def letter(app: str) -> bytes:
        return AvroCodec().encode(
            JobDeadLetter(
                event_id=uuid.uuid4(),
                cause="undecodable",
                app=app,
                run_id=None,
                schedule_id=None,
                attempt=None,
                worker="w1",
                started_at=None,
                finished_at=now,
                error="unknown framing",
                error_class="UndecodableMessage",
                attempts=(),
                original_bytes=b"junk",
                source=None,
            )
        )

    forged = letter("nosuchapp")
    publish(
        settings,
        [
            OutgoingMessage(settings.dlq_topic, letter(APP)),
            OutgoingMessage(settings.dlq_topic, forged),
            OutgoingMessage(settings.dlq_topic, forged),  # sent twice: each message set aside, and counted
            OutgoingMessage(settings.dlq_topic, letter("x" * 100_000)),
            result(after),
        ],
    )
    with running(Wiring(settings).reconciler_service()):
        wait_for(
            lambda: run_row(settings, after)["state"] == "succeeded", 60, "the event behind them applied"
        )
    assert [r["app"] for r in rows(settings, "select app from dead_letters")] == [APP]
    kept = rows(settings, "select app, reason from quarantine order by length(app)")
    assert [k["app"] for k in kept[:2]] == ["nosuchapp", "nosuchapp"] and len(kept) == 3
    assert len(kept[2]["app"]) <= 256 and "[truncated" in kept[2]["app"]
    assert all("which does not exist" in k["reason"] for k in kept), kept
    assert counter(metrics.QUARANTINED, "unknown_app") == unknown_before + 3


def test_absurd_times_in_outcome_events_neither_park_a_run_for_years_nor_end_it_before_it_began(
    settings: Settings,
) -> None:
    """A retry's wait is at most a day (the longest backoff a schedule can hold) whatever the event
    says, and an attempt never ends before it started (a worker's clock stepped back mid-job)."""
    long_wait, far_until, backwards, after = dispatched_runs(settings, 4)
    started = datetime.now(UTC)
    ended_before = JobResult(
        event_id=uuid.uuid4(), status="succeeded", run_id=backwards.id, schedule_id=backwards.schedule_id,
        app=APP, attempt=backwards.attempt, worker="w", started_at=started,
        finished_at=started - timedelta(days=20_000),
    )  # fmt: skip
    publish(
        settings,
        [
            retry(long_wait, backoff_ms=2**62),
            retry(far_until, not_before=datetime(9999, 1, 1, tzinfo=UTC)),
            ended_before,
            result(after),
        ],
    )
    with running(Wiring(settings).reconciler_service()):
        wait_for(
            lambda: run_row(settings, after)["state"] == "succeeded", 60, "the event behind them applied"
        )
    day_from_now = datetime.now(UTC) + timedelta(days=1)
    for run in (long_wait, far_until):
        row = run_row(settings, run)
        assert row["state"] == "retry_wait" and row["next_attempt_at"] <= day_from_now, row
    row = run_row(settings, backwards)
    assert row["state"] == "succeeded" and row["finished_at"] == row["started_at"], row


# --- path 6: a consumer error in the middle of a polled batch ------------------------------------


class ErrorMidBatch:
    """The librdkafka consumer, except that its first batch of several messages carries an error
    in the middle, as librdkafka hands out a partition or broker error among good messages."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.injected = False

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        messages: list[Any] = self._inner.consume(num_messages, timeout)
        if not self.injected and len(messages) >= 4:
            self.injected = True
            error = Message(error=KafkaError(KafkaError._TRANSPORT, "injected mid-batch"))
            middle = len(messages) // 2
            return [*messages[:middle], error, *messages[middle:]]
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Watched(Reconciler):
    """Remembers what it applied, and checks that no commit moves past a message it did not apply."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied: set[tuple[str, int, int]] = set()
        self.commits: list[Offset] = []
        self.bad_commits: list[Offset] = []
        self.proxies: list[ErrorMidBatch] = []

    def apply(self, conn: psycopg.Connection[Row], messages: Sequence[Received]) -> reconcile.Applied:
        applied = super().apply(conn, messages)
        self.applied |= {(m.topic, m.partition, m.offset) for m in messages}
        return applied

    def consumer_for(self, config: dict[str, Any], topics: list[str]) -> Consumer:
        reconciler = self

        class Checked(Consumer):
            def commit(self, offsets: Sequence[Offset], asynchronous: bool = False) -> None:
                for o in offsets:
                    reconciler.commits.append(o)
                    # Fresh topics start at 0: every offset below the commit must have been applied.
                    if any((o.topic, o.partition, x) not in reconciler.applied for x in range(o.offset)):
                        reconciler.bad_commits.append(o)
                super().commit(offsets, asynchronous)

        consumer = Checked(config, topics)
        proxy = ErrorMidBatch(consumer._consumer)
        consumer._consumer = proxy  # type: ignore[assignment]
        self.proxies.append(proxy)
        return consumer


def test_a_consumer_error_mid_batch_loses_no_message_and_no_commit_passes_an_unapplied_one(
    settings: Settings,
) -> None:
    runs = dispatched_runs(settings, 200)
    publish(settings, [result(run) for run in runs])
    topics = [settings.results_topic, settings.retry_topic, settings.dlq_topic]
    config = consumer_config(settings.kafka, f"{settings.topic_prefix}.reconciler", "test-reconciler")
    wiring = Wiring(settings)
    reconciler: Watched | None = None

    def consumers() -> Consumer:
        assert reconciler is not None
        return reconciler.consumer_for(config, topics)

    reconciler = Watched(settings, wiring.database, consumers, wiring.codec, wiring.kafka_check())
    with running(reconciler):
        wait_for(lambda: reconciled(settings) >= len(runs), 60, "every success applied")
        wait_for(group_at_the_end(settings), 30, "the offsets committed to the end")
        wait_for(lambda: reconciler.status.failures == 0 and reconciler.status.started, 30, "a recovery")

    assert reconciler.proxies[0].injected, "the error was injected"
    assert len(reconciler.proxies) >= 2, "the error was raised, and the consumer rebuilt from the commits"
    assert reconciler.commits and reconciler.bad_commits == []
    # Nothing before or after the error in its batch was dropped, and nothing was applied twice (a
    # success read again is recorded as a duplicate).
    assert rows(settings, "select outcome, count(*) as n from attempts group by outcome") == []
    assert rows(settings, "select state, count(*) as n from runs group by state") == [
        {"state": "succeeded", "n": len(runs)}
    ]


# --- the lease model: re-executions, the database's clock for retries, late successes ------------


def test_a_second_start_of_an_attempt_is_a_counted_reexecution_and_retries_use_the_database_clock(
    settings: Settings,
) -> None:
    twice, backoff, legacy, late = dispatched_runs(settings, 4)
    first_start = result(twice, "started", worker="w1")
    second_start = result(twice, "started", worker="w2")
    late_start = result(late, "started", worker="w1")
    worker_clock_far_off = datetime(2001, 1, 1, tzinfo=UTC)
    legacy_not_before = datetime.now(UTC) + timedelta(hours=2)
    publish(
        settings,
        [
            first_start,
            second_start,  # the job redelivered to another worker
            first_start,  # the same event redelivered: a duplicate, not an execution
            retry(backoff, backoff_ms=90_000, not_before=worker_clock_far_off),
            retry(legacy, not_before=legacy_not_before),  # an older worker: no backoff_ms
            late_start,
            # The same execution's end. It is read from another topic than its start, so either
            # may come first: both name the execution (its worker, its start), which is one.
            retry(late, worker="w1", started_at=late_start.started_at),
        ],
    )
    reexecutions_before = counter(metrics.EVENTS, "reexecution")
    with running(Wiring(settings).reconciler_service()):
        wait_for(lambda: reconciled(settings) == 4, 60, "the first events applied")
        # Every run touched is not every event applied: `late`'s retry may still be unread, and
        # read in one batch with its success below, that success would reveal an execution.
        wait_for(group_at_the_end(settings), 30, "the offsets committed past the first events")
        publish(
            settings,
            [
                result(twice, worker="w2", started_at=second_start.started_at),
                # A start after the run succeeded: a third execution, recorded although it changes nothing.
                result(twice, "started", worker="w3"),
                # The attempt that failed reports success after all (a second execution of it): it wins.
                result(late, worker="w9"),
            ],
        )
        wait_for(lambda: len(history(settings, twice)) == 5, 60, "the later events recorded")

    assert [(kind, outcome) for kind, outcome, _ in history(settings, twice)] == [
        ("started", "applied"),
        ("started", "reexecution"),
        ("started", "duplicate"),
        ("succeeded", "applied"),
        ("started", "reexecution"),
    ]
    assert counter(metrics.EVENTS, "reexecution") == reexecutions_before + 2
    assert run_row(settings, twice)["state"] == "succeeded" and run_row(settings, twice)["worker"] == "w2"

    [applied_at] = rows(
        settings, "select received_at from attempts where run_id = %s and kind = 'retry'", backoff.id
    )
    waiting = run_row(settings, backoff)
    assert waiting["state"] == "retry_wait" and waiting["lease_expires_at"] is None
    delay = (waiting["next_attempt_at"] - applied_at["received_at"]).total_seconds()
    assert 89 <= delay <= 91, delay  # the database's now + backoff_ms, not the worker's not_before
    assert run_row(settings, legacy)["next_attempt_at"] == legacy_not_before
    won = run_row(settings, late)
    assert (won["state"], won["attempt"], won["worker"]) == ("succeeded", 1, "w9")


def test_a_plain_job_is_held_by_its_run_and_copies_of_its_events_are_counted_duplicates(
    settings: Settings,
) -> None:
    plain, copied = dispatched_runs(settings, 2)
    # A worker's start and success name the same start instant: the execution's.
    plain_start = result(plain, "started", worker="w1")
    start = result(copied, "started", worker="w1")
    success = result(copied, worker="w1", started_at=start.started_at)
    duplicates_before = counter(metrics.EVENTS, "duplicate")
    publish(
        settings, [plain_start, result(plain, worker="w1", started_at=plain_start.started_at), start, success]
    )
    with running(Wiring(settings).reconciler_service()):
        wait_for(lambda: run_row(settings, copied)["state"] == "succeeded", 60, "both applied")
        wait_for(lambda: run_row(settings, plain)["state"] == "succeeded", 60, "both applied")
        # Nothing but the runs' own rows was written for a start and a success.
        assert rows(settings, "select 1 from attempts") == []
        # The same events read again (a reconciler that died before committing its offsets).
        publish(settings, [start, success])
        wait_for(lambda: len(rows(settings, "select 1 from attempts")) == 2, 60, "the copies recorded")

    assert history(settings, plain) == [("started", "applied", "w1"), ("succeeded", "applied", "w1")]
    assert history(settings, copied) == [
        ("started", "applied", "w1"),
        ("succeeded", "applied", "w1"),
        ("started", "duplicate", "w1"),
        ("succeeded", "duplicate", "w1"),
    ]
    assert counter(metrics.EVENTS, "duplicate") == duplicates_before + 2
    assert run_row(settings, copied)["reconciled_at"] is not None


def test_events_sent_by_another_apps_worker_never_change_a_run(settings: Settings) -> None:
    """An outcome sent as another app's than its run's (junk or a forged message): counted stale,
    never applied, and not written among the run's attempts."""
    victim, fenced = dispatched_runs(settings, 2)
    stale_before = counter(metrics.EVENTS, "stale")
    now = datetime.now(UTC)
    letter = JobDeadLetter(
        event_id=uuid.uuid4(), cause="undecodable", app="other", run_id=victim.id, schedule_id=None,
        attempt=1, worker="w-other", started_at=None, finished_at=now, error="unknown framing",
        error_class="UndecodableMessage", attempts=(), original_bytes=b"junk", source=None,
    )  # fmt: skip
    codec = AvroCodec()
    publish(
        settings,
        [
            OutgoingMessage(settings.dlq_topic, codec.encode(letter), victim.id.bytes),
            result(fenced, "started", worker="w-other", app="other"),
            # The run's own app's outcome, after them, is applied.
            result(fenced, worker="w1", app=APP),
        ],
    )
    with running(Wiring(settings).reconciler_service()):
        wait_for(lambda: run_row(settings, fenced)["state"] == "succeeded", 60, "the own app's success")
        wait_for(lambda: counter(metrics.EVENTS, "stale") >= stale_before + 2, 60, "both counted stale")
    assert run_row(settings, victim)["state"] == "dispatched"
    # Kept out of the runs' attempts too: their app would read the other app's worker and error.
    assert history(settings, victim) == []
    assert "w-other" not in {worker for _, _, worker in history(settings, fenced)}
    assert run_row(settings, fenced)["worker"] == "w1"


def test_another_apps_events_in_a_batch_neither_end_a_started_run_nor_count_as_executions(
    settings: Settings,
) -> None:
    """An end of another app naming a started run's attempt, and another app's start before the
    run's own in one batch: stale, never a re-execution, never among the run's attempts."""
    running_run, fresh = dispatched_runs(settings, 2)
    started = datetime.now(UTC)
    with connect(settings.database_url) as conn:
        with conn.transaction():
            reconcile.apply_outcomes(conn, [event(running_run, "started", "w1", started)], 30)
        foreign_end = replace(
            event(running_run, "succeeded", "w-other", started + timedelta(seconds=1)), app="x"
        )
        foreign_start = replace(event(fresh, "started", "w-other", started), app="x")
        own_start = event(fresh, "started", "w1", started + timedelta(milliseconds=1))
        with conn.transaction():
            applied = reconcile.apply_outcomes(conn, [foreign_end, foreign_start, own_start], 30)
    assert (applied.applied, applied.stale, applied.reexecution, applied.cross_app) == (1, 2, 0, 2)
    # What the reconciler's trace spans say of each event that moved nothing.
    assert applied.not_applied == {foreign_end.event_id: "stale", foreign_start.event_id: "stale"}
    for run in (running_run, fresh):
        row = run_row(settings, run)
        assert (row["state"], row["worker"]) == ("running", "w1"), row
        assert "w-other" not in {worker for _, _, worker in history(settings, run)}
        assert "reexecution" not in {outcome for _, outcome, _ in history(settings, run)}


def test_only_events_postgresql_stored_are_checked_against_its_clock(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """An event PostgreSQL refused (quarantined) or one sent as another app's than its run's (kept
    nowhere) says nothing of a worker's clock, however far ahead it is stamped."""
    poisoned, foreign, ahead_a, ahead_b, on_time = dispatched_runs(settings, 5)
    with connect(settings.database_url) as conn:
        conn.execute("alter table runs add constraint no_poison check (worker is distinct from 'poison')")
        conn.commit()
    ahead = datetime.now(UTC) + timedelta(minutes=5)
    before = metrics.CLOCK_AHEAD_EVENTS._value.get()
    publish(
        settings,
        [
            result(poisoned, "started", worker="poison", started_at=ahead),
            result(foreign, "started", worker="w-other", app="other", started_at=ahead),
            result(ahead_a, "started", worker="w-ahead", started_at=ahead),
            result(ahead_b, "started", worker="w-ahead", started_at=ahead),
            result(on_time, "started", worker="w-synchronised"),
        ],
    )
    with caplog.at_level(logging.WARNING), running(Wiring(settings).reconciler_service()):
        wait_for(group_at_the_end(settings), 60, "the offsets committed past all of them")
    assert [run_row(settings, run)["state"] for run in (poisoned, foreign, ahead_a, ahead_b, on_time)] == [
        "dispatched",
        "dispatched",
        "running",
        "running",
        "running",
    ]
    assert [r["run_id"] for r in rows(settings, "select run_id from quarantine")] == [poisoned.id]
    assert metrics.CLOCK_AHEAD_EVENTS._value.get() == before + 2
    named = [r.getMessage() for r in caplog.records if "later than PostgreSQL's clock" in r.getMessage()]
    assert len(named) == 1 and "w-ahead" in named[0], named


def test_a_start_gives_the_run_a_lease_of_the_window_from_the_database_clock(settings: Settings) -> None:
    [run] = dispatched_runs(settings, 1)
    with connect(settings.database_url) as conn:
        assert conn.execute("select lease_expires_at from runs").fetchone() == {"lease_expires_at": None}
        with conn.transaction():
            event = OutcomeEvent(
                str(uuid.uuid4()), run.id, 1, "started", "w", datetime.now(UTC), None, app=APP
            )
            reconcile.apply_outcomes(conn, [event], 12.5)
        row = conn.execute(
            "select state, extract(epoch from lease_expires_at - now()) as left_s from runs"
        ).fetchone()
        conn.commit()
    assert row is not None and row["state"] == "running"
    assert 12 <= float(str(row["left_s"])) <= 12.5


# --- paths 5 and 13: the sweeper and a reconciler that has not read the outcomes -----------------


def database_now(settings: Settings) -> datetime:
    [row] = rows(settings, "select now() as now")
    now: datetime = row["now"]
    return now


def test_the_sweeper_waits_for_unread_outcomes_then_redispatches_or_kills_only_silent_runs(
    settings: Settings,
) -> None:
    [succeeds] = dispatched_runs(settings, 1)
    [silent] = dispatched_runs(settings, 1, max_attempts=2)
    [last] = dispatched_runs(settings, 1, max_attempts=1)
    wiring = Wiring(settings)
    publish(settings, [result(run, "started") for run in (succeeds, silent, last)])
    with running(wiring.reconciler_service()):
        wait_for(
            lambda: len(rows(settings, "select 1 from runs where state = 'running'")) == 3, 60, "all running"
        )
    # The reconciler is down now; the success it has not read waits in .results.
    publish(settings, [result(succeeds)])

    sweeper = wiring.lease_sweeper()
    later = database_now(settings) + timedelta(hours=1)  # every lease long expired
    with connect(settings.database_url) as conn:
        held = sweeper.sweep(conn, now=later)
    assert held.swept == 0 and held.unread == 1
    assert metrics.SWEEP_UNREAD._value.get() == 1
    assert len(rows(settings, "select 1 from runs where state = 'running'")) == 3, "nothing expired"

    with running(wiring.reconciler_service()):
        wait_for(lambda: run_row(settings, succeeds)["state"] == "succeeded", 60, "the late success applied")
        with connect(settings.database_url) as conn:

            def sweep() -> Sweep | None:
                done = sweeper.sweep(conn, now=later)
                return done if done.swept else None

            swept = wait_for(sweep, 30, "a sweep once the reconciler caught up")
    assert (swept.swept, swept.dead, swept.unread) == (2, 1, 0)
    assert metrics.SWEEP_UNREAD._value.get() == 0 and metrics.SWEEP_HELD._value.get() == 0

    won = run_row(settings, succeeds)
    assert (won["state"], won["attempt"]) == ("succeeded", 1), "a success the sweeper had not seen wins"
    again = run_row(settings, silent)
    assert (again["state"], again["attempt"], again["lease_expires_at"]) == ("pending", 2, None)
    # The next attempt has not started; the silent worker's start stays on record with the verdict.
    assert again["started_at"] is None
    assert history(settings, silent) == [("started", "applied", "w"), ("retry", "applied", "sweeper")]
    assert history(settings, last) == [("started", "applied", "w"), ("dead", "applied", "sweeper")]
    dead = run_row(settings, last)
    assert (dead["state"], dead["attempt"]) == ("dead", 1) and dead["error"].startswith("LeaseExpired")

    # Both go out through the outbox, in the sweep's transaction: the next attempt, and the letter.
    codec = AvroCodec()
    queued = rows(
        settings,
        "select topic, key, value, run_id, attempt from outbox where run_id = any(%s)",
        [silent.id, last.id],
    )
    by_run = {q["run_id"]: q for q in queued}
    job = codec.decode(JobMessage, by_run[silent.id]["value"])
    assert (by_run[silent.id]["topic"], job.attempt, by_run[silent.id]["attempt"]) == (
        settings.jobs_topic(APP),
        2,
        2,
    )
    assert [(a.attempt, a.error_class) for a in job.previous_attempts] == [(1, "LeaseExpired")]
    letter = codec.decode(JobDeadLetter, by_run[last.id]["value"])
    assert by_run[last.id]["topic"] == settings.dlq_topic and by_run[last.id]["key"] == last.id.bytes
    assert (letter.cause, letter.run_id, letter.attempt, letter.worker) == (
        "retries_exhausted",
        last.id,
        1,
        None,
    )
    assert [a.error_class for a in letter.attempts] == ["LeaseExpired"]

    # The swept attempt reporting success after all is fenced: its run moved on to attempt 2.
    with running(wiring.reconciler_service()):
        publish(settings, [result(silent)])
        wait_for(
            lambda: rows(
                settings, "select 1 from attempts where run_id = %s and outcome = 'stale'", silent.id
            ),
            60,
            "the late outcome recorded",
        )
    assert run_row(settings, silent)["state"] == "pending"


def test_the_sweeper_never_expires_a_run_that_was_not_started(settings: Settings) -> None:
    runs = dispatched_runs(settings, 5, max_attempts=1)
    with connect(settings.database_url) as conn:
        # Even a lease left on a waiting run (an older scanner wrote one) does not expire it.
        conn.execute("update runs set lease_expires_at = now() - interval '1 hour'")
        conn.commit()
        swept = Wiring(settings).lease_sweeper().sweep(conn, now=database_now(settings) + timedelta(days=1))
    assert swept.swept == 0
    assert {r["state"] for r in rows(settings, "select state from runs")} == {"dispatched"}
    assert len(runs) == 5


def test_a_dead_letter_without_a_worker_is_passed_over_only_when_the_sweeper_wrote_it(
    settings: Settings,
) -> None:
    """Only the lease sweeper writes a dead letter without a worker, for a run whose death it
    recorded: reading it changes nothing. Any other such letter is quarantined, not dropped unseen,
    and its run is left to its lease."""
    [swept] = dispatched_runs(settings, 1, max_attempts=1)
    not_swept, after = dispatched_runs(settings, 2)
    wiring = Wiring(settings)
    publish(settings, [result(swept, "started")])
    with running(wiring.reconciler_service()):
        wait_for(lambda: run_row(settings, swept)["state"] == "running", 60, "the start applied")
    sweeper = wiring.lease_sweeper()
    later = database_now(settings) + timedelta(hours=1)
    with connect(settings.database_url) as conn:
        wait_for(lambda: sweeper.sweep(conn, now=later).dead, 30, "the silent run swept dead")
    # The sweeper's letter, as the relay publishes it, and a copy of it naming a run it never swept.
    [queued] = rows(
        settings,
        "select key, value from outbox where run_id = %s and topic = %s",
        swept.id,
        settings.dlq_topic,
    )
    codec = AvroCodec()
    letter = codec.decode(JobDeadLetter, queued["value"])
    assert letter.worker is None
    forged = replace(letter, event_id=uuid.uuid4(), run_id=not_swept.id, schedule_id=not_swept.schedule_id)
    # A letter whose run is not there (the history's retention deleted it, or junk) leaves no run
    # to its lease: passed over, as the sweeper's old letters a new consumer group reads again.
    gone = replace(letter, event_id=uuid.uuid4(), run_id=uuid.uuid4())
    quarantined_before = counter(metrics.QUARANTINED, "no_worker")
    publish(
        settings,
        [
            OutgoingMessage(settings.dlq_topic, queued["value"], queued["key"]),
            OutgoingMessage(settings.dlq_topic, codec.encode(forged), not_swept.id.bytes),
            OutgoingMessage(settings.dlq_topic, codec.encode(gone), b"gone"),
            result(after),
        ],
    )
    with running(wiring.reconciler_service()):
        wait_for(lambda: run_row(settings, after)["state"] == "succeeded", 60, "the event behind them")
        wait_for(group_at_the_end(settings), 30, "the offsets committed past them")

    assert history(settings, swept) == [("started", "applied", "w"), ("dead", "applied", "sweeper")]
    assert run_row(settings, not_swept)["state"] == "dispatched"
    [kept] = rows(settings, "select * from quarantine")
    assert (kept["component"], kept["run_id"], kept["app"]) == ("reconciler", not_swept.id, APP)
    assert kept["source_topic"] == settings.dlq_topic and kept["original_bytes"] == codec.encode(forged)
    assert "a dead letter without a worker" in kept["reason"], kept["reason"]
    assert counter(metrics.QUARANTINED, "no_worker") == quarantined_before + 1


# --- path 12: a buffered fire inserted while the run before it ends ------------------------------


class CountingRelease(BufferRelease):
    looks = 0

    def release(self, conn: psycopg.Connection[Row]) -> int:
        released = super().release(conn)
        self.looks += 1
        return released


def test_a_buffered_fire_committed_after_the_wakeup_is_still_released(settings: Settings) -> None:
    TopicAdmin(settings.kafka).ensure_topics(settings.core_topics, partitions=3)
    wiring = Wiring(settings)
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1)", (APP,))
        conn.commit()
        spec = ScheduleSpec(
            app=APP, kind="cron", cron="* * * * * *", handler="builtin:noop", overlap_policy="buffer_one"
        )
        first = service.create_schedule(conn, spec, "test")["next_fire_at"]
        conn.commit()
        wiring.scanner().scan_once(conn, now=first)
    [open_run] = rows(settings, "select id, schedule_id from runs")

    release = CountingRelease(wiring.database, wiring.dispatcher)
    with (
        running(release),
        connect(settings.database_url) as scanner_conn,
        connect(settings.database_url) as conn,
    ):
        wait_for(lambda: release.looks > 0, 30, "the buffer release to be looking")
        # The scanner's transaction buffers the next fire, because the run before it is still open...
        scanner_conn.execute("select 1")
        wiring.scanner().scan_once(scanner_conn, now=first + timedelta(seconds=1))
        # ... while the reconciler ends that run and wakes the release, which cannot see the fire yet.
        with conn.transaction():
            event = OutcomeEvent(
                str(uuid.uuid4()), open_run["id"], 1, "succeeded", "w", first, first, app=APP
            )
            assert reconcile.apply_outcomes(conn, [event], 30).finished == 1
            reconcile.notify_run_finished(conn)
        woken = release.looks
        wait_for(lambda: release.looks >= woken + 2, 30, "the release to look after the wake-up")
        assert conn.execute("select count(*) as n from runs where buffered").fetchone() == {"n": 0}
        scanner_conn.commit()  # the fire becomes visible only now, with no wake-up to come

        def released() -> bool:
            found = conn.execute(
                "select r.buffered, exists (select 1 from outbox o where o.run_id = r.id) as queued "
                "from runs r where r.scheduled_for = %s",
                (first + timedelta(seconds=1),),
            ).fetchone()
            conn.commit()
            return found == {"buffered": False, "queued": True}

        wait_for(released, 10, "the buffered fire released by the next look")


# --- copies of events the runs' rows hold, across retries, re-executions and sweeps --------------


def event(run: Run, kind: str, worker: str, started_at: datetime, attempt: int = 1) -> OutcomeEvent:
    ended = started_at + timedelta(milliseconds=5) if kind in ("succeeded", "retry") else None
    return OutcomeEvent(
        str(uuid.uuid4()),
        run.id,
        attempt,
        kind,
        worker,
        started_at,
        ended,
        error="boom" if kind == "retry" else None,
        error_class="Boom" if kind == "retry" else None,
        backoff_ms=0 if kind == "retry" else None,
        app=APP,
    )


def apply(settings: Settings, *events: OutcomeEvent) -> reconcile.Applied:
    with connect(settings.database_url) as conn:
        applied = reconcile.apply_outcomes(conn, events, 30.0)
        conn.commit()
    return applied


def next_attempt(settings: Settings, run: Run) -> None:
    """The retry's next attempt queued, as the scanner's redispatch leaves it."""
    with connect(settings.database_url) as conn:
        conn.execute(
            "update runs set state = 'pending', attempt = attempt + 1, next_attempt_at = null, "
            "started_at = null, dispatched_at = now() where id = %s and state = 'retry_wait'",
            (run.id,),
        )
        conn.commit()


def test_a_start_read_again_after_its_attempt_ended_and_moved_on_is_a_duplicate(settings: Settings) -> None:
    [run] = dispatched_runs(settings, 1)
    at = datetime.now(UTC)
    start = event(run, "started", "w1", at)
    assert apply(settings, start) == reconcile.Applied(applied=1)
    assert apply(settings, event(run, "retry", "w1", at)) == reconcile.Applied(applied=1)
    next_attempt(settings, run)
    # The first start read again: its execution is on record (its retry), so it is no second one.
    assert apply(settings, start) == reconcile.Applied(duplicate=1)
    # A start of attempt 1 by another worker is one: the job ran again.
    assert apply(settings, event(run, "started", "w2", at + timedelta(seconds=1))) == reconcile.Applied(
        stale=0, reexecution=1
    )
    again = run_row(settings, run)
    assert (again["state"], again["attempt"], again["started_at"]) == ("pending", 2, None)


def test_a_start_read_again_after_a_re_execution_is_a_duplicate_and_changes_nothing(
    settings: Settings,
) -> None:
    [run] = dispatched_runs(settings, 1)
    at = datetime.now(UTC)
    first, second = event(run, "started", "w1", at), event(run, "started", "w2", at + timedelta(seconds=2))
    apply(settings, first)
    assert apply(settings, second).reexecution == 1
    assert apply(settings, first) == reconcile.Applied(duplicate=1)
    assert apply(settings, second) == reconcile.Applied(duplicate=1)
    assert run_row(settings, run)["worker"] == "w2"
    assert history(settings, run) == [
        ("started", "applied", "w1"),
        ("started", "reexecution", "w2"),
        ("started", "duplicate", "w1"),
        ("started", "duplicate", "w2"),
    ]


def test_a_start_read_again_after_its_lease_expired_is_a_duplicate(settings: Settings) -> None:
    [run] = dispatched_runs(settings, 1)
    start = event(run, "started", "w1", datetime.now(UTC))
    apply(settings, start)
    sweeper, later = Wiring(settings).lease_sweeper(), database_now(settings) + timedelta(hours=1)
    with connect(settings.database_url) as conn:
        # The outcome topics are new: until their partitions are ready the sweeper cannot read their
        # ends, holds the sweep and tries again, as its loop does each second.
        swept = wait_for(lambda: sweeper.sweep(conn, now=later).swept, 30, "the expired lease swept")
    assert swept == 1 and run_row(settings, run)["attempt"] == 2
    assert apply(settings, start) == reconcile.Applied(duplicate=1)
    assert history(settings, run) == [
        ("started", "applied", "w1"),
        ("retry", "applied", "sweeper"),
        ("started", "duplicate", "w1"),
    ]


def test_a_run_queued_for_its_next_attempt_by_an_older_release_holds_no_start(settings: Settings) -> None:
    # An older release's redispatch left the attempt before's start on the run.
    [run] = dispatched_runs(settings, 1)
    at = datetime.now(UTC)
    apply(settings, event(run, "started", "w1", at))
    apply(settings, event(run, "retry", "w1", at))
    with connect(settings.database_url) as conn:
        conn.execute(
            "update runs set state = 'dispatched', attempt = 2, next_attempt_at = null where id = %s",
            (run.id,),
        )
        conn.commit()
    assert history(settings, run) == [("retry", "applied", "w1")]
    assert apply(settings, event(run, "started", "w2", at + timedelta(seconds=1), attempt=2)) == (
        reconcile.Applied(applied=1)
    )
    assert history(settings, run) == [("retry", "applied", "w1"), ("started", "applied", "w2")]


def test_an_execution_known_by_its_retry_before_its_start_is_a_counted_re_execution(
    settings: Settings,
) -> None:
    [run] = dispatched_runs(settings, 1)
    at = datetime.now(UTC)
    apply(settings, event(run, "started", "w1", at))
    # Another worker ran the attempt again; its retry (.retry) is read before its start (.results).
    later = at + timedelta(seconds=3)
    assert apply(settings, event(run, "retry", "w2", later)) == reconcile.Applied(applied=1, reexecution=1)
    assert apply(settings, event(run, "started", "w2", later)) == reconcile.Applied(duplicate=1)
    assert history(settings, run) == [
        ("started", "applied", "w1"),
        ("started", "reexecution", "w2"),
        ("retry", "applied", "w2"),
        ("started", "duplicate", "w2"),
    ]


def test_a_start_announced_twice_in_one_batch_is_one_execution(settings: Settings) -> None:
    [run] = dispatched_runs(settings, 1)
    at = datetime.now(UTC)
    # The worker announces its start again, with a new event id, when Kafka's answer was lost.
    first, again = event(run, "started", "w1", at), event(run, "started", "w1", at)
    assert apply(settings, first, again) == reconcile.Applied(applied=1, duplicate=1)
    assert history(settings, run) == [("started", "applied", "w1"), ("started", "duplicate", "w1")]


def test_a_batch_classifies_alike_with_the_prepared_plan_and_with_one_planned_for_it(
    settings: Settings,
) -> None:
    # A reconciler's connection runs small batches with the server's prepared plan, large ones with a
    # plan of their own: the same events, the same answer. The generic plan is forced here, where
    # PostgreSQL would choose it after five executions of a statement.
    size = reconcile.PREPARED_PLAN_MAX_EVENTS + 1
    small, large = dispatched_runs(settings, size), dispatched_runs(settings, size)
    at, later = datetime.now(UTC), datetime.now(UTC) + timedelta(seconds=1)

    def stages(run: Run) -> list[list[OutcomeEvent]]:
        """A start; its copy; then a second execution (known from the start the run's row holds)
        with its start and success, and a retry of an attempt the run has not reached (stale)."""
        first = event(run, "started", "w1", at)
        return [[first], [first], [event(run, "started", "w2", later), event(run, "succeeded", "w2", later),
                                   event(run, "retry", "w3", later, attempt=2)]]  # fmt: skip

    def applied(conn: psycopg.Connection[Row], runs: list[Run], per_run: bool) -> reconcile.Applied:
        total, planned = reconcile.Applied(), [stages(run) for run in runs]
        for stage in range(3):
            batches = [events[stage] for events in planned]
            for batch in batches if per_run else [[e for b in batches for e in b]]:
                total += reconcile.apply_outcomes(conn, batch, 30.0)
                conn.commit()
        return total

    with connect(settings.database_url) as conn:
        conn.execute("set plan_cache_mode = force_generic_plan")
        one_by_one, all_at_once = applied(conn, small, per_run=True), applied(conn, large, per_run=False)
        [plans] = conn.execute(
            "select sum(generic_plans)::int as n from pg_prepared_statements "
            "where statement like '%%with received as%%'"
        ).fetchall()
    # Every small batch ran a prepared generic plan, every large one a plan of its own.
    assert plans["n"] == 3 * size
    assert (
        one_by_one
        == all_at_once
        == reconcile.Applied(applied=2 * size, stale=size, duplicate=size, reexecution=size, finished=size)
    )
    for run in small + large:
        assert run_row(settings, run)["state"] == "succeeded"
        assert sorted(history(settings, run)) == [
            ("retry", "stale", "w3"),
            ("started", "applied", "w1"),
            ("started", "duplicate", "w1"),
            ("started", "reexecution", "w2"),
            ("succeeded", "applied", "w2"),
        ]


def _loops_over_the_batch(node: dict[str, Any]) -> list[str]:
    """Nested loops whose two sides both scan parts of the batch (CTEs): their work is the batch's
    size squared, which the prepared plan, taking every batch for a few rows, cannot see."""
    sides = [c for c in node.get("Plans", []) if c.get("Parent Relationship") in ("Outer", "Inner")]
    found = []
    if (
        node["Node Type"] == "Nested Loop"
        and len(sides) == 2
        and all(c["Node Type"] == "CTE Scan" for c in sides)
    ):
        found.append(" x ".join(str(c.get("CTE Name")) for c in sides))
    for child in node.get("Plans", []):
        found += _loops_over_the_batch(child)
    return found


def test_the_prepared_plan_never_loops_over_the_batch_twice(settings: Settings) -> None:
    runs = dispatched_runs(settings, 4)
    at = datetime.now(UTC)
    with connect(settings.database_url) as conn:
        # Planned on statistics, as on a table in service (autovacuum analyzes it).
        conn.execute("analyze runs, attempts")
        conn.execute("set plan_cache_mode = force_generic_plan")
        # Batches of several shapes (their parameters' types differ, each is a statement of its own).
        for batch in (
            [event(runs[0], "started", "w1", at)],
            [event(runs[0], "succeeded", "w1", at), event(runs[1], "started", "w1", at)],
            [event(runs[1], "retry", "w1", at), event(runs[2], "started", "w2", at)],
            [event(runs[2], "started", "w3", at), event(runs[3], "dead", "w1", at)],
        ):
            reconcile.apply_outcomes(conn, batch, 30.0)
            conn.commit()
        prepared = conn.execute(
            "select name, parameter_types::text[] as types from pg_prepared_statements "
            "where statement like '%%with received as%%'"
        ).fetchall()
        assert prepared
        for statement in prepared:
            types: list[str] = cast(list[str], statement["types"])
            nulls = ", ".join(f"null::{t}" for t in types)
            [row] = conn.execute(f"explain (format json) execute {statement['name']}({nulls})").fetchall()
            [plan] = cast(list[dict[str, Any]], row["QUERY PLAN"])
            assert _loops_over_the_batch(plan["Plan"]) == [], statement["name"]


def test_a_server_that_loses_prepared_statements_is_planned_for_from_then_on(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pooler in transaction mode hands each transaction another server connection, which never
    # prepared the statement: the batch is retried, unprepared, instead of failing the reconciler.
    monkeypatch.setitem(store_prepared, "kept", True)
    first, second = dispatched_runs(settings, 2)
    at = datetime.now(UTC)
    with connect(settings.database_url) as conn:
        assert apply(settings, event(first, "started", "w1", at)) == reconcile.Applied(applied=1)
        reconcile.apply_outcomes(conn, [event(first, "heartbeat", "w1", at)], 30.0)
        conn.commit()
        conn.pgconn.exec_(b"deallocate all")  # what another server connection looks like
        with pytest.raises(psycopg.OperationalError, match="prepared statement lost"), conn.transaction():
            reconcile.apply_outcomes(conn, [event(second, "started", "w1", at)], 30.0)
    assert store_prepared["kept"] is False
    # Retried on a new connection, as the service does after an OperationalError: planned, applied.
    with connect(settings.database_url) as conn:
        assert reconcile.apply_outcomes(conn, [event(second, "started", "w1", at)], 30.0) == (
            reconcile.Applied(applied=1)
        )
        conn.commit()
        [row] = conn.execute("select count(*)::int as n from pg_prepared_statements").fetchall()
    assert row["n"] == 0
    assert run_row(settings, second)["state"] == "running"


def test_a_sweeper_waiting_for_kafka_to_settle_holds_nothing_until_a_lease_has_passed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("scheduler.reconcile.lease_sweeper.time.monotonic", lambda: clock[0])
    [started] = dispatched_runs(settings, 1)
    sweeper = Wiring(settings).lease_sweeper()
    try:
        # Just started: Kafka has not answered for a lease window yet, but no lease has passed.
        with caplog.at_level(logging.INFO, logger="scheduler.lease-sweeper"):
            for _ in range(4):
                sweeper.step()
                clock[0] += 3.0
        assert metrics.SWEEP_HELD._value.get() == 0
        assert "holding expired leases" not in caplog.text

        with connect(settings.database_url) as conn:
            conn.execute(
                "update runs set state = 'running', started_at = now() - interval '2 minutes', "
                "lease_expires_at = now() - interval '1 minute' where id = %s",
                (started.id,),
            )
            conn.commit()
        with caplog.at_level(logging.WARNING, logger="scheduler.lease-sweeper"):
            for _ in range(3):
                sweeper.step()
                clock[0] += 3.0
        assert metrics.SWEEP_HELD._value.get() == 6.0
        assert "holding expired leases for 6 s: Kafka has answered for" in caplog.text
        assert run_row(settings, started)["state"] == "running", "not swept before Kafka settled"
    finally:
        sweeper.close()
