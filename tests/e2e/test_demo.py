"""`make run`'s demo: every kind of schedule it creates ends as a user would expect, and it leaves
no process behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.store import connect
from tests.support import SCHEDULER

pytestmark = pytest.mark.e2e


def test_the_demo_runs_every_schedule_kind_and_stops_cleanly(
    settings: Settings, settings_env: dict[str, str]
) -> None:
    done = subprocess.run(
        [SCHEDULER, "demo", "--duration", "22"], env=settings_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with connect(settings.database_url) as conn:
        rows: list[dict[str, Any]] = conn.execute(
            "select s.name, r.state, r.attempt from runs r join schedules s on s.id = r.schedule_id"
        ).fetchall()
    by_name: dict[str, list[tuple[str, int]]] = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append((row["state"], row["attempt"]))
    assert ("succeeded", 3) in by_name["fails-twice"]
    assert by_name["always-fails"] == [("dead", 3)]
    assert by_name["delayed-10s"] == [("succeeded", 1)]
    assert ("succeeded", 1) in by_name["http-local"]
    assert sum(state == "succeeded" for state, _ in by_name["every-5s-tokyo"]) >= 3
    assert processes_with(f"SCHEDULER_TOPIC_PREFIX={settings.topic_prefix}") == []


def processes_with(variable: str) -> list[int]:
    """Pids of live processes whose environment holds ``variable`` (this test's own components)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if variable.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]
