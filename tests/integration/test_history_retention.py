"""The history's retention (``SCHEDULER_HISTORY_RETENTION_DAYS``): finished runs older than the
retention go with their attempts and the finished schedules they leave, and nothing else does —
not dead runs (the dead-letter queue), not open runs however old, not recent history, not active
or paused schedules — and nothing it meets (locks, a row it cannot delete, a failing database)
stops it or the lease sweeper that runs it."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from scheduler.config import Settings
from scheduler.reconcile import metrics
from scheduler.reconcile.lease_sweeper import LeaseSweeper, Sweep
from scheduler.reconcile.retention import HistoryRetention
from scheduler.runtime.service import Check
from scheduler.store import api as api_store
from scheduler.store import connect
from scheduler.store import retention as retention_store
from scheduler.store.database import Database
from scheduler.wiring import Wiring
from tests.support import SCHEDULER, Component, wait_for

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


def retention(
    settings: Settings, days: float, batch: int = 5000, clock: list[float] | None = None
) -> HistoryRetention:
    """A retention as the lease sweeper holds one; ``clock`` (seconds) stands in for the monotonic one."""
    return HistoryRetention(
        Wiring(settings).database,
        days,
        logging.getLogger("test-retention"),
        batch=batch,
        clock=time.monotonic if clock is None else lambda: clock[0],
    )


def every_look(sweeper: HistoryRetention) -> int:
    """Looks until one is not whole (then the next is a minute away); how many were whole."""
    whole = 0
    try:
        while sweeper.step():
            whole += 1
    finally:
        sweeper.close()
    return whole


def test_only_finished_history_past_the_retention_goes(settings: Settings) -> None:
    history = insert_history(settings.database_url)
    before = deleted_runs_metric()
    sweeper = retention(settings, 30, batch=3)
    assert every_look(sweeper) == len(history.gone_runs) // 3
    assert sweeper.step() is False, "the next look is a minute later"
    runs, schedules, attempts, keys = remaining(settings.database_url)
    assert runs == history.kept_runs
    assert attempts == history.kept_runs, "attempts of deleted runs were left behind"
    assert schedules == history.kept_schedules
    assert keys == schedules
    assert deleted_runs_metric() - before == len(history.gone_runs)


def test_a_retention_of_zero_keeps_everything(settings: Settings) -> None:
    insert_history(settings.database_url)
    before = remaining(settings.database_url)
    assert every_look(retention(settings, 0)) == 0
    assert remaining(settings.database_url) == before


def looks_while_held(settings: Settings, lock: LiteralString, row_id: uuid.UUID) -> None:
    """Every look of a retention while another transaction holds a row with ``lock``: they must
    end without waiting for it."""
    with connect(settings.database_url) as holder:
        holder.execute(lock, (row_id,))
        worker = threading.Thread(target=every_look, args=(retention(settings, 30),))
        worker.start()
        worker.join(10)
        assert not worker.is_alive(), f"the retention waited on a row held by: {lock}"
        holder.rollback()


def test_rows_another_transaction_holds_are_skipped_not_waited_for(settings: Settings) -> None:
    history = insert_history(settings.database_url)
    locked = sorted(history.gone_runs)[0]
    # As the reconciler holds a run it is applying an event to.
    looks_while_held(settings, "select 1 from runs where id = %s for update", locked)
    runs, _, attempts, _ = remaining(settings.database_url)
    assert runs == history.kept_runs | {locked}
    assert locked in attempts


def test_a_schedule_key_the_ingestor_holds_is_skipped_and_its_schedule_goes_later(settings: Settings) -> None:
    history = insert_history(settings.database_url)
    (one_shot,) = history.gone_schedules
    # As the ingestor's schedules_by_key holds a key while it applies a command.
    looks_while_held(settings, "select 1 from schedule_keys where schedule_id = %s for update", one_shot)
    runs, schedules, _, _ = remaining(settings.database_url)
    assert runs == history.kept_runs
    assert one_shot in schedules
    every_look(retention(settings, 30))  # a later look's crawl over the schedules
    assert remaining(settings.database_url)[1] == history.kept_schedules


def test_two_sweepers_share_the_work(settings: Settings) -> None:
    history = insert_history(settings.database_url)
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            every_look(retention(settings, 30, batch=2))
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    every_look(retention(settings, 30))  # what one skipped while the other held it
    runs, schedules, attempts, _ = remaining(settings.database_url)
    assert runs == history.kept_runs
    assert attempts == history.kept_runs
    assert schedules == history.kept_schedules


def ended_cron(conn: psycopg.Connection[Row], state: str, updated_days_ago: int, runs: int) -> uuid.UUID:
    """A cron schedule in ``state`` whose ``runs`` succeeded runs all ended 40 days ago or more."""
    schedule_id = schedule(conn, "cron", state, updated_days_ago)
    for n in range(runs):
        run(conn, schedule_id, "succeeded", 40 + n, 40 + n, attempts=1)
    return schedule_id


def test_a_cancelled_schedule_goes_once_its_cancel_is_past_the_retention(settings: Settings) -> None:
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1)", (APP,))
        # The usual deleted cron: cancelled (20 days ago) after its last run ended (40 days ago).
        cancelled = ended_cron(conn, "cancelled", 20, 3)
        # Deleted before it ever fired, 40 days ago: no run leads to it.
        never_fired = schedule(conn, "cron", "cancelled", 40)
        conn.commit()
    every_look(retention(settings, 30))
    runs, schedules, _, _ = remaining(settings.database_url)
    assert runs == set(), "its runs are past the retention"
    assert schedules == {cancelled}, "its cancel is not, yet"
    with connect(settings.database_url) as conn:
        # Eleven days later its cancel is past the retention too.
        conn.execute(
            "update schedules set updated_at = now() - interval '31 days' where id = %s", (cancelled,)
        )
        conn.commit()
    every_look(retention(settings, 30))
    _, schedules, _, keys = remaining(settings.database_url)
    assert not {cancelled, never_fired} & (schedules | keys)


def test_two_replicas_splitting_a_schedules_last_runs_leave_no_finished_schedule_behind(
    settings: Settings,
) -> None:
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1)", (APP,))
        completed = ended_cron(conn, "completed", 40, 4)  # a cron that reached its end bound
        conn.commit()
    # Two replicas' batches at the same instant: the second skips the first's rows, and neither
    # sees the schedule without runs, since each still sees the runs the other is deleting.
    with connect(settings.database_url) as first, connect(settings.database_url) as second:
        for conn in (first, second):
            expired = retention_store.expired_runs(conn, 30 * 86_400, 2)
            deleted = retention_store.delete_runs(conn, [r.id for r in expired])
            assert retention_store.delete_finished_schedules(conn, deleted.schedule_ids, 30 * 86_400) == 0
        first.commit()
        second.commit()
    assert remaining(settings.database_url)[0] == set()
    every_look(retention(settings, 30))  # a later look's crawl
    _, schedules, _, keys = remaining(settings.database_url)
    assert completed not in schedules | keys


@pytest.mark.parametrize("deferred", [False, True], ids=["immediate-key", "deferred-key"])
def test_a_run_that_cannot_be_deleted_does_not_keep_the_rest_of_the_history(
    settings: Settings, caplog: pytest.LogCaptureFixture, deferred: bool
) -> None:
    history = insert_history(settings.database_url)
    with connect(settings.database_url) as conn:
        # A table of the user's own keeps the oldest expired run (a deferred key is checked only
        # at commit, where no split could find the row at fault).
        oldest = conn.execute(
            "select id from runs where id = any(%s) order by scheduled_for limit 1",
            (list(history.gone_runs),),
        ).fetchone()
        assert oldest is not None
        when = "deferrable initially deferred" if deferred else ""
        conn.execute(f"create table kept_runs (run_id uuid references runs (id) {when})")
        conn.execute("insert into kept_runs values (%s)", (oldest["id"],))
        conn.commit()
    clock = [0.0]
    sweeper = retention(settings, 30, batch=4, clock=clock)
    with caplog.at_level(logging.WARNING):
        every_look(sweeper)
    # Poison never stops a component: the rest of the expired history goes.
    assert remaining(settings.database_url)[0] == history.kept_runs | {oldest["id"]}
    refusals = [r.getMessage() for r in caplog.records if "could not be deleted" in r.getMessage()]
    assert len(refusals) == 1, caplog.text
    assert (
        f"1 rows could not be deleted and are left out for 60 minutes (the first: {oldest['id']})"
        in (refusals[0])
    )
    assert "\n" not in refusals[0]
    with connect(settings.database_url) as conn:
        conn.execute("drop table kept_runs")
        conn.commit()
    clock[0] = 120.0
    every_look(sweeper)
    assert oldest["id"] in remaining(settings.database_url)[0], "left out for an hour"
    clock[0] = 3700.0
    every_look(sweeper)
    assert remaining(settings.database_url)[0] == history.kept_runs, "tried again after the hour"


@contextmanager
def table_away(settings: Settings, table: LiteralString) -> Iterator[None]:
    """``table`` gone (renamed) for a while, as a fault that is nobody's rows' fault."""
    with connect(settings.database_url) as conn:
        conn.execute(
            sql.SQL("alter table {} rename to {}").format(
                sql.Identifier(table), sql.Identifier(f"{table}_away")
            )
        )
        conn.commit()
        try:
            yield
        finally:
            conn.execute(
                sql.SQL("alter table {} rename to {}").format(
                    sql.Identifier(f"{table}_away"), sql.Identifier(table)
                )
            )
            conn.commit()


def test_a_fault_that_is_not_the_rows_fault_leaves_no_row_out(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    history = insert_history(settings.database_url)
    clock = [0.0]
    sweeper = retention(settings, 30, clock=clock)
    with table_away(settings, "attempts"), caplog.at_level(logging.WARNING):  # the look's second statement
        assert sweeper.step() is False
    assert "history retention: look failed, tried again in 60 s" in caplog.text
    assert "could not be deleted" not in caplog.text
    clock[0] = 61.0
    every_look(sweeper)
    assert remaining(settings.database_url)[0] == history.kept_runs


def test_a_look_that_fails_is_logged_and_tried_again_a_minute_later(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    history = insert_history(settings.database_url)
    clock = [0.0]
    sweeper = retention(settings, 30, clock=clock)
    # What a look cannot do without: the table it reads first.
    with table_away(settings, "apps"), caplog.at_level(logging.WARNING):
        assert sweeper.step() is False
    assert "history retention: look failed, tried again in 60 s" in caplog.text
    assert sweeper.step() is False, "not before the next look"
    assert remaining(settings.database_url)[0] == history.kept_runs | history.gone_runs
    clock[0] = 61.0
    every_look(sweeper)
    assert remaining(settings.database_url)[0] == history.kept_runs


def test_a_retention_that_keeps_failing_does_not_stop_the_lease_sweep(settings: Settings) -> None:
    insert_history(settings.database_url)
    # A database the retention cannot read at all (statement_timeout 1 ms on its connections).
    conninfo = make_conninfo(settings.database_url, options="-c statement_timeout=1")
    unused: Any = None
    sweeper = LeaseSweeper(
        Database(conninfo, "test"), unused, unused, unused, Check("kafka", lambda: None), "p.dlq",
        retention_days=30,
    )  # fmt: skip
    sweeper._kafka_answering_since = -1e9  # Kafka has answered for long: sweeps may run
    sweeps: list[int] = []

    def sweep(conn: psycopg.Connection[Row], now: Any = None) -> Sweep:
        sweeps.append(1)
        return Sweep()

    sweeper.sweep = sweep  # type: ignore[method-assign]
    try:
        for _ in range(3):
            sweeper.step()
            sweeper.retention._next_look = 0.0  # every step a look, as if a minute had passed
    finally:
        sweeper.close()
    assert len(sweeps) == 3, "expired leases were not swept while the retention failed"


def test_the_reconciler_process_applies_the_retention(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    history = insert_history(settings.database_url)
    env = settings_env | {"SCHEDULER_HISTORY_RETENTION_DAYS": "30"}
    reconciler = Component("reconciler", env, tmp_path)
    try:
        wait_for(
            lambda: (
                remaining(settings.database_url)[:2] == (set(history.kept_runs), set(history.kept_schedules))
            ),
            60,
            "the reconciler's retention to delete the expired history",
        )
    finally:
        assert reconciler.stop() == 0, reconciler.output()[-3000:]
    assert f"history retention: {len(history.gone_runs)} runs" in reconciler.output()


def test_a_batch_that_deleted_nothing_waits_its_minute(settings: Settings) -> None:
    history = insert_history(settings.database_url)
    with connect(settings.database_url) as conn:
        # A table of the user's own keeps every run: each batch is refused whole.
        conn.execute("create table kept_runs (run_id uuid references runs (id))")
        conn.execute("insert into kept_runs select id from runs")
        conn.commit()
    clock = [0.0]
    sweeper = retention(settings, 30, batch=2, clock=clock)
    try:
        assert sweeper.step() is False, "a whole batch that deleted nothing is no reason to go on at once"
        assert sweeper.step() is False
    finally:
        sweeper.close()
    assert remaining(settings.database_url)[0] == history.kept_runs | history.gone_runs


def test_audit_entries_of_deleted_schedules_stay_with_their_app(
    settings: Settings, settings_env: dict[str, str]
) -> None:
    def cli(*args: str) -> Any:
        done = subprocess.run(
            [SCHEDULER, *args, "--json"], env=settings_env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    cli("apps", "create", APP, "--partitions", "1")
    created = cli("schedules", "create", "--app", APP, "--cron", "0 3 * * *", "--handler", "builtin:noop")
    cli("schedules", "cancel", created["id"])
    with connect(settings.database_url) as conn:
        conn.execute(
            "update schedules set updated_at = now() - interval '31 days' where id = %s", (created["id"],)
        )
        conn.commit()
    every_look(retention(settings, 30))
    assert created["id"] not in {str(s) for s in remaining(settings.database_url)[1]}
    with connect(settings.database_url) as conn:
        entries = api_store.audit_page(
            conn,
            apps=[APP],
            entity=None,
            entity_id=created["id"],
            actor=None,
            since=None,
            before_id=None,
            limit=10,
        )
    assert [(e["action"], e["app"]) for e in entries] == [("cancel", APP), ("create", APP)]
