"""The reconciler's scaling of a replayed run's retry backoff (``replay_waits`` in apply_outcomes),
at its edges: long backoffs on high attempt numbers, and batches as large as the prepared plan
takes.

Against the real PostgreSQL, applying events as the reconciler does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.config import Settings
from scheduler.reconcile.replay import Replayer, ReplayFilter
from scheduler.store import connect
from scheduler.store.reconcile import OutcomeEvent
from tests.integration.test_reconcile_robustness import APP, Run, apply, dispatched_runs, event, run_row

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000  # the longest backoff a schedule may hold (base and max alike)


def retry_after(run: Run, backoff_ms: int) -> OutcomeEvent:
    """A worker's retry of the run's current attempt, drawing ``backoff_ms``."""
    now = datetime.now(UTC)
    return OutcomeEvent(
        f"retry-{run.id}-{run.attempt}",
        run.id,
        run.attempt,
        "retry",
        "w1",
        now - timedelta(milliseconds=5),
        now,
        error="boom",
        error_class="Boom",
        not_before=now + timedelta(milliseconds=backoff_ms),
        backoff_ms=backoff_ms,
        app=APP,
    )


def test_a_replayed_run_on_a_high_attempt_with_a_day_long_backoff_gets_its_retry(settings: Settings) -> None:
    """A schedule may back off up to a day (backoff_base_ms = backoff_max_ms = 86,400,000), and a
    run's attempt numbers only grow: each replay adds its schedule's max_attempts (up to 100), each
    redispatch one more. `replay_waits` computes ``backoff_base_ms * power(2, least(attempt - 1,
    1000))`` before capping it at backoff_max_ms: past attempt 998 that product exceeds a float8,
    and PostgreSQL refuses the whole statement ("value out of range: overflow"). The worker's retry
    of such a replayed run is then refused (the reconciler quarantines it, the run stays running
    until its lease expires), where the worker's own maths caps the exponent and the product is
    merely infinite. A retry of that run must be applied like any other."""
    [run] = dispatched_runs(settings, 1, max_attempts=100)
    with connect(settings.database_url) as conn:
        conn.execute(
            "update schedules set backoff_base_ms = %s, backoff_max_ms = %s where id = %s",
            (DAY_MS, DAY_MS, run.schedule_id),
        )
        # As ten replays of its 100 attempts leave it, on its last attempt.
        conn.execute("update runs set attempt = 1000, max_attempts = 1000 where id = %s", (run.id,))
        conn.commit()
    assert apply(settings, event(run, "dead", "w1", datetime.now(UTC), attempt=1000)).finished == 1
    with connect(settings.database_url) as conn:
        assert Replayer(settings).replay(conn, ReplayFilter(run_ids=(run.id,)), 1, "test") == 1
    replayed = Run(run.id, run.schedule_id, 1001)
    assert run_row(settings, replayed)["attempt"] == 1001

    applied = apply(settings, retry_after(replayed, 5_000))

    assert applied.applied == 1
    row = run_row(settings, replayed)
    assert row["state"] == "retry_wait", row
    # Its first retry after the replay: the worker's draw stands (base and max are one day).
    assert row["next_attempt_at"] is not None
