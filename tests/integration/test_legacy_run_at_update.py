"""A cron schedule an earlier release stored with a run_at (which nothing reads) updates since
ea09fa7: the stored spec leaves that run_at behind. But the update then sees a timetable change
(run_at: the stored instant -> None) where the caller changed only a name, so it computes the next
fire afresh: the fire a paused schedule missed, which its misfire policy judges on resume, and a
due fire the scanner had not leased yet are dropped; and a PATCH of what was read is a new version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec, stored_spec
from scheduler.store import connect, schedules

pytestmark = pytest.mark.integration

APP = "billing"
Row = dict[str, Any]


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Row]]:
    with connect(settings.database_url, autocommit=True) as conn:
        schedules.create_app(conn, APP, 1)
        yield conn


def legacy_cron(conn: psycopg.Connection[Row]) -> Row:
    """A paused cron schedule, stored with a run_at, that missed a fire an hour ago."""
    spec = ScheduleSpec(app=APP, handler="builtin:noop", kind="cron", cron="0 3 * * *")
    created = service.create_schedule(conn, spec, "test", schedule_key="nightly")
    service.pause(conn, created["id"], "test")
    missed = datetime.now(UTC) - timedelta(hours=1)
    row = conn.execute(
        "update schedules set run_at = %s, next_fire_at = %s where id = %s returning *",
        (datetime(2030, 1, 1, tzinfo=UTC), missed, created["id"]),
    ).fetchone()
    assert row is not None
    return row


def test_renaming_a_legacy_cron_schedule_keeps_the_fire_it_missed(conn: psycopg.Connection[Row]) -> None:
    old = legacy_cron(conn)
    # What `schedules update --name` and the API's UpdateSchedule {name} do.
    spec = dataclasses.replace(stored_spec(old), name="renamed")
    new = service.update_schedule(conn, old["id"], spec, "test")
    assert new["name"] == "renamed"
    assert new["next_fire_at"] == old["next_fire_at"], "a rename dropped the fire the paused schedule missed"


def test_an_update_changing_nothing_of_a_legacy_cron_schedule_is_no_new_version(
    conn: psycopg.Connection[Row],
) -> None:
    old = legacy_cron(conn)
    new = service.update_schedule(conn, old["id"], stored_spec(old), "test")
    assert new["version"] == old["version"], "an update sending back what was read made a new version"
