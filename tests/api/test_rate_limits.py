"""Rate limits as a client meets them: one principal's budget for a class of calls is shared by
every replica and both transports, refusals say when to retry, and neither another principal nor
another class of calls is touched. A limit that does not parse stops the API at start.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import grpc
import httpx
import pytest

from bench.chaos_stack import free_port
from tests.api.client import GrpcCaller, HttpCaller, Outcome, token
from tests.api.conftest import ApiProcess, ApiStack
from tests.support import SCHEDULER, wait_for

Caller = HttpCaller | GrpcCaller
TRIGGERS_PER_MINUTE = 5
LIMITS = {"SCHEDULER_API_RATE_LIMITS": f"trigger={TRIGGERS_PER_MINUTE}/min,get=1000/min"}


def serving(process: ApiProcess) -> bool:
    assert process.component.proc.poll() is None, process.component.output()[-3000:]
    try:
        return httpx.get(f"{process.http_url}/v1/health", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def wait_serving(process: ApiProcess) -> None:
    wait_for(lambda: serving(process), 60, f"the API at {process.http_url} to serve")


@pytest.fixture(scope="module")
def callers(api_stack: ApiStack) -> Iterator[list[Caller]]:
    """Both transports of two replicas with the limits under test, on the module's database, in
    the order calls rotate through them."""
    replicas = [api_stack.start(LIMITS, wait=False) for _ in range(2)]
    for replica in replicas:
        wait_serving(replica)
    with ExitStack() as stack:
        (http_a, grpc_a), (http_b, grpc_b) = (stack.enter_context(api_stack.callers(r)) for r in replicas)
        yield [http_a, grpc_b, http_b, grpc_a]


def create_schedule(caller: Caller, bearer: str) -> str:
    request = {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 0 1 1 *"}
    outcome = caller.call("CreateSchedule", request, bearer)
    assert outcome.ok, outcome
    schedule_id: str = outcome.body["id"]
    return schedule_id


def assert_rate_limited(outcome: Outcome) -> None:
    assert outcome.code == "RATE_LIMITED", outcome
    if outcome.http_status is not None:
        assert outcome.http_status == 429
        retry_after = outcome.headers.get("retry-after", "")
        assert retry_after.isdigit() and int(retry_after) >= 1, f"Retry-After: {retry_after!r}"
    else:
        assert outcome.grpc_status == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_one_principal_shares_one_budget_across_replicas_and_transports(callers: list[Caller]) -> None:
    bearer = token(f"trigger-happy-{uuid.uuid4().hex[:6]}")
    schedule_id = create_schedule(callers[0], bearer)
    started = time.monotonic()
    outcomes = [
        callers[n % len(callers)].call("TriggerSchedule", {"id": schedule_id}, bearer) for n in range(30)
    ]
    elapsed_s = time.monotonic() - started
    allowed = [o for o in outcomes if o.ok]
    assert outcomes[:TRIGGERS_PER_MINUTE] == allowed[:TRIGGERS_PER_MINUTE], "a full bucket at first"
    # The burst, what refills meanwhile, and one for a refill landing between two calls.
    assert len(allowed) <= TRIGGERS_PER_MINUTE + elapsed_s * TRIGGERS_PER_MINUTE / 60 + 1
    refused = [(n, o) for n, o in enumerate(outcomes) if not o.ok]
    for _, outcome in refused:
        assert_rate_limited(outcome)
    assert {n % len(callers) for n, _ in refused} == set(range(len(callers))), "every replica and transport"


def test_another_principal_and_another_class_keep_their_own_budgets(callers: list[Caller]) -> None:
    spent, fresh = token(f"spent-{uuid.uuid4().hex[:6]}"), token(f"fresh-{uuid.uuid4().hex[:6]}")
    schedule_id = create_schedule(callers[0], spent)
    outcomes = [
        callers[n % len(callers)].call("TriggerSchedule", {"id": schedule_id}, spent) for n in range(8)
    ]
    assert not outcomes[-1].ok, "the budget is spent"
    for n in range(TRIGGERS_PER_MINUTE):
        outcome = callers[n % len(callers)].call("TriggerSchedule", {"id": schedule_id}, fresh)
        assert outcome.ok, f"another principal's trigger {n + 1}: {outcome}"
    for n in range(20):
        outcome = callers[n % len(callers)].call("GetSchedule", {"id": schedule_id}, spent)
        assert outcome.ok, f"get {n + 1} of the principal without triggers: {outcome}"
    assert_rate_limited(callers[1].call("TriggerSchedule", {"id": schedule_id}, spent))


@pytest.mark.parametrize("limits", ["trigger=five/min", "nope=1/min", "trigger=0/min", "trigger=5/fortnight"])
def test_a_limit_that_does_not_parse_stops_the_api(api_stack: ApiStack, limits: str) -> None:
    ports = [str(free_port()) for _ in range(3)]
    args = ["--port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2]]
    result = subprocess.run(
        [SCHEDULER, "run", "api", *args],
        env=api_stack.env | {"SCHEDULER_API_RATE_LIMITS": limits},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "SCHEDULER_API_RATE_LIMITS" in lines[0], result.stderr
