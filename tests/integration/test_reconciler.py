"""The reconciler against the real PostgreSQL and Kafka: fencing, duplicates, and no lost batch."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import DUE_AT_HEADER, JobResult
from scheduler.kafka.transport import (
    Consumer,
    OutgoingMessage,
    Producer,
    Received,
    TopicAdmin,
    producer_config,
)
from scheduler.reconcile import metrics
from scheduler.reconcile.reconciler import Reconciler, next_offsets
from scheduler.runtime.service import Check
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, reconcile
from scheduler.store.database import Database
from scheduler.store.reconcile import OutcomeEvent
from scheduler.wiring import Wiring
from tests.integration.test_reconcile_robustness import group_at_the_end
from tests.support import wait_for

pytestmark = pytest.mark.integration

RUNS = 200


@pytest.fixture
def dispatched_runs(settings: Settings) -> list[dict[str, Any]]:
    """RUNS runs, created by the scanner, as the relay would leave them (dispatched)."""
    TopicAdmin(settings.kafka).ensure_topics(settings.core_topics, partitions=3)
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('rec', 1)")
        conn.execute(
            "insert into schedules (id, app, name, kind, handler, next_fire_at) "
            "select gen_random_uuid(), 'rec', 'n' || g, 'immediate', 'builtin:noop', now() "
            "from generate_series(1, %s) g",
            (RUNS,),
        )
        conn.commit()
        while Wiring(settings).scanner().scan_once(conn).schedules:
            pass
        conn.execute("update runs set state = 'dispatched', dispatched_at = now()")
        conn.commit()
        return conn.execute("select id, schedule_id, attempt from runs").fetchall()


def result(
    run: dict[str, Any],
    attempt: int | None = None,
    event_id: uuid.UUID | None = None,
    *,
    worker: str = "w",
    clock_ahead: timedelta = timedelta(),
) -> JobResult:
    now = datetime.now(UTC) + clock_ahead
    return JobResult(
        event_id=event_id or uuid.uuid4(),
        status="succeeded",
        run_id=run["id"],
        schedule_id=run["schedule_id"],
        app="rec",
        attempt=attempt or run["attempt"],
        worker=worker,
        started_at=now,
        finished_at=now,
    )


def publish(settings: Settings, events: list[JobResult]) -> None:
    codec = AvroCodec()
    Producer(producer_config(settings.kafka, "t")).send(
        [OutgoingMessage(settings.results_topic, codec.encode(e), e.run_id.bytes) for e in events]
    )


class FailsOnce(Reconciler):
    """A reconciler whose first database apply fails as a dropped connection would."""

    failed = False

    def apply(
        self, conn: psycopg.Connection[dict[str, Any]], messages: Sequence[Received]
    ) -> reconcile.Applied:
        if not self.failed:
            self.failed = True
            raise psycopg.OperationalError("connection lost (injected)")
        return super().apply(conn, messages)


@pytest.fixture
def running_reconciler(settings: Settings) -> Iterator[FailsOnce]:
    reconciler = Wiring(settings).reconciler_service(FailsOnce)
    stop = threading.Event()
    thread = threading.Thread(target=reconciler.run, args=(stop,))
    thread.start()
    try:
        yield reconciler
    finally:
        stop.set()
        thread.join(30)


def outcomes(settings: Settings) -> dict[str, int]:
    """The events recorded in `attempts` by what became of them, and the successes applied, which
    the runs' own rows hold."""
    with connect(settings.database_url) as conn:
        rows = conn.execute("select outcome, count(*) as n from attempts group by outcome").fetchall()
        succeeded = conn.execute("select count(*) as n from runs where state = 'succeeded'").fetchone()
    assert succeeded is not None
    return {str(r["outcome"]): int(str(r["n"])) for r in rows} | {"succeeded": int(str(succeeded["n"]))}


def test_a_failed_batch_is_applied_again_not_skipped_and_fencing_holds(
    settings: Settings, dispatched_runs: list[dict[str, Any]], running_reconciler: FailsOnce
) -> None:
    first = [result(run) for run in dispatched_runs]
    publish(settings, first)
    wait_for(lambda: outcomes(settings)["succeeded"] == RUNS, 60, "every success applied")
    assert running_reconciler.failed, "the injected failure happened"

    # The same events again (a redelivery), and outcomes of an attempt that is not the run's.
    stale = [result(run, attempt=run["attempt"] + 1) for run in dispatched_runs[:50]]
    publish(settings, first[:50] + stale)
    wait_for(lambda: sum(outcomes(settings).values()) == RUNS + 100, 60, "the extra events recorded")
    assert outcomes(settings) == {"succeeded": RUNS, "duplicate": 50, "stale": 50}
    with connect(settings.database_url) as conn:
        states = conn.execute("select state, attempt, count(*) as n from runs group by 1, 2").fetchall()
    assert states == [{"state": "succeeded", "attempt": 1, "n": RUNS}]


