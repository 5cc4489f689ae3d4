"""An audit entry about a schedule speaks of it as GetSchedule does: the same fields, units and
time format, on both transports, whichever way the change came in and whichever release recorded
it; entries about apps, runs and a trigger's run keep what was recorded."""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.api.client import GrpcCaller, HttpCaller, token
from tests.api.conftest import ApiStack

pytestmark = pytest.mark.e2e

Caller = HttpCaller | GrpcCaller
ROOT = token(subject="root-audit-values")
SCHEDULER = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "scheduler")


def ok(caller: Caller, method: str, request: dict[str, Any]) -> dict[str, Any]:
    outcome = caller.call(method, request, ROOT)
    assert outcome.ok, (method, outcome)
    return outcome.body


def entries(caller: Caller, entity_id: str) -> list[dict[str, Any]]:
    """The entity's audit entries, oldest first."""
    return list(reversed(ok(caller, "ListAuditEntries", {"entity_id": entity_id, "limit": 500})["entries"]))


def in_a_week() -> str:
    return (datetime.now(UTC) + timedelta(days=7)).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def test_a_schedules_changes_are_audited_in_the_fields_get_schedule_answers(caller: Caller) -> None:
    create = {
        "app": "alpha",
        "schedule_key": f"audited-{uuid.uuid4().hex[:8]}",
        "name": "audited",
        "handler": "builtin:noop",
        "run_at": in_a_week(),
        "payload": {"to": "someone", "n": 1},
        "retry_config": {"max_attempts": 4, "backoff_seconds": 2.5},
        "timeout_seconds": 90,
    }
    created = ok(caller, "CreateSchedule", create)
    updated = ok(
        caller,
        "UpdateSchedule",
        {"id": created["id"], "timeout_seconds": 30.5, "retry_config": {"backoff_seconds": 4}, "payload": {}},
    )
    paused = ok(caller, "PauseSchedule", {"id": created["id"]})
    resumed = ok(caller, "ResumeSchedule", {"id": created["id"]})
    trigger = ok(caller, "TriggerSchedule", {"id": created["id"]})
    cancelled = ok(caller, "DeleteSchedule", {"id": created["id"]})
    got = ok(caller, "GetSchedule", {"id": created["id"]})

    audited = entries(caller, created["id"])
    assert [e["action"] for e in audited] == ["create", "update", "pause", "resume", "trigger", "cancel"]
    create_entry, *changes, trigger_entry, cancel_entry = audited
    # Every entry names the schedule's key, though only a single create's row recorded it.
    assert "old_value" not in create_entry and create_entry["new_value"] == created
    before = created
    for entry, after in zip([*changes, cancel_entry], [updated, paused, resumed, cancelled], strict=True):
        assert entry["old_value"] == before, entry["action"]
        assert entry["new_value"] == after, entry["action"]
        before = after
    assert cancel_entry["new_value"] == got
    assert cancel_entry["new_value"]["retry_config"] == {
        "max_attempts": 4,
        "backoff_seconds": 4,
        "max_backoff_seconds": 300,
    }
    assert (cancel_entry["new_value"]["timeout_seconds"], cancel_entry["new_value"]["payload"]) == (30.5, {})
    assert changes[0]["old_value"]["payload"] == {"to": "someone", "n": 1}
    # A trigger's value names the run it made, as recorded.
    assert "old_value" not in trigger_entry and trigger_entry["new_value"] == {"run_id": trigger["run_id"]}


def test_a_batch_create_is_audited_as_the_schedules_it_answered(caller: Caller) -> None:
    """A batch's audit rows are PostgreSQL's own JSON of the rows (``to_jsonb``, as for a Kafka
    create), with its time format: the entries answer them in the API's."""
    request = {"app": "alpha", "handler": "builtin:noop", "enabled": False}
    schedules = [request | {"cron_expression": "0 4 * * *"}, request | {"run_at": in_a_week()}]
    batch = ok(caller, "CreateSchedules", {"schedules": schedules})
    for schedule in batch["schedules"]:
        (entry,) = entries(caller, schedule["id"])
        assert entry["new_value"] == schedule
        assert entry["new_value"]["next_run_time"].endswith("Z")


def stored_entry(api_stack: ApiStack, entity: str, entity_id: str, action: str, old: Any, new: Any) -> None:
    with api_stack.connect() as conn:
        conn.execute(
            "insert into audit_log (actor, action, entity, entity_id, old_value, new_value) "
            "values ('tests:old-release', %s, %s, %s, %s::jsonb, %s::jsonb)",
            (action, entity, entity_id, json.dumps(old), json.dumps(new)),
        )


def test_an_entry_whose_id_is_no_uuid_is_answered_not_an_error(caller: Caller, api_stack: ApiStack) -> None:
    """A row written by hand naming a schedule or run by something else: the page answers it as
    recorded (with no app to scope it by: ROOT sees it) rather than fail for every caller."""
    for entity in ("schedule", "run"):
        junk = f"not-a-uuid-{uuid.uuid4().hex[:8]}"
        stored_entry(api_stack, entity, junk, "trigger", None, {"run_id": junk})
        (entry,) = entries(caller, junk)
        assert (entry["entity"], entry["entity_id"], entry["new_value"]) == (entity, junk, {"run_id": junk})


