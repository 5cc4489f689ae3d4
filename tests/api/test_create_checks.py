"""What a create is refused for before anything is stored, the same for every caller."""

from __future__ import annotations

import pytest

from tests.api.client import ADMIN, USER, GrpcCaller, HttpCaller, token
from tests.api.conftest import ApiStack

pytestmark = pytest.mark.e2e

ROOT = token(subject="root")  # every app
SCOPED = token(subject="sam", roles=(USER,), apps=["alpha"])
SCOPED_ADMIN = token(subject="sue", roles=(ADMIN,), apps=["alpha"])


@pytest.mark.parametrize("bearer", [ROOT, SCOPED, SCOPED_ADMIN], ids=["all-apps", "scoped", "scoped-admin"])
def test_a_create_without_an_app_is_invalid_for_every_caller(
    caller: HttpCaller | GrpcCaller, bearer: str
) -> None:
    outcome = caller.call("CreateSchedule", {"handler": "builtin:noop"}, bearer)
    assert outcome.code == "INVALID_SCHEDULE", outcome
    assert outcome.http_status in (None, 422)
    assert "app is required" in str(outcome.body)
    batch = caller.call("CreateSchedules", {"schedules": [{"handler": "builtin:noop"}]}, bearer)
    assert batch.code == "INVALID_SCHEDULE" and "schedules[0]: app is required" in str(batch.body), batch


@pytest.mark.parametrize(
    ("handler", "payload", "reason"),
    [
        ("builtin:sleep", {"seconds": "abc"}, 'builtin:sleep needs {"seconds": a number >= 0}'),
        ("builtin:fail", {"times": "x"}, "builtin:fail needs an integer times >= 0"),
        ("builtin:http", {"url": "ftp://h/"}, "only http and https URLs"),
        ("builtin:http", {"url": "https://h/", "headers": "str"}, "headers must be a JSON object"),
    ],
)
def test_a_payload_its_builtin_handler_cannot_take_is_refused_and_nothing_stored(
    api_stack: ApiStack, caller: HttpCaller | GrpcCaller, handler: str, payload: object, reason: str
) -> None:
    name = f"bad-{handler}-{caller.name}-{len(str(payload))}"
    outcome = caller.call(
        "CreateSchedule", {"app": "alpha", "name": name, "handler": handler, "payload": payload}, ROOT
    )
    assert outcome.code == "INVALID_SCHEDULE", outcome
    assert reason in str(outcome.body), outcome
    with api_stack.connect() as conn:
        stored = conn.execute("select count(*) as n from schedules where name = %s", (name,)).fetchone()
    assert stored is not None and stored["n"] == 0
