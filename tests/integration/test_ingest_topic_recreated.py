"""Commands read from a commands topic recreated after a loss of Kafka's topics (deploy.md, "Kafka"):
its offsets start again at 0, so a new command can sit at the very position where a command of the
old topic was rejected. It must be judged on its own, never dropped as a replay of that rejection.
"""

from __future__ import annotations

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.ingest.apply import RecordedRejection
from scheduler.store import schedules
from tests.integration import test_ingest_apply
from tests.integration.test_ingest_apply import Row, Topic, by_key, codes, command, ingest

pytestmark = pytest.mark.integration

conn = test_ingest_apply.conn  # the fixture: a connection, with the app created


def test_a_command_at_the_position_of_a_rejection_of_the_old_topic_is_applied(
    conn: psycopg.Connection[Row],
    settings: Settings,
) -> None:
    old = Topic(settings)
    first = ingest(conn, settings, [old.message(command("1", "a")), old.message(b"garbage")])
    assert first.applied == 1 and [r.rejection.code for r in first.rejected] == ["undecodable"]

    new = Topic(settings)  # the topic recreated: offsets from the start again
    result = ingest(conn, settings, [new.message(command("2", "b")), new.message(command("3", "c"))])
    assert (result.applied, result.replayed) == (2, 0), "the command at offset 2 was dropped unseen"
    assert by_key(conn, "c")["state"] == "active"


def test_a_bad_command_at_the_position_of_a_rejection_of_the_old_topic_is_rejected_and_published(
    conn: psycopg.Connection[Row],
    settings: Settings,
) -> None:
    old = Topic(settings)
    ingest(conn, settings, [old.message(command("1", "a", "pause"))])
    new = Topic(settings)
    published: list[RecordedRejection] = []
    result = ingest(conn, settings, [new.message(command("2", "b", "cancel"))], published)
    assert codes(result) == [("not_found", "2")]
    assert [p.rejection.command_id for p in published] == ["2"], "its producer never hears of it"
    [row] = conn.execute("select command_id, code from ingest_rejections").fetchall()
    assert row == {"command_id": "2", "code": "not_found"}


def test_a_batch_read_again_still_rejects_and_publishes_nothing_twice(
    conn: psycopg.Connection[Row],
    settings: Settings,
) -> None:
    topic = Topic(settings)
    batch = [topic.message(command("1", "k", "pause")), topic.message(b"garbage")]
    published: list[RecordedRejection] = []
    ingest(conn, settings, batch, published)
    replay = ingest(conn, settings, batch, published)
    assert (replay.replayed, replay.rejected) == (2, [])
    assert len(published) == 2


def test_the_same_input_produced_again_into_the_recreated_topic_is_judged_again(
    conn: psycopg.Connection[Row],
    settings: Settings,
) -> None:
    """The usual recovery: the cause of a rejection fixed (here, the app created), the same file
    produced again. Its bytes land at the very positions of the old topic's rejections; only their
    Kafka timestamps are new. They are applied, not dropped as replays."""
    old = Topic(settings)
    later = command("for-later", "k", app="later")
    first = ingest(conn, settings, [old.message(later)])
    assert codes(first) == [("invalid", "for-later")]
    schedules.create_app(conn, "later", 1)
    conn.commit()

    new = Topic(settings)
    again = ingest(conn, settings, [new.message(later)])
    assert (again.applied, again.replayed, again.rejected) == (1, 0, [])
