"""The scanner against the real PostgreSQL, with the database clock replaced by an injected `now`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.domain.storable import MAX_ERROR_CHARS, MAX_HISTORY_ERROR_CHARS
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import ATTEMPT_HEADER, DUE_AT_HEADER, RUN_ID_HEADER, JobMessage
from scheduler.kafka.transport import TopicAdmin
from scheduler.scan import metrics as scan_metrics
from scheduler.scan.scanner import LOCKED_DUE_PAUSE_S, Scanner
from scheduler.schedule import service
from scheduler.schedule.spec import InvalidSchedule, ScheduleSpec, stored_spec
from scheduler.store import connect, schedules
from scheduler.store import scan as scan_store
from scheduler.wiring import Wiring
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def app(settings: Settings) -> str:
    with connect(settings.database_url) as conn:
        service.create_app(conn, TopicAdmin(settings.kafka_bootstrap), settings, "scan", 2, "test")
    return "scan"


def create(settings: Settings, **fields: Any) -> dict[str, Any]:
    with connect(settings.database_url) as conn:
        return service.create_schedule(
            conn, ScheduleSpec(app="scan", handler="builtin:noop", **fields), "test"
        )


def runs_of(settings: Settings, schedule_id: Any) -> list[dict[str, Any]]:
    with connect(settings.database_url) as conn:
        return conn.execute(
            "select r.*, exists (select 1 from outbox o where o.run_id = r.id) as queued "
            "from runs r where schedule_id = %s order by scheduled_for",
            (schedule_id,),
        ).fetchall()


def scan(settings: Settings, now: datetime, lookahead_s: float = 0.0) -> None:
    """One scan at ``now``; without look-ahead unless asked, so that "due" means due at ``now``."""
    with connect(settings.database_url) as conn:
        Wiring(replace(settings, lookahead_s=lookahead_s)).scanner().scan_once(conn, now=now)


def test_a_delayed_schedule_fires_at_its_time_and_not_before(settings: Settings, app: str) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    row = create(settings, kind="delayed", run_at=now + timedelta(minutes=5))
    scan(settings, now + timedelta(minutes=5) - timedelta(milliseconds=1))
    assert runs_of(settings, row["id"]) == []
    scan(settings, now + timedelta(minutes=5))
    [run] = runs_of(settings, row["id"])
    assert run["scheduled_for"] == now + timedelta(minutes=5)
    assert run["state"] == "pending" and run["queued"]
    with connect(settings.database_url) as conn:
        after = schedules.get_schedule(conn, row["id"])
    assert after is not None and after["state"] == "completed" and after["next_fire_at"] is None


def every_ten_seconds_stopped_for_three_minutes(settings: Settings, misfire: str) -> list[dict[str, Any]]:
    row = create(settings, kind="cron", cron="*/10 * * * * *", misfire_policy=misfire)
    first = row["next_fire_at"]
    # The scanner was down: the first time it looks is three minutes after the first fire was due.
    scan(settings, first + timedelta(minutes=3))
    with connect(settings.database_url) as conn:
        after = schedules.get_schedule(conn, row["id"])
    assert after is not None and after["state"] == "active"
    assert after["next_fire_at"] > first + timedelta(minutes=3), "the schedule goes on after a misfire"
    return runs_of(settings, row["id"])


def test_fire_once_after_downtime_gives_one_run_and_records_the_skipped_fires(
    settings: Settings, app: str
) -> None:
    runs = every_ten_seconds_stopped_for_three_minutes(settings, "fire_once")
    pending = [r for r in runs if r["state"] == "pending"]
    skipped = [r for r in runs if r["state"] == "skipped"]
    assert len(pending) == 1 and pending[0]["queued"]
    assert pending[0]["scheduled_for"] == max(r["scheduled_for"] for r in runs), "the latest missed time"
    assert len(skipped) == 18  # 19 fires in three minutes and one second, the latest of which runs
    assert {r["skip_reason"] for r in skipped} == {"misfire"}


def test_fire_all_after_downtime_runs_every_missed_fire_up_to_a_hundred(settings: Settings, app: str) -> None:
    runs = every_ten_seconds_stopped_for_three_minutes(settings, "fire_all")
    assert 1 < len(runs) <= 100
    assert {r["state"] for r in runs} == {"pending"}
    assert len(runs) == 19


def test_skip_after_downtime_runs_nothing(settings: Settings, app: str) -> None:
    runs = every_ten_seconds_stopped_for_three_minutes(settings, "skip")
    assert [r for r in runs if r["state"] != "skipped"] == []


def test_overlap_skip_records_the_fire_while_the_previous_run_is_open(settings: Settings, app: str) -> None:
    row = create(settings, kind="cron", cron="* * * * *", overlap_policy="skip")
    first = row["next_fire_at"]
    scan(settings, first)
    scan(settings, first + timedelta(minutes=1))
    runs = runs_of(settings, row["id"])
    assert [(r["state"], r["skip_reason"]) for r in runs] == [("pending", None), ("skipped", "overlap")]


def test_a_run_made_under_allow_counts_once_the_policy_becomes_skip(settings: Settings, app: str) -> None:
    row = create(settings, kind="cron", cron="* * * * *")
    first = row["next_fire_at"]
    scan(settings, first)
    [open_run] = runs_of(settings, row["id"])
    assert (open_run["state"], open_run["guarded"]) == ("pending", False)
    with connect(settings.database_url) as conn:
        service.update_schedule(
            conn,
            row["id"],
            ScheduleSpec(
                app="scan", handler="builtin:noop", kind="cron", cron="* * * * *", overlap_policy="skip"
            ),
            "test",
        )
        conn.execute(
            "update schedules set next_fire_at = %s where id = %s", (first + timedelta(minutes=1), row["id"])
        )
    scan(settings, first + timedelta(minutes=1))
    runs = runs_of(settings, row["id"])
    assert [(r["state"], r["skip_reason"], r["guarded"]) for r in runs] == [
        ("pending", None, True),
        ("skipped", "overlap", False),
    ]


def test_a_run_made_while_an_update_to_skip_waits_for_the_schedule_is_guarded(
    settings: Settings, app: str
) -> None:
    row = create(settings, kind="cron", cron="* * * * *")
    spec = ScheduleSpec(
        app="scan", handler="builtin:noop", kind="cron", cron="* * * * *", overlap_policy="skip"
    )
    # A scanner's transaction: the schedule leased (locked), an allow run made, not yet committed.
    with connect(settings.database_url) as scanning:
        scanning.execute("select 1 from schedules where id = %s for update", (row["id"],))
        scanning.execute(
            "insert into runs (id, schedule_id, app, scheduled_for, state, max_attempts, guarded) "
            "values (gen_random_uuid(), %s, 'scan', %s, 'pending', 3, false)",
            (row["id"], row["next_fire_at"]),
        )
        done: list[Exception | None] = []

        def update() -> None:
            try:
                with connect(settings.database_url) as conn:
                    service.update_schedule(conn, row["id"], spec, "test")
                done.append(None)
            except Exception as exc:  # reported below
                done.append(exc)

        updating = threading.Thread(target=update)
        updating.start()
        with connect(settings.database_url, autocommit=True) as watch:
            wait_for(
                lambda: watch.execute(
                    "select 1 from pg_stat_activity where wait_event_type = 'Lock' "
                    "and datname = current_database() and pid <> pg_backend_pid()"
                ).fetchone(),
                30,
                "the update waiting for the schedule",
            )
        scanning.commit()
        updating.join(30)
    assert done == [None]
    [made] = runs_of(settings, row["id"])
    assert made["guarded"], "the run the scanner made while the update waited counts for the overlap policy"


def test_schedules_made_together_without_a_name_get_names_of_their_own(settings: Settings, app: str) -> None:
    names = {create(settings, kind="immediate")["name"] for _ in range(20)}
    assert len(names) == 20 and all(n.startswith("immediate-") for n in names)


def test_paused_schedules_do_not_fire_and_resume_follows_the_misfire_policy(
    settings: Settings, app: str
) -> None:
    row = create(settings, kind="cron", cron="*/10 * * * * *", misfire_policy="skip")
    with connect(settings.database_url) as conn:
        service.pause(conn, row["id"], "test")
    scan(settings, row["next_fire_at"] + timedelta(minutes=5))
    assert runs_of(settings, row["id"]) == []
    with connect(settings.database_url) as conn:
        service.resume(conn, row["id"], "test")
    scan(settings, row["next_fire_at"] + timedelta(minutes=5))
    assert {r["state"] for r in runs_of(settings, row["id"])} == {"skipped"}


def test_an_update_that_keeps_the_timetable_keeps_the_fires_a_paused_schedule_missed(
    settings: Settings, app: str
) -> None:
    """Changing a payload recomputed the next fire from now, and resume then had nothing to judge:
    the fires missed while paused were gone, without a skipped record."""
    created = create(settings, kind="cron", cron="*/10 * * * * *", misfire_policy="fire_all")
    with connect(settings.database_url) as conn:
        service.pause(conn, created["id"], "test")
        # Paused a minute ago: six fires missed by the time of the update.
        conn.execute(
            "update schedules set next_fire_at = next_fire_at - interval '60 seconds' where id = %s",
            (created["id"],),
        )
        row = schedules.get_schedule(conn, created["id"])
        assert row is not None
        updated = service.update_schedule(
            conn, row["id"], replace(stored_spec(row), payload={"v": 2}), "test"
        )
        assert updated["next_fire_at"] == row["next_fire_at"]
        service.resume(conn, row["id"], "test")
    scan(settings, row["next_fire_at"] + timedelta(seconds=60, milliseconds=1))
    fired = sorted(r["scheduled_for"] for r in runs_of(settings, row["id"]) if r["state"] != "skipped")
    assert fired == [row["next_fire_at"] + timedelta(seconds=10 * n) for n in range(7)]
    with connect(settings.database_url) as conn:
        spec = replace(stored_spec(schedule_row(settings, row["id"])), cron="5 * * * * *")
        retimed = service.update_schedule(conn, row["id"], spec, "test")
    assert retimed["next_fire_at"].second == 5, "a new timetable computes the next fire afresh"


def test_concurrent_scanners_never_create_a_fire_twice(settings: Settings, app: str) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    rows = [create(settings, kind="cron", cron="* * * * * *") for _ in range(200)]
    later = now + timedelta(seconds=30)
    barrier = threading.Barrier(4)

    def scanner() -> None:
        barrier.wait()
        with connect(settings.database_url) as conn:
            for _ in range(20):
                Wiring(settings).scanner().scan_once(conn, now=later)

    threads = [threading.Thread(target=scanner) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with connect(settings.database_url) as conn:
        dupes = conn.execute(
            "select schedule_id, scheduled_for, count(*) from runs group by 1, 2 having count(*) > 1"
        ).fetchall()
        per_schedule = conn.execute("select schedule_id, count(*) as n from runs group by 1").fetchall()
        outbox = conn.execute("select count(*) as n, count(distinct run_id) as runs from outbox").fetchone()
    assert dupes == []
    # Each schedule was ~30 s behind: on time (within the catch-up window), so every fire ran.
    assert len(per_schedule) == len(rows)
    assert outbox is not None and outbox["n"] == outbox["runs"]


def metric(name: str, **labels: str) -> float:
    return scan_metrics.REGISTRY.get_sample_value(name, labels or None) or 0.0


def test_a_schedule_whose_fires_cannot_be_computed_is_set_aside_and_the_batch_goes_on(
    settings: Settings, app: str
) -> None:
    good = [create(settings, kind="cron", cron="*/10 * * * * *") for _ in range(3)]
    zone = create(settings, kind="cron", cron="*/10 * * * * *", name="on mars")
    expression = create(settings, kind="cron", cron="*/10 * * * * *", name="bad cron")
    first = min(r["next_fire_at"] for r in good)
    due = {zone["id"]: first - timedelta(seconds=20), expression["id"]: first - timedelta(seconds=10)}
    with connect(settings.database_url) as conn:
        # What a tzdata update or a stricter cron library does to stored schedules (the CLI refuses
        # both): and both sort before every good one, as the oldest due fires.
        conn.execute(
            "update schedules set tz = 'Mars/Olympus', next_fire_at = %s where id = %s",
            (due[zone["id"]], zone["id"]),
        )
        conn.execute(
            "update schedules set cron = '61 * * * *', next_fire_at = %s where id = %s",
            (due[expression["id"]], expression["id"]),
        )
    errored_before = metric("scheduler_scanner_schedules_errored_total", app="scan")
    scanner = Wiring(settings).scanner()
    with connect(settings.database_url) as conn:
        report = scanner.scan_once(conn, now=first + timedelta(seconds=5))
        assert report.errored == 2 and report.created == 3
        scanner.scan_once(conn, now=first + timedelta(seconds=15))
        rows: dict[Any, dict[str, Any]] = {
            r["id"]: r for r in conn.execute("select * from schedules").fetchall()
        }
    for bad, reason in ((zone, "unknown time zone 'Mars/Olympus'"), (expression, "invalid cron expression")):
        row = rows[bad["id"]]
        assert row["state"] == "error" and reason in row["error"], row["error"]
        assert row["errored_at"] is not None
        assert row["next_fire_at"] == due[bad["id"]], "kept, so that a resume judges what was missed"
        assert runs_of(settings, bad["id"]) == []
    # The good schedules fired in the same scans: once at their first fire, once 10 s later.
    assert all(len(runs_of(settings, g["id"])) == 2 for g in good)
    assert metric("scheduler_scanner_schedules_errored_total", app="scan") == errored_before + 2
    try:
        scanner.step()  # a running scanner's step refreshes the gauge the alert watches
    finally:
        scanner.close()
    assert metric("scheduler_schedules_in_error") == 2


def test_a_schedule_in_error_is_fixed_by_update_and_resumed_only_once_it_computes(
    settings: Settings, app: str
) -> None:
    row = create(settings, kind="cron", cron="0 * * * *", tz="Europe/Berlin", misfire_policy="skip")
    with connect(settings.database_url) as conn:
        conn.execute("update schedules set tz = 'Mars/Olympus' where id = %s", (row["id"],))
    scan(settings, row["next_fire_at"])
    with connect(settings.database_url) as conn:
        with pytest.raises(service.InvalidTransition, match=r"still cannot be computed.*Mars/Olympus"):
            service.resume(conn, row["id"], "test")
        fixed = service.update_schedule(
            conn,
            row["id"],
            ScheduleSpec(app="scan", handler="builtin:noop", kind="cron", cron="30 * * * *", tz="Asia/Tokyo"),
            "test",
        )
    assert (fixed["state"], fixed["error"], fixed["errored_at"], fixed["tz"]) == (
        "active",
        None,
        None,
        "Asia/Tokyo",
    )
    assert fixed["next_fire_at"].minute == 30 and fixed["version"] == row["version"] + 1
    # Back in error (the zone database lost the zone again), then it comes back: resume works.
    with connect(settings.database_url) as conn:
        conn.execute("update schedules set tz = 'Mars/Olympus' where id = %s", (row["id"],))
    scan(settings, fixed["next_fire_at"])
    with connect(settings.database_url) as conn:
        conn.execute("update schedules set tz = 'Asia/Tokyo' where id = %s", (row["id"],))
        resumed = service.resume(conn, row["id"], "test")
        assert (resumed["state"], resumed["error"]) == ("active", None)
        conn.execute("update schedules set tz = 'Mars/Olympus' where id = %s", (row["id"],))
    scan(settings, fixed["next_fire_at"])
    with connect(settings.database_url) as conn:
        cancelled = service.cancel(conn, row["id"], "test")
        actions = [
            r["action"]
            for r in conn.execute("select action from audit_log where entity = 'schedule' order by id")
        ]
    assert (cancelled["state"], cancelled["error"]) == ("cancelled", None)
    assert actions == ["create", "error", "update", "error", "resume", "error", "cancel"]


def test_new_runs_retries_and_triggers_have_no_lease_until_a_worker_starts_them(
    settings: Settings, app: str
) -> None:
    row = create(settings, kind="cron", cron="*/10 * * * * *", timeout_ms=5000)
    now = row["next_fire_at"] + timedelta(seconds=1)
    scan(settings, now)
    [run] = runs_of(settings, row["id"])
    assert run["lease_expires_at"] is None
    with connect(settings.database_url) as conn:
        [job] = conn.execute("select value from outbox where run_id = %s", (run["id"],)).fetchall()
        message = AvroCodec().decode(JobMessage, bytes(cast(bytes, job["value"])))
        assert message.deadline == now + timedelta(seconds=5), "informational: dispatch time + timeout"
        conn.execute(
            "update runs set state = 'retry_wait', next_attempt_at = %s where id = %s", (now, run["id"])
        )
        run_id = service.trigger(conn, settings, row["id"], "test")
    scan(settings, now + timedelta(seconds=2))
    with connect(settings.database_url) as conn:
        leases = {
            r["id"]: (r["state"], r["attempt"], r["lease_expires_at"])
            for r in conn.execute("select * from runs where id = any(%s)", ([run["id"], run_id],))
        }
    assert leases == {run["id"]: ("pending", 2, None), run_id: ("pending", 1, None)}


def test_two_triggers_at_one_instant_make_two_runs_and_answer_their_ids(settings: Settings, app: str) -> None:
    """A run is one per schedule and instant, and a trigger's instant is its transaction's start:
    two triggers in one transaction (or two begun in one microsecond) once made one run, and the
    second answered the id of a run that was never made."""
    row = create(settings, kind="cron", cron="0 0 1 1 *")
    with connect(settings.database_url) as conn, conn.transaction():
        first = service.trigger(conn, settings, row["id"], "test")
        second = service.trigger(conn, settings, row["id"], "test")
    runs = {run["id"]: run["scheduled_for"] for run in runs_of(settings, row["id"])}
    assert set(runs) == {first, second}
    assert runs[second] == runs[first] + timedelta(microseconds=1)


def test_jitter_holds_each_fire_back_by_a_random_delay_of_up_to_jitter_ms(
    settings: Settings, app: str
) -> None:
    jittered = [create(settings, kind="cron", cron="0 * * * *", jitter_ms=60_000) for _ in range(20)]
    plain = create(settings, kind="cron", cron="0 * * * *")
    scan(settings, plain["next_fire_at"])
    with connect(settings.database_url) as conn:
        rows: list[dict[str, Any]] = conn.execute(
            "select r.schedule_id, o.available_at, o.created_at from outbox o join runs r on r.id = o.run_id"
        ).fetchall()
    delays = {r["schedule_id"]: r["available_at"] and r["available_at"] - r["created_at"] for r in rows}
    assert delays[plain["id"]] is None, "no jitter: published at once"
    spread = [delays[j["id"]] for j in jittered]
    assert all(timedelta(0) <= d <= timedelta(seconds=60) for d in spread)
    assert len(set(spread)) > 10, "the delays are drawn per fire"
    # A fire is due to start after its delay: the worker's start lag does not count the jitter.
    due = due_at_of(settings)
    assert due[plain["id"]] == plain["next_fire_at"]
    assert all(due[j["id"]] == plain["next_fire_at"] + delays[j["id"]] for j in jittered)


def test_a_retry_carries_its_run_and_attempt_in_headers_and_each_earlier_error_capped(
    settings: Settings, app: str
) -> None:
    row = create(settings, kind="cron", cron="*/10 * * * * *")
    now = row["next_fire_at"] + timedelta(seconds=1)
    scan(settings, now)
    [run] = runs_of(settings, row["id"])
    long_error = "x" * MAX_ERROR_CHARS  # as long as a stored error may be
    with connect(settings.database_url) as conn:
        [first] = conn.execute("select headers from outbox where run_id = %s", (run["id"],)).fetchall()
        headers = cast(dict[str, str], first["headers"])
        assert (headers[RUN_ID_HEADER], headers[ATTEMPT_HEADER]) == (str(run["id"]), "1")
        conn.execute("delete from outbox")
        conn.execute(
            "insert into attempts (run_id, attempt, kind, outcome, worker, finished_at, error, error_class) "
            "values (%s, 1, 'retry', 'applied', 'w1', %s, %s, 'Boom')",
            (run["id"], now, long_error),
        )
        conn.execute(
            "update runs set state = 'retry_wait', next_attempt_at = %s where id = %s", (now, run["id"])
        )
        conn.commit()
    scan(settings, now + timedelta(seconds=2))
    with connect(settings.database_url) as conn:
        [job] = conn.execute("select value, headers from outbox where run_id = %s", (run["id"],)).fetchall()
    headers = cast(dict[str, str], job["headers"])
    assert (headers[RUN_ID_HEADER], headers[ATTEMPT_HEADER]) == (str(run["id"]), "2")
    message = AvroCodec().decode(JobMessage, bytes(cast(bytes, job["value"])))
    [earlier] = message.previous_attempts
    # Every later message of the run carries the history again: each error is cut, visibly.
    assert len(earlier.error) == MAX_HISTORY_ERROR_CHARS
    assert earlier.error.startswith("xxx") and earlier.error.endswith(
        f"[truncated {MAX_ERROR_CHARS - MAX_HISTORY_ERROR_CHARS} characters]"
    )


def due_at_of(settings: Settings) -> dict[Any, datetime]:
    """Per schedule, when its queued first attempt is due to start, as its job's headers say: at its
    instant when they say nothing (a fire dispatched on time carries no such header)."""
    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "select r.schedule_id, r.scheduled_for, o.headers from outbox o join runs r on r.id = o.run_id"
            " where o.attempt = 1"
        ).fetchall()
    return {r["schedule_id"]: _due(r["headers"], r["scheduled_for"]) for r in rows}


def _due(headers: object, scheduled_for: object) -> datetime:
    said = cast(dict[str, str], headers).get(DUE_AT_HEADER)
    return cast(datetime, scheduled_for) if said is None else datetime.fromisoformat(said)


def test_a_fire_found_late_within_the_catch_up_window_is_due_at_its_instant(
    settings: Settings, app: str
) -> None:
    """The scanner late (down, slow) is the scheduler's own lateness: the start lag counts it."""
    row = create(settings, kind="cron", cron="* * * * *")
    scan(settings, row["next_fire_at"] + timedelta(seconds=30))
    assert due_at_of(settings) == {row["id"]: row["next_fire_at"]}
    with connect(settings.database_url) as conn:
        [job] = conn.execute("select headers from outbox").fetchall()
    # Due at its instant, as nearly every job is: its message says nothing more than before.
    assert DUE_AT_HEADER not in cast(dict[str, str], job["headers"])


