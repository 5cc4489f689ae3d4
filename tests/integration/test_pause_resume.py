"""A paused cron schedule fires nothing, and on resume its misfire policy judges the fires it
missed, even when the pause was shorter than the catch-up window."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta
from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.store import connect
from scheduler.wiring import Wiring
from tests.support import SCHEDULER, wait_for

pytestmark = pytest.mark.integration


def cli(env: dict[str, str], *args: str) -> Any:
    done = subprocess.run(
        [SCHEDULER, *args], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def db_now(settings: Settings) -> datetime:
    with connect(settings.database_url) as conn:
        row = conn.execute("select now() as now").fetchone()
    assert row is not None
    now = row["now"]
    assert isinstance(now, datetime)
    return now


@pytest.mark.parametrize("policy", ["skip", "fire_once", "fire_all"])
def test_fires_missed_in_a_short_pause_follow_the_misfire_policy(
    settings_env: dict[str, str], settings: Settings, policy: str
) -> None:
    assert (
        subprocess.run([SCHEDULER, "apps", "create", "billing"], env=settings_env, check=False).returncode
        == 0
    )
    created = cli(
        settings_env, "schedules", "create", "--app", "billing", "--cron", "*/2 * * * * *",
        "--misfire", policy, "--handler", "builtin:noop",
    )  # fmt: skip
    sid = created["id"]
    paused = cli(settings_env, "schedules", "pause", sid)
    first_missed = datetime.fromisoformat(paused["next_fire_at"])
    # Three fires of the two-second schedule go by while it is paused (far within the 60 s window).
    wait_for(lambda: db_now(settings) > first_missed + timedelta(seconds=4.5), 30, "three missed fires")
    resumed = cli(settings_env, "schedules", "resume", sid)
    now = db_now(settings)
    assert resumed["state"] == "active"
    next_fire = datetime.fromisoformat(resumed["next_fire_at"])
    if policy == "skip":
        assert next_fire > now - timedelta(seconds=1), "none of the missed fires is left to run"
        assert next_fire.second % 2 == 0
    elif policy == "fire_once":
        assert first_missed + timedelta(seconds=4) <= next_fire <= now, "only the latest missed fire is left"
    else:
        assert next_fire == first_missed, "every missed fire is left for the scanner to run"


def test_a_one_shot_leased_ahead_is_refused_with_where_its_run_is(
    settings_env: dict[str, str], settings: Settings
) -> None:
    """Within the look-ahead before its instant a one-shot's fire is a run already, and the
    schedule completed: cancelling it is refused, saying that the run is pending, not that it ran."""
    assert (
        subprocess.run([SCHEDULER, "apps", "create", "mail"], env=settings_env, check=False).returncode == 0
    )
    at = db_now(settings) + timedelta(seconds=30)
    created = cli(
        settings_env,
        "schedules",
        "create",
        "--app",
        "mail",
        "--at",
        at.isoformat(),
        "--handler",
        "builtin:noop",
    )
    with connect(settings.database_url) as conn:
        Wiring(settings).scanner().scan_once(conn, now=at - timedelta(milliseconds=500))  # 1 s look-ahead
        run = conn.execute("select id, state from runs where schedule_id = %s", (created["id"],)).fetchone()
    assert run is not None and run["state"] == "pending", "leased ahead of its instant"
    for action in ("cancel", "pause"):
        refused = subprocess.run(
            [SCHEDULER, "schedules", action, created["id"]],
            env=settings_env, capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert refused.returncode != 0
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert f"cannot {action} schedule {created['id']}: it is completed" in lines[0]
        assert f"run {run['id']}, pending" in lines[0]


def test_the_refusal_names_the_one_shots_fire_not_a_run_a_trigger_made(
    settings_env: dict[str, str], settings: Settings
) -> None:
    created_app = subprocess.run([SCHEDULER, "apps", "create", "mail"], env=settings_env, check=False)
    assert created_app.returncode == 0
    at = db_now(settings) + timedelta(seconds=1)
    created = cli(
        settings_env, "schedules", "create", "--app", "mail", "--at", at.isoformat(),
        "--handler", "builtin:noop",
    )  # fmt: skip
    cli(settings_env, "schedules", "pause", created["id"])
    wait_for(lambda: db_now(settings) > at, 10, "the one-shot's instant to pass while it is paused")
    triggered = cli(settings_env, "schedules", "trigger", created["id"])  # a run later than the fire
    cli(settings_env, "schedules", "resume", created["id"])  # fire_once: the missed fire runs
    with connect(settings.database_url) as conn:
        Wiring(settings).scanner().scan_once(conn)
        fire = conn.execute(
            "select id from runs where schedule_id = %s and id <> %s", (created["id"], triggered["run_id"])
        ).fetchone()
    assert fire is not None
    refused = subprocess.run(
        [SCHEDULER, "schedules", "cancel", created["id"]],
        env=settings_env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0
    assert f"its fire is run {fire['id']}" in refused.stderr, refused.stderr
