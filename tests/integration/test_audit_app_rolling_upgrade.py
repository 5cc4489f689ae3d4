"""docs/deploy.md, Upgrading: "Migrations go first; the new pods wait for them; the old pods keep
working ... a release accepts a schema newer than its own." After migration 0018 (2f7bf38) an
entry's app is a column every writer of this release fills; the pods of the release before still
write entries without it while the rollout goes on. Before 0018 a scoped listing found such an
entry through its schedule (or run); now it matches no app, and a token scoped to that app, or
`scheduler audit list --app`, never sees it again, though nothing about the entry changed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import api, connect, schedules
from scheduler.store.migrate import available

pytestmark = pytest.mark.integration

APP = "billing"
Row = dict[str, Any]
# The statement the release before 0018 runs for every audit entry (its queries/schedules.sql).
PREVIOUS_RELEASE_INSERT_AUDIT = (
    "insert into audit_log (actor, action, entity, entity_id, old_value, new_value)"
    " values (%s, 'trigger', 'schedule', %s, null, jsonb_build_object('run_id', gen_random_uuid()))"
)


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Row]]:
    with connect(settings.database_url, autocommit=True) as conn:
        schedules.create_app(conn, APP, 1)
        yield conn


def test_an_entry_an_old_pod_writes_during_the_rollout_is_listed_for_its_app(
    conn: psycopg.Connection[Row],
) -> None:
    spec = ScheduleSpec(app=APP, handler="builtin:noop", kind="cron", cron="0 3 * * *")
    created = service.create_schedule(conn, spec, "cli:new-pod", schedule_key="nightly")
    conn.execute(PREVIOUS_RELEASE_INSERT_AUDIT, ("api:old-pod", str(created["id"])))

    def page(apps: list[str] | None) -> list[str]:
        rows = api.audit_page(
            conn, apps=apps, entity=None, entity_id=None, actor=None, since=None, before_id=None, limit=50
        )
        return [row["actor"] for row in rows]

    assert "api:old-pod" in page(None)
    assert "api:old-pod" in page([APP]), "the old pod's entry is lost to every listing scoped to its app"


def test_migration_0018_gives_the_entries_before_it_their_app(conn: psycopg.Connection[Row]) -> None:
    """Its backfill, on entries written without an app as the release before wrote them: of a
    schedule, of one whose rows the retention deleted (the app it recorded), and one written by hand
    whose id is no uuid (no app, and no failure of the upgrade)."""
    spec = ScheduleSpec(app=APP, handler="builtin:noop", kind="cron", cron="0 3 * * *")
    created = service.create_schedule(conn, spec, "cli:before", schedule_key="nightly")
    conn.execute(
        "insert into audit_log (actor, action, entity, entity_id, old_value, new_value) values"
        " ('ops:by-hand', 'note', 'schedule', 'not-a-uuid', null, null),"
        " ('api:gone', 'update', 'schedule', gen_random_uuid()::text, null, %s::jsonb)",
        ('{"app": "billing"}',),
    )
    conn.execute("update audit_log set app = null")  # as they were before 0018
    migration = next(m for m in available() if m.version == 18).sql()
    backfill = migration[migration.index("update audit_log set app") :]
    conn.execute(backfill[: backfill.index(";") + 1])
    rows = api.audit_page(
        conn, apps=[APP], entity=None, entity_id=None, actor=None, since=None, before_id=None, limit=50
    )
    actors = {row["actor"] for row in rows}
    assert {"cli:before", "api:gone"} <= actors and "ops:by-hand" not in actors, actors
    assert created["app"] == APP
