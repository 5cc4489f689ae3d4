"""Two relays claiming the outbox at once never claim the same row."""

from __future__ import annotations

import threading

import pytest

from scheduler.store import connect, query

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
