"""`ListRuns` (`GET /v1/runs`): an app's runs, newest fire first, a cursor page at a time, on both
transports. Pages cover every run exactly once while new runs keep coming, the state filter and
the page limit hold, and a cursor or state that is not one the API gives is refused."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.api.openapi import document
from tests.api.client import GrpcCaller, HttpCaller, token
from tests.api.conftest import ApiStack

pytestmark = pytest.mark.e2e

Caller = HttpCaller | GrpcCaller
ROOT = token(subject="root-runs")


def runs_of(
    api_stack: ApiStack, app: str, count: int, state: str = "succeeded", latest: datetime | None = None
) -> list[str]:
    """``count`` runs of one schedule of ``app``, a second apart up to ``latest`` (default now), as
    PostgreSQL would hold them."""
    schedule_id = uuid.uuid4()
    with api_stack.connect() as conn:
        conn.execute(
            "insert into schedules (id, app, name, kind, cron, handler) "
            "values (%s, %s, 'listed', 'cron', '* * * * *', 'builtin:noop')",
            (schedule_id, app),
        )
        rows = conn.execute(
            "insert into runs (id, schedule_id, app, scheduled_for, state, max_attempts) "
            "select gen_random_uuid(), %s, %s, coalesce(%s, now()) - make_interval(secs => g), %s, 1 "
            "  from generate_series(0, %s - 1) g returning id",
            (schedule_id, app, latest, state, count),
        ).fetchall()
    return [str(row["id"]) for row in rows]


def walk(caller: Caller, request: dict[str, Any], between_pages: Any = None) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    cursor = ""
    while True:
        page = caller.call("ListRuns", request | ({"cursor": cursor} if cursor else {}), ROOT)
        assert page.ok, page
        runs += page.body.get("runs", [])
        if not page.body.get("has_more"):
            assert not page.body.get("next_cursor")
            return runs
        cursor = page.body["next_cursor"]
        if between_pages is not None:
            between_pages()


def test_pages_cover_an_apps_runs_once_newest_first_while_runs_come(
    caller: Caller, api_stack: ApiStack
) -> None:
    app = "alpha"
    with api_stack.connect() as conn:
        before = {str(r["id"]) for r in conn.execute("select id from runs where app = %s", (app,))}
    # Two schedules firing at the same instants: ties are ordered by id, and no page splits them wrong.
    latest = datetime.now(UTC)
    listed_ids = set(runs_of(api_stack, app, 23, latest=latest)) | set(
        runs_of(api_stack, app, 23, latest=latest)
    )
    runs = walk(caller, {"app": app, "limit": 5}, between_pages=lambda: runs_of(api_stack, app, 2))
    ids = [run["id"] for run in runs]
    assert len(ids) == len(set(ids)), "a run listed twice"
    assert listed_ids | before <= set(ids), "a run that was there before the first page is missing"
    fired = [(run["scheduled_for"], run["id"]) for run in runs]
    assert [t for t, _ in fired] == sorted((t for t, _ in fired), reverse=True), "newest fire first"
    assert {run["app"] for run in runs} == {app}


def test_the_state_filter_and_every_app_in_scope(caller: Caller, api_stack: ApiStack) -> None:
    dead = set(runs_of(api_stack, "beta", 3, state="dead"))
    runs_of(api_stack, "beta", 3, state="succeeded")
    listed = walk(caller, {"app": "beta", "state": "dead", "limit": 2})
    assert dead <= {run["id"] for run in listed}
    assert {run["state"] for run in listed} == {"dead"}
    everywhere = walk(caller, {"state": "dead", "limit": 500})
    assert dead <= {run["id"] for run in everywhere}


@pytest.mark.parametrize(
    ("request_json", "field"),
    [
        ({"state": "finished"}, "state"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"limit": 501}, "limit"),
    ],
)
def test_what_the_api_does_not_give_is_refused(
    caller: Caller, request_json: dict[str, Any], field: str
) -> None:
    outcome = caller.call("ListRuns", request_json, ROOT)
    assert outcome.code == "INVALID_ARGUMENT", outcome
    assert field in str(outcome.body), outcome


@pytest.mark.parametrize("method", ["ListRuns", "ListSchedules", "ListAuditEntries", "ListDeadLetters"])
def test_a_limit_of_zero_in_the_query_is_refused_not_taken_for_the_default(
    http: HttpCaller, method: str
) -> None:
    # gRPC cannot tell 0 from a limit left out (proto3); a query that says limit=0 can, and means it.
    request = {"app": "alpha", "limit": 0} if method != "ListRuns" else {"limit": 0}
    outcome = http.call(method, request, ROOT)
    assert outcome.code == "INVALID_ARGUMENT", outcome
    assert "limit must be 1 to 500" in str(outcome.body), outcome
    parameter = next(
        p
        for route in document()["paths"].values()
        for operation in route.values()
        if operation.get("operationId") == method
        for p in operation.get("parameters", [])
        if p["name"] == "limit"
    )
    assert (parameter["schema"]["minimum"], parameter["schema"]["maximum"]) == (1, 500)


def test_a_limit_of_zero_in_a_replay_body_is_the_default_as_over_grpc(http: HttpCaller) -> None:
    # Only the query's limit is one the caller typed; a body's 0 is what proto3 JSON writes for none.
    outcome = http.call("ReplayDeadLetters", {"app": "alpha", "limit": 0}, ROOT)
    assert outcome.code == "OK", outcome
