"""The history's retention (``SCHEDULER_HISTORY_RETENTION_DAYS``): finished runs older than the
retention go with their attempts and the one-shot schedules they leave, and nothing else does —
not dead runs (the dead-letter queue), not open runs however old, not recent history, not active
schedules."""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.reconcile import metrics
from scheduler.reconcile.retention import HistoryRetention
from scheduler.store import connect
from tests.support import Component, wait_for

pytestmark = pytest.mark.integration

APP = "kept"
SECONDS = itertools.count()  # so that no two fires of a schedule share an instant
Row = dict[str, Any]


@dataclass(frozen=True)
class History:
    """Ids of what the test inserted, by what the retention must do with it."""

    gone_runs: frozenset[uuid.UUID]
    kept_runs: frozenset[uuid.UUID]
    gone_schedules: frozenset[uuid.UUID]
    kept_schedules: frozenset[uuid.UUID]


def schedule(conn: psycopg.Connection[Row], kind: str, state: str, updated_days_ago: int) -> uuid.UUID:
    schedule_id = uuid.uuid4()
    conn.execute(
        "insert into schedules (id, app, name, kind, handler, state, cron, updated_at) "
        "values (%s, %s, %s, %s, 'builtin:noop', %s, %s, now() - make_interval(days => %s))",
        (schedule_id, APP, f"{kind}-{state}", kind, state,
         "0 * * * * *" if kind == "cron" else None, updated_days_ago),
    )  # fmt: skip
    conn.execute(
        "insert into schedule_keys (app, schedule_key, schedule_id) values (%s, %s, %s)",
        (APP, f"key-{schedule_id}", schedule_id),
    )
    return schedule_id


def run(
    conn: psycopg.Connection[Row], schedule_id: uuid.UUID, state: str, ended_days_ago: int | None,
    fired_days_ago: int, attempts: int = 2,
) -> uuid.UUID:  # fmt: skip
    run_id = uuid.uuid4()
    conn.execute(
        "insert into runs (id, schedule_id, app, scheduled_for, state, attempt, max_attempts, "
        "started_at, finished_at, created_at) "
        "values (%s, %s, %s, now() - make_interval(days => %s, secs => %s), %s, 1, 3, "
        "now() - make_interval(days => %s), now() - make_interval(days => %s), "
        "now() - make_interval(days => %s))",
        (run_id, schedule_id, APP, fired_days_ago, next(SECONDS), state, fired_days_ago, ended_days_ago,
         fired_days_ago),
    )  # fmt: skip
    for kind in ("started", "succeeded")[:attempts]:
        conn.execute(
            "insert into attempts (run_id, attempt, event_id, kind, outcome) "
            "values (%s, 1, %s, %s, 'applied')",
            (run_id, str(uuid.uuid4()), kind),
        )
    return run_id


def insert_history(database_url: str) -> History:
    gone_runs, kept_runs, gone_schedules, kept_schedules = set(), set(), set(), set()
    with connect(database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1)", (APP,))
        # A cron that keeps firing: its old finished runs go, the schedule and its other runs stay.
        cron = schedule(conn, "cron", "active", 60)
        kept_schedules.add(cron)
        for state in ("succeeded", "skipped", "cancelled"):
            gone_runs.add(run(conn, cron, state, 40, 40))
        gone_runs.add(run(conn, cron, "succeeded", 31, 45))  # a long run: ended before the horizon
        kept_runs.add(run(conn, cron, "succeeded", 29, 31))  # fired before the horizon, ended after it
        kept_runs.add(run(conn, cron, "dead", 50, 50))  # the dead-letter queue
        for state in ("running", "retry_wait", "pending"):
            kept_runs.add(run(conn, cron, state, None, 50, attempts=1))  # open, however old
        kept_runs.add(run(conn, cron, "succeeded", 1, 1))
        # A completed one-shot whose only run is past the retention: it goes with its key.
        one_shot = schedule(conn, "immediate", "completed", 40)
        gone_runs.add(run(conn, one_shot, "succeeded", 40, 40))
        gone_schedules.add(one_shot)
        # A recent one-shot stays whole.
        recent = schedule(conn, "immediate", "completed", 2)
        kept_runs.add(run(conn, recent, "succeeded", 2, 2))
        kept_schedules.add(recent)
        # A deleted (cancelled) schedule whose dead run is still in the dead-letter queue stays.
        cancelled = schedule(conn, "cron", "cancelled", 40)
        gone_runs.add(run(conn, cancelled, "succeeded", 45, 45))
        kept_runs.add(run(conn, cancelled, "dead", 40, 40))
        kept_schedules.add(cancelled)
        # A paused schedule with nothing recent is not finished: it stays, its old runs go.
        paused = schedule(conn, "cron", "paused", 90)
        gone_runs.add(run(conn, paused, "succeeded", 80, 80))
        kept_schedules.add(paused)
        conn.commit()
    return History(
        frozenset(gone_runs), frozenset(kept_runs), frozenset(gone_schedules), frozenset(kept_schedules)
    )


