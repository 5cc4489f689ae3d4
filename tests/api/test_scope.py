"""A token scoped to one app cannot see, change or even detect another app's objects.

App beta holds a schedule, a pending run and a dead run; tokens scoped to alpha call every method
on them, on both transports. Each answer is NOT_FOUND, shaped exactly like the answer for an id (or
app) that does not exist at all, so nothing can be learnt by probing; listings leave beta out; and
PostgreSQL shows that none of the refused calls changed anything.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import jwt
import pytest

from tests.api.client import ADMIN, SECRET, USER, GrpcCaller, HttpCaller, Outcome, token
from tests.api.conftest import ApiStack

pytestmark = pytest.mark.e2e

Caller = HttpCaller | GrpcCaller
ROOT = token(subject="root")  # an admin without an apps claim: every app
ALPHA_USER = token(subject="ulla", roles=(USER,), apps=["alpha"])
ALPHA_ADMIN = token(subject="ada", roles=(ADMIN,), apps=["alpha"])
EVERY_APP = token(subject="eve", roles=(USER,), apps=["*"])
NO_SUCH_APP = "gamma"


def new_schedule(app: str, name: str, **fields: Any) -> dict[str, Any]:
    return {"app": app, "name": name, "handler": "builtin:noop", "cron_expression": "0 3 * * *"} | fields


@dataclass(frozen=True)
class Objects:
    alpha_schedule: str
    alpha_dead_run: str
    beta_schedule: str
    beta_run: str
    beta_dead_run: str


def die(api_stack: ApiStack, run_id: str) -> None:
    """What a worker would do to a run of builtin:fail with one attempt; no worker runs here."""
    with api_stack.connect() as conn:
        conn.execute(
            "update runs set state = 'dead', finished_at = now(), error = 'X: y' where id = %s", (run_id,)
        )


@pytest.fixture(scope="module")
def objects(api_stack: ApiStack, http: HttpCaller) -> Objects:
    def ok(method: str, request: dict[str, Any]) -> dict[str, Any]:
        outcome = http.call(method, request, ROOT)
        assert outcome.ok, outcome
        return outcome.body

    alpha = ok("CreateSchedule", new_schedule("alpha", "alpha-report"))
    alpha_dead = ok("TriggerSchedule", {"id": alpha["id"]})["run_id"]
    beta = ok(
        "CreateSchedule",
        new_schedule(
            "beta",
            "beta-export",
            schedule_key="nightly-export",
            handler="builtin:fail",
            payload={"times": 99},
            retry_config={"max_attempts": 1},
        ),
    )
    beta_run = ok("TriggerSchedule", {"id": beta["id"]})["run_id"]
    beta_dead = ok("TriggerSchedule", {"id": beta["id"]})["run_id"]
    die(api_stack, alpha_dead)
    die(api_stack, beta_dead)
    return Objects(alpha["id"], alpha_dead, beta["id"], beta_run, beta_dead)


def snapshot(api_stack: ApiStack) -> dict[str, Any]:
    """Beta as PostgreSQL holds it: its schedules, their versions and states, and its runs."""
    with api_stack.connect() as conn:
        schedules = conn.execute(
            "select id::text, name, state, version, updated_at from schedules where app = 'beta' order by id"
        ).fetchall()
        runs = conn.execute(
            "select id::text, state, attempt, version from runs where app = 'beta' order by id"
        ).fetchall()
        replays = conn.execute(
            "select count(*) as n from audit_log where entity = 'run' and action = 'replay'"
        ).fetchone()
    return {"schedules": schedules, "runs": runs, "replays": replays}


def shape(outcome: Outcome, asked_for: str) -> tuple[Any, ...]:
    """An answer with the id or app asked for blanked out: what a prober could compare."""
    message = str(outcome.body.get("message", ""))
    return (
        outcome.code,
        outcome.http_status,
        outcome.grpc_status,
        sorted(outcome.body),
        message.replace(asked_for, "<asked>"),
        outcome.body.get("details"),
    )


def assert_missing_alike(
    caller: Caller, method: str, bearer: str, request: dict[str, Any], field: str, theirs: str, unknown: str
) -> None:
    """``request`` with ``field`` set to another app's object and to one that does not exist gets
    the same NOT_FOUND."""
    other = caller.call(method, request | {field: theirs}, bearer)
    missing = caller.call(method, request | {field: unknown}, bearer)
    assert other.code == "NOT_FOUND", (method, other)
    if other.grpc_status is None:
        assert other.http_status == 404
    else:
        assert other.grpc_status == grpc.StatusCode.NOT_FOUND
    assert shape(other, theirs) == shape(missing, unknown), (method, other.body, missing.body)
    assert "beta" not in json.dumps(other.body).replace(theirs, ""), (method, other.body)


def test_another_apps_objects_answer_as_missing(
    caller: Caller, objects: Objects, api_stack: ApiStack
) -> None:
    before = snapshot(api_stack)
    schedule, run = objects.beta_schedule, objects.beta_run
    unknown = str(uuid.uuid4())
    by_schedule: list[tuple[str, str, dict[str, Any]]] = [
        ("GetSchedule", ALPHA_USER, {}),
        ("UpdateSchedule", ALPHA_USER, {"name": "hijacked", "payload": {"times": 0}}),
        ("UpdateSchedule", ALPHA_USER, {"enabled": False, "version": 1}),
        ("DeleteSchedule", ALPHA_ADMIN, {}),
        ("PauseSchedule", ALPHA_USER, {}),
        ("ResumeSchedule", ALPHA_USER, {}),
        ("TriggerSchedule", ALPHA_USER, {}),
        ("TriggerSchedule", ALPHA_USER, {"idempotency_key": f"probe-{unknown}"}),
        ("GetScheduleHistory", ALPHA_USER, {}),
    ]
    for method, bearer, rest in by_schedule:
        assert_missing_alike(caller, method, bearer, rest, "id", schedule, unknown)
    assert_missing_alike(caller, "GetRun", ALPHA_USER, {}, "id", run, unknown)
    assert_missing_alike(caller, "GetRun", ALPHA_USER, {}, "id", objects.beta_dead_run, unknown)
    # Filters that name beta's schedule are no way round it either.
    assert_missing_alike(caller, "ListDeadLetters", ALPHA_USER, {}, "schedule_id", schedule, unknown)
    assert_missing_alike(caller, "ReplayDeadLetters", ALPHA_ADMIN, {}, "schedule_id", schedule, unknown)
    named = caller.call("ReplayDeadLetters", {"run_ids": [objects.beta_dead_run]}, ALPHA_ADMIN)
    nameless = caller.call("ReplayDeadLetters", {"run_ids": [unknown]}, ALPHA_ADMIN)
    assert named.code == "NOT_FOUND", named
    assert shape(named, objects.beta_dead_run) == shape(nameless, unknown), (named.body, nameless.body)

    tag = uuid.uuid4().hex[:8]
    by_app: list[tuple[str, str, dict[str, Any]]] = [
        ("ListSchedules", ALPHA_USER, {}),
        ("ListRuns", ALPHA_USER, {}),
        ("ListRuns", ALPHA_USER, {"state": "dead"}),
        ("ListDeadLetters", ALPHA_USER, {}),
        ("ListAuditEntries", ALPHA_USER, {}),
        ("ReplayDeadLetters", ALPHA_ADMIN, {}),
        ("ReplayDeadLetters", ALPHA_ADMIN, {"force": True}),
    ]
    for method, bearer, rest in by_app:
        assert_missing_alike(caller, method, bearer, rest, "app", "beta", NO_SUCH_APP)
    # A name of this test's own, so that a schedule it made would be found below.
    creates: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
        ("CreateSchedule", lambda app: new_schedule(app, f"sneaked-{tag}")),
        ("CreateSchedules", lambda app: {"schedules": [new_schedule(app, f"sneaked-{tag}")]}),
    ]
    for method, request in creates:
        theirs = caller.call(method, request("beta"), ALPHA_USER)
        nobodys = caller.call(method, request(NO_SUCH_APP), ALPHA_USER)
        assert theirs.code == "NOT_FOUND", (method, theirs)
        assert shape(theirs, "beta") == shape(nobodys, NO_SUCH_APP), (method, theirs.body, nobodys.body)

    assert snapshot(api_stack) == before
    with api_stack.connect() as conn:
        sneaked = conn.execute("select app from schedules where name = %s", (f"sneaked-{tag}",)).fetchall()
        dead = conn.execute("select state from runs where id = %s", (objects.beta_dead_run,)).fetchone()
    assert sneaked == []
    assert dead == {"state": "dead"}


def test_a_batch_with_one_item_of_another_app_creates_nothing(
    caller: Caller, objects: Objects, api_stack: ApiStack
) -> None:
    tag = uuid.uuid4().hex[:8]
    batch = {"schedules": [new_schedule("alpha", f"mine-{tag}"), new_schedule("beta", f"theirs-{tag}")]}
    outcome = caller.call("CreateSchedules", batch, ALPHA_USER)
    assert outcome.code == "NOT_FOUND", outcome
    assert str(outcome.body["details"].get("index")) == "1"
    with api_stack.connect() as conn:
        made = conn.execute(
            "select name from schedules where name in (%s, %s)", (f"mine-{tag}", f"theirs-{tag}")
        ).fetchall()
    assert made == [], "a batch is all or nothing"


def test_listings_leave_another_app_out(caller: Caller, objects: Objects) -> None:
    beta_ids = {objects.beta_schedule, objects.beta_run, objects.beta_dead_run}

    schedules = caller.call("ListSchedules", {"limit": 500}, ALPHA_USER)
    assert schedules.ok, schedules
    assert objects.alpha_schedule in {s["id"] for s in schedules.body["schedules"]}
    assert {s["app"] for s in schedules.body["schedules"]} == {"alpha"}

    dead = caller.call("ListDeadLetters", {"limit": 500}, ALPHA_USER)
    assert dead.ok, dead
    assert [letter["id"] for letter in dead.body["dead_letters"]] == [objects.alpha_dead_run]

    runs = caller.call("ListRuns", {"limit": 500}, ALPHA_USER)
    assert runs.ok, runs
    assert objects.alpha_dead_run in {r["id"] for r in runs.body["runs"]}
    assert {r["app"] for r in runs.body["runs"]} == {"alpha"}

    audit = caller.call("ListAuditEntries", {"limit": 500}, ALPHA_USER)
    assert audit.ok, audit
    entries = audit.body["entries"]
    assert objects.alpha_schedule in {entry["entity_id"] for entry in entries}
    assert {entry["app"] for entry in entries} == {"alpha"}
    text = json.dumps(entries)
    assert not [thing for thing in beta_ids if thing in text]

    for filtered in ({"entity_id": objects.beta_schedule}, {"entity": "schedule", "actor": "api:root"}):
        entries = caller.call("ListAuditEntries", filtered, ALPHA_USER).body["entries"]
        assert {entry["app"] for entry in entries} <= {"alpha"}, entries
        assert objects.beta_schedule not in json.dumps(entries)


def test_a_token_for_every_app_sees_both(caller: Caller, objects: Objects, api_stack: ApiStack) -> None:
    schedules = caller.call("ListSchedules", {"limit": 500}, EVERY_APP)
    assert {objects.alpha_schedule, objects.beta_schedule} <= {s["id"] for s in schedules.body["schedules"]}
    beta = caller.call("GetSchedule", {"id": objects.beta_schedule}, EVERY_APP)
    assert (beta.code, beta.body.get("app"), beta.body.get("schedule_key")) == (
        "OK",
        "beta",
        "nightly-export",
    )
    run = caller.call("GetRun", {"id": objects.beta_run}, EVERY_APP)
    assert (run.code, run.body.get("app"), run.body.get("state")) == ("OK", "beta", "pending")
    history = caller.call("GetScheduleHistory", {"id": objects.beta_schedule}, EVERY_APP)
    assert {r["id"] for r in history.body["runs"]} == {objects.beta_run, objects.beta_dead_run}
    runs = caller.call("ListRuns", {"app": "beta"}, EVERY_APP)
    assert {r["id"] for r in runs.body["runs"]} == {objects.beta_run, objects.beta_dead_run}
    every = caller.call("ListRuns", {"limit": 500}, EVERY_APP)
    assert {objects.alpha_dead_run, objects.beta_run} <= {r["id"] for r in every.body["runs"]}

    dead = caller.call("ListDeadLetters", {}, EVERY_APP)
    assert {letter["id"] for letter in dead.body["dead_letters"]} == {
        objects.alpha_dead_run,
        objects.beta_dead_run,
    }
    only_beta = caller.call("ListDeadLetters", {"app": "beta"}, EVERY_APP)
    assert [(d["id"], d["error"]) for d in only_beta.body["dead_letters"]] == [
        (objects.beta_dead_run, "X: y")
    ]
    audit = caller.call("ListAuditEntries", {"app": "beta", "limit": 500}, EVERY_APP)
    assert audit.body["entries"] and {entry["app"] for entry in audit.body["entries"]} == {"beta"}

    every_admin = token(subject="root-too", roles=(ADMIN,), apps=["*"])
    dry = caller.call("ReplayDeadLetters", {"app": "beta", "dry_run": True}, every_admin)
    assert (dry.code, dry.body.get("run_ids")) == ("OK", [objects.beta_dead_run]), dry
    with api_stack.connect() as conn:
        state = conn.execute("select state from runs where id = %s", (objects.beta_dead_run,)).fetchone()
    assert state == {"state": "dead"}, "a dry run changes nothing"


def test_a_replay_may_name_its_dead_runs(caller: Caller, objects: Objects, api_stack: ApiStack) -> None:
    """Runs named are replayed whatever app each is of (within the caller's scope), and only if
    dead; a name that is not an id is refused."""
    before = snapshot(api_stack)
    alpha = {"run_ids": [objects.alpha_dead_run], "dry_run": True}
    dry = caller.call("ReplayDeadLetters", alpha, ALPHA_ADMIN)
    assert (dry.code, dry.body.get("run_ids")) == ("OK", [objects.alpha_dead_run]), dry
    every_admin = token(subject="root-too", roles=(ADMIN,), apps=["*"])
    both = [objects.alpha_dead_run, objects.beta_dead_run]
    dry = caller.call("ReplayDeadLetters", {"run_ids": both, "dry_run": True}, every_admin)
    assert dry.code == "OK" and sorted(dry.body["run_ids"]) == sorted(both), dry
    pending = caller.call("ReplayDeadLetters", {"run_ids": [objects.beta_run]}, every_admin)
    assert pending.code == "FAILED_PRECONDITION", pending
    assert f"run {objects.beta_run} is pending, not dead" in pending.body["message"]
    nonsense = caller.call("ReplayDeadLetters", {"run_ids": ["nonsense"]}, every_admin)
    assert nonsense.code == "INVALID_ARGUMENT", nonsense
    letter = str(uuid.uuid4())
    with api_stack.connect() as conn:  # what the reconciler keeps of a job no worker could decode
        conn.execute(
            "insert into dead_letters (event_id, app, cause, error, original_bytes) "
            "values (%s, 'beta', 'undecodable', 'undecodable: bad bytes', '\\xff')",
            (letter,),
        )
    undecodable = caller.call("ReplayDeadLetters", {"run_ids": [letter]}, every_admin)
    assert undecodable.code == "FAILED_PRECONDITION", undecodable
    assert f"{letter} is an undecodable dead letter, not a run" in undecodable.body["message"]
    unknown = str(uuid.uuid4())
    theirs = caller.call("ReplayDeadLetters", {"run_ids": [letter]}, ALPHA_ADMIN)
    missing = caller.call("ReplayDeadLetters", {"run_ids": [unknown]}, ALPHA_ADMIN)
    assert theirs.code == "NOT_FOUND", theirs
    assert shape(theirs, letter) == shape(missing, unknown), (theirs, missing)
    assert snapshot(api_stack) == before


@pytest.mark.parametrize("apps", [None, [], "", {"alpha": True}], ids=["null", "empty", "blank", "object"])
def test_an_admin_whose_apps_claim_names_no_app_sees_none(
    caller: Caller, objects: Objects, apps: Any
) -> None:
    """Only an admin token that has no apps claim sees every app; an identity provider's null or
    empty claim for "no apps" must not read as "all apps"."""
    bearer = jwt.encode(
        {"sub": "nobody", "exp": int(time.time()) + 600, "roles": [ADMIN], "apps": apps}, SECRET, "HS256"
    )
    schedules = caller.call("ListSchedules", {"limit": 500}, bearer)
    assert schedules.ok and schedules.body["schedules"] == [], schedules
    assert caller.call("GetSchedule", {"id": objects.alpha_schedule}, bearer).code == "NOT_FOUND"
    assert caller.call("ListRuns", {"app": "alpha"}, bearer).code == "NOT_FOUND"
