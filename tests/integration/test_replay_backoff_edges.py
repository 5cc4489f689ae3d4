"""The reconciler's scaling of a replayed run's retry backoff (in apply_outcomes),
at its edges: long backoffs on high attempt numbers, and batches as large as the prepared plan
takes.

Against the real PostgreSQL, applying events as the reconciler does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.config import Settings
from scheduler.reconcile.replay import Replayer, ReplayFilter
from scheduler.store import connect, reconcile
from scheduler.store.reconcile import PREPARED_PLAN_MAX_EVENTS, OutcomeEvent
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
    redispatch one more. The scaling's first version (a CTE, replay_waits) computed
    ``backoff_base_ms * power(2, least(attempt - 1, 1000))`` before capping it at backoff_max_ms:
    past attempt 998 that product exceeds a float8,
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


def _timed(settings: Settings, runs: Sequence[Run], generic: bool) -> float:
    """Seconds PostgreSQL takes to apply one retry of each run in one batch, on the server's
    prepared plan (``generic``: as a reconciler runs a batch of up to PREPARED_PLAN_MAX_EVENTS) or
    planned for the batch."""
    with connect(settings.database_url) as conn:
        conn.execute("analyze runs, attempts, schedules")
        conn.execute(f"set plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
        # The statement prepared and its plan cached on a small batch first, as a service's is.
        reconcile.apply_outcomes(conn, [retry_after(runs[0], 10)], 30.0)
        conn.commit()
        batch = [retry_after(run, 10) for run in runs[1:]]
        began = time.perf_counter()
        applied = reconcile.apply_outcomes(conn, batch, 30.0)
        took = time.perf_counter() - began
        conn.commit()
    assert applied.applied == len(batch)
    return took


def test_a_full_batch_of_retries_costs_the_prepared_plan_no_more_than_a_planned_one(
    settings: Settings,
) -> None:
    """The scaling's first version joined `decisive` with a CTE, replay_waits, which PostgreSQL inlined:
    under the prepared (generic) plan, which takes the batch for a row or two, that join is a nested
    loop whose inner side scans `decisive` again, with runs, schedules and attempts, for every event
    of the batch: the batch's size squared. A batch of 500 retries (the largest the reconciler runs
    on the prepared plan, a burst of failures) took about 1 s against 0.016 s before the change,
    and 4,000 took 41 s against 0.09 s; planned for its size, the same batch takes a few
    hundredths. The prepared plan is there to be cheaper than planning, never 40 times dearer."""
    size = PREPARED_PLAN_MAX_EVENTS
    runs = dispatched_runs(settings, 2 * (size + 1))
    planned = _timed(settings, runs[: size + 1], generic=False)
    prepared = _timed(settings, runs[size + 1 :], generic=True)
    assert prepared < 5 * planned + 0.05, (
        f"{size} retries: {prepared:.3f} s on the prepared plan, {planned:.3f} s planned for the batch"
    )
