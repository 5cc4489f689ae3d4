"""A replayed run retries as a fresh one would: its first failure after `dlq replay` waits at most
the schedule's first backoff, not the backoff of the attempt number it has reached.

Against the real PostgreSQL and Kafka, the reconciler applying the events a worker sends.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobDeadLetter
from scheduler.kafka.transport import OutgoingMessage
from scheduler.reconcile.replay import Replayer, ReplayFilter
from scheduler.store import connect
from scheduler.wiring import Wiring
from tests.integration.test_reconcile_robustness import (
    APP,
    Run,
    dispatched_runs,
    publish,
    retry,
    rows,
    run_row,
    running,
)
from tests.support import wait_for

pytestmark = pytest.mark.integration

BUDGET = 5
BASE_MS = 1000  # dispatched_runs' schedules: backoff 1 s doubling, at most 300 s


def waited(settings: Settings, run: Run) -> float:
    """Seconds from the reconciler's record of the run's retry to its next attempt's due time (the
    same statement's now())."""
    [applied] = rows(
        settings,
        "select received_at from attempts where run_id = %s and kind = 'retry' and attempt = %s",
        run.id,
        run.attempt,
    )
    row = run_row(settings, run)
    assert row["state"] == "retry_wait", row
    return float((row["next_attempt_at"] - applied["received_at"]).total_seconds())


def test_a_replayed_runs_first_retry_backs_off_as_a_fresh_runs_first_does(settings: Settings) -> None:
    doomed, fresh = dispatched_runs(settings, 2, max_attempts=BUDGET)
    with connect(settings.database_url) as conn:  # as four retries leave it: on its last attempt
        conn.execute("update runs set attempt = %s where id = %s", (BUDGET, doomed.id))
        conn.commit()
    last = Run(doomed.id, doomed.schedule_id, BUDGET)
    letter = JobDeadLetter(
        event_id=uuid.uuid4(), cause="retries_exhausted", app=APP, run_id=doomed.id,
        schedule_id=doomed.schedule_id, attempt=BUDGET, worker="w", started_at=datetime.now(UTC),
        finished_at=datetime.now(UTC), error="boom", error_class="Boom", attempts=(),
        original_bytes=b"", source=None,
    )  # fmt: skip
    publish(settings, [OutgoingMessage(settings.dlq_topic, AvroCodec().encode(letter), doomed.id.bytes)])
    with running(Wiring(settings).reconciler_service()):
        wait_for(lambda: run_row(settings, last)["state"] == "dead", 60, "the run dead")
        with connect(settings.database_url) as conn:
            assert Replayer(settings).replay(conn, ReplayFilter(run_ids=(doomed.id,)), 1, "test") == 1
        replayed = Run(doomed.id, doomed.schedule_id, BUDGET + 1)
        row = run_row(settings, replayed)
        # A fresh budget of the schedule's max_attempts, counted on from the attempts spent.
        assert (row["state"], row["attempt"], row["max_attempts"]) == ("pending", BUDGET + 1, 2 * BUDGET)
        # Each worker draws the wait after attempt n from [0, base * 2^(n-1)]: these are the tops of
        # those ranges, attempt 6's for the replayed run and attempt 1's for the one never replayed.
        publish(settings, [retry(replayed, backoff_ms=BASE_MS * 2**BUDGET), retry(fresh, backoff_ms=BASE_MS)])
        wait_for(
            lambda: all(run_row(settings, r)["state"] == "retry_wait" for r in (replayed, fresh)),
            60,
            "both retries applied",
        )
    # The replay's first retry waits at most what a fresh run's first retry does (it waited 32 s).
    assert waited(settings, replayed) == pytest.approx(BASE_MS / 1000, abs=0.01)
    assert waited(settings, fresh) == pytest.approx(BASE_MS / 1000, abs=0.01)
