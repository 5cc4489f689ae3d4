"""docs/deploy.md, Upgrading: the old pods keep working while a rollout goes on. After migration
0019 an undecodable letter's error class is a column the reconciler of this release fills from the
letter; one of the release before still keeps letters without it. Such a letter must still be kept,
and listed by the class its text gives, as every letter was before 0019."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.store import connect, runs, schedules

pytestmark = pytest.mark.integration

APP = "billing"
# The statement the release before 0019 runs for such a letter (its queries/reconcile.sql).
PREVIOUS_RELEASE_INSERT_LETTER = (
    "insert into dead_letters (event_id, app, cause, error, original_bytes, source_topic, source_partition,"
    " source_offset) values (gen_random_uuid()::text, %s, 'undecodable', %s, '\\xff', null, null, null)"
)


def test_a_letter_an_old_reconciler_keeps_during_the_rollout_is_listed_by_its_text_class(
    settings: Settings,
) -> None:
    with connect(settings.database_url, autocommit=True) as conn:
        schedules.create_app(conn, APP, 1)
        conn.execute(PREVIOUS_RELEASE_INSERT_LETTER, (APP, "BadFraming: first byte 0xff"))
        listed: list[dict[str, Any]] = runs.list_dead(conn, app=APP, error_class="BadFraming")
    assert [(d["kind"], d["error"]) for d in listed] == [("undecodable", "BadFraming: first byte 0xff")]
