"""When the scanner says a fire was due (header ``scheduler-due-at``, what the worker's start lag
counts from), where a schedule's ``updated_at`` moved for a reason that made no fire due: the
fire is dispatched late by the scheduler, and that lateness must stay in the start lag.

Against the real PostgreSQL (the scanner's own transactions, the database's clock).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

import pytest

from scheduler.config import Settings
from scheduler.kafka.messages import DUE_AT_HEADER
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, schedules
from scheduler.wiring import Wiring

pytestmark = pytest.mark.integration

APP = "sessrev-due"


@pytest.fixture
def app(settings: Settings) -> str:
    with connect(settings.database_url) as conn:
        service.create_app(conn, TopicAdmin(settings.kafka_bootstrap), settings, APP, 1, "test")
    return APP


def create(settings: Settings, **fields: Any) -> dict[str, Any]:
    with connect(settings.database_url) as conn:
        return service.create_schedule(conn, ScheduleSpec(app=APP, handler="builtin:noop", **fields), "test")


def missed_since(settings: Settings, schedule_id: Any, seconds: int) -> datetime:
    """The schedule as a scanner that stopped ``seconds`` ago (about) leaves it: its next fire, on
    its timetable, that far in the past, and nothing changed it since long before. Returns the
    fire's instant."""
    with connect(settings.database_url) as conn:
        row = conn.execute(
            "update schedules set next_fire_at = next_fire_at - make_interval(secs => %s),"
            " updated_at = next_fire_at - make_interval(secs => %s) - interval '1 hour'"
            " where id = %s returning next_fire_at",
            (seconds, seconds, schedule_id),
        ).fetchone()
    assert row is not None
    return cast(datetime, row["next_fire_at"])


def due_at_by_fire(settings: Settings) -> dict[datetime, datetime]:
    """Per fire instant, when its queued first attempt is due, as its job's headers say (its
    instant when they say nothing)."""
    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "select r.scheduled_for, o.headers from outbox o join runs r on r.id = o.run_id"
            " where o.attempt = 1"
        ).fetchall()
    due: dict[datetime, datetime] = {}
    for row in rows:
        instant = cast(datetime, row["scheduled_for"])
        said = cast(dict[str, str], row["headers"]).get(DUE_AT_HEADER)
        due[instant] = instant if said is None else datetime.fromisoformat(said)
    return due


def test_a_payload_update_of_a_schedule_whose_fire_the_scanner_missed_leaves_the_fire_due_at_its_instant(
    settings: Settings, app: str
) -> None:
    """A cron fire due 10 to 20 s ago that the scanner has not leased yet (it is down, or behind), and a
    user changes only the schedule's payload: the update keeps the next fire (service.update_schedule:
    "nor a due one the scanner has not leased yet") and sets updated_at. The fire was due at its
    instant, no change made it due, and the scanner that dispatches it that late is late: the docs
    count "a scanner that finds it late" in the start lag, and list only resumes and one-shots
    created after their instant as due from a change. The scanner's `_due_at` takes any updated_at
    after the instant as the moment the fire became due, so the job says it was due at the update
    and those seconds of the scheduler's own lateness leave the start lag (and SchedulerStartLagHigh)."""
    row = create(settings, kind="cron", cron="*/10 * * * * *", payload={"v": 1})
    instant = missed_since(settings, row["id"], 20)
    with connect(settings.database_url) as conn:
        service.update_schedule(
            conn,
            row["id"],
            ScheduleSpec(
                app=APP, handler="builtin:noop", kind="cron", cron="*/10 * * * * *", payload={"v": 2}
            ),
            "test",
        )
        now = schedules.db_now(conn)
        kept = schedules.get_schedule(conn, row["id"])
    assert kept is not None and kept["next_fire_at"] == instant, "the update keeps the missed fire"
    assert now - instant < timedelta(seconds=settings.catchup_window_s), "within the catch-up window"
    with connect(settings.database_url) as conn:
        Wiring(replace(settings, lookahead_s=0.0)).scanner().scan_once(conn, now=now)
    due = due_at_by_fire(settings)
    assert instant in due, due
    assert due[instant] == instant, f"due at the payload update ({due[instant] - instant} after the fire)"


def test_fires_past_the_first_hundred_of_a_late_scan_stay_due_at_their_instants(
    settings: Settings, app: str
) -> None:
    """A scan plans at most MAX_CATCHUP_FIRES (100) fires of a schedule; its advance sets the
    schedule's updated_at, and the next scan plans the rest. With a catch-up window longer than a
    hundred of a schedule's periods (SCHEDULER_CATCHUP_WINDOW may be a day), a scanner back after
    150 s finds a one-second cron's 150 fires late within the window: each is due at its instant
    and late by the scheduler. The first 100 say so; the other 50, planned by the next scan, read
    the first scan's advance as the moment they became due, and their 50 s to 1 s of lateness are
    not counted in the start lag."""
    late = replace(settings, lookahead_s=0.0, catchup_window_s=3600.0)
    row = create(settings, kind="cron", cron="* * * * * *")
    first = missed_since(settings, row["id"], 150)
    with connect(settings.database_url) as conn:
        scanner = Wiring(late).scanner()
        while scanner.scan_once(conn).created:
            pass
    due = due_at_by_fire(settings)
    assert len(due) >= 150, len(due)
    later = {at: said for at, said in due.items() if at >= first + timedelta(seconds=100)}
    assert later, due
    hidden = {at: said - at for at, said in later.items() if said != at}
    assert hidden == {}, f"{len(hidden)} fires due after their instants, up to {max(hidden.values())}"
