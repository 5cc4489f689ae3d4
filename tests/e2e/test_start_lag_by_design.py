"""The worker's start lag counts only the scheduler's own lateness, never a start late by design.

``scheduler_worker_start_lag_seconds`` is what an operator watches (and alerts on) for firing
precision. Some first attempts start late because that is what was asked for: a ``buffer_one``
fire waits for its schedule's previous run to end, and a one-shot due before it was created (or a
misfire's catch-up, or a fire a resume made due) runs at once, past its instant. Counted from their
``scheduled_for``, each reads as seconds of lateness and pages someone for a scheduler that did
exactly its job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.chaos_stack import free_port
from tests.e2e.health import cli, cli_json, get, wait_for_statuses
from tests.support import Component, wait_for

pytestmark = pytest.mark.e2e

APP = "lagfix-design"
PIPELINE = ("scanner", "relay", "reconciler")
# The buffered fire waits for the run before it, which sleeps this long: it starts about this much
# after its instant, well over LATE_S.
SLOW_S = 8.0
LATE_S = 5.0
# The one-shot is due this long before it is created.
PAST_S = 30.0


def start_lags_over(exposition: str, bound: float) -> tuple[float, float]:
    """The worker's start lag of the app: how many starts it counted, and how many over ``bound``
    (one of its bucket bounds)."""
    count = within = 0.0
    for family in text_string_to_metric_families(exposition):
        if family.name != "scheduler_worker_start_lag_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("app") != APP:
                continue
            if sample.name.endswith("_count"):
                count = sample.value
            elif sample.name.endswith("_bucket") and float(sample.labels["le"]) == bound:
                within = sample.value
    return count, count - within


def test_a_buffered_fire_and_a_fire_due_before_its_schedule_existed_are_not_counted_late(
    settings_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    cli(env, "init")
    cli(env, "apps", "create", APP)
    ports = {name: free_port() for name in (*PIPELINE, "worker")}
    started = [
        Component(name, env | {"SCHEDULER_METRICS_PORT": str(ports[name])}, tmp_path) for name in PIPELINE
    ]
    started.append(
        Component("worker", env | {"SCHEDULER_METRICS_PORT": str(ports["worker"])}, tmp_path, "--app", APP)
    )

    def logs() -> str:
        return "\n".join(f"--- {c.name}\n{c.output()[-2500:]}" for c in started)

    try:
        wait_for_statuses(ports, "/ready", 200, 60, logs)
        # Every second, each run sleeping SLOW_S: the fire after a running one waits for its end.
        buffered = cli_json(
            env, "schedules", "create", "--app", APP, "--cron", "* * * * * *", "--overlap", "buffer_one",
            "--handler", "builtin:sleep", "--payload", f'{{"seconds": {SLOW_S}}}',
        )["id"]  # fmt: skip
        past = (datetime.now(UTC) - timedelta(seconds=PAST_S)).isoformat()
        one_shot = cli_json(
            env, "schedules", "create", "--app", APP, "--at", past, "--handler", "builtin:noop"
        )["id"]

        with psycopg.connect(database_url, autocommit=True) as conn:

            def late_starts() -> list[float]:
                """The starts, over LATE_S after their instant, of the buffered fire and the one-shot:
                both there, by the runs' own history."""
                rows = conn.execute(
                    "select schedule_id, extract(epoch from started_at - scheduled_for)::float from runs"
                    " where schedule_id = any(%s) and started_at > scheduled_for + make_interval(secs => %s)",
                    ([buffered, one_shot], LATE_S),
                ).fetchall()
                late = {str(row[0]): row[1] for row in rows}
                return list(late.values()) if set(late) == {buffered, one_shot} else []

            lags = wait_for(late_starts, 90, "a buffered fire and the one-shot to start late", 0.5)
        cli(env, "schedules", "cancel", buffered)

        count, over = start_lags_over(get(ports["worker"], "/metrics").text, LATE_S)
        assert count >= 3, f"the worker counted {count:g} starts; the runs started {lags} s late"
        assert over == 0, (
            f"{over:g} of the {count:g} starts the worker counted are over {LATE_S:g} s late, and "
            f"the only starts that late (by the runs' history, {sorted(lags)} s) were late by design: "
            "a buffer_one fire waiting for the run before it, a one-shot due before it was created"
        )
    finally:
        codes = {c.name: c.stop() for c in started}
    assert codes == dict.fromkeys((*PIPELINE, "worker"), 0), logs()
