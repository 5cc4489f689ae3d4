"""Both transports are one API: the same scripted calls give the same outcomes in the same order and
leave the same rows in PostgreSQL; pages stay stable while schedules are created; batches are all
or nothing; and the caps on payloads, bodies, strings and pages hold on either transport.
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.api.client import GrpcCaller, HttpCaller, Outcome, token
from tests.api.conftest import ApiStack
from tests.support import wait_for

Caller = HttpCaller | GrpcCaller

# What a user reads for each outcome: the HTTP status and the gRPC status code.
WIRE: dict[str, tuple[int, grpc.StatusCode]] = {
    "OK": (200, grpc.StatusCode.OK),
    "INVALID_ARGUMENT": (400, grpc.StatusCode.INVALID_ARGUMENT),
    "INVALID_SCHEDULE": (422, grpc.StatusCode.INVALID_ARGUMENT),
    "ALREADY_EXISTS": (409, grpc.StatusCode.ALREADY_EXISTS),
    "VERSION_CONFLICT": (409, grpc.StatusCode.ABORTED),
    "FAILED_PRECONDITION": (409, grpc.StatusCode.FAILED_PRECONDITION),
    "PAYLOAD_TOO_LARGE": (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
}
# Whole numbers must stay integers through gRPC's doubles; fractions, nesting and nulls survive too.
PAYLOAD: dict[str, Any] = {
    "count": 3,
    "ratio": 0.25,
    "big": 9_007_199_254_740_991,
    "nested": {"list": [1, 2.5, "three", True, None], "empty": {}},
}
RETRY = {"max_attempts": 5, "backoff_seconds": 1.5, "max_backoff_seconds": 60.0}
MIB = 1024 * 1024


def check(outcome: Outcome, code: str, what: str) -> Outcome:
    """``outcome`` is ``code``, with that code's status on the transport it came by."""
    assert outcome.code == code, f"{what}: expected {code}, got {outcome.code} {outcome.body}"
    http_status, grpc_status = WIRE[code]
    if outcome.http_status is not None:
        assert outcome.http_status == http_status, f"{what}: HTTP {outcome.http_status}"
    else:
        assert outcome.grpc_status == grpc_status, f"{what}: gRPC {outcome.grpc_status}"
    return outcome


def undecodable(caller: GrpcCaller, method: str, bearer: str) -> Outcome:
    """Bytes that are no request message (a field's length running past the end), sent raw."""
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = caller.channel.unary_unary(
        f"/scheduler.v1.SchedulerService/{method}"
    )
    try:
        call(b"\x0a\xff", metadata=(("authorization", f"Bearer {bearer}"),), timeout=30)
    except grpc.RpcError as error:
        status = rpc_status.from_call(error)
        reason = ""
        for detail in status.details if status is not None else ():
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                reason = info.reason
        code: grpc.StatusCode = error.code()
        return Outcome(reason or code.name, {"message": error.details()}, grpc_status=code)
    raise AssertionError("the server accepted bytes that are no request")


@dataclass
class Session:
    """One transport's run of the script: its caller, its principal, its own schedule keys."""

    caller: Caller
    stack: ApiStack
    subject: str
    prefix: str
    app: str = "alpha"
    codes: list[tuple[str, str]] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    """The entity id of each successful write, in order: what the audit log must hold."""

    @property
    def bearer(self) -> str:
        return token(self.subject)

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def outcome(self, step: str, outcome: Outcome, expected: str) -> dict[str, Any]:
        self.codes.append((step, outcome.code))
        return check(outcome, expected, f"{self.caller.name} {step}").body

    def call(self, step: str, method: str, request: dict[str, Any], expected: str = "OK") -> dict[str, Any]:
        return self.outcome(step, self.caller.call(method, request, self.bearer), expected)

    def write(self, step: str, method: str, request: dict[str, Any], entity: str = "") -> dict[str, Any]:
        body = self.call(step, method, request)
        self.writes.append(entity or body["id"])
        return body

    def create(self, step: str, request: dict[str, Any]) -> dict[str, Any]:
        body = self.write(step, "CreateSchedule", {"app": self.app, "handler": "builtin:noop"} | request)
        self.schedules.append(body["id"])
        return body

    def walk(self, step: str, method: str, request: dict[str, Any], items: str) -> list[dict[str, Any]]:
        """Every page of a listing, following next_cursor, each within the limit: one step however
        many pages (the other transport's schedules may lengthen it)."""
        listed: list[dict[str, Any]] = []
        cursor = ""
        for _ in range(1000):
            outcome = self.caller.call(method, request | {"cursor": cursor}, self.bearer)
            page = check(outcome, "OK", f"{self.caller.name} {step}").body
            assert len(page[items]) <= request["limit"]
            assert page["has_more"] == bool(page["next_cursor"])
            listed += page[items]
            if not page["has_more"]:
                self.codes.append((step, "OK"))
                return listed
            cursor = page["next_cursor"]
        raise AssertionError(f"{step}: the listing did not end")

    def malformed(self, step: str) -> dict[str, Any]:
        if isinstance(self.caller, HttpCaller):
            request = {"app": self.app, "handler": "builtin:noop", "colour": "blue"}
            error = self.call(step, "CreateSchedule", request, "INVALID_ARGUMENT")
            assert error["details"] == {"field": "colour"}, error
            return error
        return self.outcome(step, undecodable(self.caller, "CreateSchedule", self.bearer), "INVALID_ARGUMENT")


