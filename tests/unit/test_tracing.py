"""Trace context on messages and the spans built on it: what a trace backend would show of a run."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from scheduler.domain.ids import new_id
from scheduler.domain.run_state import RunState
from scheduler.kafka.tracing import (
    HEADER,
    child_traceparent,
    new_traceparent,
    run_traceparent,
    traceparent_of,
)
from scheduler.relay.relay import _root_of
from scheduler.store.outbox import OutboxRow
from scheduler.telemetry import tracing
from scheduler.telemetry.tracing import (
    JOB_EXECUTION,
    JOB_FAILURE,
    JOB_SCHEDULING,
    SCHEDULE_CREATE,
    caller_context,
    child_span,
    context_from_traceparent,
    continuing,
    current_traceparent,
    job_attributes,
    job_outcome_attributes,
    kafka_attributes,
    links_from_traceparents,
    messaging_span_kind,
    messaging_span_name,
    record_failure,
    span_context_from_traceparent,
    start_span_from_traceparent,
    traceparent_of_span,
    traces_export_requested,
    valid_traceparent,
)

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
PARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"

Finished = Callable[[], tuple[ReadableSpan, ...]]


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process: reuse an SDK one another test set.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield memory
    memory.shutdown()  # the processor stays registered; a shut-down exporter keeps nothing


@pytest.fixture
def finished(exporter: InMemorySpanExporter) -> Finished:
    exporter.clear()
    return exporter.get_finished_spans


def ids(traceparent: str) -> tuple[str, str, str]:
    _, trace_id, span_id, flags = traceparent.split("-")
    return trace_id, span_id, flags


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return trace.format_trace_id(span.context.trace_id)


def hex_span(span: ReadableSpan) -> str:
    assert span.context is not None
    return trace.format_span_id(span.context.span_id)


def hex_span_of(span_context: trace.SpanContext) -> str:
    return trace.format_span_id(span_context.span_id)


def only(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    matching = [span for span in spans if span.name == name]
    assert len(matching) == 1, [span.name for span in spans]
    return matching[0]


# --- the header's wire format --------------------------------------------------------------------


def test_a_valid_traceparent_gives_a_remote_context_of_its_ids() -> None:
    for value in (PARENT, PARENT.encode()):
        context = context_from_traceparent(value)
        assert context is not None
        span_context = trace.get_current_span(context).get_span_context()
        assert span_context.is_valid and span_context.is_remote
        assert trace.format_trace_id(span_context.trace_id) == TRACE_ID
        assert trace.format_span_id(span_context.span_id) == SPAN_ID
        assert span_context.trace_flags.sampled


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(f"00-{'0' * 32}-{SPAN_ID}-01", id="all-zero trace id"),
        pytest.param(f"00-{TRACE_ID}-{'0' * 16}-01", id="all-zero span id"),
        pytest.param(f"ff-{TRACE_ID}-{SPAN_ID}-01", id="reserved version ff"),
        pytest.param(f"00-{TRACE_ID}-{SPAN_ID}-01-extra", id="version 00 with a fifth field"),
        pytest.param(f"00-{TRACE_ID.upper()}-{SPAN_ID}-01", id="upper-case hex"),
        pytest.param(f"00-{TRACE_ID[:-1]}-{SPAN_ID}-01", id="short trace id"),
        pytest.param(f"00_{TRACE_ID}_{SPAN_ID}_01", id="wrong separators"),
        pytest.param("garbage", id="garbage"),
        pytest.param("", id="empty"),
        pytest.param(None, id="missing"),
        pytest.param(b"\xff\xfe", id="bytes that are not ASCII"),
    ],
)
def test_malformed_and_all_zero_traceparents_are_rejected(value: str | bytes | None) -> None:
    assert context_from_traceparent(value) is None
    assert span_context_from_traceparent(value) is None


def test_a_future_version_is_read_by_its_first_four_fields_as_w3c_asks() -> None:
    assert span_context_from_traceparent(f"01-{TRACE_ID}-{SPAN_ID}-01-future") is not None


@given(st.text(max_size=80) | st.binary(max_size=80))
def test_any_header_value_is_either_rejected_or_a_valid_context(value: str | bytes) -> None:
    span_context = span_context_from_traceparent(value)
    assert span_context is None or (span_context.is_valid and span_context.trace_id != 0)


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.booleans())
def test_a_span_context_survives_the_header_round_trip(trace_id: int, span_id: int, sampled: bool) -> None:
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT)
    span = trace.NonRecordingSpan(trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags))
    parsed = span_context_from_traceparent(traceparent_of_span(span))
    assert parsed is not None
    assert (parsed.trace_id, parsed.span_id, parsed.trace_flags) == (trace_id, span_id, flags)


def test_an_invalid_span_still_gives_a_fresh_valid_traceparent() -> None:
    first, second = traceparent_of_span(trace.INVALID_SPAN), traceparent_of_span(trace.INVALID_SPAN)
    assert TRACEPARENT.match(first) and span_context_from_traceparent(first) is not None
    assert ids(first)[0] != ids(second)[0]
    assert ids(first)[2] == "01"  # sampled: a downstream exporter records the rest


def test_a_child_keeps_the_trace_and_flags_with_a_new_span() -> None:
    child = child_traceparent(PARENT)
    assert TRACEPARENT.match(child)
    assert ids(child)[0] == TRACE_ID
    assert ids(child)[1] != SPAN_ID and child.endswith("-01")


def test_a_missing_malformed_or_all_zero_parent_starts_a_new_trace() -> None:
    for parent in (None, "", "garbage", f"00-{'0' * 32}-{SPAN_ID}-01"):
        child = child_traceparent(parent)
        assert span_context_from_traceparent(child) is not None
        assert ids(child)[0] != "0" * 32
    assert new_traceparent() != new_traceparent()


def test_the_header_is_found_in_lists_and_mappings() -> None:
    value = new_traceparent()
    assert traceparent_of([("other", b"x"), (HEADER, value.encode())]) == value
    assert traceparent_of({"traceparent": value}) == value
    assert traceparent_of(None) is None


# --- spans --------------------------------------------------------------------------------------


def test_a_span_continues_the_trace_its_message_names(finished: Finished) -> None:
    attributes = job_attributes(uuid.uuid4(), "http", 1, datetime(2025, 1, 1, tzinfo=UTC))
    with start_span_from_traceparent(JOB_EXECUTION, PARENT, SpanKind.CONSUMER, attributes) as span:
        inside = current_traceparent()
        assert inside == traceparent_of_span(span)
        # What the worker puts on its outcome: the recorded span, not a made-up one.
        assert child_traceparent(PARENT) == inside
        assert new_traceparent() == inside
    execution = only(finished(), JOB_EXECUTION)
    assert hex_trace(execution) == TRACE_ID == ids(inside)[0]
    assert execution.parent is not None and execution.parent.is_remote
    assert trace.format_span_id(execution.parent.span_id) == SPAN_ID
    assert execution.kind is SpanKind.CONSUMER
    assert execution.attributes is not None and execution.attributes["job.type"] == "http"


def test_without_a_traceparent_a_span_starts_its_own_trace_linked_to_the_enclosing_one(
    finished: Finished,
) -> None:
    with child_span("scan") as scan:
        with start_span_from_traceparent(JOB_SCHEDULING, None) as first:
            first_traceparent = traceparent_of_span(first)
        with start_span_from_traceparent(JOB_SCHEDULING, "garbage") as second:
            second_traceparent = traceparent_of_span(second)
    scan_span = only(finished(), "scan")
    scheduling = [span for span in finished() if span.name == JOB_SCHEDULING]
    assert ids(first_traceparent)[0] != ids(second_traceparent)[0] != ids(traceparent_of_span(scan))[0]
    for span in scheduling:
        assert span.parent is None
        assert [hex_span_of(link.context) for link in span.links] == [hex_span(scan_span)]


def test_a_message_span_inside_a_batch_is_the_message_trace_linked_to_the_batch(finished: Finished) -> None:
    with (
        child_span("process sched.results", SpanKind.CONSUMER) as batch,
        start_span_from_traceparent("apply outcome", PARENT) as one,
    ):
        assert ids(traceparent_of_span(one))[0] == TRACE_ID
    applied = only(finished(), "apply outcome")
    assert applied.parent is not None and hex_span_of(applied.parent) == SPAN_ID
    assert [hex_span_of(link.context) for link in applied.links] == [ids(traceparent_of_span(batch))[1]]


def test_a_span_may_start_at_an_instant_already_past(finished: Finished) -> None:
    created = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    with start_span_from_traceparent(JOB_SCHEDULING, None, start_time=created):
        pass
    span = only(finished(), JOB_SCHEDULING)
    assert span.start_time == 1740830400_123456_000


def test_an_exception_marks_the_span_failed_without_its_secrets(finished: Finished) -> None:
    with (
        pytest.raises(ValueError),
        start_span_from_traceparent(JOB_EXECUTION, PARENT),
    ):
        raise ValueError("cannot reach https://user:hunter2@db.example/x")
    span = only(finished(), JOB_EXECUTION)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["error.type"] == "ValueError"
    (event,) = span.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert "hunter2" not in str(event.attributes["exception.message"])
    assert "db.example" in str(event.attributes["exception.message"])
    assert "hunter2" not in (span.status.description or "")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_exception_whose_text_cannot_be_formatted_still_marks_the_span_failed(finished: Finished) -> None:
    """Its __str__ raising must not replace it with the formatter's own exception."""
    with pytest.raises(_Unprintable), start_span_from_traceparent(JOB_EXECUTION, PARENT):
        raise _Unprintable()
    span = only(finished(), JOB_EXECUTION)
    assert span.status.status_code is StatusCode.ERROR
    (event,) = span.events
    assert event.attributes is not None
    assert event.attributes["exception.message"] == "(an exception whose text could not be formatted)"


