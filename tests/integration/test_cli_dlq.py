"""`scheduler dlq replay` as a user runs it: with --json, JSON only on stdout, dry run or not."""

from __future__ import annotations

import json
import uuid

import pytest

from scheduler.config import Settings
from scheduler.domain.run_state import RunState
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, scan
from scheduler.store.scan import NewRun
from tests.integration.test_schedules_cli import Cli

pytestmark = pytest.mark.integration

APP = "billing"


@pytest.fixture
def cli(settings: Settings, settings_env: dict[str, str]) -> Cli:
    """The app, with three dead runs (error class PlannedFailure)."""
    cli = Cli(settings_env)
    assert cli("apps", "create", APP, "--partitions", "1").returncode == 0
    with connect(settings.database_url) as conn:
        for _ in range(3):
            spec = ScheduleSpec(app=APP, handler="builtin:fail", kind="immediate", max_attempts=1)
            schedule = service.create_schedule(conn, spec, "test")
            scan.create_runs(
                conn,
                [NewRun(uuid.uuid4(), schedule["id"], APP, schedule["next_fire_at"], RunState.PENDING, 1)],
            )
        conn.execute("delete from outbox")
        conn.execute("update runs set state = 'dead', finished_at = now(), error = 'PlannedFailure: no'")
        conn.commit()
    return cli


def test_a_replay_with_json_prints_its_summary_as_json_only(cli: Cli) -> None:
    nothing = cli("dlq", "replay", "--app", APP, "--error-class", "Nope", "--json")
    assert nothing.returncode == 0, nothing.stderr
    assert json.loads(nothing.stdout) | {"seconds": 0} == {"replayed": 0, "seconds": 0, "per_second": 0}

    done = cli("dlq", "replay", "--app", APP, "--error-class", "PlannedFailure", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["replayed"] == 3 and summary["seconds"] >= 0 and summary["per_second"] >= 0, summary
    assert [r["state"] for r in cli.json("runs", "list", "--app", APP, "--json")] == ["pending"] * 3

    text = cli("dlq", "replay", "--app", APP, "--force")
    assert text.returncode == 0 and text.stdout.startswith("replayed 0 runs in "), text