def run_script(s: Session, run_at: str) -> None:
    """Every method of the service, once or more, with the refusals a client meets."""
    cron = s.create(
        "create cron",
        {
            "schedule_key": s.key("nightly"),
            "name": "nightly report",
            "description": "The nightly report, mailed to the team",
            "cron_expression": "0 3 * * *",
            "timezone": "Europe/Paris",
            "payload": PAYLOAD,
            "retry_config": RETRY,
            "timeout_seconds": 30,
            "misfire_policy": "skip",
            "overlap_policy": "skip",
        },
    )
    assert (cron["kind"], cron["state"], cron["enabled"], cron["version"]) == ("cron", "active", True, 1)
    assert cron["schedule_key"] == s.key("nightly")
    assert cron["payload"] == PAYLOAD and cron["retry_config"] == RETRY
    assert cron["next_run_time"]
    delayed = s.create(
        "create delayed",
        {"schedule_key": s.key("reminder"), "name": "reminder", "run_at": run_at, "payload": {"to": "ops"}},
    )
    assert delayed["kind"] == "delayed"
    assert datetime.fromisoformat(delayed["run_at"]) == datetime.fromisoformat(run_at)
    immediate = s.create(
        "create immediate",
        {"schedule_key": s.key("now"), "name": "one-off", "retry_config": {"max_attempts": 1}},
    )
    assert immediate["kind"] == "immediate"
    disabled = s.create(
        "create disabled",
        {
            "schedule_key": s.key("later"),
            "name": "disabled",
            "cron_expression": "*/5 * * * *",
            "enabled": False,
        },
    )
    assert (disabled["state"], disabled["enabled"]) == ("paused", False)
    mine = [cron["id"], delayed["id"], immediate["id"], disabled["id"]]

    assert s.call("get", "GetSchedule", {"id": cron["id"]}) == cron

    listed = [
        row["id"] for row in s.walk("list by app", "ListSchedules", {"app": s.app, "limit": 2}, "schedules")
    ]
    assert len(listed) == len(set(listed))
    assert [i for i in listed if i in mine] == mine, "a listing is in creation order"
    filters: list[tuple[dict[str, Any], set[str]]] = [
        ({"state": "paused"}, {disabled["id"]}),
        ({"enabled": False}, {disabled["id"]}),
        ({"enabled": True}, {cron["id"], delayed["id"], immediate["id"]}),
    ]
    for request, wanted in filters:
        rows = s.walk(f"list {request}", "ListSchedules", {"app": s.app, "limit": 2} | request, "schedules")
        assert {row["id"] for row in rows} & set(mine) == wanted, request
        if "state" in request:
            assert {row["state"] for row in rows} == {request["state"]}
        else:
            assert {row["enabled"] for row in rows} == {request["enabled"]}

    changed = s.write("update", "UpdateSchedule", {"id": cron["id"], "description": "Mailed at dawn"})
    assert (changed["description"], changed["version"]) == ("Mailed at dawn", 2)
    assert changed["cron_expression"] == "0 3 * * *", "fields not given stay"
    changed = s.write(
        "update at version",
        "UpdateSchedule",
        {"id": cron["id"], "version": 2, "cron_expression": "30 4 * * *"},
    )
    assert (changed["cron_expression"], changed["version"]) == ("30 4 * * *", 3)
    s.call(
        "update stale", "UpdateSchedule", {"id": cron["id"], "version": 1, "name": "x"}, "VERSION_CONFLICT"
    )
    paused = s.write("update disable", "UpdateSchedule", {"id": cron["id"], "enabled": False})
    assert (paused["state"], paused["enabled"]) == ("paused", False)
    active = s.write("update enable", "UpdateSchedule", {"id": cron["id"], "enabled": True})
    assert (active["state"], active["enabled"]) == ("active", True)
    assert s.write("pause", "PauseSchedule", {"id": cron["id"]})["state"] == "paused"
    assert s.write("resume", "ResumeSchedule", {"id": cron["id"]})["state"] == "active"

    first = s.write("trigger", "TriggerSchedule", {"id": cron["id"]}, entity=cron["id"])
    second = s.write("trigger again", "TriggerSchedule", {"id": cron["id"]}, entity=cron["id"])
    assert first["schedule_id"] == cron["id"] and first["run_id"] != second["run_id"]
    page = s.call("history", "GetScheduleHistory", {"id": cron["id"], "limit": 1})
    assert [run["id"] for run in page["runs"]] == [second["run_id"]], "newest first"
    assert page["has_more"] and page["next_cursor"]
    page = s.call(
        "history page 2", "GetScheduleHistory", {"id": cron["id"], "limit": 1, "cursor": page["next_cursor"]}
    )
    assert [run["id"] for run in page["runs"]] == [first["run_id"]]
    assert not page["has_more"] and not page["next_cursor"]
    run = s.call("get run", "GetRun", {"id": first["run_id"]})
    assert (run["schedule_id"], run["app"], run["state"]) == (cron["id"], s.app, "pending")
    assert run["max_attempts"] == RETRY["max_attempts"]

    # No worker runs here: the run dies as a worker's dead event would leave it.
    with s.stack.connect() as conn:
        conn.execute(
            "update runs set state = 'dead', finished_at = now(), error = 'HTTP503: upstream down' "
            "where id = %s",
            (first["run_id"],),
        )
    dead = s.call("dead letters", "ListDeadLetters", {"app": s.app, "schedule_id": cron["id"]})
    assert [(d["id"], d["kind"], d["schedule_id"]) for d in dead["dead_letters"]] == [
        (first["run_id"], "run", cron["id"])
    ]
    by_class = {"app": s.app, "error_class": "HTTP503"}
    assert [d["id"] for d in s.call("by class", "ListDeadLetters", by_class)["dead_letters"]] == [
        first["run_id"]
    ]
    other = by_class | {"error_class": "Timeout"}
    assert s.call("another class", "ListDeadLetters", other)["dead_letters"] == []
    replay = {"app": s.app, "schedule_id": cron["id"]}
    dry = s.call("replay dry run", "ReplayDeadLetters", replay | {"dry_run": True})
    assert (dry["replayed"], dry["run_ids"], dry["dry_run"]) == (1, [first["run_id"]], True)
    assert s.call("still dead", "GetRun", {"id": first["run_id"]})["state"] == "dead"
    done = s.write("replay", "ReplayDeadLetters", replay, entity=first["run_id"])
    assert (done["replayed"], done["run_ids"], done["dry_run"]) == (1, [first["run_id"]], False)
    assert s.call("replayed run", "GetRun", {"id": first["run_id"]})["state"] != "dead"
    assert s.call("no dead letters", "ListDeadLetters", replay)["dead_letters"] == []

    cancelled = s.write("delete", "DeleteSchedule", {"id": cron["id"]})
    assert (cancelled["state"], cancelled["enabled"]) == ("cancelled", False)
    assert s.call("get cancelled", "GetSchedule", {"id": cron["id"]})["state"] == "cancelled"
    s.call("resume cancelled", "ResumeSchedule", {"id": cron["id"]}, "FAILED_PRECONDITION")
    invalid = {"app": s.app, "handler": "builtin:noop", "cron_expression": "every day at noon"}
    s.call("invalid cron", "CreateSchedule", invalid, "INVALID_SCHEDULE")
    taken = {"app": s.app, "handler": "builtin:noop", "schedule_key": s.key("reminder")}
    s.call("taken key", "CreateSchedule", taken, "ALREADY_EXISTS")
    s.call("malformed id", "GetSchedule", {"id": "schedule-1"}, "INVALID_ARGUMENT")
    s.malformed("malformed request")

    entries = s.walk("audit", "ListAuditEntries", {"actor": f"api:{s.subject}", "limit": 5}, "entries")
    assert {entry["actor"] for entry in entries} == {f"api:{s.subject}"}
    assert [entry["entity_id"] for entry in reversed(entries)] == s.writes, "every write, in order"