def test_a_failure_is_its_own_span_under_the_execution(finished: Finished) -> None:
    run_id = uuid.uuid4()
    with start_span_from_traceparent(JOB_EXECUTION, PARENT, SpanKind.CONSUMER):
        try:
            raise TimeoutError("handler took too long")
        except TimeoutError as error:
            record_failure(
                error,
                "handler took too long",
                job_attributes(run_id, "http", 2, None, status=RunState.RETRY_WAIT),
            )
    execution, failure = only(finished(), JOB_EXECUTION), only(finished(), JOB_FAILURE)
    assert failure.parent is not None and hex_span_of(failure.parent) == hex_span(execution)
    assert hex_trace(failure) == TRACE_ID
    for span in (execution, failure):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None and span.attributes["error.type"] == "TimeoutError"
    assert failure.attributes is not None
    assert failure.attributes["job.status"] == "retry_wait" and failure.attributes["job.retry_count"] == 1
    (event,) = failure.events
    assert event.attributes is not None
    assert event.attributes["exception.message"] == "handler took too long"
    assert "test_tracing.py" in str(event.attributes["exception.stacktrace"])


def test_a_failure_without_an_exception_names_its_error_class(finished: Finished) -> None:
    with start_span_from_traceparent("process sched.results", PARENT, SpanKind.CONSUMER):
        record_failure("LeaseExpired")
    failure = only(finished(), JOB_FAILURE)
    assert failure.attributes is not None and failure.attributes["error.type"] == "LeaseExpired"
    assert failure.status.description == "LeaseExpired"