@pytest.mark.parametrize("misfire", ["fire_once", "fire_all"])
def test_a_misfire_catch_up_is_due_when_the_policy_runs_it(
    settings: Settings, app: str, misfire: str
) -> None:
    """Found later than the catch-up window, a fire the misfire policy runs is late by design; the
    fires after the scan's instant are due at theirs."""
    row = create(settings, kind="cron", cron="*/10 * * * * *", misfire_policy=misfire)
    now = row["next_fire_at"] + timedelta(minutes=3)
    with connect(settings.database_url) as conn:
        Wiring(replace(settings, lookahead_s=0.0)).scanner().scan_once(conn, now=now)
        rows = conn.execute(
            "select r.scheduled_for, o.headers from outbox o join runs r on r.id = o.run_id"
        ).fetchall()
    due = {r["scheduled_for"]: _due(r["headers"], r["scheduled_for"]) for r in rows}
    assert len(due) == (1 if misfire == "fire_once" else 19)
    assert set(due.values()) == {now}


def test_a_fire_a_resume_made_due_within_the_catch_up_window_is_due_at_its_instant(
    settings: Settings, app: str
) -> None:
    """Paused before a fire and resumed 30 s after it (within the catch-up window), fire_once runs
    the missed fire at once, and its start lag counts the pause: nothing on the schedule tells a
    resume from a change that leaves a due fire due (a payload's), whose lateness is the
    scheduler's. Later than the window, it is a misfire's catch-up, due at the scan."""
    row = create(settings, kind="cron", cron="*/10 * * * * *", misfire_policy="fire_once")
    with connect(settings.database_url) as conn:
        service.pause(conn, row["id"], "test")
        conn.execute(
            "update schedules set next_fire_at = next_fire_at - interval '30 seconds' where id = %s",
            (row["id"],),
        )
        resumed = service.resume(conn, row["id"], "test")
        now = schedules.db_now(conn)
    assert resumed["next_fire_at"] < now
    scan(settings, now)
    assert due_at_of(settings) == {row["id"]: resumed["next_fire_at"]}


