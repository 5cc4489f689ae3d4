"""Idempotency keys as a client relies on them: a retried request (same key, same body) gets the
first response and changes nothing more, whichever transport or replica it comes by; a key is the
principal's and the method's; a failed request leaves its key free; an expired key is new again.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import grpc
import pytest

from scheduler.store import api as store
from tests.api.client import GrpcCaller, HttpCaller, Outcome, token
from tests.api.conftest import ApiStack

Caller = HttpCaller | GrpcCaller


def keyed(caller: Caller, method: str, request: dict[str, Any], key: str, bearer: str) -> Outcome:
    """``request`` under idempotency ``key``: HTTP's header, gRPC's request field."""
    if isinstance(caller, HttpCaller):
        return caller.call(method, request, bearer, headers={"Idempotency-Key": key})
    return caller.call(method, request | {"idempotency_key": key}, bearer)


def ok(outcome: Outcome, what: str) -> dict[str, Any]:
    assert outcome.ok, f"{what}: {outcome.code} {outcome.body}"
    return outcome.body


def assert_reused(outcome: Outcome) -> None:
    assert outcome.code == "IDEMPOTENCY_KEY_REUSED", outcome
    if outcome.http_status is not None:
        assert outcome.http_status == 409
    else:
        assert outcome.grpc_status == grpc.StatusCode.ALREADY_EXISTS


def new_schedule(name: str, **fields: Any) -> dict[str, Any]:
    return {"app": "alpha", "handler": "builtin:noop", "name": name, "cron_expression": "0 6 * * *"} | fields


def count(stack: ApiStack, sql: str, *params: object) -> int:
    with stack.connect() as conn:
        row = conn.execute(f"select count(*) as n from {sql}", params).fetchone()
    assert row is not None and isinstance(row["n"], int)
    return row["n"]


def named(stack: ApiStack, name: str) -> int:
    return count(stack, "schedules where name = %s", name)


def expire(stack: ApiStack, key: str) -> None:
    with stack.connect() as conn:
        updated = conn.execute(
            "update api_idempotency set expires_at = now() - interval '1 second' where idempotency_key = %s",
            (key,),
        ).rowcount
    assert updated >= 1, f"no idempotency row for {key}"


def test_a_repeated_create_returns_the_first_schedule(api_stack: ApiStack, caller: Caller) -> None:
    key, name, bearer = str(uuid.uuid4()), f"report-{uuid.uuid4().hex[:8]}", token("idem")
    first = ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bearer), "first")
    again = ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bearer), "again")
    assert again == first
    assert named(api_stack, name) == 1
    assert_reused(keyed(caller, "CreateSchedule", new_schedule(name, description="other"), key, bearer))
    assert named(api_stack, name) == 1


def test_a_repeated_trigger_returns_the_first_run(api_stack: ApiStack, caller: Caller) -> None:
    bearer = token("idem")
    schedule = ok(caller.call("CreateSchedule", new_schedule("trigger me"), bearer), "create")
    other = ok(caller.call("CreateSchedule", new_schedule("not me"), bearer), "create")
    key = str(uuid.uuid4())
    first = ok(keyed(caller, "TriggerSchedule", {"id": schedule["id"]}, key, bearer), "first")
    again = ok(keyed(caller, "TriggerSchedule", {"id": schedule["id"]}, key, bearer), "again")
    assert (again["schedule_id"], again["run_id"]) == (schedule["id"], first["run_id"])
    assert count(api_stack, "runs where schedule_id = %s", schedule["id"]) == 1
    assert_reused(keyed(caller, "TriggerSchedule", {"id": other["id"]}, key, bearer))
    assert count(api_stack, "runs where schedule_id = %s", other["id"]) == 0


def test_a_repeated_replay_returns_the_first_answer(api_stack: ApiStack, caller: Caller) -> None:
    bearer = token("idem")
    schedule = ok(caller.call("CreateSchedule", new_schedule("replay me"), bearer), "create")
    run_id = ok(caller.call("TriggerSchedule", {"id": schedule["id"]}, bearer), "trigger")["run_id"]

    def die() -> None:  # as a worker's dead event leaves it (no worker runs here)
        with api_stack.connect() as conn:
            conn.execute(
                "update runs set state = 'dead', finished_at = now(), error = 'HTTP503: down' where id = %s",
                (run_id,),
            )

    def state() -> object:
        with api_stack.connect() as conn:
            row = conn.execute("select state from runs where id = %s", (run_id,)).fetchone()
        assert row is not None
        return row["state"]

    die()
    # force: a run replayed before is replayed again, so only the key can stop a second replay.
    replay = {"app": "alpha", "schedule_id": schedule["id"], "force": True}
    key = str(uuid.uuid4())
    first = ok(keyed(caller, "ReplayDeadLetters", replay, key, bearer), "first")
    assert first["replayed"] == 1 and state() != "dead"
    die()
    assert ok(keyed(caller, "ReplayDeadLetters", replay, key, bearer), "again") == first
    assert state() == "dead", "the repeated request replayed nothing"
    assert_reused(keyed(caller, "ReplayDeadLetters", replay | {"limit": 5}, key, bearer))
    assert state() == "dead"
    assert (
        ok(keyed(caller, "ReplayDeadLetters", replay, str(uuid.uuid4()), bearer), "new key")["replayed"] == 1
    )
    assert state() != "dead"


def test_keys_are_per_method_and_per_principal(api_stack: ApiStack, caller: Caller) -> None:
    key, name = str(uuid.uuid4()), f"shared-{uuid.uuid4().hex[:8]}"
    alice, bob = token("alice-idem"), token("bob-idem")
    mine = ok(keyed(caller, "CreateSchedule", new_schedule(name), key, alice), "alice")
    triggered = ok(keyed(caller, "TriggerSchedule", {"id": mine["id"]}, key, alice), "alice's trigger")
    assert triggered["schedule_id"] == mine["id"]
    theirs = ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bob), "bob")
    assert theirs["id"] != mine["id"]
    assert named(api_stack, name) == 2
    assert (
        ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bob), "bob again")["id"] == theirs["id"]
    )
    assert named(api_stack, name) == 2


def test_concurrent_duplicates_on_both_transports_create_one_schedule(
    api_stack: ApiStack, http: HttpCaller, grpc_caller: GrpcCaller
) -> None:
    key, name, bearer = str(uuid.uuid4()), f"raced-{uuid.uuid4().hex[:8]}", token("racer")
    request = new_schedule(name, payload={"attempt": 1, "rate": 0.5})
    start = threading.Barrier(20)
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def send(caller: Caller) -> None:
        start.wait(30)
        outcome = keyed(caller, "CreateSchedule", request, key, bearer)
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=send, args=(http if n % 2 else grpc_caller,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 20
    assert [o.code for o in outcomes] == ["OK"] * 20, [o.body for o in outcomes if not o.ok]
    assert len({o.body["id"] for o in outcomes}) == 1
    assert named(api_stack, name) == 1


def test_a_failed_request_leaves_its_key_free(api_stack: ApiStack, caller: Caller) -> None:
    key, name, bearer = str(uuid.uuid4()), f"fixed-{uuid.uuid4().hex[:8]}", token("idem")
    refused = keyed(caller, "CreateSchedule", new_schedule(name, cron_expression="0 25 * * *"), key, bearer)
    assert refused.code == "INVALID_SCHEDULE"
    fixed = ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bearer), "corrected")
    assert named(api_stack, name) == 1
    assert ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bearer), "again")["id"] == fixed["id"]


def test_an_expired_key_is_taken_over(api_stack: ApiStack, caller: Caller) -> None:
    key, name, bearer = str(uuid.uuid4()), f"expired-{uuid.uuid4().hex[:8]}", token("idem")
    first = ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bearer), "first")
    expire(api_stack, key)
    second = ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bearer), "after expiry")
    assert second["id"] != first["id"]
    assert named(api_stack, name) == 2
    assert ok(keyed(caller, "CreateSchedule", new_schedule(name), key, bearer), "again")["id"] == second["id"]
    expire(api_stack, key)
    other = ok(keyed(caller, "CreateSchedule", new_schedule(f"{name}-other"), key, bearer), "another body")
    assert other["id"] not in (first["id"], second["id"])


@pytest.mark.parametrize(
    "method", ["CreateSchedule", "CreateSchedules", "TriggerSchedule", "ReplayDeadLetters"]
)
def test_a_key_with_a_nul_character_is_malformed(api_stack: ApiStack, caller: Caller, method: str) -> None:
    """(HTTP headers cannot carry one: the body's idempotency_key field can.)"""
    bearer = token("idem")
    name = f"nul-{uuid.uuid4().hex[:8]}"
    requests = {
        "CreateSchedule": new_schedule(name),
        "CreateSchedules": {"schedules": [new_schedule(name)]},
        "TriggerSchedule": {
            "id": ok(caller.call("CreateSchedule", new_schedule("nul"), bearer), "create")["id"]
        },
        "ReplayDeadLetters": {"app": "alpha", "dry_run": True},
    }
    outcome = caller.call(method, requests[method] | {"idempotency_key": "retry\x00-1"}, bearer)
    assert outcome.code == "INVALID_ARGUMENT", f"{outcome.code} {outcome.body}"
    if outcome.http_status is not None:
        assert outcome.http_status == 400
    else:
        assert outcome.grpc_status == grpc.StatusCode.INVALID_ARGUMENT
    assert named(api_stack, name) == 0


@pytest.mark.parametrize("limit", [2, 1000])
def test_the_retention_sweep_deletes_expired_keys_only(
    api_stack: ApiStack, http: HttpCaller, limit: int
) -> None:
    bearer = token("sweeper")
    keys = [f"sweep-{uuid.uuid4()}" for _ in range(5)]
    for n, key in enumerate(keys):
        ok(keyed(http, "CreateSchedule", new_schedule(f"sweep-{n}"), key, bearer), key)
    for key in keys[:3]:
        expire(api_stack, key)
    with api_stack.connect() as conn:
        while deleted := store.delete_expired_idempotency_keys(conn, limit):
            assert deleted <= limit
        left = conn.execute(
            "select idempotency_key from api_idempotency where idempotency_key = any(%s)", (keys,)
        ).fetchall()
    assert sorted(str(row["idempotency_key"]) for row in left) == sorted(keys[3:])