TIME_TEXT = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?")
# Each create's own trace: no two schedules share it, whichever transport created them.
UNIQUE_PER_CALL = ("traceparent",)


def normalised(value: Any, names: dict[str, str]) -> Any:
    """``value`` with times (also as text, in audit values) as a marker and every id and key
    prefix as its label."""
    if isinstance(value, dict):
        return {k: normalised(v, names) for k, v in value.items() if k not in UNIQUE_PER_CALL}
    if isinstance(value, list):
        return [normalised(v, names) for v in value]
    if isinstance(value, datetime):
        return "<time>"
    if isinstance(value, uuid.UUID):
        value = str(value)
    if isinstance(value, str):
        for text, label in names.items():
            value = value.replace(text, label)
        value = TIME_TEXT.sub("<time>", value)
    return value


def stored(stack: ApiStack, s: Session) -> dict[str, Any]:
    """The session's schedules, their runs and its audit entries as PostgreSQL holds them."""
    names = {schedule_id: f"<schedule {n}>" for n, schedule_id in enumerate(s.schedules)}
    with stack.connect() as conn:
        schedules = conn.execute(
            "select s.*, k.schedule_key from schedules s join schedule_keys k on k.schedule_id = s.id "
            "where s.id = any(%s::uuid[]) order by s.created_at, s.id",
            (s.schedules,),
        ).fetchall()
        runs = conn.execute(
            "select * from runs where schedule_id = any(%s::uuid[]) order by created_at, id", (s.schedules,)
        ).fetchall()
        names |= {str(run["id"]): f"<run {n}>" for n, run in enumerate(runs)}
        audit = conn.execute(
            "select actor, action, entity, entity_id, old_value, new_value from audit_log "
            "where actor = %s order by id",
            (f"api:{s.subject}",),
        ).fetchall()
    names |= {s.prefix: "<prefix>", f"api:{s.subject}": "<actor>"}
    state: dict[str, Any] = normalised({"schedules": schedules, "runs": runs, "audit": audit}, names)
    return state


