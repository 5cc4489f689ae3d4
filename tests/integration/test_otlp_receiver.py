"""Spans from real processes to a real OTLP/HTTP receiver, configured by the ``OTEL_*`` variables only.

No Kafka here: each process stands for a component, and the ``traceparent`` one prints is what the
next one would have read from a message header.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

import scheduler
from scheduler.telemetry.tracing import span_context_from_traceparent
from tests.otlp_receiver import ReceivedSpan, otlp_receiver

REPO = Path(__file__).resolve().parents[2]

# One component's part of a run: a root job.scheduling, or a job.execution continuing argv[2].
COMPONENT = """
import json, sys
from opentelemetry.trace import SpanKind
from scheduler.telemetry.tracing import (
    JOB_EXECUTION, JOB_SCHEDULING, configure_tracing, current_traceparent, job_attributes,
    shutdown_tracing, start_span_from_traceparent, tracing_exports,
)

component, parent = sys.argv[1], sys.argv[2] or None
configure_tracing(component)
configure_tracing(component)  # a second call changes nothing
name, kind = (JOB_EXECUTION, SpanKind.CONSUMER) if parent else (JOB_SCHEDULING, SpanKind.INTERNAL)
with start_span_from_traceparent(name, parent, kind, job_attributes("run-1", "http", 1, None)):
    traceparent = current_traceparent()
exports = tracing_exports()
shutdown_tracing()
shutdown_tracing()
print(json.dumps({
    "traceparent": traceparent,
    "exports": exports,
    "exporter_imported": "opentelemetry.exporter.otlp.proto.http.trace_exporter" in sys.modules,
}))
"""


def run_component(component: str, parent: str | None, **otel: str) -> dict[str, Any]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    env.update(otel)
    done = subprocess.run(
        [sys.executable, "-c", COMPONENT, component, parent or ""],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def named(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    (span,) = [span for span in spans if span["name"] == name]
    return span


def test_two_components_export_one_trace_linked_by_the_traceparent() -> None:
    with otlp_receiver() as receiver:
        scanner = run_component("scanner", None, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
        worker = run_component(
            "worker", scanner["traceparent"], OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint
        )
        spans = receiver.wait_for(lambda spans: len(spans) >= 2)
    assert scanner["exports"] and worker["exports"]
    scheduling, execution = named(spans, "job.scheduling"), named(spans, "job.execution")
    assert scheduling["trace_id"] == execution["trace_id"] == scanner["traceparent"].split("-")[1]
    assert scheduling["parent_span_id"] == ""
    assert execution["parent_span_id"] == scheduling["span_id"]
    assert worker["traceparent"].split("-")[1:3] == [execution["trace_id"], execution["span_id"]]
    assert (scheduling["service_name"], execution["service_name"]) == (
        "scheduler-scanner",
        "scheduler-worker",
    )
    assert execution["resource"]["service.version"] == scheduler.__version__
    assert (scheduling["kind"], execution["kind"]) == ("internal", "consumer")
    assert execution["attributes"]["job.id"] == "run-1"
    assert execution["scope"] == "scheduler"
    assert len(spans) == 2


def test_the_service_name_and_compression_come_from_the_otel_variables() -> None:
    with otlp_receiver() as receiver:
        run_component(
            "relay",
            None,
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{receiver.endpoint}/v1/traces",
            OTEL_SERVICE_NAME="billing-relay",
            OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
        )
        (span,) = receiver.wait_for(lambda spans: len(spans) >= 1)
        assert receiver.content_encodings == ["gzip"]
    assert span["service_name"] == "billing-relay"


def test_without_otel_variables_nothing_is_exported_and_messages_keep_a_valid_trace() -> None:
    scanner = run_component("scanner", None)
    worker = run_component("worker", scanner["traceparent"])
    for process in (scanner, worker):
        assert not process["exports"] and not process["exporter_imported"]
        assert span_context_from_traceparent(process["traceparent"]) is not None
    assert worker["traceparent"].split("-")[1] == scanner["traceparent"].split("-")[1]


@pytest.mark.parametrize("switch", [{"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "true"}])
def test_export_switched_off_sends_nothing_but_keeps_the_trace(switch: dict[str, str]) -> None:
    with otlp_receiver() as receiver:
        scanner = run_component("scanner", None, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, **switch)
        worker = run_component(
            "worker", scanner["traceparent"], OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, **switch
        )
        # Both processes have exited, after shutdown_tracing: anything they sent has arrived.
        assert receiver.requests == 0
    assert not scanner["exports"] and not worker["exports"]
    assert span_context_from_traceparent(worker["traceparent"]) is not None
    assert worker["traceparent"].split("-")[1] == scanner["traceparent"].split("-")[1]


# --- the receiver itself ------------------------------------------------------------------------


def export_request() -> ExportTraceServiceRequest:
    span = Span(
        trace_id=bytes.fromhex("0af7651916cd43dd8448eb211c80319c"),
        span_id=bytes.fromhex("b7ad6b7169203331"),
        name="send sched.jobs.billing",
        kind=Span.SPAN_KIND_PRODUCER,
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        attributes=[
            KeyValue(key="messaging.kafka.offset", value=AnyValue(int_value=42)),
            KeyValue(key="messaging.system", value=AnyValue(string_value="kafka")),
        ],
    )
    resource = Resource(
        attributes=[KeyValue(key="service.name", value=AnyValue(string_value="scheduler-relay"))]
    )
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=[span])])]
    )


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_receiver_decodes_gzip_protobuf_and_rejects_what_is_not_otlp() -> None:
    body = gzip.compress(export_request().SerializeToString())
    with otlp_receiver() as receiver:
        url = f"{receiver.endpoint}/v1/traces"
        protobuf = {"Content-Type": "application/x-protobuf"}
        assert post(url, body, {**protobuf, "Content-Encoding": "gzip"}) == 200
        assert post(url, b"{}", {"Content-Type": "application/json"}) == 415
        assert post(f"{receiver.endpoint}/v1/metrics", body, protobuf) == 404
        assert post(url, b"\xff" * 8, protobuf) == 400
        (span,) = receiver.spans()
        assert receiver.requests == 4 and receiver.content_encodings == ["gzip"]
    assert span == {
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
        "parent_span_id": "",
        "name": "send sched.jobs.billing",
        "kind": "producer",
        "attributes": {"messaging.kafka.offset": 42, "messaging.system": "kafka"},
        "events": [],
        "links": [],
        "status": "unset",
        "status_message": "",
        "service_name": "scheduler-relay",
        "resource": {"service.name": "scheduler-relay"},
        "scope": "",
        "start_ns": 1,
        "end_ns": 2,
    }


def test_waiting_for_spans_that_never_come_fails_with_what_did() -> None:
    with otlp_receiver() as receiver, pytest.raises(AssertionError, match="no matching spans"):
        receiver.wait_for(lambda spans: bool(spans), timeout_s=0.05)
