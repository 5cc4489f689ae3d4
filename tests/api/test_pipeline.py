"""What an API user sees end to end: a schedule created and triggered through the API runs through
the whole pipeline (scanner, relay, a worker, the reconciler, as processes), and its history and
runs, read back through the API, show how each attempt went."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.client import USER, GrpcCaller, HttpCaller, token
from tests.api.conftest import ApiStack
from tests.support import SCHEDULER, Component, components, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pipeline(api_stack: ApiStack) -> Iterator[None]:
    subprocess.run([SCHEDULER, "init"], env=api_stack.env, check=True, capture_output=True)
    env = api_stack.env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    with components(env, api_stack.log_dir, "scanner", "relay", "reconciler"):
        worker = Component("worker", env, api_stack.log_dir, "--app", "alpha", "--concurrency", "8")
        try:
            yield
        finally:
            assert worker.stop() == 0, worker.output()[-3000:]


def _history(caller: HttpCaller | GrpcCaller, bearer: str, schedule_id: str) -> list[dict[str, Any]]:
    outcome = caller.call("GetScheduleHistory", {"id": schedule_id}, bearer)
    assert outcome.ok, outcome
    runs: list[dict[str, Any]] = outcome.body["runs"]
    return runs


def test_a_schedule_made_and_triggered_through_the_api_runs_and_its_history_shows_the_attempts(
    pipeline: None, caller: HttpCaller | GrpcCaller
) -> None:
    bearer = token(subject=f"pipeline-{caller.name}", roles=(USER,), apps=["alpha"])
    created = caller.call(
        "CreateSchedule",
        {
            "app": "alpha",
            "name": f"fails-once-{caller.name}",
            "handler": "builtin:fail",
            "payload": {"times": 1},
            "retry_config": {"max_attempts": 3, "backoff_seconds": 0.1, "max_backoff_seconds": 0.2},
        },
        bearer,
    )
    assert created.ok, created
    schedule_id = created.body["id"]
    runs = wait_for(
        lambda: [r for r in _history(caller, bearer, schedule_id) if r["state"] == "succeeded"] or None,
        90,
        "the immediate schedule's run to succeed on its second attempt",
    )
    assert runs[0]["attempt"] == 2
    kinds = [(a["attempt"], a["kind"]) for a in runs[0]["attempts"]]
    assert (1, "retry") in kinds and (2, "succeeded") in kinds

    # A one-shot is completed once it fired; a paused cron schedule can be fired by hand.
    paused = caller.call(
        "CreateSchedule",
        {"app": "alpha", "cron_expression": "0 0 1 1 *", "handler": "builtin:noop", "enabled": False},
        bearer,
    )
    assert paused.ok and paused.body["state"] == "paused", paused
    schedule_id = paused.body["id"]
    triggered = caller.call("TriggerSchedule", {"id": schedule_id}, bearer)
    assert triggered.ok, triggered
    run = wait_for(
        lambda: (
            (got := caller.call("GetRun", {"id": triggered.body["run_id"]}, bearer)).ok
            and got.body["state"] in ("succeeded", "dead")
            and got.body
        ),
        90,
        "the triggered run to finish",
    )
    assert run["schedule_id"] == schedule_id and run["state"] == "succeeded"
