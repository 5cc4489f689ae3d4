"""What a careless or hostile client cannot do: break a listing for everyone with a payload the API
cannot carry, make a page of large payloads grow without bound, get a 500 with numbers or times
out of range, a cron expression longer than the database holds or a forged cursor, lose a concurrent
update, reach a first response about an app its token no longer sees, or make the API parse a body
before it has shown a token."""

from __future__ import annotations

import base64
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
from google.protobuf import json_format

from scheduler.api.messages import MAX_PAGE_BYTES, encode_cursor
from scheduler.api.service import METHODS
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule import service
from scheduler.schedule.spec import MAX_CRON_LENGTH, MAX_PAYLOAD_DEPTH
from scheduler.store import connect
from tests.api.client import USER, VIEWER, GrpcCaller, HttpCaller, token
from tests.api.conftest import ApiProcess, ApiStack

CREATE = {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 6 * * *"}
CREATED = ("schedule", "create")


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"k": value}
    return value


def test_a_payload_deeper_than_the_api_carries_is_refused_and_an_old_one_never_breaks_a_listing(
    caller: HttpCaller | GrpcCaller, api_stack: ApiStack
) -> None:
    bearer = token(subject=f"deep-{caller.name}", roles=(USER,), apps=["alpha"])
    deepest = caller.call("CreateSchedule", CREATE | {"payload": _nested(MAX_PAYLOAD_DEPTH - 1)}, bearer)
    assert deepest.ok, deepest
    refused = caller.call("CreateSchedule", CREATE | {"payload": _nested(MAX_PAYLOAD_DEPTH + 1)}, bearer)
    assert refused.code == "INVALID_SCHEDULE", refused
    # A row stored before the limit (or by hand) deeper than protobuf carries: shown, not a 500.
    with api_stack.connect() as conn:
        conn.execute(
            "update schedules set payload = %s::jsonb where id = %s",
            (json.dumps(_nested(60)), deepest.body["id"]),
        )
    got = caller.call("GetSchedule", {"id": deepest.body["id"]}, bearer)
    assert got.ok and "nested too deeply" in got.body["payload"], got
    listed = caller.call("ListSchedules", {"app": "alpha", "limit": 500}, bearer)
    assert listed.ok, listed
    audit = caller.call("ListAuditEntries", {"entity_id": deepest.body["id"]}, bearer)
    assert audit.ok, audit


def test_a_page_of_large_payloads_ends_at_its_byte_bound_and_the_walk_still_sees_every_schedule(
    caller: HttpCaller | GrpcCaller, api_stack: ApiStack
) -> None:
    """A viewer's page of 500 schedules of a megabyte each was an answer of half a gigabyte over
    HTTP, and over gRPC past its send limit (RESOURCE_EXHAUSTED, so no gRPC client could page
    through that app); the audit entries of their creation hold the payloads too."""
    app = f"paged-{caller.name}"
    with connect(api_stack.database_url) as conn:
        service.create_app(
            conn, TopicAdmin(api_stack.settings.kafka_bootstrap), api_stack.settings, app, 1, "t"
        )
    writer = token(subject=f"pager-{caller.name}", roles=(USER,), apps=[app])
    large = {"blob": "x" * 900_000}
    ids = []
    for n in range(9):
        request = CREATE | {"app": app, "enabled": False, "payload": large if n >= 3 else {"n": n}}
        created = caller.call("CreateSchedule", request, writer)
        assert created.ok, created.code
        ids.append(created.body["id"])
    viewer = token(subject=f"page-viewer-{caller.name}", roles=(VIEWER,), apps=[app])

    def walk(method: str, items: str) -> list[list[dict[str, Any]]]:
        pages, cursor = [], ""
        while True:
            page = caller.call(method, {"app": app, "limit": 500, "cursor": cursor}, viewer)
            assert page.ok, page.code
            assert page.body.get(items), "a page always holds at least one"
            pages.append(page.body[items])
            if not page.body.get("has_more"):
                return pages
            cursor = page.body["next_cursor"]

    def created_ids(entries: list[list[dict[str, Any]]]) -> list[str]:
        return [e["entity_id"] for page in entries for e in page if (e["entity"], e["action"]) == CREATED]

    pages = walk("ListSchedules", "schedules")
    # 1 MiB holds the three small payloads and one of the large ones, never two.
    assert [len(page) for page in pages] == [4, 1, 1, 1, 1, 1]
    assert [s["id"] for page in pages for s in page] == ids
    for page in pages:
        assert sum(len(json.dumps(s["payload"])) for s in page[1:]) <= MAX_PAGE_BYTES
    entries = walk("ListAuditEntries", "entries")
    assert len(entries) > 1
    assert sorted(created_ids(entries)) == sorted(ids)
    # One row alone over the bound (stored before the limits, or by hand) is a page of its own,
    # and the walk goes on past it.
    with api_stack.connect() as conn:
        conn.execute(
            "update schedules set payload = jsonb_build_object('blob', repeat('y', %s)) where id = %s",
            (MAX_PAGE_BYTES + 100, ids[1]),
        )
        conn.execute(
            "update audit_log set new_value = new_value || jsonb_build_object('blob', repeat('y', %s))"
            " where entity_id = %s and action = 'create'",
            (MAX_PAGE_BYTES + 100, ids[1]),
        )
    pages = walk("ListSchedules", "schedules")
    assert [s["id"] for page in pages for s in page] == ids
    assert [ids[1]] in [[s["id"] for s in page] for page in pages]
    entries = walk("ListAuditEntries", "entries")
    assert sorted(created_ids(entries)) == sorted(ids)


