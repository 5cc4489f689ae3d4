"""The OpenAPI document against the running API: it is valid OpenAPI, it lists every route, and no
request generated from it (well-formed or not) gets a server error or an answer the document does
not describe.

Each operation is fuzzed by its own test, with Hypothesis driving schemathesis' strategies:
schemathesis' own pytest integration for a schema only known at run time (``from_fixture``) sets
``Function._nodeid``, which pytest 9.2 no longer has.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import BaseSchema, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from scheduler.api.routes import ROUTES
from tests.api.client import HttpCaller, token
from tests.api.conftest import ApiProcess

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
HEALTH = ("GET", "/v1/health")
OPERATIONS = [(route.verb, route.path) for route in ROUTES] + [HEALTH]
EXAMPLES_PER_OPERATION = 20
# Random ids and apps reach only "malformed" and "not found": generated requests also go to a real
# schedule's and run's ids, and creates into a real app with a real handler, to reach the answers.
REAL = [
    (route.verb, route.path) for route in ROUTES if route.path_fields or route.method.startswith("Create")
]
VARIANTS = [
    pytest.param(verb, path, mode, False, id=f"{verb} {path} {mode}")
    for verb, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if (verb, path) != HEALTH or mode == GenerationMode.POSITIVE  # it takes no input to get wrong
] + [pytest.param(verb, path, GenerationMode.POSITIVE, True, id=f"{verb} {path} real") for verb, path in REAL]
IN_ALPHA = {"app": "alpha", "handler": "builtin:noop"}


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as plain:
        plain.trust_env = False  # straight to 127.0.0.1, whatever proxy the environment names
        plain.headers["Authorization"] = f"Bearer {token('fuzzer')}"
        yield plain


@pytest.fixture(scope="module")
def api_schema(api: ApiProcess) -> BaseSchema:
    return schemathesis.openapi.from_url(f"{api.http_url}/openapi.json", proxies={"http": "", "https": ""})


@pytest.fixture(scope="module")
def real_ids(http: HttpCaller) -> dict[str, str]:
    """A schedule of app alpha with a run, by the path each one's id goes in."""
    bearer = token("fuzzer")
    request = {
        "app": "alpha",
        "handler": "builtin:noop",
        "cron_expression": "0 12 * * *",
        "payload": {"n": 1},
    }
    schedule = http.call("CreateSchedule", request, bearer)
    assert schedule.ok, schedule
    run = http.call("TriggerSchedule", {"id": schedule.body["id"]}, bearer)
    assert run.ok, run
    return {"/v1/schedules": schedule.body["id"], "/v1/runs": run.body["run_id"]}


def test_the_document_is_valid_openapi_and_lists_every_route(api_schema: BaseSchema) -> None:
    api_schema.validate()
    listed = set()
    for result in api_schema.get_all_operations():
        assert isinstance(result, Ok), f"schemathesis cannot read an operation: {result.err()}"
        listed.add((result.ok().method.upper(), result.ok().path))
    assert listed == set(OPERATIONS)


@pytest.mark.parametrize(("verb", "path", "mode", "real"), VARIANTS)
def test_no_generated_request_breaks_the_api_or_its_document(
    api_schema: BaseSchema,
    session: requests.Session,
    real_ids: dict[str, str],
    verb: str,
    path: str,
    mode: GenerationMode,
    real: bool,
) -> None:
    operation = api_schema[path][verb]
    fixed = {"id": real_ids[path.split("/{")[0]]} if real and "{id}" in path else None

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(mode, path_parameters=fixed))
    def exchange(case: Case[Any]) -> None:
        if real and fixed is None and isinstance(case.body, dict):
            items = case.body.get("schedules", [case.body])
            for item in items if isinstance(items, list) else ():
                if isinstance(item, dict):
                    item.update(IN_ALPHA)
        case.call_and_validate(session=session, checks=CHECKS)

    exchange()