def test_a_one_shot_created_after_its_instant_is_due_from_its_creation(settings: Settings, app: str) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    row = create(settings, kind="delayed", run_at=now - timedelta(seconds=10))
    scan(settings, row["created_at"] + timedelta(milliseconds=5))
    assert due_at_of(settings) == {row["id"]: row["created_at"]}


def schedule_row(settings: Settings, schedule_id: Any) -> dict[str, Any]:
    with connect(settings.database_url) as conn:
        row = schedules.get_schedule(conn, schedule_id)
    assert row is not None
    return row


def test_with_look_ahead_a_fire_due_within_it_gets_its_run_and_outbox_row_now(
    settings: Settings, app: str
) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    soon = create(settings, kind="delayed", run_at=now + timedelta(milliseconds=500))
    later = create(settings, kind="delayed", run_at=now + timedelta(milliseconds=1500))
    scan(settings, now, lookahead_s=1.0)
    [run] = runs_of(settings, soon["id"])
    assert run["scheduled_for"] == now + timedelta(milliseconds=500), "the fire's instant, not the scan's"
    assert run["state"] == "pending" and run["queued"]
    assert schedule_row(settings, soon["id"])["state"] == "completed"
    assert runs_of(settings, later["id"]) == [], "beyond the look-ahead: not yet"
    with connect(settings.database_url) as conn:
        [job] = conn.execute("select value from outbox where run_id = %s", (run["id"],)).fetchall()
    message = AvroCodec().decode(JobMessage, bytes(cast(bytes, job["value"])))
    assert message.scheduled_for == now + timedelta(milliseconds=500)