def test_a_cron_expression_longer_than_the_database_holds_is_refused_and_its_payload_never_logged(
    caller: HttpCaller | GrpcCaller, api: ApiProcess
) -> None:
    """It was a 500, and the server's log quoted PostgreSQL's failing row, payload values too."""
    bearer = token(subject=f"long-cron-{caller.name}", roles=(USER,), apps=["alpha"])
    card = f"4111-1111-{caller.name}-1111"
    long_cron = "0," * ((MAX_CRON_LENGTH - 8) // 2) + "0 * * * *"
    assert len(long_cron) > MAX_CRON_LENGTH
    refused = caller.call(
        "CreateSchedule", CREATE | {"cron_expression": long_cron, "payload": {"card": card}}, bearer
    )
    assert refused.code == "INVALID_SCHEDULE", refused
    assert f"at most {MAX_CRON_LENGTH} characters" in json.dumps(refused.body)
    created = caller.call("CreateSchedule", CREATE | {"payload": {"card": card}}, bearer)
    assert created.ok, created.code
    update = {"id": created.body["id"], "cron_expression": long_cron}
    assert caller.call("UpdateSchedule", update, bearer).code == "INVALID_SCHEDULE"
    assert card not in api.component.output()


def test_a_forged_cursor_nested_deeper_than_json_reads_is_refused_not_failed(
    caller: HttpCaller | GrpcCaller,
) -> None:
    bearer = token(subject=f"nested-cursor-{caller.name}")
    cursor = base64.urlsafe_b64encode(b"[" * 3000).decode().rstrip("=")
    for method in ("ListSchedules", "ListRuns", "ListAuditEntries"):
        outcome = caller.call(method, {"cursor": cursor}, bearer)
        assert outcome.code == "INVALID_ARGUMENT", (method, outcome)


def test_numbers_and_times_out_of_range_are_refused_not_failed(http: HttpCaller) -> None:
    bearer = token(subject="ranges")
    one_shot = {"app": "alpha", "handler": "builtin:noop"}
    cases = {
        "a start in year 1": CREATE | {"start_at": "0001-01-01T00:00:00Z"},
        "a start at the end of 9999": CREATE | {"start_at": "9999-12-31T23:59:00Z"},
        "a one-shot in year 1": one_shot | {"run_at": "0001-01-01T00:00:00Z"},
    }
    for name, request in cases.items():
        outcome = http.call("CreateSchedule", request, bearer)
        assert outcome.code == "INVALID_SCHEDULE", (name, outcome)
    for number in ("1e400", "-1e400", "NaN", "Infinity"):
        body = json.dumps(one_shot)[:-1] + f', "payload": {{"x": {number}}}}}'
        answer = http.client.post(
            "/v1/schedules", content=body, headers={"Authorization": f"Bearer {bearer}"}
        )
        assert answer.status_code in (400, 422), (number, answer.text)
    for cursor in (encode_cursor("9999999999999999999"), encode_cursor("²"), encode_cursor("-1")):
        outcome = http.call("ListAuditEntries", {"cursor": cursor}, bearer)
        assert outcome.code == "INVALID_ARGUMENT", (cursor, outcome)


def test_concurrent_updates_without_a_version_both_apply(http: HttpCaller, grpc_caller: GrpcCaller) -> None:
    bearer = token(subject="patcher", roles=(USER,), apps=["alpha"])
    ids = []
    for _ in range(15):
        created = http.call("CreateSchedule", CREATE, bearer)
        assert created.ok, created
        ids.append(created.body["id"])

    def patch(args: tuple[str, int]) -> str:
        schedule_id, index = args
        caller, field = (http, "name") if index % 2 else (grpc_caller, "description")
        return caller.call("UpdateSchedule", {"id": schedule_id, field: f"changed-{field}"}, bearer).code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(patch, [(schedule_id, i) for schedule_id in ids for i in (0, 1)]))
    assert set(codes) == {"OK"}, codes
    for schedule_id in ids:
        final = http.call("GetSchedule", {"id": schedule_id}, bearer).body
        assert (final["name"], final["description"], final["version"]) == (
            "changed-name",
            "changed-description",
            3,
        ), final


