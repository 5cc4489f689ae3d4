"""The scale benchmark's pure helpers: what its figures are computed from."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.scale import hourly_spread, max_overlap, plan_scans, plateau, small_spread


def test_in_flight_is_the_most_intervals_open_at_once() -> None:
    assert max_overlap([(0, 30), (1, 31), (2, 32)]) == 3
    assert max_overlap([(0, 1), (2, 3)]) == 1
    # A job that ends at the instant another starts is not in flight with it.
    assert max_overlap([(0, 1), (1, 2)]) == 1
    assert max_overlap([]) == 0


def test_plateau_is_the_memory_while_nearly_every_job_runs() -> None:
    samples = [(0, 80.0), (4_000, 120.0), (4_990, 150.0), (5_000, 152.0), (5_000, 154.0), (10, 90.0)]
    assert plateau(samples, 5_000) == 152.0
    assert plateau([(10, 80.0)], 5_000) is None


def test_the_comparison_fires_at_the_same_rate_from_about_a_thousand_schedules() -> None:
    big = hourly_spread(60)
    assert big.expression == "H H * * * *"
    assert big.period_s == 3600
    small, count = small_spread(1_000_000 / big.period_s)
    assert small.expression == "H/4 * * * * *"
    assert count == 1_111
    assert count / small.period_s == pytest.approx(1_000_000 / 3600, rel=0.001)
    assert hourly_spread(10).expression == "H H/10 * * * *"
    with pytest.raises(ValueError):
        hourly_spread(7)


def test_a_plan_lists_every_scan_with_its_index() -> None:
    plan = {
        "Node Type": "Limit",
        "Plans": [
            {"Node Type": "Seq Scan", "Relation Name": "runs"},
            {"Node Type": "Index Scan", "Relation Name": "schedules", "Index Name": "schedules_pkey"},
        ],
    }
    assert list(plan_scans(plan)) == ["Seq Scan on runs", "Index Scan on schedules (schedules_pkey)"]


def test_a_scan_that_never_ran_says_so() -> None:
    plan = {"Node Type": "Seq Scan", "Relation Name": "schedules", "Actual Loops": 0}
    assert list(plan_scans(plan)) == ["Seq Scan on schedules (never executed)"]


# The address points nowhere: a step that started would fail on it (exit status 1, a traceback).
NOWHERE = {
    "SCHEDULER_DATABASE_URL": "postgresql://bench@127.0.0.1:1/none",
    "SCHEDULER_KAFKA_BOOTSTRAP": "127.0.0.1:1",
}


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        # A cron period that does not divide an hour.
        (["--cron-every", "7"], "--cron-every"),
        # A schedule's runs are read a page of 50 and then the next: with fewer, the step failed on
        # an assertion once the 10,000-run comparison had run.
        (["--only", "history", "--runs", "10"], "--runs"),
    ],
)
def test_a_flag_no_step_can_run_with_is_refused_before_any_step_runs(args: list[str], flag: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.scale", *args],
        env=os.environ | NOWHERE,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert flag in done.stderr.strip().splitlines()[-1]
