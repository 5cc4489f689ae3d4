"""A create refused for one of its fields names that field, as the client sent it, in ``details.field``
(a batch's item by its whole path, with ``details.index``), whichever field it is: docs/api.md says
so of every refusal of one field, not only of the limits and the key."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.client import GrpcCaller, HttpCaller, token

pytestmark = pytest.mark.e2e

ROOT = token(subject="root-field-named")
CRON = {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 3 * * *"}

# What each field is refused for: a value the schedule's validation (not the parser) refuses.
REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("cron_expression", {"cron_expression": "61 * * * *"}),
    ("timezone", {"timezone": "Mars/Olympus_Mons"}),
    ("handler", {"handler": "not a handler"}),
    ("name", {"name": "n" * 201}),
    ("description", {"description": "d" * 2001}),
    ("misfire_policy", {"misfire_policy": "never"}),
    ("overlap_policy", {"overlap_policy": "sometimes"}),
    ("end_at", {"start_at": "2031-01-01T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"}),
    ("run_at", {"cron_expression": "", "run_at": "9999-01-01T00:00:00Z"}),
    ("payload", {"handler": "builtin:sleep", "payload": {"seconds": "a while"}}),
]


@pytest.mark.parametrize(("field", "change"), REFUSED, ids=[field for field, _ in REFUSED])
def test_a_create_refused_for_a_field_names_it_in_details(
    caller: HttpCaller | GrpcCaller, field: str, change: dict[str, Any]
) -> None:
    outcome = caller.call("CreateSchedule", CRON | change, ROOT)
    assert outcome.code == "INVALID_SCHEDULE", outcome
    assert outcome.body["details"].get("field") == field, outcome.body


@pytest.mark.parametrize(("field", "change"), REFUSED, ids=[field for field, _ in REFUSED])
def test_a_batch_item_refused_for_a_field_names_it_by_its_whole_path(
    caller: HttpCaller | GrpcCaller, field: str, change: dict[str, Any]
) -> None:
    outcome = caller.call("CreateSchedules", {"schedules": [CRON, CRON | change]}, ROOT)
    assert outcome.code == "INVALID_SCHEDULE", outcome
    details = outcome.body["details"]
    # gRPC carries the details as an ErrorInfo's metadata, whose values are strings.
    assert (details.get("field"), str(details.get("index"))) == (f"schedules[1].{field}", "1"), outcome.body