def test_a_narrower_token_of_the_same_subject_never_gets_a_first_response_about_another_app(
    http: HttpCaller,
) -> None:
    wide = token(subject="svc", roles=(USER,), apps=["alpha", "beta"])
    narrow = token(subject="svc", roles=(USER,), apps=["alpha"])
    request = {"app": "beta", "handler": "builtin:noop", "cron_expression": "0 7 * * *"}
    first = http.call("CreateSchedule", request, wide, headers={"Idempotency-Key": "cross-scope-1"})
    assert first.ok, first
    again = http.call("CreateSchedule", request, narrow, headers={"Idempotency-Key": "cross-scope-1"})
    assert again.code in ("IDEMPOTENCY_KEY_REUSED", "NOT_FOUND"), again
    assert first.body["id"] not in json.dumps(again.body)


def test_a_large_body_without_a_token_is_refused_unparsed_and_a_trailing_slash_is_no_redirect(
    api: ApiProcess,
) -> None:
    body = b'{"schedules": [' + b",".join([b"{}"] * 2_000_000) + b"]}"
    with httpx.Client(base_url=api.http_url, timeout=60, trust_env=False) as client:
        refused = client.post("/v1/schedules:batchCreate", content=body)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHENTICATED"
        slash = client.get("/v1/schedules/", headers={"Host": "evil.example"})
        assert slash.status_code == 404 and "location" not in slash.headers
        assert slash.json()["error"]["code"] == "NOT_FOUND"


def test_a_query_parameter_or_body_a_route_does_not_take_is_refused_not_dropped(http: HttpCaller) -> None:
    """A misspelt ``limt`` would answer a full page, a second ``app`` one of the two, and a DELETE's
    version in a body would cancel without the check it asked for."""
    bearer = token(subject="strict")
    auth = {"Authorization": f"Bearer {bearer}"}
    created = http.call("CreateSchedule", CREATE | {"name": "strict"}, bearer)
    assert created.ok, created
    schedule = created.body["id"]
    for query, field in (
        ("limt=1&app=alpha", "limt"),
        ("app=alpha&app=beta", "app"),
        ("limit=5_0", "limit"),
        ("limit=%205%20", "limit"),
        ("limit=%2B5", "limit"),
    ):
        answer = http.client.get(f"/v1/schedules?{query}", headers=auth)
        assert answer.status_code == 400, (query, answer.text)
        error = answer.json()["error"]
        assert (error["code"], error["details"].get("field")) == ("INVALID_ARGUMENT", field), (query, error)
    assert http.client.get("/v1/dlq?cursor=x", headers=auth).status_code == 400
    with_body = http.client.request(
        "DELETE", f"/v1/schedules/{schedule}", json={"version": 999}, headers=auth
    )
    assert with_body.status_code == 400 and "takes no body" in with_body.json()["error"]["message"]
    assert http.call("GetSchedule", {"id": schedule}, bearer).body["state"] == "active"
    # Without a token the answer is about the token, whatever the query.
    assert http.client.get("/v1/schedules?limt=1").status_code == 401


def test_an_error_names_what_is_wrong_and_the_field_it_is_in(http: HttpCaller) -> None:
    bearer = token(subject="precise")
    auth = {"Authorization": f"Bearer {bearer}"}
    big = '{"app": "alpha", "handler": "builtin:noop", "payload": {"n": ' + "1" * 5000 + "}}"
    answer = http.client.post("/v1/schedules", content=big, headers=auth)
    assert answer.status_code == 400 and "too many digits" in answer.json()["error"]["message"]
    deep = http.client.post("/v1/schedules", content="[" * 100_000, headers=auth)
    assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]["message"]
    for method, request in (
        ("ListDeadLetters", {"schedule_id": "not-a-uuid"}),
        ("ReplayDeadLetters", {"schedule_id": "not-a-uuid"}),
    ):
        outcome = http.call(method, request, bearer)
        assert (outcome.code, outcome.body["details"].get("field")) == ("INVALID_ARGUMENT", "schedule_id")