def test_a_batch_span_links_the_messages_it_covers() -> None:
    other = f"00-{'1' * 32}-{'2' * 16}-00"
    links = links_from_traceparents([PARENT, None, "garbage", other.encode()])
    assert [(trace.format_trace_id(link.context.trace_id)) for link in links] == [TRACE_ID, "1" * 32]


def test_with_a_no_op_tracer_spans_still_carry_one_valid_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    # As with OTEL_SDK_DISABLED or tracing never configured: the API's tracer gives roots no ids.
    monkeypatch.setattr(tracing, "_TRACER", trace.NoOpTracer())
    with start_span_from_traceparent(JOB_SCHEDULING, None) as root:
        assert span_context_from_traceparent(current_traceparent()) is not None
        assert current_traceparent() == current_traceparent() == traceparent_of_span(root)
        with child_span("outbox insert"):
            assert ids(current_traceparent())[0] == ids(traceparent_of_span(root))[0]
    with start_span_from_traceparent(JOB_EXECUTION, PARENT):
        assert ids(current_traceparent())[0] == TRACE_ID
        assert ids(child_traceparent(PARENT))[0] == TRACE_ID


def test_an_api_callers_span_is_the_parent_of_the_spans_of_its_call(finished: Finished) -> None:
    # The API's transports hand over every value of each header (or gRPC metadata) name.
    caller = caller_context([PARENT], ["vendor=a1", "other=b2"])
    with continuing(caller), child_span(SCHEDULE_CREATE) as create:
        stored = traceparent_of_span(create)
    span = only(finished(), SCHEDULE_CREATE)
    assert hex_trace(span) == TRACE_ID == ids(stored)[0]
    assert span.parent is not None and span.parent.is_remote and hex_span_of(span.parent) == SPAN_ID
    assert span.context is not None and dict(span.context.trace_state) == {"vendor": "a1", "other": "b2"}
    assert trace.get_current_span().get_span_context().is_valid is False, "the caller's context stays"