def test_buffer_one_keeps_one_waiting_fire_and_dispatches_it_when_the_running_one_ends(
    settings: Settings,
) -> None:
    TopicAdmin(settings.kafka).ensure_topics(settings.core_topics, partitions=3)
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('rec', 1)")
        conn.commit()
        row = service.create_schedule(
            conn,
            ScheduleSpec(
                app="rec",
                kind="cron",
                cron="* * * * * *",
                handler="builtin:noop",
                overlap_policy="buffer_one",
            ),
            "test",
        )
        first = row["next_fire_at"]
        scanner = Wiring(settings).scanner()
        for seconds in range(3):  # three fires while the first run never ends
            scanner.scan_once(conn, now=first + timedelta(seconds=seconds))
        runs = conn.execute(
            "select r.id, r.schedule_id, r.attempt, r.state, r.buffered, r.skip_reason, r.scheduled_for, "
            "exists (select 1 from outbox o where o.run_id = r.id) as queued "
            "from runs r order by scheduled_for"
        ).fetchall()
    assert [(r["state"], r["buffered"], r["skip_reason"], r["queued"]) for r in runs] == [
        ("pending", False, None, True),
        ("pending", True, None, False),
        ("skipped", False, "overlap", False),
    ]

    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,)) for s in Wiring(settings).reconciler()]
    for thread in threads:
        thread.start()
    try:
        # Let go after its instant, as a buffered fire is when the run before it overruns: due then.
        wait_for(
            lambda: datetime.now(UTC) > cast(datetime, runs[1]["scheduled_for"]) + timedelta(milliseconds=10),
            10,
            "the waiting fire's instant to pass",
        )
        publish(settings, [result(runs[0])])

        def buffered_released() -> bool:
            with connect(settings.database_url) as conn:
                waiting = conn.execute(
                    "select r.buffered, exists (select 1 from outbox o where o.run_id = r.id) as queued "
                    "from runs r where id = %s",
                    (runs[1]["id"],),
                ).fetchone()
            return waiting == {"buffered": False, "queued": True}

        wait_for(buffered_released, 60, "the waiting fire to be dispatched")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    with connect(settings.database_url) as conn:
        released = conn.execute(
            "select r.dispatched_at, o.headers from runs r join outbox o on o.run_id = r.id where r.id = %s",
            (runs[1]["id"],),
        ).fetchone()
    # It waits for the run before it by design: its start lag counts from its release, not its fire.
    assert released is not None
    assert (
        datetime.fromisoformat(cast(dict[str, str], released["headers"])[DUE_AT_HEADER])
        == (released["dispatched_at"])
    )


