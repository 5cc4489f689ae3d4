"""Relays take outbox batches by row lock: two at once never take the same row, a batch's rows are
free again the moment its relay's session ends (or the server ends it for idling past its bound),
a row held back by its available_at is not taken before that time, and a claim by a relay of an
earlier version is respected until it lapses."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest

from scheduler.store import connect, outbox
from scheduler.store.schedules import db_now
from tests.support import wait_for

pytestmark = pytest.mark.integration

ROWS = 5000


def test_two_concurrent_relays_drain_the_outbox_without_taking_a_row_twice(database_url: str) -> None:
    with connect(database_url) as conn:
        conn.execute(
            "insert into outbox (topic, value) select 'jobs', convert_to(g::text, 'utf8') "
            "from generate_series(1, %(n)s) g",
            {"n": ROWS},
        )
        conn.commit()

    taken: dict[str, list[int]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def relay(name: str) -> None:
        with connect(database_url) as conn:
            start.wait()
            while True:
                # What a relay does: lock a batch, "publish" it, delete it, in one transaction.
                with conn.transaction():
                    rows = outbox.lock(conn, 100)
                    if not rows:
                        return
                    taken[name].extend(row.id for row in rows)
                    outbox.complete(conn, [row.id for row in rows])

    threads = [threading.Thread(target=relay, args=(n,)) for n in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    a, b = taken["a"], taken["b"]
    assert len(a) + len(b) == ROWS
    assert not set(a) & set(b)
    # Both did real work: SKIP LOCKED let them run side by side instead of one waiting.
    assert a and b
    with connect(database_url) as conn:
        assert conn.execute("select count(*) as n from outbox").fetchone() == {"n": 0}


def test_a_batch_is_free_for_another_relay_once_its_relay_is_gone_or_idles_past_the_bound(
    database_url: str,
) -> None:
    with connect(database_url) as conn:
        conn.execute("insert into outbox (topic, value) select 'jobs', 'x' from generate_series(1, 10)")
        conn.commit()
    with connect(database_url) as first, connect(database_url) as second:
        first.execute("begin")
        mine = outbox.lock(first, 6)
        with second.transaction():
            others = outbox.lock(second, 100)
        assert len(mine) == 6
        assert {row.id for row in others}.isdisjoint(row.id for row in mine) and len(others) == 4
        first.rollback()  # the relay gave up (an exception): its rows are free at once
        with second.transaction():
            assert len(outbox.lock(second, 100)) == 10

    # A relay that stops answering mid-batch (SIGSTOP, a hung host): the server ends its session
    # after the bound, and another relay takes the rows without waiting for the stuck one.
    stuck = connect(database_url)
    try:
        stuck.execute("begin")
        outbox.bound_transaction(stuck, 1.0)
        assert len(outbox.lock(stuck, 100)) == 10
        started = time.monotonic()
        with connect(database_url) as other:

            def free() -> bool:
                with other.transaction():
                    return len(outbox.lock(other, 100)) == 10

            wait_for(free, timeout_s=15, what="the stuck relay's rows to be free")
        assert time.monotonic() - started >= 0.9
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            stuck.execute("select 1")
    finally:
        stuck.close()


def test_a_row_held_back_by_available_at_is_taken_only_once_that_time_passes(database_url: str) -> None:
    with connect(database_url) as conn:
        conn.execute(
            "insert into outbox (topic, value, available_at) values "
            "('jobs', 'later', now() + interval '10 minutes'), ('jobs', 'now', null), "
            "('jobs', 'due', now() - interval '1 second')"
        )
        conn.commit()
        with conn.transaction():
            taken = outbox.lock(conn, 100)
            assert sorted(bytes(r.value) for r in taken) == [b"due", b"now"]
            outbox.complete(conn, [r.id for r in taken])
        # What the idle relay sleeps for: until the held-back row is due (by the database clock).
        wait_s = outbox.next_available_in(conn)
        assert wait_s is not None and 590 < wait_s <= 600
        with conn.transaction():
            assert outbox.lock(conn, 100, now=db_now(conn) + timedelta(minutes=9)) == []
            [later] = outbox.lock(conn, 100, now=db_now(conn) + timedelta(minutes=11))
        assert later.value == b"later"


def test_a_claim_by_a_relay_of_an_earlier_version_is_respected_until_it_lapses(database_url: str) -> None:
    with connect(database_url) as conn:
        conn.execute(
            "insert into outbox (topic, value, claimed_by, claimed_until, publish_count) values "
            "('jobs', 'claimed', 'old-relay', now() + interval '1 minute', 1), "
            "('jobs', 'lapsed', 'old-relay', now() - interval '1 second', 1), ('jobs', 'free', null, null, 0)"
        )
        conn.commit()
        with conn.transaction():
            assert sorted(bytes(r.value) for r in outbox.lock(conn, 100)) == [b"free", b"lapsed"]


def test_a_released_row_counts_its_publish_only_when_it_was_produced(database_url: str) -> None:
    with connect(database_url) as conn:
        conn.execute("insert into outbox (topic, value) values ('jobs', 'produced'), ('jobs', 'held')")
        conn.commit()
        with conn.transaction():
            produced, held = outbox.lock(conn, 100)
            outbox.release(conn, [produced.id], produced=True, back_off=True)
            outbox.release(conn, [held.id], produced=False, back_off=True)
        rows = conn.execute(
            "select convert_from(value, 'utf8') as value, publish_count, available_at > now() as waiting"
            "  from outbox order by id"
        ).fetchall()
    assert rows == [
        {"value": "produced", "publish_count": 1, "waiting": True},
        {"value": "held", "publish_count": 0, "waiting": True},
    ]


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
            # Every row was published once without an answer, and is now due to be published again.
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
            taken = outbox.lock(conn, 100)
            dropped = outbox.drop_obsolete_republishes(conn, [r.id for r in taken], "p.jobs.")
        kept = sorted(bytes(r.value) for r in taken if r.id not in dropped)
        assert kept == [b"letter", b"pending"]
        assert conn.execute("select count(*) as n from outbox").fetchone() == {"n": 2}


def test_a_row_held_back_on_purpose_is_no_wait_until_it_is_released(database_url: str) -> None:
    """A fire's jitter and a retry's delay are the schedule's, not the relay's: they count neither in
    the dispatch lag (age_s) nor in the oldest wait's gauge, which alert at 10 s and at a minute. A
    row Kafka did not acknowledge waits from its creation, its back-offs included."""
    with connect(database_url) as conn:
        now = db_now(conn)
        rows = {
            "jittered, still held": (now - timedelta(seconds=5), now + timedelta(seconds=600), 0),
            "jittered, released": (now - timedelta(seconds=300), now - timedelta(seconds=2), 0),
            "plain": (now - timedelta(seconds=20), None, 0),
        }
        for name, (created, available, published) in rows.items():
            conn.execute(
                "insert into outbox (topic, value, created_at, available_at, publish_count) "
                "values ('jobs', convert_to(%s, 'utf8'), %s, %s, %s)",
                (name, created, available, published),
            )
        conn.commit()
        with conn.transaction(force_rollback=True):
            ages = {bytes(row.value).decode(): row.age_s for row in outbox.lock(conn, 10)}
        assert set(ages) == {"jittered, released", "plain"}
        assert 2 <= ages["jittered, released"] < 10 and 20 <= ages["plain"] < 30
        stats = outbox.stats(conn)
        assert stats.depth == 3 and 20 <= stats.oldest_age_s < 30

        # Kafka did not answer for a row, which now backs off: it waits from its creation.
        conn.execute(
            "insert into outbox (topic, value, created_at, available_at, publish_count) "
            "values ('jobs', 'unanswered', %s, %s, 3)",
            (now - timedelta(seconds=90), now + timedelta(seconds=20)),
        )
        conn.commit()
        assert 90 <= outbox.stats(conn).oldest_age_s < 100