@pytest.mark.parametrize(
    ("traceparents", "tracestates"),
    [
        ([], []),
        (["garbage"], ["vendor=a1"]),
        ([f"00-{'0' * 32}-{SPAN_ID}-01"], []),
        ([PARENT, f"00-{'1' * 32}-{SPAN_ID}-01"], []),  # two: which one is the caller's is not known
        ([PARENT + "\x00" * 10_000], []),
    ],
)
def test_a_call_without_one_valid_traceparent_starts_a_new_trace(
    traceparents: list[str], tracestates: list[str], finished: Finished
) -> None:
    caller = caller_context(traceparents, tracestates)
    assert caller is None
    with continuing(caller), child_span(SCHEDULE_CREATE):
        pass
    span = only(finished(), SCHEDULE_CREATE)
    assert span.parent is None and hex_trace(span) != TRACE_ID


def test_a_malformed_tracestate_is_dropped_and_the_traceparent_still_continued(finished: Finished) -> None:
    with continuing(caller_context([PARENT], ["vendor=a1", "not a tracestate"])), child_span(SCHEDULE_CREATE):
        pass
    span = only(finished(), SCHEDULE_CREATE)
    assert span.parent is not None and hex_span_of(span.parent) == SPAN_ID
    assert span.context is not None and not span.context.trace_state


# --- attributes ---------------------------------------------------------------------------------


def test_job_attributes_follow_the_system_design() -> None:
    run_id, schedule_id = uuid.uuid4(), uuid.uuid4()
    paris = timezone(timedelta(hours=1))
    attributes = job_attributes(
        run_id,
        "http",
        3,
        datetime(2025, 1, 1, 10, 30, tzinfo=paris),
        status=RunState.SUCCEEDED,
        duration_ms=12.5,
        app="billing",
        schedule_id=schedule_id,
    )
    assert attributes == {
        "job.id": str(run_id),
        "job.type": "http",
        "job.retry_count": 2,
        "job.scheduled_at": "2025-01-01T09:30:00+00:00",
        "job.status": "succeeded",
        "job.execution_duration_ms": 12.5,
        "scheduler.app": "billing",
        "scheduler.schedule_id": str(schedule_id),
    }


def test_job_attributes_leave_out_what_is_not_known_yet() -> None:
    assert job_attributes("r1", "shell", 1, datetime(2025, 1, 1, 9, 30)) == {
        "job.id": "r1",
        "job.type": "shell",
        "job.retry_count": 0,
        "job.scheduled_at": "2025-01-01T09:30:00+00:00",  # naive is UTC
    }
    assert job_outcome_attributes("dead", 40) == {"job.status": "dead", "job.execution_duration_ms": 40.0}
    assert job_outcome_attributes(None) == {}


def test_kafka_attributes_follow_the_messaging_conventions() -> None:
    key = uuid.uuid4()
    assert kafka_attributes(
        "process", "sched.jobs.billing", partition=3, offset=42, key=key, consumer_group="sched-workers"
    ) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "sched.jobs.billing",
        "messaging.destination.partition.id": "3",
        "messaging.kafka.offset": 42,
        "messaging.kafka.message.key": str(key),
        "messaging.consumer.group.name": "sched-workers",
    }
    assert kafka_attributes("send", "sched.results", key=b"\xff\x00", batch_size=10) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "sched.results",
        "messaging.batch.message_count": 10,
    }
    assert (
        kafka_attributes("receive", "sched.dlq", key=b"sched-1")["messaging.kafka.message.key"] == "sched-1"
    )
    assert kafka_attributes("receive", "sched.dlq")["messaging.operation.name"] == "poll"