def test_without_look_ahead_a_fire_is_leased_only_once_due(settings: Settings, app: str) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    row = create(settings, kind="delayed", run_at=now + timedelta(milliseconds=500))
    scan(settings, now, lookahead_s=0.0)
    assert runs_of(settings, row["id"]) == []
    assert schedule_row(settings, row["id"])["next_fire_at"] == now + timedelta(milliseconds=500)


def test_a_cron_schedule_is_leased_ahead_of_each_fire_and_advanced_past_it(
    settings: Settings, app: str
) -> None:
    row = create(settings, kind="cron", cron="*/5 * * * * *")
    first = row["next_fire_at"]
    scan(settings, first - timedelta(milliseconds=900), lookahead_s=1.0)
    assert [r["scheduled_for"] for r in runs_of(settings, row["id"])] == [first]
    assert schedule_row(settings, row["id"])["next_fire_at"] == first + timedelta(seconds=5)
    scan(settings, first + timedelta(seconds=3), lookahead_s=1.0)
    assert len(runs_of(settings, row["id"])) == 1, "the next fire is 2 s away: not yet"
    scan(settings, first + timedelta(seconds=4, milliseconds=100), lookahead_s=1.0)
    assert [r["scheduled_for"] for r in runs_of(settings, row["id"])] == [first, first + timedelta(seconds=5)]


