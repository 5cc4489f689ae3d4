"""HTTP's own rules for a body and for HEAD: a body declared as other than JSON (the form `curl -d`
declares) is refused with 415 and creates nothing, one declared as JSON or not declared is read;
every GET answers HEAD with its status and headers and no body."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.api.client import USER, HttpCaller, token

CREATE = {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 6 * * *"}


def keys_of(http: HttpCaller, bearer: str) -> set[str]:
    answer = http.client.get("/v1/schedules", params={"app": "alpha", "limit": 500}, headers=auth(bearer))
    assert answer.status_code == 200, answer.text
    return {item["schedule_key"] for item in answer.json()["schedules"]}


def auth(bearer: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {bearer}"}


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded",  # curl -d without --json or a Content-Type header
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
    ],
)
def test_a_body_declared_as_other_than_json_is_refused_with_415_and_creates_nothing(
    http: HttpCaller, content_type: str
) -> None:
    bearer = token(subject="media", roles=(USER,), apps=["alpha"])
    key = f"form-{uuid.uuid4().hex[:8]}"
    answer = http.client.post(
        "/v1/schedules",
        content=json.dumps(CREATE | {"schedule_key": key}),
        headers=auth(bearer) | {"Content-Type": content_type},
    )
    assert answer.status_code == 415, answer.text
    error = answer.json()["error"]
    assert error["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert "application/json" in error["message"] and "\n" not in error["message"]
    assert key not in keys_of(http, bearer)


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json", "Application/JSON; charset=UTF-8", "application/merge-patch+json"],
)
def test_a_body_declared_as_json_or_not_declared_is_read(http: HttpCaller, content_type: str | None) -> None:
    bearer = token(subject="media", roles=(USER,), apps=["alpha"])
    key = f"json-{uuid.uuid4().hex[:8]}"
    headers = auth(bearer) | ({"Content-Type": content_type} if content_type else {})
    answer = http.client.post(
        "/v1/schedules", content=json.dumps(CREATE | {"schedule_key": key}), headers=headers
    )
    assert answer.status_code == 200, answer.text
    assert key in keys_of(http, bearer)


def test_an_empty_body_needs_no_content_type(http: HttpCaller) -> None:
    """A pause without a version sends nothing to declare."""
    bearer = token(subject="media", roles=(USER,), apps=["alpha"])
    created = http.call("CreateSchedule", CREATE, bearer)
    assert created.ok, created
    answer = http.client.post(
        f"/v1/schedules/{created.body['id']}:pause", headers=auth(bearer) | {"Content-Type": "text/plain"}
    )
    assert answer.status_code == 200, answer.text


def test_every_get_answers_head_with_its_status_and_no_body(http: HttpCaller) -> None:
    bearer = token(subject="head", roles=(USER,), apps=["alpha"])
    created = http.call("CreateSchedule", CREATE, bearer)
    assert created.ok, created
    for path, status in (
        ("/v1/health", 200),
        ("/v1/schedules?app=alpha", 200),
        (f"/v1/schedules/{created.body['id']}", 200),
        (f"/v1/schedules/{uuid.uuid4()}", 404),
        (f"/v1/schedules/{created.body['id']}/runs", 200),
        ("/v1/runs?app=alpha", 200),
        ("/v1/dlq?app=alpha", 200),
        ("/v1/audit?app=alpha", 200),
    ):
        got = http.client.get(path, headers=auth(bearer))
        head = http.client.head(path, headers=auth(bearer))
        assert (head.status_code, head.content) == (status, b""), (path, head.status_code, head.content)
        assert got.status_code == status, (path, got.text)
        assert head.headers["content-type"] == got.headers["content-type"], path
    unauthenticated = http.client.head("/v1/schedules?app=alpha")
    assert unauthenticated.status_code == 401 and unauthenticated.content == b""
