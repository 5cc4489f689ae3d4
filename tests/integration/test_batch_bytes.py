"""Scan and relay batches are bounded in bytes as well as rows: a batch of large payloads once took
the scanner and the relay past their memory limits, and again at every restart, on the same rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from scheduler.config import Settings
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, dlq, outbox, scan

pytestmark = pytest.mark.integration

Row = dict[str, Any]
PAYLOAD_TEXT = 600  # bytes of each payload's JSON text, about


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Row]]:
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('big', 1)")
        conn.commit()
        yield conn


def test_a_scan_batch_takes_payloads_up_to_its_bound_and_leaves_the_rest_due(
    conn: psycopg.Connection[Row],
) -> None:
    for n in range(5):
        blob = str(n) * (PAYLOAD_TEXT - 12)
        spec = ScheduleSpec(app="big", handler="builtin:noop", kind="immediate", payload={"blob": blob})
        service.create_schedule(conn, spec, "test")
    conn.commit()
    sizes = [row["n"] for row in conn.execute("select octet_length(payload::text) as n from schedules")]
    assert all(PAYLOAD_TEXT - 5 <= size <= PAYLOAD_TEXT + 5 for size in sizes), sizes

    with conn.transaction(force_rollback=True):
        # Two payloads fit below 1,000 bytes before them; the third would start past it.
        assert len(scan.lease_due_schedules(conn, 500, max_bytes=1000)) == 2
    with conn.transaction(force_rollback=True):
        assert len(scan.lease_due_schedules(conn, 500, max_bytes=1)) == 1, "the first always goes"
    with conn.transaction(force_rollback=True):
        assert len(scan.lease_due_schedules(conn, 500)) == 5, "the default bound is megabytes"
    # What a batch left locked is due for the next one, in order.
    taken: list[object] = []
    for _ in range(3):
        with conn.transaction():
            batch = scan.lease_due_schedules(conn, 500, max_bytes=1000)
            taken += [due.schedule.id for due in batch]
            conn.execute(
                "update schedules set state = 'completed', next_fire_at = null where id = any(%s)",
                ([due.schedule.id for due in batch],),
            )
    assert len(taken) == len(set(taken)) == 5


def test_a_relay_batch_takes_messages_up_to_its_bound(conn: psycopg.Connection[Row]) -> None:
    conn.execute(
        "insert into outbox (topic, value) select 'jobs', convert_to(repeat('x', 400), 'utf8') "
        "from generate_series(1, 6)"
    )
    conn.commit()
    with conn.transaction(force_rollback=True):
        assert len(outbox.lock(conn, 1000, max_bytes=1000)) == 3  # 0, 400 and 800 bytes before them
    with conn.transaction(force_rollback=True):
        assert len(outbox.lock(conn, 1000, max_bytes=1)) == 1
    with conn.transaction(force_rollback=True):
        assert [len(row.value) for row in outbox.lock(conn, 1000)] == [400] * 6


def test_a_replay_chunk_takes_payloads_up_to_its_bound_and_a_dry_run_lists_all(
    conn: psycopg.Connection[Row],
) -> None:
    for n in range(4):
        spec = ScheduleSpec(
            app="big",
            handler="builtin:noop",
            kind="immediate",
            payload={"blob": str(n) * (PAYLOAD_TEXT - 12)},
        )
        schedule = service.create_schedule(conn, spec, "test")
        conn.execute(
            "insert into runs (id, schedule_id, app, scheduled_for, state, attempt, max_attempts, "
            "finished_at, error) values (gen_random_uuid(), %s, 'big', now(), 'dead', 1, 1, now(), 'E: x')",
            (schedule["id"],),
        )
    conn.commit()
    where = dlq.DeadRunFilter(app="big")
    with conn.transaction(force_rollback=True):
        assert len(dlq.dead_runs_for_replay(conn, where, limit=500, max_bytes=1000)) == 2
    with conn.transaction(force_rollback=True):
        assert len(dlq.dead_runs_for_replay(conn, where, limit=500)) == 4