def test_a_method_a_path_does_not_take_is_405_with_every_method_it_does(http: HttpCaller) -> None:
    auth = {"Authorization": f"Bearer {token(subject='verbs')}"}
    some_id = "e3e70682-c209-4cac-a29f-6fbed82c07cd"
    for method, path, allowed in (
        ("PUT", f"/v1/schedules/{some_id}", "DELETE, GET, HEAD, PATCH"),
        ("OPTIONS", "/v1/schedules", "GET, HEAD, POST"),
        # A colon ends the id: this is the resume path, not an update of an id ending in ":resume".
        ("PATCH", f"/v1/schedules/{some_id}:resume", "POST"),
        ("POST", "/openapi.json", "GET, HEAD"),
    ):
        answer = http.client.request(method, path, headers=auth, json={"version": 1})
        assert answer.status_code == 405, (method, path, answer.text)
        assert answer.headers["allow"] == allowed and answer.json()["error"]["code"] == "METHOD_NOT_ALLOWED"


def test_a_filter_on_an_app_that_does_not_exist_is_not_found_even_for_an_admin(http: HttpCaller) -> None:
    """An empty page would read as an app with nothing in it, and a typo would go unseen (the CLI
    refuses such an --app too)."""
    admin = token(subject="admin-of-all")  # no apps claim: every app
    for method in ("ListSchedules", "ListRuns", "ListDeadLetters", "ListAuditEntries"):
        outcome = http.call(method, {"app": "no-such-app"}, admin)
        assert outcome.code == "NOT_FOUND", (method, outcome)
        assert http.call(method, {"app": "alpha"}, admin).ok


def test_the_document_says_what_a_request_may_hold(api: ApiProcess) -> None:
    spec = httpx.get(f"{api.http_url}/openapi.json", timeout=10, trust_env=False).json()
    parameters = {p["name"]: p["schema"] for p in spec["paths"]["/v1/schedules"]["get"]["parameters"]}
    assert parameters["state"]["enum"] == ["", "active", "paused", "cancelled", "completed", "error"]
    assert parameters["app"]["pattern"].startswith("^$|")
    body = spec["components"]["schemas"]["CreateScheduleBody"]
    assert {"app", "handler"} <= set(body["required"])
    assert body["properties"]["misfire_policy"]["enum"] == ["", "fire_once", "fire_all", "skip", None]
    [get_one] = spec["paths"]["/v1/schedules/{id}"]["get"]["parameters"]
    assert get_one["schema"]["format"] == "uuid"
    batch = spec["components"]["schemas"]["CreateSchedulesBody"]["properties"]["schedules"]
    assert (batch["minItems"], batch["maxItems"]) == (1, 1000)
    assert "405" in spec["paths"]["/v1/schedules"]["get"]["responses"]


def test_an_empty_time_zone_is_utc_on_create_and_on_update(http: HttpCaller) -> None:
    bearer = token(subject="zones")
    created = http.call("CreateSchedule", CREATE | {"timezone": "Asia/Tokyo"}, bearer)
    assert created.ok and created.body["timezone"] == "Asia/Tokyo", created
    updated = http.call("UpdateSchedule", {"id": created.body["id"], "timezone": ""}, bearer)
    assert updated.ok and updated.body["timezone"] == "UTC", updated
    assert http.call("CreateSchedule", CREATE | {"timezone": ""}, bearer).body["timezone"] == "UTC"


