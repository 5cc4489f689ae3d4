"""A client's trace goes on through the API into the run it asked for, as a Kafka command's does.

A service that calls ``POST /v1/schedules`` inside a trace of its own sends the W3C ``traceparent``
header, as every OpenTelemetry HTTP client does. The ingestor continues a command's ``traceparent``
(the run of a one-shot schedule is in the trace of the command that made it); the API is the other
way in, over HTTP (headers) as over gRPC (metadata), and the run it makes must be found in the
caller's trace the same way. A malformed ``traceparent`` is no reason to refuse a call: it is
ignored, and the schedule starts a trace of its own.

Every component and the API export to a real OTLP/HTTP receiver of the test's own."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from bench.chaos_stack import free_port
from scheduler.v1 import scheduler_pb2 as pb
from scheduler.v1 import scheduler_pb2_grpc
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


def test_a_schedule_created_through_the_api_runs_in_the_callers_trace(
    settings_env: dict[str, str], receiver: Receiver, tmp_path: Path
) -> None:
    """Over HTTP and over gRPC, the API's ``schedule.create`` is a child of the caller's span, and
    the run's ``job.scheduling``, ``job.execution`` and ``process`` spans follow it into the
    caller's trace (the API once read no ``traceparent``, so the caller's trace ended at its call
    and the job was nowhere in it). A malformed one is answered as if none was sent."""
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

    def over_http(traceparent: str) -> str:
        answer = httpx.post(
            f"http://127.0.0.1:{http_port}/v1/schedules",
            json={"app": APP, "handler": "builtin:noop"},
            headers={"Authorization": f"Bearer {token()}", "traceparent": traceparent},
            timeout=30,
            trust_env=False,
        )
        assert answer.status_code == 200, answer.text
        return str(answer.json()["id"])

    def batch_over_http(traceparent: str) -> list[str]:
        answer = httpx.post(
            f"http://127.0.0.1:{http_port}/v1/schedules:batchCreate",
            json={"schedules": [{"app": APP, "handler": "builtin:noop"}] * 2},
            headers={"Authorization": f"Bearer {token()}", "traceparent": traceparent},
            timeout=30,
            trust_env=False,
        )
        assert answer.status_code == 200, answer.text
        return [str(created["id"]) for created in answer.json()["schedules"]]

    def over_grpc(traceparent: str) -> str:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub: Any = scheduler_pb2_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]
            created = stub.CreateSchedule(
                pb.CreateScheduleRequest(app=APP, handler="builtin:noop"),
                metadata=[
                    ("authorization", f"Bearer {token()}"),
                    ("traceparent", traceparent),
                    ("tracestate", "caller=1"),
                ],
                timeout=30,
            )
        return str(created.id)

    try:
        wait_for_statuses(ports, "/ready", 200, 120, logs)
        callers = {transport: (secrets.token_hex(16), secrets.token_hex(8)) for transport in ("http", "grpc")}
        schedule_ids = {
            "http": over_http("00-{}-{}-01".format(*callers["http"])),
            "grpc": over_grpc("00-{}-{}-01".format(*callers["grpc"])),
            "malformed": over_http("00-{}-{}-01".format(*callers["http"]).upper()),
        }
        batch_caller = (secrets.token_hex(16), secrets.token_hex(8))
        batch_ids = batch_over_http("00-{}-{}-01".format(*batch_caller))

        def span(spans: list[ReceivedSpan], name: str, schedule_id: str) -> ReceivedSpan | None:
            return next(
                (
                    s
                    for s in spans
                    if s["name"] == name and s["attributes"].get("scheduler.schedule_id") == schedule_id
                ),
                None,
            )

        def processed_in(trace_id: str) -> bool:
            return any(
                s["trace_id"] == trace_id and s["name"].startswith("process ") for s in receiver.spans()
            )

        def executed(spans: list[ReceivedSpan]) -> bool:
            return all(span(spans, "job.execution", sid) for sid in [*schedule_ids.values(), *batch_ids])

        spans = receiver.wait_for(executed, 90)
        for transport, (caller_trace, caller_span) in callers.items():
            create = span(spans, "schedule.create", schedule_ids[transport])
            execution = span(spans, "job.execution", schedule_ids[transport])
            assert create is not None and execution is not None
            assert create["service_name"] == "scheduler-api"
            assert (create["trace_id"], create["parent_span_id"]) == (caller_trace, caller_span), (
                f"the API's schedule.create is not a child of the {transport} caller's span"
            )
            assert execution["trace_id"] == caller_trace, (
                f"the job ran outside the {transport} caller's trace"
            )
            wait_for(
                partial(processed_in, caller_trace),
                30,
                f"the reconciler's processing of the outcome in the {transport} caller's trace",
            )
        # A CreateSchedules batch is one call: one schedule.create, the caller's child, whose trace
        # every one-shot run of the batch goes on in (the batch's schedules were once in none).
        batch_creates = [
            s for s in spans if s["name"] == "schedule.create" and s["trace_id"] == batch_caller[0]
        ]
        assert [(s["parent_span_id"], s["attributes"].get("scheduler.schedules")) for s in batch_creates] == [
            (batch_caller[1], 2)
        ], "a batch's schedule.create is not one child of its caller's span"
        for schedule_id in batch_ids:
            execution = span(spans, "job.execution", schedule_id)
            assert execution is not None and execution["trace_id"] == batch_caller[0], (
                "a one-shot of a batch ran outside its caller's trace"
            )
        create = span(spans, "schedule.create", schedule_ids["malformed"])
        execution = span(spans, "job.execution", schedule_ids["malformed"])
        assert create is not None and execution is not None
        assert create["parent_span_id"] == "", "a malformed traceparent was taken as a parent"
        assert create["trace_id"] not in {caller_trace for caller_trace, _ in callers.values()}
        assert execution["trace_id"] == create["trace_id"]
    finally:
        codes = {c.name: c.stop() for c in started}
    assert codes == dict.fromkeys((*COMPONENTS, "api"), 0), logs()