def test_a_worker_whose_clock_is_ahead_is_counted_and_named(
    settings: Settings,
    dispatched_runs: list[dict[str, Any]],
    running_reconciler: FailsOnce,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker's clock ahead of the database's starts held jobs early, and its events say the
    instants its clock gave: the reconciler, which applies them on PostgreSQL's clock, tells."""

    def ahead_events() -> float:
        return metrics.REGISTRY.get_sample_value("scheduler_reconciler_clock_ahead_events_total") or 0.0

    before = ahead_events()
    with caplog.at_level(logging.WARNING):
        on_time = [result(run, worker="w-synchronised") for run in dispatched_runs[:100]]
        publish(settings, on_time)
        wait_for(lambda: outcomes(settings)["succeeded"] == 100, 60, "the on-time successes applied")
        assert ahead_events() == before, "events stamped by a synchronised clock are not counted"

        early = [
            result(run, worker="w-ahead", clock_ahead=timedelta(seconds=30)) for run in dispatched_runs[100:]
        ]
        publish(settings, early)
        wait_for(lambda: outcomes(settings)["succeeded"] == RUNS, 60, "the other successes applied")
    # Applied all the same: the run's record is the worker's, which is all there is.
    assert ahead_events() == before + RUNS - 100
    named = [r.getMessage() for r in caplog.records if "later than PostgreSQL's clock" in r.getMessage()]
    assert named and all("w-ahead" in line for line in named), caplog.text
    assert "w-synchronised" not in caplog.text
    assert len(named) == 1, "a worker is named once a minute, not once per batch"


def test_workers_by_the_thousand_are_counted_in_one_line_not_named_each(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Junk or forged events naming thousands of workers must not flood the log nor grow memory."""
    reconciler = Wiring(settings).reconciler_service(Reconciler)
    db_now = datetime.now(UTC)
    ahead = db_now + timedelta(hours=1)

    def events(workers: range) -> list[OutcomeEvent]:
        return [
            OutcomeEvent(
                str(uuid.uuid4()), uuid.uuid4(), 1, "succeeded", f"junk-{w}", ahead, ahead, app="rec"
            )
            for w in workers
        ]

    with caplog.at_level(logging.WARNING):
        for first in range(0, 3000, 500):
            reconciler._check_clocks(events(range(first, first + 500)), db_now)
        reconciler._check_clocks(events(range(5)), db_now)  # a few: each named
    lines = [r.getMessage() for r in caplog.records if "PostgreSQL's clock" in r.getMessage()]
    assert sum("too many to name" in line for line in lines) == 1, lines
    assert sum("stamps its events" in line for line in lines) == 5, lines
    assert len(reconciler._clock_warned) <= 1000


class FirstCommitRefused:
    """The librdkafka consumer, except that its first commit fails, as one does in a rebalance."""

    def __init__(self, inner: Any, reconciler: CommitFailsOnce) -> None:
        self._inner = inner
        self._reconciler = reconciler

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        if not self._reconciler.commit_failed:
            self._reconciler.commit_failed = True
            raise KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS, "injected"))
        return self._inner.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CommitFailsOnce(Reconciler):
    """A reconciler whose first offset commit fails after its batch was stored in PostgreSQL: the
    batch is read again and applied again."""

    def __init__(
        self,
        settings: Settings,
        database: Database,
        consumers: Callable[[], Consumer],
        codec: AvroCodec,
        kafka_check: Check,
    ) -> None:
        self.commit_failed = False

        def refusing_first_commit() -> Consumer:
            consumer = consumers()
            consumer._consumer = FirstCommitRefused(consumer._consumer, self)  # type: ignore[assignment]
            return consumer

        super().__init__(settings, database, refusing_first_commit, codec, kafka_check)


def test_events_of_a_batch_read_again_after_a_failed_commit_are_checked_against_the_clock_once(
    settings: Settings, dispatched_runs: list[dict[str, Any]]
) -> None:
    """A batch applied again is counted again as duplicates, as it should be; its workers' clocks
    are not: the alert on them counts events, not readings."""

    def ahead_events() -> float:
        return metrics.REGISTRY.get_sample_value("scheduler_reconciler_clock_ahead_events_total") or 0.0

    before = ahead_events()
    publish(
        settings,
        [result(run, worker="w-ahead", clock_ahead=timedelta(seconds=30)) for run in dispatched_runs],
    )
    at_the_end = group_at_the_end(settings)
    reconciler = Wiring(settings).reconciler_service(CommitFailsOnce)
    stop = threading.Event()
    thread = threading.Thread(target=reconciler.run, args=(stop,))
    thread.start()
    try:
        wait_for(at_the_end, 60, "the offsets committed to the end")
    finally:
        stop.set()
        thread.join(30)
    assert reconciler.commit_failed, "the injected failure happened"
    # The batch whose commit failed was applied again: its successes are on record as duplicates.
    recorded = outcomes(settings)
    assert recorded["succeeded"] == RUNS and recorded.get("duplicate", 0) > 0, recorded
    assert ahead_events() == before + RUNS


def test_a_commit_forgets_only_the_checks_it_passed(settings: Settings) -> None:
    """A batch read again after a failed commit seldom ends where it did on every partition: more
    messages arrived on some. What was checked past the new commit on a partition stays checked."""
    reconciler: Reconciler = Wiring(settings).reconciler_service()
    topic = settings.results_topic

    def batch(*ranges: tuple[int, range]) -> list[tuple[Received, Any]]:
        # Positions only: what the messages hold does not decide what was checked.
        return [(Received(topic, part, offset, b""), None) for part, offs in ranges for offset in offs]

    def offsets(checked: Sequence[tuple[Received, Any]]) -> list[tuple[int, int]]:
        return [(m.partition, m.offset) for m, _ in checked]

    first = batch((0, range(5)), (1, range(5)))  # applied; its commit fails
    assert len(reconciler._unchecked(first)) == 10
    again = batch((0, range(10)), (1, range(2)))  # read again, cut elsewhere; committed
    assert offsets(reconciler._unchecked(again)) == [(0, o) for o in range(5, 10)]
    reconciler._forget_checked(next_offsets([m for m, _ in again]))
    rest = batch((1, range(2, 10)), (0, range(10, 12)))
    assert offsets(reconciler._unchecked(rest)) == [(1, o) for o in range(5, 10)] + [(0, 10), (0, 11)]
    reconciler._forget_checked(next_offsets([m for m, _ in rest]))
    assert reconciler._clock_checked == {}
