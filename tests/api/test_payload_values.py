"""A payload's cost is its values as much as its bytes: a megabyte of zeros is half a million
values, each about 2 µs to convert between JSON and protobuf. A request's payloads may hold
100,000 values together (a batch's, 1,000,000), counted before any is converted, on both
transports; over that, PAYLOAD_TOO_LARGE with the limit, and nothing is created."""

from __future__ import annotations

import uuid

from scheduler.schedule.spec import MAX_PAYLOAD_VALUES
from tests.api.client import USER, GrpcCaller, HttpCaller, token

CREATE = {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 6 * * *"}


def zeros(values: int) -> list[int]:
    """A list holding ``values`` JSON values: itself and its zeros."""
    return [0] * (values - 1)


def test_a_payload_of_the_most_values_is_created_and_one_more_is_refused(
    caller: HttpCaller | GrpcCaller,
) -> None:
    bearer = token(subject=f"values-{caller.name}", roles=(USER,), apps=["alpha"])
    most = caller.call("CreateSchedule", CREATE | {"payload": {"ids": zeros(MAX_PAYLOAD_VALUES - 1)}}, bearer)
    assert most.ok, most
    key = f"many-{uuid.uuid4().hex[:8]}"
    refused = caller.call(
        "CreateSchedule",
        CREATE | {"schedule_key": key, "payload": {"ids": zeros(MAX_PAYLOAD_VALUES)}},
        bearer,
    )
    assert refused.code == "PAYLOAD_TOO_LARGE", refused
    assert int(refused.body["details"]["limit_values"]) == MAX_PAYLOAD_VALUES
    assert "100,000 values" in refused.body["message"]
    listed = caller.call("ListSchedules", {"app": "alpha", "limit": 500}, bearer)
    assert key not in {item["schedule_key"] for item in listed.body["schedules"]}


def test_an_update_of_too_many_values_is_refused_and_changes_nothing(caller: HttpCaller | GrpcCaller) -> None:
    bearer = token(subject=f"values-{caller.name}", roles=(USER,), apps=["alpha"])
    created = caller.call("CreateSchedule", CREATE | {"payload": {"n": 1}}, bearer)
    assert created.ok, created
    refused = caller.call(
        "UpdateSchedule", {"id": created.body["id"], "payload": zeros(MAX_PAYLOAD_VALUES + 1)}, bearer
    )
    assert refused.code == "PAYLOAD_TOO_LARGE", refused
    got = caller.call("GetSchedule", {"id": created.body["id"]}, bearer)
    assert got.body["payload"] == {"n": 1} and got.body["version"] == created.body["version"]


def test_a_batch_whose_payloads_together_pass_a_million_values_creates_nothing(
    caller: HttpCaller | GrpcCaller,
) -> None:
    """Each of the eleven payloads is within the limit of one; together they are not."""
    bearer = token(subject=f"values-{caller.name}", roles=(USER,), apps=["alpha"])
    prefix = f"batch-{uuid.uuid4().hex[:8]}"
    items = [
        CREATE | {"schedule_key": f"{prefix}-{i}", "payload": zeros(MAX_PAYLOAD_VALUES)} for i in range(11)
    ]
    refused = caller.call("CreateSchedules", {"schedules": items}, bearer)
    assert refused.code == "PAYLOAD_TOO_LARGE", refused
    assert int(refused.body["details"]["limit_values"]) == 10 * MAX_PAYLOAD_VALUES
    listed = caller.call("ListSchedules", {"app": "alpha", "limit": 500}, bearer)
    assert not [item for item in listed.body["schedules"] if item["schedule_key"].startswith(prefix)]
    taken = caller.call("CreateSchedules", {"schedules": items[:10]}, bearer)
    assert taken.ok, taken