@pytest.mark.parametrize("overlap", ["skip", "buffer_one"])
def test_a_schedule_whose_overlap_policy_is_not_allow_is_not_leased_ahead(
    settings: Settings, app: str, overlap: str
) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    run_at = now + timedelta(milliseconds=500)
    row = create(settings, kind="delayed", run_at=run_at, overlap_policy=overlap)
    scan(settings, now, lookahead_s=1.0)
    assert runs_of(settings, row["id"]) == []
    scan(settings, run_at, lookahead_s=1.0)
    [run] = runs_of(settings, row["id"])
    assert run["scheduled_for"] == run_at and run["queued"]


def test_the_scanner_wakes_its_look_ahead_before_the_next_fire(settings: Settings, app: str) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    create(settings, kind="delayed", run_at=now + timedelta(seconds=10), overlap_policy="skip")
    with connect(settings.database_url) as conn:
        assert scan_store.next_due_in(conn, now, lookahead_s=1.0) == pytest.approx(10.0)
    create(settings, kind="delayed", run_at=now + timedelta(seconds=20))
    create(settings, kind="delayed", run_at=now + timedelta(seconds=10, milliseconds=500))
    with connect(settings.database_url) as conn:
        assert scan_store.next_due_in(conn, now, lookahead_s=1.0) == pytest.approx(9.5)
        assert scan_store.next_due_in(conn, now, lookahead_s=0.0) == pytest.approx(10.0)


