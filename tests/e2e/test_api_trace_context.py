"""A client's trace goes on through the API into the run it asked for, as a Kafka command's does.

A service that calls ``POST /v1/schedules`` inside a trace of its own sends the W3C ``traceparent``
header, as every OpenTelemetry HTTP client does. The ingestor continues a command's ``traceparent``
(the run of a one-shot schedule is in the trace of the command that made it); the API is the other
way in, and the run it makes must be found in the caller's trace the same way.

Every component and the API export to a real OTLP/HTTP receiver of the test's own."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.chaos_stack import free_port
from tests.api.client import SECRET, token
from tests.e2e.health import cli, wait_for_statuses
from tests.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tests.support import Component, wait_for

pytestmark = pytest.mark.e2e

APP = "traced-api"
COMPONENTS = ("scanner", "relay", "reconciler", "worker")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as received:
        yield received


def test_a_schedule_created_through_the_http_api_runs_in_the_callers_trace(
    settings_env: dict[str, str], receiver: Receiver, tmp_path: Path
) -> None:
    """The API reads no ``traceparent``: its ``schedule.create`` span is the root of a new trace,
    and the run's ``job.scheduling``, ``job.execution`` and ``process`` spans follow it there, so
    the caller's trace ends at its HTTP call and the job is nowhere in it."""
    env = settings_env | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "SCHEDULER_MAX_SCAN_SLEEP": "0.2",
        "SCHEDULER_JWT_SECRET": SECRET,
    }
    cli(env, "init")
    cli(env, "apps", "create", APP)
    ports = {name: free_port() for name in (*COMPONENTS, "api")}
    http_port, grpc_port = free_port(), free_port()
    started = [
        Component(name, env | {"SCHEDULER_METRICS_PORT": str(ports[name])}, tmp_path, *args)
        for name, args in [
            ("scanner", ()),
            ("relay", ()),
            ("reconciler", ()),
            ("worker", ("--app", APP)),
            ("api", ("--port", str(http_port), "--grpc-port", str(grpc_port))),
        ]
    ]

    def logs() -> str:
        return "\n".join(f"--- {c.name}\n{c.output()[-2500:]}" for c in started)

    try:
        wait_for_statuses(ports, "/ready", 200, 120, logs)
        caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
        answer = httpx.post(
            f"http://127.0.0.1:{http_port}/v1/schedules",
            json={"app": APP, "handler": "builtin:noop"},
            headers={
                "Authorization": f"Bearer {token()}",
                "traceparent": f"00-{caller_trace}-{caller_span}-01",
            },
            timeout=30,
            trust_env=False,
        )
        assert answer.status_code == 200, answer.text
        schedule_id = answer.json()["id"]

        def executed(spans: list[ReceivedSpan]) -> bool:
            return any(
                s["name"] == "job.execution" and s["attributes"].get("scheduler.schedule_id") == schedule_id
                for s in spans
            )

        spans = receiver.wait_for(executed, 90)
        create = next(
            s
            for s in spans
            if s["name"] == "schedule.create" and s["attributes"].get("scheduler.schedule_id") == schedule_id
        )
        execution = next(
            s
            for s in spans
            if s["name"] == "job.execution" and s["attributes"].get("scheduler.schedule_id") == schedule_id
        )
        assert create["service_name"] == "scheduler-api"
        assert (create["trace_id"], create["parent_span_id"]) == (caller_trace, caller_span), (
            "the API's schedule.create is not a child of the caller's span"
        )
        assert execution["trace_id"] == caller_trace, "the job ran outside the caller's trace"
        wait_for(
            lambda: [
                s
                for s in receiver.spans()
                if s["trace_id"] == caller_trace and s["name"].startswith("process ")
            ],
            30,
            "the reconciler's processing of the outcome in the caller's trace",
        )
    finally:
        codes = {c.name: c.stop() for c in started}
    assert codes == dict.fromkeys((*COMPONENTS, "api"), 0), logs()