def test_both_transports_give_the_same_outcomes_and_store_the_same(
    api_stack: ApiStack, http: HttpCaller, grpc_caller: GrpcCaller
) -> None:
    run_at = (datetime.now(UTC) + timedelta(days=7)).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    by_http = Session(http, api_stack, "parity-http", f"h{uuid.uuid4().hex[:6]}-")
    by_grpc = Session(grpc_caller, api_stack, "parity-grpc", f"g{uuid.uuid4().hex[:6]}-")
    run_script(by_http, run_at)
    run_script(by_grpc, run_at)
    assert by_http.codes == by_grpc.codes
    assert stored(api_stack, by_http) == stored(api_stack, by_grpc)


def test_pages_neither_repeat_nor_skip_while_schedules_are_created(
    api_stack: ApiStack, caller: Caller
) -> None:
    bearer = token("pager")
    tag = uuid.uuid4().hex[:8]

    def create(name: str) -> str:
        request = {"app": "beta", "handler": "builtin:noop", "name": name, "enabled": False}
        schedule_id: str = check(caller.call("CreateSchedule", request, bearer), "OK", name).body["id"]
        return schedule_id

    initial = [create(f"{tag}-initial-{n}") for n in range(24)]
    walking = threading.Event()
    during: list[str] = []

    def create_more() -> None:
        walking.wait(30)
        for n in range(12):
            during.append(create(f"{tag}-during-{n}"))

    def created_since(count: int) -> bool:
        return len(during) > count or not creator.is_alive()

    creator = threading.Thread(target=create_more)
    creator.start()
    seen: list[str] = []
    pages = 0
    try:
        walking.set()
        cursor = ""
        while True:
            request = {"app": "beta", "state": "paused", "limit": 3, "cursor": cursor}
            page = check(caller.call("ListSchedules", request, bearer), "OK", "list").body
            seen += [row["id"] for row in page["schedules"]]
            pages += 1
            if not page["has_more"]:
                break
            cursor = page["next_cursor"]
            # Schedules are created between pages (until the creator is done), however threads run.
            wait_for(partial(created_since, len(during)), 30, "a schedule created between two pages")
    finally:
        creator.join(60)
    assert len(during) == 12 and pages > len(initial) // 3
    assert len(seen) == len(set(seen)), "no schedule on two pages"
    assert [i for i in seen if i in set(initial)] == initial, "every schedule there at the start, in order"


