"""Two relays claiming the outbox at once never claim the same row; a row held back by its
available_at is not claimed before that time."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from scheduler.store import connect, outbox, query
from scheduler.store.schedules import db_now

pytestmark = pytest.mark.integration

ROWS = 5000


def test_two_concurrent_claimers_drain_the_outbox_without_claiming_a_row_twice(database_url: str) -> None:
    with connect(database_url) as conn:
        conn.execute(
            "insert into outbox (topic, value) select 'jobs', convert_to(g::text, 'utf8') "
            "from generate_series(1, %(n)s) g",
            {"n": ROWS},
        )
        conn.commit()

    claimed: dict[str, list[int]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def claimer(name: str) -> None:
        with connect(database_url) as conn:
            start.wait()
            while True:
                with conn.transaction():
                    rows = conn.execute(
                        query("claim_outbox"),
                        {"now": None, "claim_seconds": 600, "relay": name, "limit": 100},
                    ).fetchall()
                if not rows:
                    return
                claimed[name].extend(int(str(r["id"])) for r in rows)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    a, b = claimed["a"], claimed["b"]
    assert len(a) + len(b) == ROWS
    assert len(set(a) | set(b)) == ROWS
    assert not set(a) & set(b)
    # Both did real work: SKIP LOCKED let them run side by side instead of one waiting.
    assert a and b
    with connect(database_url) as conn:
        row = conn.execute("select count(*) as n, max(publish_count) as most from outbox").fetchone()
    assert row == {"n": ROWS, "most": 1}


def test_a_row_held_back_by_available_at_is_claimed_only_once_that_time_passes(database_url: str) -> None:
    with connect(database_url) as conn:
        conn.execute(
            "insert into outbox (topic, value, available_at) values "
            "('jobs', 'later', now() + interval '10 minutes'), ('jobs', 'now', null), "
            "('jobs', 'due', now() - interval '1 second')"
        )
        conn.commit()
        with conn.transaction():
            claimed = outbox.claim(conn, "a", 100, 3600)
        assert sorted(bytes(r.value) for r in claimed) == [b"due", b"now"]
        # What the idle relay sleeps for: until the held-back row is due (by the database clock).
        wait_s = outbox.next_available_in(conn)
        assert wait_s is not None and 590 < wait_s <= 600
        with conn.transaction():
            assert outbox.claim(conn, "b", 100, 600, now=db_now(conn) + timedelta(minutes=9)) == []
            [later] = outbox.claim(conn, "b", 100, 600, now=db_now(conn) + timedelta(minutes=11))
        assert later.value == b"later"
        assert outbox.next_available_in(conn) is None


def test_a_republished_job_whose_attempt_already_started_is_dropped_not_published_twice(
    database_url: str,
) -> None:
    with connect(database_url) as conn:
        conn.execute("insert into apps (name, partitions) values ('billing', 1)")
        conn.execute(
            "insert into schedules (id, app, name, kind, handler)"
            " values ('00000000-0000-0000-0000-00000000000a', 'billing', 's', 'immediate', 'builtin:noop')"
        )
        runs = {"pending": 1, "running": 1, "succeeded": 1, "moved_on": 2}
        for n, (state, attempt) in enumerate(runs.items(), start=1):
            conn.execute(
                "insert into runs (id, schedule_id, app, scheduled_for, state, attempt, max_attempts)"
                " values (%s, '00000000-0000-0000-0000-00000000000a', 'billing',"
                " now() + make_interval(secs => %s), %s, %s, 3)",
                (
                    f"00000000-0000-0000-0000-00000000000{n}",
                    n,
                    "pending" if state == "moved_on" else state,
                    attempt,
                ),
            )
            # Every row was claimed once before (its relay died), and is now due to be published again.
            conn.execute(
                "insert into outbox (topic, value, run_id, attempt, publish_count) values (%s, %s, %s, 1, 1)",
                ("p.jobs.billing", state.encode(), f"00000000-0000-0000-0000-00000000000{n}"),
            )
        # A dead letter the sweeper queued for a dead run: its run is dead by design, it must go out.
        conn.execute(
            "insert into outbox (topic, value, run_id, attempt, publish_count)"
            " values ('p.dlq', 'letter', '00000000-0000-0000-0000-000000000003', 1, 1)"
        )
        conn.commit()
        with conn.transaction():
            claimed = outbox.claim(conn, "a", 100, 60)
            dropped = outbox.drop_obsolete_republishes(conn, "a", [r.id for r in claimed], "p.jobs.")
        kept = sorted(bytes(r.value) for r in claimed if r.id not in dropped)
        assert kept == [b"letter", b"pending"]
        assert conn.execute("select count(*) as n from outbox").fetchone() == {"n": 2}
