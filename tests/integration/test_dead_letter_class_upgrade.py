"""docs/deploy.md, Upgrading: the old pods keep working while a rollout goes on. After migration
0019 an undecodable letter's error class is a column the reconciler of this release fills from the
letter; one of the release before still keeps letters without it. Such a letter must still be kept,
and listed by the class its worker gave it (UndecodableMessage), as the letters of this release are."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.store import connect, runs, schedules
from scheduler.store.migrate import available

pytestmark = pytest.mark.integration

APP = "billing"
# The statement the release before 0019 runs for such a letter (its queries/reconcile.sql).
PREVIOUS_RELEASE_INSERT_LETTER = (
    "insert into dead_letters (event_id, app, cause, error, original_bytes, source_topic, source_partition,"
    " source_offset) values (gen_random_uuid()::text, %s, 'undecodable', %s, '\\xff', null, null, null)"
)


def test_a_letter_an_old_reconciler_keeps_during_the_rollout_is_kept_under_its_workers_class(
    settings: Settings,
) -> None:
    """Its text's part before a ':' is no class: an undecodable letter's class is UndecodableMessage."""
    with connect(settings.database_url, autocommit=True) as conn:
        schedules.create_app(conn, APP, 1)
        conn.execute(PREVIOUS_RELEASE_INSERT_LETTER, (APP, "BadFraming: first byte 0xff"))
        by_text: list[dict[str, Any]] = runs.list_dead(conn, app=APP, error_class="BadFraming")
        listed: list[dict[str, Any]] = runs.list_dead(conn, app=APP, error_class="UndecodableMessage")
    assert by_text == []
    assert [(d["kind"], d["error"]) for d in listed] == [("undecodable", "BadFraming: first byte 0xff")]


# What a worker of every release says of bytes on a job topic that are no job (worker.py's
# _dead_undecodable): its text, and the class it gives the letter, which has always been this one.
UNDECODABLE_TEXT = "unknown framing (first byte 0xff)"
UNDECODABLE_CLASS = "UndecodableMessage"


def test_a_letter_an_old_reconciler_keeps_during_the_rollout_is_listed_by_the_class_its_worker_gave_it(
    settings: Settings,
) -> None:
    """The letter an old reconciler keeps during the rollout came from a worker that gave it the
    class UndecodableMessage, as the new reconciler's letters have it. `dlq list --error-class
    UndecodableMessage` (docs: "for an undecodable letter, the class on the letter") must list both;
    it lists the new one only: the trigger gives the old one its text ("unknown framing (first byte
    0xff)") as its class, so the same kind of letter is found under two classes, by when it came."""
    with connect(settings.database_url, autocommit=True) as conn:
        schedules.create_app(conn, APP, 1)
        conn.execute(PREVIOUS_RELEASE_INSERT_LETTER, (APP, UNDECODABLE_TEXT))
        conn.execute(
            "insert into dead_letters (event_id, app, cause, error, error_class, original_bytes)"
            " values ('new-reconciler', %s, 'undecodable', %s, %s, '\\xff')",
            (APP, UNDECODABLE_TEXT, UNDECODABLE_CLASS),
        )
        listed: list[dict[str, Any]] = runs.list_dead(conn, app=APP, error_class=UNDECODABLE_CLASS)
    assert len(listed) == 2, [(d["id"], d["error"]) for d in listed]


def test_migration_0019_gives_the_letters_before_it_the_class_their_worker_gave_them(
    settings: Settings,
) -> None:
    """Every letter in dead_letters before 0019 is a worker's undecodable letter (a letter with a run
    is the run's), whose class was UndecodableMessage. After the upgrade, `dlq list --error-class
    UndecodableMessage` must find them beside the new ones; the backfill gives them their text as
    their class, so the letters of before the upgrade are found by no class a worker ever gave."""
    with connect(settings.database_url, autocommit=True) as conn:
        schedules.create_app(conn, APP, 1)
        conn.execute(PREVIOUS_RELEASE_INSERT_LETTER, (APP, UNDECODABLE_TEXT))
        conn.execute("alter table dead_letters alter column error_class drop not null")
        conn.execute("update dead_letters set error_class = null")  # as they were before 0019
        migration = next(m for m in available() if m.version == 19).sql()
        backfill = migration[migration.index("update dead_letters set error_class") :]
        conn.execute(backfill[: backfill.index(";") + 1])
        listed: list[dict[str, Any]] = runs.list_dead(conn, app=APP, error_class=UNDECODABLE_CLASS)
    assert [d["error"] for d in listed] == [UNDECODABLE_TEXT]