def test_messaging_spans_are_named_operation_then_destination() -> None:
    assert messaging_span_name("send", "sched.jobs.billing") == "send sched.jobs.billing"
    assert messaging_span_name("process", "sched.results") == "process sched.results"
    assert messaging_span_kind("send") is SpanKind.PRODUCER
    assert messaging_span_kind("process") is SpanKind.CONSUMER


# --- when the OTEL_* variables ask for export ----------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "exports"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),  # the standard default endpoint
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "console"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "otlp,console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, False),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            True,
        ),
    ],
)
def test_export_is_on_only_when_the_otel_variables_ask(environ: dict[str, str], exports: bool) -> None:
    assert traces_export_requested(environ) is exports


def test_the_spans_of_a_batch_are_each_in_their_message_trace_and_never_linked_to_each_other(
    finished: Finished,
) -> None:
    other = f"00-{'ab' * 16}-{'cd' * 8}-01"
    with (
        pytest.raises(RuntimeError),
        tracing.ending(
            [tracing.message_span(JOB_EXECUTION, tp, SpanKind.CONSUMER) for tp in (PARENT, other)]
        ),
    ):
        raise RuntimeError("the batch failed")
    spans = [s for s in finished() if s.name == JOB_EXECUTION]
    assert sorted(hex_trace(s) for s in spans) == sorted([TRACE_ID, "ab" * 16])
    assert all(not s.links for s in spans), "spans open together must not link each other"
    assert all(s.status.status_code is StatusCode.ERROR for s in spans), "a failed batch fails each"


# A run's own trace -----------------------------------------------------------------------------


