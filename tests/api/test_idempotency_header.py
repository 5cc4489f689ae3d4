"""An ``Idempotency-Key`` header sent to a method that takes no idempotency key is refused, as the
same key in the body is, never ignored: the client that sends one expects a retry to be answered
with the first response, not done again."""

from __future__ import annotations

import pytest

from scheduler.api.routes import ROUTES
from scheduler.api.service import METHODS
from tests.api.client import ROUTE_OF, HttpCaller, token

ROOT = token(subject="keys-root")
WITHOUT_KEYS = [route.method for route in ROUTES if not METHODS[route.method].idempotent]


def test_a_pause_with_an_idempotency_key_is_refused_and_changes_nothing(http: HttpCaller) -> None:
    created = http.call(
        "CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 4 * * *"}, ROOT
    )
    assert created.ok, created
    schedule = {"id": created.body["id"]}
    refused = http.call("PauseSchedule", schedule, ROOT, headers={"Idempotency-Key": "abc"})
    assert (refused.http_status, refused.code) == (400, "INVALID_ARGUMENT"), refused
    assert "Idempotency-Key" in refused.body["message"]
    assert refused.body["details"] == {"header": "Idempotency-Key"}
    assert http.call("GetSchedule", schedule, ROOT).body["enabled"] is True
    in_body = http.call("PauseSchedule", schedule | {"idempotency_key": "abc"}, ROOT)
    assert (in_body.http_status, in_body.code) == (400, "INVALID_ARGUMENT"), in_body
    paused = http.call("PauseSchedule", schedule, ROOT)
    assert paused.ok and paused.body["enabled"] is False, paused


@pytest.mark.parametrize("method", WITHOUT_KEYS)
def test_every_method_without_idempotency_refuses_the_header(http: HttpCaller, method: str) -> None:
    """Refused before the rest of the request is looked at: a malformed id will do."""
    request = {name: "not-an-id" for name in ROUTE_OF[method].path_fields}
    outcome = http.call(method, request, ROOT, headers={"Idempotency-Key": "k-1"})
    assert (outcome.http_status, outcome.code) == (400, "INVALID_ARGUMENT"), outcome
    assert "takes no Idempotency-Key header" in outcome.body["message"]


def test_the_methods_with_idempotency_still_take_the_header(http: HttpCaller) -> None:
    request = {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 5 * * *"}
    first = http.call("CreateSchedule", request, ROOT, headers={"Idempotency-Key": "create-1"})
    again = http.call("CreateSchedule", request, ROOT, headers={"Idempotency-Key": "create-1"})
    assert first.ok and again.ok and again.body["id"] == first.body["id"], (first, again)