def schedules_named(stack: ApiStack, prefix: str) -> int:
    with stack.connect() as conn:
        row = conn.execute(
            "select count(*) as n from schedules where name like %s", (f"{prefix}%",)
        ).fetchone()
    assert row is not None and isinstance(row["n"], int)
    return row["n"]


def test_a_batch_of_1000_is_created_and_listed(api_stack: ApiStack, caller: Caller) -> None:
    bearer = token("batcher")
    tag = uuid.uuid4().hex[:8]
    batch = [
        {"app": "beta", "handler": "builtin:noop", "name": f"{tag}-{n}", "payload": {"n": n}}
        for n in range(1000)
    ]
    created = check(caller.call("CreateSchedules", {"schedules": batch}, bearer), "OK", "batch").body
    ids = [row["id"] for row in created["schedules"]]
    assert [row["name"] for row in created["schedules"]] == [item["name"] for item in batch]
    assert [row["payload"] for row in created["schedules"]] == [{"n": n} for n in range(1000)]
    listed: set[str] = set()
    cursor = ""
    while True:
        page = check(
            caller.call("ListSchedules", {"app": "beta", "limit": 500, "cursor": cursor}, bearer),
            "OK",
            "list",
        ).body
        listed |= {row["id"] for row in page["schedules"]}
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert set(ids) <= listed


def test_a_batch_with_one_invalid_schedule_creates_none(api_stack: ApiStack, caller: Caller) -> None:
    bearer = token("batcher")
    tag = uuid.uuid4().hex[:8]
    batch = [{"app": "beta", "handler": "builtin:noop", "name": f"{tag}-{n}"} for n in range(10)]
    batch[7]["cron_expression"] = "61 * * * *"
    refused = check(caller.call("CreateSchedules", {"schedules": batch}, bearer), "INVALID_SCHEDULE", "batch")
    assert str(refused.body["details"]["index"]) == "7"
    assert schedules_named(api_stack, tag) == 0


def test_a_batch_of_1001_is_refused(api_stack: ApiStack, caller: Caller) -> None:
    tag = uuid.uuid4().hex[:8]
    batch = [{"app": "beta", "handler": "builtin:noop", "name": f"{tag}-{n}"} for n in range(1001)]
    check(caller.call("CreateSchedules", {"schedules": batch}, token()), "INVALID_ARGUMENT", "batch of 1001")
    assert schedules_named(api_stack, tag) == 0


def test_a_payload_over_1_mib_is_refused_and_nothing_stored(api_stack: ApiStack, caller: Caller) -> None:
    tag = uuid.uuid4().hex[:8]
    # {"blob":"…"} encoded: 11 bytes around the string.
    request = {"app": "alpha", "handler": "builtin:noop", "name": tag, "payload": {"blob": "x" * (MIB - 10)}}
    refused = check(caller.call("CreateSchedule", request, token()), "PAYLOAD_TOO_LARGE", "payload")
    assert str(refused.body["details"]["limit_bytes"]) == str(MIB)
    assert schedules_named(api_stack, tag) == 0
    request["payload"] = {"blob": "x" * (MIB - 11)}  # exactly the limit
    check(caller.call("CreateSchedule", request, token()), "OK", "payload at the limit")
    assert schedules_named(api_stack, tag) == 1


