"""Two minutes of ``make chaos``: a thousand jobs through every component while each kind of
fault hits once (a worker killed, a worker stopped past its session timeout, each of scanner,
relay, reconciler and ingestor killed, the broker killed, PostgreSQL stopped immediately).

It runs the very code of ``python -m bench.chaos``, on a PostgreSQL and a Kafka of its own (the
faults never touch the shared stack), and asserts what must hold whatever the faults: nothing
lost or stuck, every poison job dead after one attempt, every execution known to ``attempts``,
no consumer lag once drained, and nothing executed again when every worker restarts. The full
report (JSON and Markdown, with the logs) stays in the test's temporary folder.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.chaos import ChaosOptions, run_chaos

pytestmark = pytest.mark.e2e

SLICE = ChaosOptions(
    jobs=1000,
    duration_s=50.0,
    seed=7,
    workers=6,
    concurrency=5,
    partitions=30,
    kill_every_s=25.0,  # one kill -9 of a worker
    stop_s=12.0,  # past the consumers' 10 s session timeout
    kafka_down_s=15.0,
    pg_down_s=10.0,
    drain_timeout_s=90.0,
    quiet_s=8.0,
    special=2,
)


@pytest.mark.timeout(420)
def test_a_slice_of_the_chaos_run_loses_nothing_and_records_every_execution(tmp_path: Path) -> None:
    report = run_chaos(replace(SLICE, report_dir=tmp_path))
    figures = report["figures"]
    where = f"(report: {tmp_path / 'report.md'})"

    kinds = {fault["kind"] for fault in report["faults"] if fault["fired_at"] is not None}
    assert kinds == {"kill_worker", "stop_worker", "kill_component", "kill_kafka", "stop_postgres"}, where
    assert {f["victim"] for f in report["faults"] if f["kind"] == "kill_component"} == {
        "scanner",
        "relay",
        "reconciler",
        "ingestor",
    }, where

    assert figures["lost"] == 0, f"lost runs {report['evidence']['missing']} {where}"
    assert figures["stuck"] == 0, f"stuck runs {figures['stuck_by_state']} {where}"
    assert figures["created_runs"] == figures["expected_runs"], where
    poison = figures["poison"]
    assert poison["runs"] > 0 and poison["dead_after_one_attempt_on_dlq"] == poison["runs"], (
        f"poison {poison}, {figures['outcomes']['poison']['violations']} {where}"
    )
    assert figures["unrecorded_double_effects"] == 0, f"{report['evidence']['unrecorded']} {where}"
    assert figures["consumer_lag_after_drain"]["known"], where
    assert figures["consumer_lag_after_drain"]["total"] == 0, (
        f"lag per partition {figures['consumer_lag_after_drain']['per_partition']} {where}"
    )
    assert figures["executions_after_restart"] == 0, f"{report['evidence']['restart_executed_runs']} {where}"