def test_large_batches_sent_at_once_are_applied_one_after_another(
    http: HttpCaller, grpc_caller: GrpcCaller
) -> None:
    """Batches over 4 MiB are read and applied one at a time (four of 28 MiB at once took the API
    past its memory limit): sent together over both transports, each is still created whole."""
    bearer = token(subject="bulk")
    blob = "ab" * 450_000  # 900 KB of payload, six a batch: over 5 MiB

    def batch(tag: str) -> dict[str, Any]:
        return {
            "schedules": [CREATE | {"name": f"bulk-{tag}-{i}", "payload": {"blob": blob}} for i in range(6)]
        }

    callers: list[HttpCaller | GrpcCaller] = [http, http, http, grpc_caller, grpc_caller]
    with ThreadPoolExecutor(len(callers)) as pool:
        outcomes = list(
            pool.map(lambda n: callers[n].call("CreateSchedules", batch(str(n)), bearer), range(5))
        )
    assert [o.code for o in outcomes] == ["OK"] * 5, [o.body for o in outcomes if not o.ok]
    assert sorted(len(o.body["schedules"]) for o in outcomes) == [6] * 5
    # Without a token, a large body is refused on its token, not held behind the others' turn.
    body = json.dumps(batch("anonymous")).encode()
    with httpx.Client(base_url=http.client.base_url, timeout=60, trust_env=False) as client:
        refused = client.post("/v1/schedules:batchCreate", content=body)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHENTICATED"
    # A viewer may not create: refused at once, over either transport, never waiting for a turn.
    viewer = token(subject="looker", roles=(VIEWER,))
    for caller in (http, grpc_caller):
        assert caller.call("CreateSchedules", batch("viewer"), viewer).code == "PERMISSION_DENIED"


def test_a_client_that_stalls_in_a_large_body_holds_no_other_batch_back(
    api: ApiProcess, http: HttpCaller
) -> None:
    """The turn of a large body is bounded: its body must come within 20 s of taking it."""
    bearer = token(subject="stalls")
    host, port = api.http_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as stalled:
        stalled.sendall(
            b"POST /v1/schedules:batchCreate HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {bearer}\r\nContent-Length: {6 * 1024 * 1024}\r\n\r\n".encode()
            + b'{"schedules": ['
            + b" " * (5 * 1024 * 1024)
        )  # and nothing more
        started = time.monotonic()
        batch = {
            "schedules": [
                CREATE | {"name": f"after-stall-{i}", "payload": {"blob": "cd" * 450_000}} for i in range(6)
            ]
        }
        after = http.call("CreateSchedules", batch, bearer)
        assert after.ok, after
        assert time.monotonic() - started < 45, "it waited out the stalled body's 20 s, no more"
        answer = stalled.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 400") and "did not arrive within 20 s" in answer, answer[:300]


def test_a_request_that_says_one_thing_twice_is_refused_not_read_one_way(
    http: HttpCaller, grpc_caller: GrpcCaller, api_stack: ApiStack
) -> None:
    """A proxy or firewall in front that reads the other copy would judge another request than the
    API serves: a key twice in a JSON object, two tokens, two idempotency keys."""
    bearer = token(subject="twice", roles=(USER,), apps=["alpha", "beta"])
    auth = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"}
    name = f"twice-{time.time_ns()}"
    bodies = (
        f'{{"app": "beta", "handler": "builtin:noop", "name": "{name}", "app": "alpha"}}',
        f'{{"app": "alpha", "handler": "builtin:noop", "name": "{name}", "payload": {{"to": 1, "to": 2}}}}',
    )
    for body in bodies:
        answer = http.client.post("/v1/schedules", content=body, headers=auth)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "INVALID_ARGUMENT" and "a key twice" in error["message"]
    two_tokens = [("Authorization", f"Bearer {bearer}"), ("Authorization", "Bearer garbage")]
    for headers in (two_tokens, two_tokens[::-1]):
        answer = http.client.post("/v1/schedules", json=CREATE | {"name": name}, headers=headers)
        assert answer.status_code == 401 and "send one" in answer.json()["error"]["message"], answer.text
    keys = [*auth.items(), ("Idempotency-Key", "k1"), ("Idempotency-Key", "k2")]
    answer = http.client.post("/v1/schedules", json=CREATE | {"name": name}, headers=keys)
    assert answer.status_code == 400 and "more than once" in answer.json()["error"]["message"], answer.text
    # Only once the caller is known: without a token the answer is about the token.
    anonymous = http.client.get(
        "/v1/schedules", headers=[("Idempotency-Key", "k1"), ("Idempotency-Key", "k2")]
    )
    assert anonymous.status_code == 401, anonymous.text
    message = grpc_caller.stub.ListSchedules
    try:
        message(
            json_format.ParseDict({}, METHODS["ListSchedules"].request()),
            metadata=[("authorization", f"Bearer {bearer}"), ("authorization", "Bearer garbage")],
            timeout=30,
        )
        raise AssertionError("two tokens over gRPC were taken")
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
    with api_stack.connect() as conn:
        made = conn.execute("select count(*) as n from schedules where name = %s", (name,)).fetchone()
    assert made == {"n": 0}