def test_entries_of_earlier_releases_answer_the_fields_they_hold_never_an_error(
    caller: Caller, api_stack: ApiStack
) -> None:
    created = ok(caller, "CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "run_at": in_a_week()})
    # A row of a release before descriptions, errors and jitter, with a column since dropped, its
    # times in Python's text of a datetime; and one whose version and update time do not read.
    old_release = {
        "id": created["id"], "app": "alpha", "name": "nightly", "kind": "cron", "cron": "0 2 * * *",
        "tz": "Europe/Berlin", "run_at": None, "start_at": "2026-03-01 09:00:00.250000+01:00",
        "end_at": None, "handler": "builtin:noop", "payload": {"n": 1}, "max_attempts": 3,
        "backoff_base_ms": 1000, "backoff_max_ms": 300000, "timeout_ms": 300000,
        "misfire_policy": "fire_once", "overlap_policy": "allow", "state": "active",
        "next_fire_at": "2026-03-02T01:00:00+00:00", "version": 2, "created_at": "2026-02-01T08:00:00+00:00",
        "updated_at": "2026-02-01T08:00:00+00:00", "priority": 5,
    }  # fmt: skip
    unreadable = old_release | {"version": "two", "updated_at": "infinity", "name": 7}
    stored_entry(api_stack, "schedule", created["id"], "update", old_release, unreadable)
    # The scanner's error: the state and its reason.
    reason = "ZoneInfoNotFoundError: Mars/Olympus"
    errored = {"state": "error", "error": reason, "errored_at": "2026-03-01T00:00:00+00:00"}
    stored_entry(api_stack, "schedule", created["id"], "error", {"state": "active"}, errored)

    update, error = entries(caller, created["id"])[1:]
    old = update["old_value"]
    assert old == {
        "id": created["id"], "schedule_key": created["schedule_key"], "app": "alpha", "name": "nightly",
        "kind": "cron", "cron_expression": "0 2 * * *", "timezone": "Europe/Berlin",
        "start_at": "2026-03-01T08:00:00.250Z",
        "handler": "builtin:noop", "payload": {"n": 1}, "enabled": True,
        "retry_config": {"max_attempts": 3, "backoff_seconds": 1, "max_backoff_seconds": 300},
        "timeout_seconds": 300, "misfire_policy": "fire_once", "overlap_policy": "allow", "state": "active",
        "next_run_time": "2026-03-02T01:00:00Z", "version": 2, "created_at": "2026-02-01T08:00:00Z",
        "updated_at": "2026-02-01T08:00:00Z",
    }  # fmt: skip
    assert update["new_value"] == {
        name: value for name, value in old.items() if name not in ("version", "updated_at", "name")
    }
    assert error["old_value"] == {"state": "active", "enabled": True}
    assert error["new_value"] == {"state": "error", "enabled": False, "error": reason}


def test_entries_about_apps_and_runs_keep_what_was_recorded(caller: Caller, api_stack: ApiStack) -> None:
    run_id = str(uuid.uuid4())
    dead, pending = {"state": "dead", "attempt": 3}, {"state": "pending", "attempt": 4}
    stored_entry(api_stack, "run", run_id, "replay", dead, pending)
    with api_stack.connect() as conn:
        app_row = conn.execute(
            "select new_value from audit_log "
            "where entity = 'app' and entity_id = 'alpha' and action = 'create'"
        ).fetchone()
    assert app_row is not None
    (app_entry,) = [e for e in entries(caller, "alpha") if e["action"] == "create"]
    assert app_entry["new_value"] == app_row["new_value"]
    (run_entry,) = entries(caller, run_id)
    assert (run_entry["old_value"], run_entry["new_value"]) == (dead, pending)


def test_a_payload_number_past_a_double_is_shown_as_get_schedule_shows_it_never_an_error(
    caller: Caller, api_stack: ApiStack
) -> None:
    """The CLI stores a payload's integer of any size (jsonb keeps it exact); the API carries
    numbers as doubles, so GetSchedule and the schedule's audit entries say so in the payload's
    place, and a run's audit value holding one says it too, where each answered INTERNAL."""
    huge = "1" + "0" * 400
    created = subprocess.run(
        [SCHEDULER, "schedules", "create", "--app", "alpha", "--handler", "builtin:noop",
         "--at", in_a_week(), "--payload", f'{{"n": {huge}}}'],
        env=api_stack.env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    schedule_id = json.loads(created.stdout)["id"]
    got = ok(caller, "GetSchedule", {"id": schedule_id})
    assert "too large" in got["payload"], got
    (create_entry,) = entries(caller, schedule_id)
    assert create_entry["new_value"] == got
    run_id = str(uuid.uuid4())
    stored_entry(api_stack, "run", run_id, "replay", {"state": "dead", "n": int(huge)}, {"state": "pending"})
    (run_entry,) = entries(caller, run_id)
    assert "too large" in run_entry["old_value"], run_entry


def test_a_fraction_past_a_double_written_by_hand_answers_as_too_large_never_an_error(
    caller: Caller, api_stack: ApiStack
) -> None:
    """jsonb keeps a number with a fraction past a double's range as written in SQL; read, it is
    infinity, which no JSON carries: the schedule's payload and an audit value holding one say so
    where each answered INTERNAL."""
    huge = "1" + "0" * 400 + ".5"
    created = ok(caller, "CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "run_at": in_a_week()})
    run_id = str(uuid.uuid4())
    with api_stack.connect() as conn:
        payload = f'{{"n": {huge}}}'
        conn.execute("update schedules set payload = %s::jsonb where id = %s", (payload, created["id"]))
        conn.execute(
            "insert into audit_log (actor, action, entity, entity_id, old_value, new_value) "
            "values ('tests:by-hand', 'replay', 'run', %s, %s::jsonb, '{\"state\": \"pending\"}'::jsonb)",
            (run_id, f'{{"state": "dead", "n": [-{huge}]}}'),
        )
    got = ok(caller, "GetSchedule", {"id": created["id"]})
    assert "too large" in got["payload"], got
    (run_entry,) = entries(caller, run_id)
    assert "too large" in run_entry["old_value"] and run_entry["new_value"] == {"state": "pending"}, run_entry
