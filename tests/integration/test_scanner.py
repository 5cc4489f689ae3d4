"""The scanner against the real PostgreSQL, with the database clock replaced by an injected `now`."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, schedules
from scheduler.wiring import Wiring

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


def scan(settings: Settings, now: datetime) -> None:
    with connect(settings.database_url) as conn:
        Wiring(settings).scanner().scan_once(conn, now=now)


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