def remaining(database_url: str) -> tuple[set[uuid.UUID], set[uuid.UUID], set[uuid.UUID], set[uuid.UUID]]:
    with connect(database_url) as conn:

        def ids(sql: LiteralString) -> set[uuid.UUID]:
            return {uuid.UUID(str(r["id"])) for r in conn.execute(sql)}

        runs = ids("select id from runs")
        schedules = ids("select id from schedules")
        attempts = ids("select run_id as id from attempts")
        keys = ids("select schedule_id as id from schedule_keys")
    return runs, schedules, attempts, keys


def deleted_runs_metric() -> float:
    return metrics.REGISTRY.get_sample_value("scheduler_history_deleted_total", {"table": "runs"}) or 0.0


def retention(days: float, batch: int = 5000) -> HistoryRetention:
    return HistoryRetention(days, logging.getLogger("test-retention"), batch=batch)


def test_only_finished_history_past_the_retention_goes(settings: Settings) -> None:
    history = insert_history(settings.database_url)
    before = deleted_runs_metric()
    sweeper = retention(30, batch=3)
    with connect(settings.database_url) as conn:
        batches = 0
        while sweeper.step(conn):  # a whole batch: more may be due, the next step goes on at once
            batches += 1
        assert sweeper.step(conn) is False, "the next look is a minute later"
    runs, schedules, attempts, keys = remaining(settings.database_url)
    assert runs == history.kept_runs
    assert attempts <= runs, "attempts of deleted runs were left behind"
    assert attempts == history.kept_runs
    assert schedules == history.kept_schedules
    assert keys == schedules
    assert batches == len(history.gone_runs) // 3
    assert deleted_runs_metric() - before == len(history.gone_runs)


def test_a_retention_of_zero_keeps_everything(settings: Settings) -> None:
    insert_history(settings.database_url)
    before = remaining(settings.database_url)
    with connect(settings.database_url) as conn:
        assert retention(0).step(conn) is False
    assert remaining(settings.database_url) == before


def test_rows_another_transaction_holds_are_skipped_not_waited_for(settings: Settings) -> None:
    history = insert_history(settings.database_url)
    locked = sorted(history.gone_runs)[0]
    with connect(settings.database_url) as holder:
        # As the reconciler holds a run it is applying an event to.
        holder.execute("select 1 from runs where id = %s for update", (locked,))
        with connect(settings.database_url) as conn:
            worker = threading.Thread(target=retention(30).step, args=(conn,))
            worker.start()
            worker.join(10)
            assert not worker.is_alive(), "the retention waited on a locked run"
        holder.rollback()
    runs, _, attempts, _ = remaining(settings.database_url)
    assert runs == history.kept_runs | {locked}
    assert locked in attempts


def test_two_sweepers_share_the_work(settings: Settings) -> None:
    history = insert_history(settings.database_url)
    errors: list[BaseException] = []

    def sweep() -> None:
        sweeper = retention(30, batch=2)
        try:
            with connect(settings.database_url) as conn:
                while sweeper.step(conn):
                    pass
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    with connect(settings.database_url) as conn:
        retention(30).step(conn)  # what one skipped while the other held it
    runs, _, attempts, _ = remaining(settings.database_url)
    assert runs == history.kept_runs
    assert attempts == history.kept_runs


def test_a_refused_batch_is_logged_and_tried_at_the_next_look(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    history = insert_history(settings.database_url)
    clock = [0.0]
    sweeper = HistoryRetention(30, logging.getLogger("test-retention"), every_s=60, clock=lambda: clock[0])
    with connect(settings.database_url) as conn:
        # Something that refuses the delete: a table of the user's own that keeps its runs.
        conn.execute("create table kept_runs (run_id uuid references runs (id))")
        conn.execute("insert into kept_runs select id from runs")
        conn.commit()
        with caplog.at_level(logging.WARNING):
            assert sweeper.step(conn) is False
        assert "history retention: batch refused, tried again in 60 s" in caplog.text
        assert sweeper.step(conn) is False  # not before the next look
        conn.execute("drop table kept_runs")
        conn.commit()
        clock[0] = 61.0
        sweeper.step(conn)
    assert remaining(settings.database_url)[0] == history.kept_runs


def test_the_reconciler_process_applies_the_retention(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    history = insert_history(settings.database_url)
    env = settings_env | {"SCHEDULER_HISTORY_RETENTION_DAYS": "30"}
    reconciler = Component("reconciler", env, tmp_path)
    try:
        wait_for(
            lambda: remaining(settings.database_url)[0] == history.kept_runs,
            60,
            "the reconciler's retention to delete the expired runs",
        )
    finally:
        assert reconciler.stop() == 0, reconciler.output()[-3000:]
    assert f"history retention: {len(history.gone_runs)} runs" in reconciler.output()
    assert remaining(settings.database_url)[1] == history.kept_schedules
