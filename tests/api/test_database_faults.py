"""What a caller sees when PostgreSQL holds a call up or drops the API's connections.

A call waiting on a row lock another transaction holds answers UNAVAILABLE once the API's lock
timeout passes, changing nothing, instead of waiting as long as the lock is held; once the lock is
gone the same call succeeds. After PostgreSQL ended every connection of the API (a restart, a
failover, an operator's ``pg_terminate_backend``), the next calls are answered as before: the
pool checks a connection that has been idle before handing it out.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from scheduler.store.database import CHECK_IDLE_S
from tests.api.client import token
from tests.api.conftest import ApiStack

pytestmark = pytest.mark.e2e

ROOT = token(subject="root")


def create(api_stack: ApiStack, caller: Any, name: str) -> str:
    outcome = caller.call(
        "CreateSchedule",
        {"app": "alpha", "name": name, "handler": "builtin:noop", "cron_expression": "0 3 * * *"},
        ROOT,
    )
    assert outcome.ok, outcome
    return str(outcome.body["id"])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_call_held_up_by_a_row_lock_answers_unavailable_and_changes_nothing(
    api_stack: ApiStack, transport: str
) -> None:
    process = api_stack.start({"SCHEDULER_API_LOCK_TIMEOUT_S": "1"})
    with api_stack.callers(process) as (http, grpc_caller):
        caller = http if transport == "http" else grpc_caller
        schedule_id = create(api_stack, caller, f"locked-{transport}")
        with api_stack.connect() as holder:
            holder.autocommit = False
            holder.execute("select id from schedules where id = %s for update", (schedule_id,))
            started = time.monotonic()
            outcome = caller.call("UpdateSchedule", {"id": schedule_id, "description": "changed"}, ROOT)
            waited = time.monotonic() - started
            holder.rollback()
        assert outcome.code == "UNAVAILABLE", outcome
        assert outcome.http_status in (None, 503)
        assert waited < 10, f"answered after {waited:.1f} s, with a lock timeout of 1 s"
        assert "changed" not in str(outcome.body), "the error tells nothing of the request"
        unchanged = caller.call("GetSchedule", {"id": schedule_id}, ROOT)
        assert unchanged.ok and unchanged.body.get("description", "") == "", unchanged
        again = caller.call("UpdateSchedule", {"id": schedule_id, "description": "changed"}, ROOT)
        assert again.ok and again.body["description"] == "changed", again
    assert process.stop() == 0, process.component.output()[-3000:]


def test_calls_after_postgresql_ended_the_apis_connections_are_answered(api_stack: ApiStack) -> None:
    process = api_stack.start({"SCHEDULER_API_POOL_SIZE": "4"})
    with api_stack.callers(process) as (http, grpc_caller):
        for i in range(8):  # every connection of the pool opened and used
            create(api_stack, http if i % 2 else grpc_caller, f"before-{i}")
        with api_stack.connect() as conn:
            ended = conn.execute(
                "select count(*) filter (where pg_terminate_backend(pid)) as n from pg_stat_activity"
                " where datname = current_database() and application_name = 'scheduler'"
                " and pid <> pg_backend_pid()"
            ).fetchone()
        assert ended is not None and int(str(ended["n"])) >= 2, "the API's pooled connections were ended"
        # The check applies to connections idle for longer than this: a pool in steady use pays
        # no round trip for it.
        time.sleep(CHECK_IDLE_S + 0.2)
        outcomes = [
            (http if i % 2 else grpc_caller).call("ListSchedules", {"app": "alpha", "limit": 1}, ROOT)
            for i in range(12)
        ]
        assert [o.code for o in outcomes] == ["OK"] * 12, outcomes
    assert process.stop() == 0, process.component.output()[-3000:]
