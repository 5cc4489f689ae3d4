"""A schedule command's spec holds the times its kind uses and no other: `run_at` belongs to a
delayed schedule. `scheduler produce` (as the client, and the ingestor after them) took a `run_at`
on an immediate or a cron spec and dropped its meaning: an immediate create with `run_at` three
years ahead ran at once, and a cron schedule was stored with a `run_at` that nothing reads.
`schedules create` refuses `--at` with `--cron`, the API `cron_expression` with `run_at`, and the
wire format says `run_at` is null unless the kind is delayed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scheduler.config import Settings
from scheduler.store import connect
from tests.support import SCHEDULER, read_topic

pytestmark = pytest.mark.integration

RUN_AT = "2030-01-01T00:00:00Z"


@pytest.fixture
def env(settings_env: dict[str, str]) -> dict[str, str]:
    """The commands topic exists (`scheduler init`) and so does the app; no ingestor reads it."""
    for args in (["init"], ["apps", "create", "billing", "--partitions", "1"]):
        done = subprocess.run(
            [SCHEDULER, *args], env=settings_env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
    return settings_env


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "immediate", "run_at": RUN_AT, "handler": "builtin:noop"},
        {"cron": "0 3 * * *", "run_at": RUN_AT, "handler": "builtin:noop"},
        {"kind": "cron", "cron": "0 3 * * *", "run_at": RUN_AT, "handler": "builtin:noop"},
    ],
)
def test_a_run_at_on_a_spec_that_is_not_delayed_is_a_bad_line_not_produced(
    env: dict[str, str], settings: Settings, tmp_path: Path, spec: dict[str, str]
) -> None:
    line = {"schedule_key": "nightly", "app": "billing", "operation": "create", "spec": spec}
    commands = tmp_path / "commands.jsonl"
    commands.write_text(json.dumps(line) + "\n")
    done = subprocess.run(
        [SCHEDULER, "produce", "--file", str(commands), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert json.loads(done.stdout) | {"seconds": 0, "rate": 0} == {
        "produced": 0,
        "failed": 1,
        "seconds": 0,
        "rate": 0,
        "interrupted": False,
    }
    [bad] = [text for text in done.stderr.splitlines() if text.startswith("line 1: ")]
    assert "run_at" in bad, bad
    assert read_topic(settings.kafka_bootstrap, settings.schedules_topic) == []


def test_a_cron_schedule_an_earlier_release_stored_with_a_run_at_still_updates(
    env: dict[str, str], settings: Settings
) -> None:
    """Stored before run_at was refused on it: an update (its name alone) validates the spec as a
    create does, and leaves that run_at behind rather than refuse the schedule for good."""
    created = subprocess.run(
        [SCHEDULER, "schedules", "create", "--app", "billing", "--cron", "0 3 * * *",
         "--handler", "builtin:noop", "--key", "nightly"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    schedule_id = json.loads(created.stdout)["id"]
    with connect(settings.database_url, autocommit=True) as conn:
        conn.execute("update schedules set run_at = %s where id = %s", (RUN_AT, schedule_id))
    updated = subprocess.run(
        [SCHEDULER, "schedules", "update", schedule_id, "--name", "nightly-renamed"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert updated.returncode == 0, updated.stderr
    shown = json.loads(updated.stdout)
    assert (shown["name"], shown["run_at"], shown["cron"]) == ("nightly-renamed", None, "0 3 * * *")
