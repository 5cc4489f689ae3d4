"""How the API reads what a client may get wrong in a well-formed request: times whose offset does
not exist, keys a person cannot read back, empty strings in an update, an app that is not there.
Each is refused with one line naming the field as the client sent it, the same on both transports
where both carry it, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.client import GrpcCaller, HttpCaller, token
from tests.api.conftest import ApiStack

pytestmark = pytest.mark.e2e

ROOT = token(subject="rules")  # an admin of every app
CRON = {"app": "alpha", "handler": "builtin:noop", "cron_expression": "0 6 * * *"}
ONE_SHOT = {"app": "alpha", "handler": "builtin:noop"}


def _stored(api_stack: ApiStack, name: str) -> int:
    with api_stack.connect() as conn:
        row = conn.execute("select count(*) as n from schedules where name = %s", (name,)).fetchone()
    assert row is not None and isinstance(row["n"], int)
    return row["n"]


@pytest.mark.parametrize(
    "moment",
    [
        "2027-01-01T09:00:00+25:00",
        "2027-01-01T09:00:00-24:00",
        "2027-01-01T09:00:00+02:60",
        "2027-01-01T09:00:00-00:60",
        "2027-01-01T09:00:00+ 2:00",
        "2027-01-01T09:00:00+2:00",
        "2027-01-01T09:00:00+0200",
        "2027-1-1T9:00:00Z",
        "2027-01-01 09:00:00Z",
        "2027-01-01t09:00:00z",
        "2027-13-01T09:00:00Z",
        "2027-04-31T09:00:00Z",
        "2027-01-01T09:00:00",
    ],
)
def test_a_time_with_an_offset_that_does_not_exist_or_in_another_form_is_refused_naming_its_field(
    api_stack: ApiStack, http: HttpCaller, moment: str
) -> None:
    name = f"odd-time-{moment}"
    requests: list[tuple[str, dict[str, Any], str]] = [
        ("CreateSchedule", ONE_SHOT | {"name": name, "run_at": moment}, "run_at"),
        ("CreateSchedule", CRON | {"name": name, "start_at": moment}, "start_at"),
        ("CreateSchedule", CRON | {"name": name, "end_at": moment}, "end_at"),
        ("CreateSchedules", {"schedules": [CRON | {"name": name}, ONE_SHOT | {"run_at": moment}]},
         "schedules[1].run_at"),
        ("ListDeadLetters", {"since": moment}, "since"),
        ("ListAuditEntries", {"since": moment}, "since"),
    ]  # fmt: skip
    for method, request, field in requests:
        outcome = http.call(method, request, ROOT)
        assert (outcome.http_status, outcome.code) == (400, "INVALID_ARGUMENT"), (method, outcome)
        assert outcome.body["details"] == {"field": field}, outcome
        assert outcome.body["message"].startswith(f"{field} must be an RFC 3339 time"), outcome
    created = http.call("CreateSchedule", CRON | {"name": f"{name}-ok"}, ROOT)
    assert created.ok, created
    patched = http.call("UpdateSchedule", {"id": created.body["id"], "start_at": moment}, ROOT)
    assert (patched.code, patched.body["details"]) == ("INVALID_ARGUMENT", {"field": "start_at"}), patched
    assert _stored(api_stack, name) == 0


def test_every_offset_that_exists_is_read_as_the_instant_it_names(http: HttpCaller) -> None:
    for moment, instant in (
        ("2027-01-01T09:00:00+23:59", "2026-12-31T09:01:00Z"),
        ("2027-01-01T09:00:00-23:59", "2027-01-02T08:59:00Z"),
        ("2027-01-01T09:00:00+05:30", "2027-01-01T03:30:00Z"),
        ("2027-01-01T09:00:00-00:00", "2027-01-01T09:00:00Z"),
        ("2027-01-01T09:00:00.5Z", "2027-01-01T09:00:00.500Z"),
    ):
        created = http.call("CreateSchedule", ONE_SHOT | {"run_at": moment}, ROOT)
        assert created.ok and created.body["run_at"] == instant, (moment, created)


def test_the_document_gives_the_form_of_a_time(http: HttpCaller) -> None:
    spec = http.client.get("/openapi.json").json()
    run_at = spec["components"]["schemas"]["CreateScheduleBody"]["properties"]["run_at"]
    assert run_at["format"] == "date-time" and "2[0-3]" in run_at["pattern"], run_at
    assert "pattern" not in spec["components"]["schemas"]["Schedule"]["properties"]["run_at"]


BAD_KEYS = [" leading", "trailing ", "tab\there", "new\nline", "carriage\rreturn", "del\x7f",
            "nbsp\xa0inside", "zero\u200bwidth", "line\u2028separator", "joiner\u200d",
            "\u200cnon-joiner", "x" * 201, "soft\u00adhyphen", "grapheme\u034fjoiner", "letter\u061cmark",
            "hangul\u3164filler", "khmer\u17b4vowel", "mongolian\u180eseparator", "anchor\ufff9"]  # fmt: skip


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_a_schedule_key_a_person_cannot_read_back_is_refused_on_both_transports(
    api_stack: ApiStack, caller: HttpCaller | GrpcCaller, key: str
) -> None:
    name = f"bad-key-{caller.name}-{BAD_KEYS.index(key)}"
    outcome = caller.call("CreateSchedule", CRON | {"name": name, "schedule_key": key}, ROOT)
    assert outcome.code == "INVALID_SCHEDULE" and outcome.http_status in (None, 422), outcome
    assert outcome.body["details"] == {"field": "schedule_key"}, outcome
    assert "schedule key" in outcome.body["message"] and "no tab, line break" in outcome.body["message"]
    batch = caller.call("CreateSchedules", {"schedules": [CRON | {"name": name, "schedule_key": key}]}, ROOT)
    assert batch.code == "INVALID_SCHEDULE", batch
    assert batch.body["details"] in (
        {"field": "schedules[0].schedule_key", "index": 0},
        {"field": "schedules[0].schedule_key", "index": "0"},
    )
    assert batch.body["message"].startswith("schedules[0]: schedule key"), batch
    assert _stored(api_stack, name) == 0


def test_a_schedule_key_in_any_script_with_inner_spaces_is_kept_as_written(
    caller: HttpCaller | GrpcCaller,
) -> None:
    # Persian needs the zero-width non-joiner, an emoji family the joiner: between characters both are
    # part of the text, not invisible padding.
    for key in (f"rapport été 日本 {caller.name}", f"می\u200cخواهم 👨\u200d👩\u200d👧 {caller.name}"):
        created = caller.call("CreateSchedule", CRON | {"schedule_key": key}, ROOT)
        assert created.ok and created.body["schedule_key"] == key, created


@pytest.mark.parametrize("key", [*BAD_KEYS, "café"], ids=repr)
def test_an_idempotency_key_outside_printable_ascii_is_refused_in_the_body_and_over_grpc(
    api_stack: ApiStack, caller: HttpCaller | GrpcCaller, key: str
) -> None:
    name = f"bad-idem-{caller.name}-{len(key)}-{key.isascii()}"
    outcome = caller.call("CreateSchedule", CRON | {"name": name, "idempotency_key": key}, ROOT)
    assert outcome.code == "INVALID_ARGUMENT" and outcome.http_status in (None, 400), outcome
    assert outcome.body["details"] == {"field": "idempotency_key"}, outcome
    assert "printable ASCII" in outcome.body["message"], outcome
    assert _stored(api_stack, name) == 0


def test_the_idempotency_key_header_follows_the_same_rule(api_stack: ApiStack, http: HttpCaller) -> None:
    for index, raw in enumerate((b"tab\there", b"caf\xc3\xa9", b"latin\xe9")):
        name = f"bad-idem-header-{index}"
        headers = [(b"Authorization", f"Bearer {ROOT}".encode()), (b"Idempotency-Key", raw)]
        answer = http.client.post("/v1/schedules", json=CRON | {"name": name}, headers=headers)
        error = answer.json()["error"]
        assert (answer.status_code, error["code"]) == (400, "INVALID_ARGUMENT"), (raw, error)
        assert "printable ASCII" in error["message"] and error["details"] == {"field": "idempotency_key"}
        assert _stored(api_stack, name) == 0
    request = CRON | {"name": "spaced-idem"}
    first = http.call("CreateSchedule", request, ROOT, headers={"Idempotency-Key": "order 42/retry #1"})
    again = http.call("CreateSchedule", request | {"idempotency_key": "order 42/retry #1"}, ROOT)
    assert first.ok and again.ok and again.body["id"] == first.body["id"], (first, again)


def test_the_document_gives_the_keys_rules(http: HttpCaller) -> None:
    spec = http.client.get("/openapi.json").json()
    body = spec["components"]["schemas"]["CreateScheduleBody"]["properties"]
    assert body["schedule_key"]["pattern"].startswith("^$|") and body["schedule_key"]["maxLength"] == 200
    assert body["idempotency_key"]["pattern"] == "^$|^(?:[!-~](?:[ -~]*[!-~])?)$"
    [header] = [p for p in spec["paths"]["/v1/schedules"]["post"]["parameters"] if p["in"] == "header"]
    assert header["schema"]["pattern"] == body["idempotency_key"]["pattern"]


def test_an_empty_string_in_an_update_clears_a_description_is_utc_as_a_zone_and_is_refused_elsewhere(
    caller: HttpCaller | GrpcCaller,
) -> None:
    created = caller.call(
        "CreateSchedule",
        CRON | {"name": f"kept-{caller.name}", "description": "d", "timezone": "Asia/Tokyo"},
        ROOT,
    )
    assert created.ok, created
    schedule = created.body["id"]
    for field in ("name", "handler", "cron_expression", "misfire_policy", "overlap_policy"):
        outcome = caller.call("UpdateSchedule", {"id": schedule, field: ""}, ROOT)
        assert outcome.code == "INVALID_SCHEDULE" and outcome.http_status in (None, 422), (field, outcome)
        assert outcome.body["details"] == {"field": field}, outcome
        assert outcome.body["message"] == f"{field} cannot be empty; leave it out to keep the schedule's"
    unchanged = caller.call("GetSchedule", {"id": schedule}, ROOT).body
    assert (unchanged["version"], unchanged["name"]) == (created.body["version"], f"kept-{caller.name}")
    cleared = caller.call("UpdateSchedule", {"id": schedule, "description": "", "timezone": ""}, ROOT)
    assert cleared.ok and (cleared.body["description"], cleared.body["timezone"]) == ("", "UTC"), cleared
    assert cleared.body["name"] == f"kept-{caller.name}"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"retry_config": {"max_attempts": 0}}, "retry_config.max_attempts",
         "retry_config.max_attempts must be 1 to 100, got 0"),
        ({"retry_config": {"backoff_seconds": -1}}, "retry_config.backoff_seconds",
         "retry_config.backoff_seconds must be 0 to 86400, got -1"),
        ({"retry_config": {"backoff_seconds": 10, "max_backoff_seconds": 1}}, "retry_config.backoff_seconds",
         "retry_config.backoff_seconds (10) must not be over retry_config.max_backoff_seconds (1)"),
        ({"retry_config": {"backoff_seconds": 900}}, "retry_config.backoff_seconds",
         "retry_config.backoff_seconds (900) must not be over retry_config.max_backoff_seconds "
         "(as stored or by default) (300)"),
        ({"timeout_seconds": 0}, "timeout_seconds", "timeout_seconds must be 0.001 to 86400, got 0"),
        ({"timeout_seconds": 90000}, "timeout_seconds", "timeout_seconds must be 0.001 to 86400, got 90000"),
        ({"jitter_seconds": -1.5}, "jitter_seconds", "jitter_seconds must be 0 to 86400, got -1.5"),
    ],
)  # fmt: skip
def test_a_limit_is_said_in_the_field_and_the_seconds_the_client_sent(
    caller: HttpCaller | GrpcCaller, fields: dict[str, Any], field: str, message: str
) -> None:
    outcome = caller.call("CreateSchedule", CRON | fields, ROOT)
    assert (outcome.code, outcome.body["message"]) == ("INVALID_SCHEDULE", message), outcome
    assert outcome.body["details"] == {"field": field}, outcome
    created = caller.call("CreateSchedule", CRON, ROOT)
    assert created.ok, created
    patched = caller.call("UpdateSchedule", {"id": created.body["id"]} | fields, ROOT)
    assert (patched.code, patched.body["message"], patched.body["details"]) == (
        "INVALID_SCHEDULE", message, {"field": field}
    ), patched  # fmt: skip


@pytest.mark.parametrize(
    ("method", "body", "field"),
    [
        ("CreateSchedule", {"retry_config": {"max_attempts": "three"}}, "retry_config.max_attempts"),
        ("CreateSchedule", {"retry_config": {"max_attempts": 1.5}}, "retry_config.max_attempts"),
        ("CreateSchedule", {"retry_config": {"backoff_seconds": "abc"}}, "retry_config.backoff_seconds"),
        ("CreateSchedule", {"retry_config": {"tries": 3}}, "retry_config.tries"),
        ("CreateSchedules", {"schedules": [CRON, CRON | {"retry_config": {"max_attempts": "x"}}]},
         "schedules[1].retry_config.max_attempts"),
        ("CreateSchedules", {"schedules": [CRON | {"tries": 3}]}, "schedules[0].tries"),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_named_by_its_whole_path(
    http: HttpCaller, method: str, body: dict[str, Any], field: str
) -> None:
    request = body if method == "CreateSchedules" else CRON | body
    outcome = http.call(method, request, ROOT)
    assert (outcome.code, outcome.body["details"]) == ("INVALID_ARGUMENT", {"field": field}), outcome
    assert repr(field) in outcome.body["message"], outcome


def test_a_batch_items_value_out_of_its_limits_is_named_by_its_whole_path(
    caller: HttpCaller | GrpcCaller,
) -> None:
    """As a value of the wrong type is: the item's field within the request, and the item's index."""
    items = [CRON, CRON | {"retry_config": {"max_attempts": 0}}]
    outcome = caller.call("CreateSchedules", {"schedules": items}, ROOT)
    assert outcome.code == "INVALID_SCHEDULE", outcome
    field = {"field": "schedules[1].retry_config.max_attempts"}
    assert outcome.body["details"] in (field | {"index": 1}, field | {"index": "1"}), outcome
    assert outcome.body["message"] == "schedules[1]: retry_config.max_attempts must be 1 to 100, got 0"


def test_a_token_that_does_not_verify_is_told_why_in_words(caller: HttpCaller | GrpcCaller) -> None:
    for bearer, reason in (
        ("garbage", "the token is not a well-formed JWT"),
        ("a.b.c", "the token is not a well-formed JWT"),
        (token(secret="another-secret-of-at-least-32-bytes!"), "the token's signature does not verify"),
    ):
        outcome = caller.call("ListSchedules", {}, bearer)
        assert outcome.code == "UNAUTHENTICATED" and outcome.body["message"].startswith(reason), outcome
        assert "Error" not in outcome.body["message"], outcome


def test_a_create_into_an_app_that_does_not_exist_is_not_found_as_one_out_of_scope(
    api_stack: ApiStack, caller: HttpCaller | GrpcCaller
) -> None:
    """Whoever asks, and whether one schedule or a batch: NOT_FOUND, as another app's is to a token
    scoped to apps, which so cannot tell an app that exists from one that does not."""
    scoped = token(subject="scoped-rules", roles=("SCHEDULER_USER",), apps=["alpha", "ghost"])
    name = f"nowhere-{caller.name}"
    for bearer, app, says in (
        (ROOT, "ghost", "unknown app 'ghost': create it first with `scheduler apps create ghost`"),
        (scoped, "ghost", "unknown app 'ghost': create it first with `scheduler apps create ghost`"),
        (scoped, "beta", "no app 'beta'"),
        (scoped, "nowhere", "no app 'nowhere'"),
    ):
        single = caller.call("CreateSchedule", ONE_SHOT | {"app": app, "name": name}, bearer)
        assert (single.code, single.body["message"]) == ("NOT_FOUND", says), single
        assert single.http_status in (None, 404) and single.body["details"] == {"field": "app"}, single
        items = [ONE_SHOT | {"name": name}, ONE_SHOT | {"app": app, "name": name}]
        batch = caller.call("CreateSchedules", {"schedules": items}, bearer)
        assert (batch.code, batch.body["message"]) == ("NOT_FOUND", f"schedules[1]: {says}"), batch
        app_field = {"field": "schedules[1].app"}
        assert batch.body["details"] in (app_field | {"index": 1}, app_field | {"index": "1"}), batch
    assert _stored(api_stack, name) == 0


def test_a_trigger_takes_the_version_read_as_every_other_change_does(
    api_stack: ApiStack, caller: HttpCaller | GrpcCaller
) -> None:
    created = caller.call("CreateSchedule", CRON | {"name": f"versioned-trigger-{caller.name}"}, ROOT)
    assert created.ok, created
    schedule, version = created.body["id"], created.body["version"]
    renamed = caller.call("UpdateSchedule", {"id": schedule, "description": "changed"}, ROOT)
    assert renamed.ok and renamed.body["version"] == version + 1, renamed
    stale = caller.call("TriggerSchedule", {"id": schedule, "version": version}, ROOT)
    assert stale.code == "VERSION_CONFLICT" and stale.http_status in (None, 409), stale
    assert f"is at version {version + 1}, not {version}" in stale.body["message"], stale
    with api_stack.connect() as conn:
        runs = conn.execute("select count(*) as n from runs where schedule_id = %s", (schedule,)).fetchone()
    assert runs is not None and runs["n"] == 0, "a refused trigger made a run"
    fired = caller.call("TriggerSchedule", {"id": schedule, "version": version + 1}, ROOT)
    assert fired.ok and fired.body["schedule_id"] == schedule, fired
    assert caller.call("GetSchedule", {"id": schedule}, ROOT).body["version"] == version + 1
    assert caller.call("TriggerSchedule", {"id": schedule}, ROOT).ok  # without one, as before
