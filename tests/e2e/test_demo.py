"""`make run`'s demo: every kind of schedule it creates ends as a user would expect, and it leaves
no process behind."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.config import Settings
from scheduler.store import connect
from tests.support import SCHEDULER, wait_for

pytestmark = pytest.mark.e2e


def test_the_demo_runs_every_schedule_kind_and_stops_cleanly(
    settings: Settings, settings_env: dict[str, str]
) -> None:
    demo = subprocess.Popen(
        [SCHEDULER, "demo", "--duration", "22"],
        env=settings_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert demo.stdout is not None
    printed = [demo.stdout.readline() for _ in range(3)]
    url = re.search(r"API: (http://\S+) ", printed[1])
    token = re.search(r"token for app demo \(1 h\): (\S+)", printed[2])
    assert url and token, printed
    # What the demo prints is enough to use its API.
    listed = wait_for(
        lambda: _get(f"{url.group(1)}/v1/schedules?app=demo", token.group(1)), 60, "the demo's API to answer"
    )
    assert {s["name"] for s in listed["schedules"]} >= {"every-5s-tokyo", "delayed-10s", "http-local"}
    # A schedule the user made in the demo's app is theirs: the demo's stop leaves it as it is.
    mine = httpx.post(
        f"{url.group(1)}/v1/schedules",
        json={"app": "demo", "name": "mine", "cron_expression": "0 3 * * *", "handler": "builtin:noop"},
        headers={"Authorization": f"Bearer {token.group(1)}"},
        timeout=10,
        trust_env=False,
    )
    assert mine.status_code == 200, mine.text
    stdout, stderr = demo.communicate(timeout=120)
    assert demo.returncode == 0, stderr[-3000:]
    # Its own crons do not go on firing under a later `scheduler run all` (whose HTTP jobs would be
    # refused: the endpoint and the allow-list were the demo's).
    assert "its 2 active schedules cancelled" in stdout, stdout[-2000:]
    with connect(settings.database_url) as conn:
        states = {r["name"]: r["state"] for r in conn.execute("select name, state from schedules")}
    assert states["every-5s-tokyo"] == states["http-local"] == "cancelled"
    assert states["mine"] == "active"
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


def _get(url: str, token: str) -> dict[str, Any] | None:
    try:
        answer = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5, trust_env=False)
    except httpx.HTTPError:
        return None
    if answer.status_code != 200:
        return None
    body: dict[str, Any] = answer.json()
    return body


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