@pytest.fixture
def run_tracer(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The module's tracer on a provider built as configure_tracing builds it."""
    provider = tracing._new_provider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(tracing, "_TRACER", provider.get_tracer("test"))
    yield memory
    provider.shutdown()


def test_a_run_without_a_trace_to_continue_is_in_a_trace_whose_id_is_the_run_id() -> None:
    run_id = uuid.uuid4()
    trace_id, span_id, flags = ids(run_traceparent(run_id))
    assert trace_id == run_id.hex, "an operator finds a run's trace by the run's id"
    assert span_id == f"{run_id.int & (2**64 - 1):016x}"
    assert flags == "01"
    assert run_traceparent(run_id) == run_traceparent(run_id), "every attempt of the run: one trace"


def test_a_run_made_inside_a_span_is_in_its_own_trace_as_its_later_attempts_are(finished: Finished) -> None:
    run_id = uuid.uuid4()
    with child_span("api call"):
        assert ids(run_traceparent(run_id))[0] == run_id.hex


def test_a_first_attempt_is_its_run_trace_root_and_later_attempts_are_its_children(
    run_tracer: InMemorySpanExporter,
) -> None:
    run_id = uuid.uuid4()
    header = run_traceparent(run_id)
    first = tracing.message_span(JOB_SCHEDULING, header, SpanKind.PRODUCER, root_of=run_id)
    first.end()
    second = tracing.message_span(JOB_SCHEDULING, header, SpanKind.PRODUCER)  # attempt 2: no root_of
    second.end()
    root, child = run_tracer.get_finished_spans()
    assert root.parent is None, "the first attempt's job.scheduling is the trace's root"
    assert (hex_trace(root), hex_span(root)) == ids(header)[:2], "with the very ids its header names"
    assert child.parent is not None and child.parent.span_id == root.context.span_id
    assert hex_trace(child) == run_id.hex
    # Ids are chosen only for that span: the next ones are random again.
    other = tracing.message_span(JOB_SCHEDULING, None, SpanKind.PRODUCER)
    other.end()
    assert hex_trace(run_tracer.get_finished_spans()[-1]) != run_id.hex


def test_root_of_leaves_a_trace_that_is_not_the_runs_own_alone(run_tracer: InMemorySpanExporter) -> None:
    """A one-shot's first attempt continues its creation's trace: root_of changes nothing there."""
    span = tracing.message_span(JOB_SCHEDULING, PARENT, SpanKind.PRODUCER, root_of=uuid.uuid4())
    span.end()
    [finished_span] = run_tracer.get_finished_spans()
    assert finished_span.parent is not None and hex_trace(finished_span) == TRACE_ID
    assert f"{finished_span.parent.span_id:016x}" == SPAN_ID


def test_a_first_attempt_produced_again_is_a_child_of_its_run_root_not_a_second_root(
    run_tracer: InMemorySpanExporter,
) -> None:
    """The relay records a first attempt's job.scheduling as its run's root only the first time it
    produces it; produced again (Kafka did not answer), the span hangs from that root."""
    run_id = uuid.uuid4()
    header = run_traceparent(run_id)

    def row(attempt: int, publish_count: int) -> OutboxRow:
        return OutboxRow(
            1, "t.jobs.a", None, b"", {"traceparent": header}, run_id, attempt, publish_count, 0.0
        )

    for outbox_row in (row(1, 0), row(1, 1)):
        span = tracing.message_span(JOB_SCHEDULING, header, SpanKind.PRODUCER, root_of=_root_of(outbox_row))
        span.end()
    first, again = run_tracer.get_finished_spans()
    assert first.parent is None and again.parent is not None
    assert again.parent.span_id == first.context.span_id != again.context.span_id
    assert _root_of(row(2, 0)) is None, "a later attempt is never a root"


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.75])
def test_a_ratio_sampler_records_its_share_of_run_traces_each_whole(
    rate: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run id's low bits are not uniform (UUIDv7: fixed variant bits, a counter within the
    millisecond); a ratio sampler deciding on them recorded no run at 0.5 or below. Each run's
    trace is decided once, and its root, its later attempts and the worker's spans all follow."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", str(rate))
    provider = tracing._new_provider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(tracing, "_provider", provider)
    monkeypatch.setattr(tracing, "_TRACER", provider.get_tracer("test"))
    runs = [new_id() for _ in range(4000)]  # made in a burst, as a scan makes them
    sampled = set()
    for run_id in runs:
        header = run_traceparent(run_id)
        assert run_traceparent(run_id) == header, "every attempt of a run carries one decision"
        if header.endswith("-01"):
            sampled.add(run_id.hex)
        tracing.message_span(JOB_SCHEDULING, header, SpanKind.PRODUCER, root_of=run_id).end()
        tracing.message_span(JOB_SCHEDULING, header, SpanKind.PRODUCER).end()  # a retry
        with start_span_from_traceparent(JOB_EXECUTION, header, SpanKind.CONSUMER):
            pass
    assert abs(len(sampled) / len(runs) - rate) < 0.03, f"{len(sampled)} of {len(runs)} runs sampled"
    recorded: dict[str, int] = {}
    for span in memory.get_finished_spans():
        recorded[hex_trace(span)] = recorded.get(hex_trace(span), 0) + 1
    assert set(recorded) == sampled, "a run's spans are recorded exactly when its header says sampled"
    assert set(recorded.values()) == {3}, "root, retry and execution: each recorded run's trace is whole"
    provider.shutdown()


VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        (VALID, VALID),
        (VALID.encode(), VALID),
        ("01" + VALID[2:] + "-a-later-version's-field", VALID),  # read as version 00 reads it
        ("01" + VALID[2:], VALID),
        (VALID + "-tail", None),  # version 00 has four fields
        ("ff" + VALID[2:], None),
        ("00-" + "0" * 32 + VALID[35:], None),  # an all-zero trace id
        (VALID[:36] + "0" * 16 + VALID[52:], None),  # an all-zero parent id
        (VALID.upper(), None),
        (b"00-\x00x", None),
        (b"y" * 5_000_000, None),
        ("", None),
        (None, None),
    ],
)
def test_a_traceparent_from_outside_is_kept_only_as_w3c_writes_one(
    header: str | bytes | None, kept: str | None
) -> None:
    assert valid_traceparent(header) == kept
