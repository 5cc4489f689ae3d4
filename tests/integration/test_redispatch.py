"""`scheduler runs redispatch`: after Kafka's topics are lost, the runs whose job messages went with
them (dispatched before the loss, never started, nothing left in the outbox) are sent again with a
new attempt number, and nothing else is touched."""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from scheduler.config import Settings
from scheduler.kafka.messages import ATTEMPT_HEADER, RUN_ID_HEADER
from scheduler.kafka.topics import ensure_sized_topics
from scheduler.store import connect
from scheduler.wiring import Wiring
from tests.support import read_records

pytestmark = pytest.mark.integration

APP = "lost"
SCHEDULER = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "scheduler")


def redispatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, "runs", "redispatch", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_only_runs_lost_with_the_topics_are_sent_again(
    settings: Settings, settings_env: dict[str, str]
) -> None:
    schedule_id = uuid.uuid4()
    runs = {name: uuid.uuid4() for name in ("lost", "queued", "recent", "running")}
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1)", (APP,))
        conn.execute(
            "insert into schedules (id, app, name, kind, handler) "
            "values (%s, %s, 'l', 'immediate', 'builtin:noop')",
            (schedule_id, APP),
        )
        for i, (name, run_id) in enumerate(runs.items()):
            conn.execute(
                "insert into runs (id, schedule_id, app, scheduled_for, state, attempt, max_attempts, "
                "dispatched_at, started_at) values (%s, %s, %s, now() - make_interval(secs => %s), %s, 1, 3, "
                "now() - make_interval(mins => %s), %s)",
                (
                    run_id, schedule_id, APP, i, "running" if name == "running" else "dispatched",
                    1 if name == "recent" else 60, None,
                ),
            )  # fmt: skip
        # Its message is still to be published: the relay will send it, nothing is lost.
        conn.execute(
            "insert into outbox (topic, key, value, run_id, attempt) values (%s, 'k', 'v', %s, 1)",
            (settings.jobs_topic(APP), runs["queued"]),
        )
        conn.commit()
    cutoff = "2000-01-01T00:00:00Z"
    assert json.loads(redispatch(settings_env, "--dispatched-before", cutoff, "--json").stdout) == {
        "redispatched": 0
    }

    cutoff = (datetime.now(UTC) - timedelta(minutes=30)).isoformat()
    dry = redispatch(settings_env, "--dispatched-before", cutoff, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert [row["id"] for row in json.loads(dry.stdout)] == [str(runs["lost"])]

    done = redispatch(settings_env, "--dispatched-before", cutoff, "--app", APP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "redispatched 1 runs"
    with connect(settings.database_url) as conn:
        state = {
            r["id"]: r for r in conn.execute("select id, state, attempt, max_attempts from runs").fetchall()
        }
        audit = conn.execute("select action, entity_id, old_value, new_value from audit_log").fetchall()
    assert (state[runs["lost"]]["state"], state[runs["lost"]]["attempt"]) == ("pending", 2)
    # The lost attempt never ran: the run keeps the attempts it had left.
    assert state[runs["lost"]]["max_attempts"] == 4
    for name in ("queued", "recent"):
        assert (state[runs[name]]["state"], state[runs[name]]["attempt"]) == ("dispatched", 1)
    assert state[runs["running"]]["state"] == "running"
    assert [(a["action"], a["entity_id"]) for a in audit] == [("redispatch", str(runs["lost"]))]
    assert audit[0]["old_value"] == {"state": "dispatched", "attempt": 1}

    # A second call finds nothing more: the run is pending with its message in the outbox.
    again = redispatch(settings_env, "--dispatched-before", cutoff)
    assert again.stdout.strip() == "redispatched 0 runs"

    # The relay publishes the new attempt to the (rebuilt) job topic.
    wiring = Wiring(settings)
    ensure_sized_topics(wiring.admin, [settings.jobs_topic(APP)], 1)
    relay = wiring.relay()
    try:
        relay.relay_once()
    finally:
        relay.close()
    published = [
        headers
        for _, _, _, headers in read_records(settings.kafka_bootstrap, settings.jobs_topic(APP))
        if headers.get(RUN_ID_HEADER) == str(runs["lost"]).encode()
    ]
    assert [h[ATTEMPT_HEADER] for h in published] == [b"2"]


def test_a_bad_cut_off_is_one_line_and_changes_nothing(settings_env: dict[str, str]) -> None:
    done = redispatch(settings_env, "--dispatched-before", "yesterday")
    assert done.returncode == 2
    assert "--dispatched-before" in done.stderr and "ISO 8601" in done.stderr
    assert "Traceback" not in done.stderr
    # A cut-off after now would take the runs it just sent again, once the relay stamps them.
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    ahead = redispatch(settings_env, "--dispatched-before", future)
    assert ahead.returncode == 2
    assert ahead.stderr.startswith("error: --dispatched-before") and "in the future" in ahead.stderr
    assert len(ahead.stderr.strip().splitlines()) == 1