def insert_fires(
    settings: Settings, first: datetime, count: int, every_ms: float, overlap: str = "allow"
) -> None:
    """``count`` delayed schedules of app "scan", the first at ``first``, one every ``every_ms``."""
    with connect(settings.database_url) as conn:
        conn.execute(
            "insert into schedules (id, app, name, kind, handler, run_at, next_fire_at, overlap_policy) "
            "select gen_random_uuid(), 'scan', 'fire-' || g, 'delayed', 'builtin:noop', t, t, %s "
            "  from generate_series(0, %s - 1) g, "
            "       lateral (select %s::timestamptz + g * %s * interval '1 millisecond' as t) x",
            (overlap, count, first, every_ms),
        )
        conn.commit()


def slice_due_in(settings: Settings, now: datetime) -> float | None:
    """next_due_in as the scanner asks it with a 1 s look-ahead."""
    with connect(settings.database_url) as conn:
        return scan_store.next_due_in(
            conn, now, lookahead_s=1.0, slice_fires=200, min_slice_s=0.1, max_slice_s=0.5
        )


def test_dense_fires_are_leased_in_slices_of_about_200(settings: Settings, app: str) -> None:
    """The scan that wakes at the returned time leases the fires up to it plus the look-ahead:
    200 of them at one a millisecond (a slice of 199 ms), whatever woke the scanner before."""
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    insert_fires(settings, now + timedelta(seconds=10), 1000, every_ms=1.0)
    assert slice_due_in(settings, now) == pytest.approx(10 - 1 + 0.199, abs=1e-6)


