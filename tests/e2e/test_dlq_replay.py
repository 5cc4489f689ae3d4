"""Operators replay the dead-letter queue: dry run, limits, at most once, through the pipeline."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.store import connect
from tests.e2e.test_execution import APP, pipeline, runs
from tests.support import SCHEDULER, attempts_history, wait_for

pytestmark = pytest.mark.e2e
__all__ = ["pipeline"]

DEAD = 500


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([SCHEDULER, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def snapshot(settings: Settings) -> list[dict[str, Any]]:
    with connect(settings.database_url) as conn:
        return conn.execute("select id, state, attempt, version from runs order by id").fetchall()


def test_replaying_dead_runs(pipeline: Settings, settings_env: dict[str, str]) -> None:
    # Jobs that fail on their first attempt and have no retries: 500 dead runs, the real way.
    with connect(pipeline.database_url) as conn:
        conn.execute(
            "insert into schedules (id, app, name, kind, handler, payload, max_attempts, next_fire_at) "
            "select gen_random_uuid(), %s, 'dies-' || g, 'immediate', 'builtin:fail', "
            "'{\"times\": 1}', 1, now() from generate_series(1, %s) g",
            (APP, DEAD),
        )
        conn.execute("select pg_notify('scheduler_due', '')")
        conn.commit()
    wait_for(lambda: len(runs(pipeline, "state = 'dead'")) == DEAD, 120, "500 dead runs")

    before = snapshot(pipeline)
    dry = json.loads(cli(settings_env, "dlq", "replay", "--dry-run", "--limit", "1000", "--json").stdout)
    assert len(dry) == DEAD
    assert snapshot(pipeline) == before, "a dry run changes nothing"

    first = cli(settings_env, "dlq", "replay", "--limit", "100")
    assert first.stdout.startswith("replayed 100 runs in "), first.stdout  # stdout: the result line only
    wait_for(lambda: len(runs(pipeline, "state = 'succeeded'")) == 100, 60, "the 100 replays to run")
    replayed = {r["id"] for r in runs(pipeline, "state = 'succeeded'")}
    assert {r["attempt"] for r in runs(pipeline, "state = 'succeeded'")} == {2}
    executions = Counter(
        a["run_id"]
        for a in attempts_history(pipeline.database_url)
        if a["kind"] == "succeeded" and a["outcome"] == "applied"
    )
    with connect(pipeline.database_url) as conn:
        audit: list[dict[str, Any]] = conn.execute(
            "select actor, entity_id from audit_log where action = 'replay'"
        ).fetchall()
    assert set(executions) == replayed and set(executions.values()) == {1}
    assert {a["entity_id"] for a in audit} == {str(r) for r in replayed}
    assert all(a["actor"].startswith("cli:") for a in audit)

    # The same replay again: none of those 100 again (100 others, never replayed, are taken instead).
    cli(settings_env, "dlq", "replay", "--limit", "100")
    wait_for(lambda: len(runs(pipeline, "state = 'succeeded'")) == 200, 60, "the next 100 replays to run")
    with connect(pipeline.database_url) as conn:
        twice = conn.execute(
            "select entity_id from audit_log where action = 'replay' group by entity_id having count(*) > 1"
        ).fetchall()
    assert twice == []