def test_an_http_body_over_4_mib_is_refused(api_stack: ApiStack, http: HttpCaller) -> None:
    tag = uuid.uuid4().hex[:8]
    body = {"app": "alpha", "handler": "builtin:noop", "name": tag, "payload": ["x" * MIB] * 4}
    response = http.client.post("/v1/schedules", json=body, headers={"Authorization": f"Bearer {token()}"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert schedules_named(api_stack, tag) == 0


def test_a_name_over_200_characters_is_not_a_schedule(api_stack: ApiStack, caller: Caller) -> None:
    request = {"app": "alpha", "handler": "builtin:noop", "name": "n" * 201}
    check(caller.call("CreateSchedule", request, token()), "INVALID_SCHEDULE", "long name")
    request["name"] = "n" * 200
    check(caller.call("CreateSchedule", request, token()), "OK", "name of 200")


LONG = "z" * 5000


@pytest.mark.parametrize(
    ("method", "request_json"),
    [
        ("CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "name": LONG}),
        ("CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "description": LONG}),
        ("CreateSchedule", {"app": "alpha", "handler": LONG}),
        ("CreateSchedule", {"app": LONG, "handler": "builtin:noop"}),
        ("CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "schedule_key": LONG}),
        ("CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "cron_expression": LONG}),
        ("CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "timezone": LONG}),
        (
            "CreateSchedules",
            {"schedules": [{"app": "alpha", "handler": "builtin:noop", "misfire_policy": LONG}]},
        ),
        ("GetSchedule", {"id": LONG}),
        ("ListSchedules", {"app": "alpha", "state": LONG}),
        ("ListAuditEntries", {"actor": LONG}),
        ("ReplayDeadLetters", {"app": "alpha", "error_class": LONG, "dry_run": True}),
    ],
    ids=lambda value: value if isinstance(value, str) else ",".join(value)[:60],
)
def test_a_5000_character_string_is_malformed(
    caller: Caller, method: str, request_json: dict[str, Any]
) -> None:
    outcome = check(caller.call(method, request_json, token()), "INVALID_ARGUMENT", f"{method} long string")
    assert LONG not in str(outcome.body), "the error does not echo the value"


NUL = "a\x00b"


@pytest.mark.parametrize(
    ("method", "request_json"),
    [
        ("CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "name": NUL}),
        ("CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "schedule_key": NUL}),
        ("CreateSchedule", {"app": "alpha", "handler": "builtin:noop", "payload": {"text": NUL}}),
        ("ListSchedules", {"app": NUL}),
        ("ListDeadLetters", {"app": NUL}),
        ("ListAuditEntries", {"app": NUL}),
        ("ListAuditEntries", {"actor": NUL}),
        ("ListAuditEntries", {"entity_id": NUL}),
        ("ReplayDeadLetters", {"app": NUL, "dry_run": True}),
        ("ReplayDeadLetters", {"app": "alpha", "error_class": NUL, "dry_run": True}),
    ],
    ids=lambda value: value if isinstance(value, str) else ",".join(value)[:60],
)
def test_a_nul_character_is_the_requests_fault(
    caller: Caller, method: str, request_json: dict[str, Any]
) -> None:
    """PostgreSQL's text cannot hold one: a request with one is refused as the client's (4xx),
    like any other string no field takes, and never reaches a statement to fail there (500)."""
    outcome = caller.call(method, request_json, token())
    assert outcome.code in ("INVALID_ARGUMENT", "INVALID_SCHEDULE"), (
        f"{method}: {outcome.code} {outcome.body}"
    )


@pytest.mark.parametrize(
    "method", ["ListSchedules", "ListRuns", "ListDeadLetters", "ListAuditEntries", "GetScheduleHistory"]
)
def test_a_page_of_501_is_refused(caller: Caller, method: str) -> None:
    request: dict[str, Any] = {"limit": 501}
    if method == "GetScheduleHistory":
        created = caller.call("CreateSchedule", {"app": "alpha", "handler": "builtin:noop"}, token())
        request["id"] = check(created, "OK", "create").body["id"]
    check(caller.call(method, request, token()), "INVALID_ARGUMENT", f"{method} limit 501")
    check(caller.call(method, request | {"limit": 500}, token()), "OK", f"{method} limit 500")