def test_sparse_fires_are_leased_every_half_window(settings: Settings, app: str) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    insert_fires(settings, now + timedelta(seconds=10), 50, every_ms=10.0)  # 100 fires/s
    assert slice_due_in(settings, now) == pytest.approx(9.5, abs=1e-6)


def test_a_flood_of_fires_is_leased_no_more_often_than_a_tenth_of_the_window(
    settings: Settings, app: str
) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    insert_fires(settings, now + timedelta(seconds=10), 1000, every_ms=0.1)  # 10,000 fires/s
    assert slice_due_in(settings, now) == pytest.approx(9.1, abs=1e-6)


def test_guarded_fires_do_not_shorten_the_slice(settings: Settings, app: str) -> None:
    """Fires of skip schedules are leased at their instant, not ahead: they are no part of a slice."""
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    insert_fires(settings, now + timedelta(seconds=10), 1000, every_ms=0.1, overlap="skip")
    insert_fires(settings, now + timedelta(seconds=10), 10, every_ms=10.0)
    assert slice_due_in(settings, now) == pytest.approx(9.5, abs=1e-6)


@contextmanager
def held_due_fire(settings: Settings, late: timedelta) -> Iterator[tuple[Scanner, psycopg.Connection[Any]]]:
    """A scanner (look-ahead 1 s), and one fire ``late`` past due whose schedule's row another
    transaction holds (as another scanner's batch or a user's update would) until it rolls back."""
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    insert_fires(settings, now - late, 1, every_ms=1.0)
    scanner = Wiring(replace(settings, lookahead_s=1.0)).scanner()
    try:
        with connect(settings.database_url) as other:
            other.execute("select 1 from schedules where app = 'scan' for update")
            yield scanner, other
    finally:
        scanner.close()


