"""A run's attempt history now travels in every later job message of the run, a replay's included
(bebb5b4): a run replayed again and again carries more of it each time, with no bound. The topics
and producers are sized for the largest message the scheduler writes (docs: "a dead letter of a
1 MiB payload after 100 attempts is about 1.3 MiB", under the producers' 4 MiB), which a run within
one budget of 100 attempts stays under; a run replayed tens of times does not."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.domain.run_state import RunState
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, scan
from scheduler.store.scan import NewRun
from tests.integration.test_schedules_cli import Cli
from tests.support import SCHEDULER, Component, components, stop_all, wait_for

pytestmark = pytest.mark.e2e

APP = "payments"
BUDGET = 100  # the largest max_attempts a schedule takes
REPLAYS = 40
# What a failing handler's error typically is: a line and a stack's worth of text. Each attempt
# keeps it, and a job message carries the first 1,024 characters of each (MAX_HISTORY_ERROR_CHARS).
ERROR = "ConnectionError: upstream refused the connection; " + "x" * 1100


@pytest.fixture
def cli(settings: Settings, settings_env: dict[str, str], tmp_path: Path) -> Iterator[Cli]:
    subprocess.run([SCHEDULER, "init"], env=settings_env, check=True, capture_output=True)
    cli = Cli(settings_env)
    assert cli("apps", "create", APP, "--partitions", "1").returncode == 0
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        worker = Component("worker", env, tmp_path, "--app", APP)
        try:
            yield cli
        finally:
            stop_all([worker])


def run_row(settings: Settings, run_id: uuid.UUID) -> dict[str, Any]:
    with connect(settings.database_url) as conn:
        row = conn.execute("select state, attempt, error from runs where id = %s", (run_id,)).fetchone()
    assert row is not None
    return dict(row)


def test_a_run_replayed_many_times_is_still_delivered(cli: Cli, settings: Settings) -> None:
    """A job that failed its 100 attempts, was replayed, and failed again, 40 times over (an
    operator replaying a flaky upstream's dead letters each day for a month and more): PostgreSQL
    holds its 4,000 failed attempts as the reconciler left them, each with its error. The upstream
    is fixed, the operator replays it once more (the handler now succeeds): the run must run and
    succeed. Its replayed job message carries all 4,000 attempts' errors (about 4.4 MB), over
    what the producer sends (4 MiB): the relay quarantines it and the run dies again, RelayRefused,
    as it will at every replay from now on."""
    with connect(settings.database_url) as conn:
        spec = ScheduleSpec(app=APP, handler="builtin:noop", kind="immediate", max_attempts=BUDGET)
        schedule = service.create_schedule(conn, spec, "test")
        run_id = uuid.uuid4()
        scan.create_runs(
            conn, [NewRun(run_id, schedule["id"], APP, schedule["next_fire_at"], RunState.PENDING, BUDGET)]
        )
        conn.execute("delete from outbox")
        attempts = BUDGET * REPLAYS
        conn.execute(
            "insert into attempts (run_id, attempt, kind, outcome, worker, started_at, finished_at, error,"
            " error_class)"
            " select %(run)s, n, case when n %% %(budget)s = 0 then 'dead' else 'retry' end, 'applied',"
            "        'payments-worker-7f9c', now() - interval '1 day', now() - interval '1 day', %(error)s,"
            "        'ConnectionError'"
            "   from generate_series(1, %(attempts)s) n",
            {"run": run_id, "budget": BUDGET, "error": ERROR, "attempts": attempts},
        )
        conn.execute(
            "update runs set state = 'dead', attempt = %s, max_attempts = %s, finished_at = now(),"
            " error = %s where id = %s",
            (attempts, attempts, ERROR, run_id),
        )
        conn.commit()

    replay = cli("dlq", "replay", "--run", str(run_id), "--force")
    assert replay.returncode == 0, replay
    ended = wait_for(
        lambda: (r := run_row(settings, run_id))["state"] in ("succeeded", "dead") and r,
        120,
        "the replayed run to end",
    )
    assert ended["state"] == "succeeded", ended
