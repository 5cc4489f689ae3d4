"""What a client that sends back what it read, or writes nulls for fields it leaves out, sees: a
`null` payload is one left out, an update that changes nothing is no new version, and a replay by
a token of every app names its app. On both transports."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.api.client import GrpcCaller, HttpCaller, token

pytestmark = pytest.mark.e2e

Caller = HttpCaller | GrpcCaller
ROOT = token(subject="root-unchanged")


def created(caller: Caller, **fields: Any) -> dict[str, Any]:
    request = {
        "app": "alpha",
        "name": f"unchanged-{uuid.uuid4().hex[:8]}",
        "handler": "builtin:noop",
        "cron_expression": "0 3 * * *",
        "timezone": "Europe/Berlin",
    }
    outcome = caller.call("CreateSchedule", request | fields, ROOT)
    assert outcome.ok, outcome
    return outcome.body


def updated(caller: Caller, schedule: dict[str, Any], **fields: Any) -> dict[str, Any]:
    outcome = caller.call("UpdateSchedule", {"id": schedule["id"]} | fields, ROOT)
    assert outcome.ok, outcome
    return outcome.body


def audited_updates(caller: Caller, schedule: dict[str, Any]) -> int:
    outcome = caller.call("ListAuditEntries", {"entity_id": schedule["id"], "limit": 500}, ROOT)
    assert outcome.ok, outcome
    return sum(1 for entry in outcome.body.get("entries", []) if entry["action"] == "update")


def test_a_null_payload_is_one_left_out(caller: Caller) -> None:
    schedule = created(caller, payload=None)
    assert schedule["payload"] == {}, "created without a payload"
    changed = updated(caller, schedule, payload={"to": "someone"})
    assert changed["version"] == schedule["version"] + 1
    kept = updated(caller, changed, payload=None, version=changed["version"])
    assert (kept["payload"], kept["version"]) == ({"to": "someone"}, changed["version"])
    assert caller.call("GetSchedule", {"id": schedule["id"]}, ROOT).body["payload"] == {"to": "someone"}


def test_an_update_to_what_is_stored_is_no_new_version_and_no_audit_entry(caller: Caller) -> None:
    schedule = created(caller, payload={"n": 1, "tags": ["a", "b"]}, description="nightly")
    before = audited_updates(caller, schedule)
    same = {
        key: schedule[key]
        for key in ("name", "description", "cron_expression", "timezone", "handler", "payload")
    } | {"retry_config": schedule["retry_config"], "misfire_policy": schedule["misfire_policy"]}
    again = updated(caller, schedule, version=schedule["version"], **same)
    assert again["version"] == schedule["version"]
    assert again["next_run_time"] == schedule["next_run_time"]
    assert audited_updates(caller, schedule) == before
    # A value of another JSON type is a change, though Python's equality would take 1 for true.
    typed = updated(caller, schedule, payload={"n": True, "tags": ["a", "b"]})
    assert (typed["payload"], typed["version"]) == ({"n": True, "tags": ["a", "b"]}, schedule["version"] + 1)
    assert audited_updates(caller, schedule) == before + 1


def test_a_payload_sent_back_as_read_is_no_change_though_its_numbers_were_written_out(
    caller: Caller,
) -> None:
    """A whole number past a double's exact integers travels as a double (1e16) and is stored and
    read back in full: sent back as read, it is the same payload."""
    schedule = created(caller, payload={"id": 1e16, "tiny": 0.1})
    read = caller.call("GetSchedule", {"id": schedule["id"]}, ROOT).body
    again = updated(caller, schedule, payload=read["payload"], version=read["version"])
    assert again["version"] == schedule["version"]


def test_a_replay_by_a_token_of_every_app_must_name_its_app(caller: Caller) -> None:
    for bearer in (token(subject="root-unchanged", apps=["*"]), ROOT):
        unnamed = caller.call("ReplayDeadLetters", {"dry_run": True}, bearer)
        assert unnamed.code == "INVALID_ARGUMENT", unnamed
        assert "name the app" in unnamed.body["message"]
        named = caller.call("ReplayDeadLetters", {"app": "alpha", "dry_run": True}, bearer)
        assert named.ok, named