def test_due_work_another_transaction_holds_is_looked_at_again_after_a_pause(
    settings: Settings, app: str
) -> None:
    """Another scanner's batch, or a user's update, holds the due schedule's row: the scan leases
    nothing, and the scanner looks again after a short pause instead of at once (it spun)."""
    with held_due_fire(settings, timedelta(seconds=1)) as (scanner, other):
        scanner.step()
        assert scanner.sleep_s() == pytest.approx(LOCKED_DUE_PAUSE_S)
        other.rollback()
        scanner.step()
        with connect(settings.database_url) as conn:
            assert conn.execute("select count(*) as n from runs").fetchone() == {"n": 1}
        assert scanner.sleep_s() > LOCKED_DUE_PAUSE_S, "nothing due any more"


def test_the_scan_lag_keeps_growing_while_the_database_cannot_be_read(settings: Settings, app: str) -> None:
    """A fire 30 s overdue that the scanner cannot lease: the lag its last step read is 30 s, and a
    scrape after that (no step since, as while PostgreSQL is down) sees it older, not held."""
    with held_due_fire(settings, timedelta(seconds=30)) as (scanner, other):
        scanner.step()
        first = metric("scheduler_scan_lag_seconds")
        assert 30.0 <= first < 40.0
        wait_for(lambda: metric("scheduler_scan_lag_seconds") >= first + 1.0, 10, "the lag to grow")
        other.rollback()
        scanner.step()
        assert metric("scheduler_scan_lag_seconds") == 0.0, "leased: nothing due any more"


def test_the_scan_lag_is_the_scanning_ones_whatever_other_scanner_the_process_builds_or_closes(
    settings: Settings, app: str
) -> None:
    """Another scanner built in the same process (a one-off scan, as `scan` above does) took the
    gauge over, though it had read nothing: the lag of the scanner behind by 30 s read 0. And a
    closed scanner's last reading went on ageing: its process's lag grew for ever."""
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    insert_fires(settings, now - timedelta(seconds=30), 1, every_ms=1.0)
    scanner = Wiring(replace(settings, lookahead_s=1.0)).scanner()
    try:
        with connect(settings.database_url) as other:
            other.execute("select 1 from schedules where app = 'scan' for update")
            scanner.step()
            first = metric("scheduler_scan_lag_seconds")
            assert 30.0 <= first < 40.0
            Wiring(settings).scanner().close()  # built, never stepped
            assert metric("scheduler_scan_lag_seconds") >= first, "the scanning one's lag"
            other.rollback()
    finally:
        scanner.close()
    closed = metric("scheduler_scan_lag_seconds")
    with connect(settings.database_url) as conn:
        schedules.db_now(conn)  # time passes
    assert metric("scheduler_scan_lag_seconds") == closed == 0.0, "a closed scanner is behind on nothing"


def test_jitter_still_holds_a_fire_leased_ahead_back_from_its_instant(settings: Settings, app: str) -> None:
    with connect(settings.database_url) as conn:
        now = schedules.db_now(conn)
    run_at = now + timedelta(seconds=3)
    rows = [create(settings, kind="delayed", run_at=run_at, jitter_ms=5_000) for _ in range(10)]
    with connect(settings.database_url) as conn:
        # The database's own clock: the outbox delay counts from the scan's transaction.
        Wiring(replace(settings, lookahead_s=10.0)).scanner().scan_once(conn)
        held: list[dict[str, Any]] = conn.execute(
            "select o.available_at from outbox o join runs r on r.id = o.run_id"
        ).fetchall()
    assert len(held) == len(rows)
    assert all(run_at <= h["available_at"] <= run_at + timedelta(seconds=5, milliseconds=1) for h in held)


def test_an_update_naming_another_app_is_refused_for_the_app_before_the_state(
    settings: Settings, app: str
) -> None:
    row = create(settings, kind="cron", cron="* * * * *")
    with connect(settings.database_url) as conn:
        service.cancel(conn, row["id"], "test")
        spec = replace(stored_spec(schedule_row(settings, row["id"])), app="elsewhere")
        # Cancelled: an update from its own app is refused for the state, naming it; one from
        # another app is told only that the schedule is not its own.
        with pytest.raises(InvalidSchedule, match="belongs to app 'scan', not 'elsewhere'"):
            service.update_schedule(conn, row["id"], spec, "test")
