"""Traces: W3C trace context on every message, and the spans a run leaves on its way through.

A run's trace holds every attempt of the run. A cron run's trace is its own and its id is the run
id, so the run id alone finds it; the relay's ``job.scheduling`` span of the first attempt is its
root, with ids derived from the run id (``run_traceparent``, ``message_span(root_of=...)``). A
one-shot run continues the trace its schedule was created in. A retry, a sweeper's re-dispatch
after an expired lease and a replay continue the run's trace. Each attempt goes through the relay's
``job.scheduling``, the worker's ``job.execution`` (and ``job.failure`` when it fails) and the
reconciler's ``process`` span; the ``traceparent`` header of each message links one hop to the
next, and its sampled flag, decided once per run (``_samples_run``), keeps a run's trace whole or
drops it whole. A message always gets a valid ``traceparent``: the current span's, or a fresh
random one when there is none, so the header is there even with tracing unconfigured.
(``scheduler.kafka.tracing`` puts it on Kafka messages; this module sits below the Kafka layer and
knows nothing of Kafka but the conventions' attribute names.)

Export follows the standard ``OTEL_*`` variables and is off unless they ask for it. With export
off a component still runs the SDK, only without span processors. Measured on the development
machine (CPython 3.11, SDK 1.45), a ``start_span_from_traceparent`` span with a run's dozen job and
Kafka attributes costs about 25 µs, against 14 µs with an always-off sampler, 12 µs with no SDK
and 40 µs when exporting. The extra microseconds buy what the cheaper choices lose: the sampled
flag a downstream component that does export relies on (an always-off sampler tells it to drop the
trace), spans with ids of their own for the logs to carry, and the sampler ``OTEL_TRACES_SAMPLER``
names; next to a run's PostgreSQL round trips they are noise. With ``OTEL_SDK_DISABLED=true`` there
is no SDK at all; the span helpers here still hand out a valid span context, so every message keeps
a valid ``traceparent`` and every hop of a run stays in one trace.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import traceback
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Final, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    format_span_id,
    format_trace_id,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes, AttributeValue

import scheduler
from scheduler.telemetry.redact import exception_text, redact_text

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator

__all__ = [
    "JOB_EXECUTION",
    "JOB_FAILURE",
    "JOB_SCHEDULING",
    "SCHEDULE_CREATE",
    "TRACEPARENT_HEADER",
    "TRACESTATE_HEADER",
    "MessagingOperation",
    "caller_context",
    "child_span",
    "child_traceparent",
    "configure_tracing",
    "context_from_traceparent",
    "continuing",
    "current_traceparent",
    "ending",
    "job_attributes",
    "job_outcome_attributes",
    "kafka_attributes",
    "links_from_traceparents",
    "mark_span_failed",
    "message_span",
    "messaging_span_kind",
    "messaging_span_name",
    "new_traceparent",
    "record_failure",
    "run_traceparent",
    "shutdown_tracing",
    "span_context_from_traceparent",
    "start_span_from_traceparent",
    "traceparent_of_span",
    "traces_export_requested",
    "tracing_exports",
]

_log = logging.getLogger(__name__)

# --- trace context: the traceparent a message carries -----------------------------------------

TRACEPARENT_HEADER: Final = "traceparent"
TRACESTATE_HEADER: Final = "tracestate"

# OpenTelemetry's own W3C parser, so a header is valid here exactly when it is for the SDK: it
# rejects malformed values, the reserved version ff, a fifth field after version 00, and the
# all-zero trace and span ids.
_PROPAGATOR = TraceContextTextMapPropagator()


# W3C Trace Context's traceparent: version, trace id, parent span id, flags, in lower-case hex. A
# version after 00 may add fields after a "-", which a reader of 00 reads it without. Version ff
# and all-zero ids are invalid.
_TRACEPARENT = re.compile(
    r"(?!ff)([0-9a-f]{2})-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})"
)
# Version 00 as every client writes it: taken as it is, with one match (every command and job
# message carries one, so the ingestor and the workers read thousands a second).
_TRACEPARENT_00 = re.compile(rb"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
TRACEPARENT_LENGTH: Final = 55


def valid_traceparent(value: str | bytes | None) -> str | None:
    """A ``traceparent`` that came from outside (a client's command, a job message) as this process
    keeps and passes it on: version 00's 55 characters; None when ``value`` is missing or is no
    traceparent. Whatever else a header holds (a NUL, megabytes, another format) is never stored
    or copied onward; only its first 56 characters are read. Read here, by the format's pattern,
    rather than by OpenTelemetry's propagator (:func:`context_from_traceparent`) and composed
    again: that took 4.9 µs a header against 0.35, and the ingestor reads one per command."""
    if value is None:
        return None
    if isinstance(value, bytes) and len(value) == TRACEPARENT_LENGTH and _TRACEPARENT_00.fullmatch(value):
        return value.decode("ascii")
    head = value[: TRACEPARENT_LENGTH + 1]
    text = head.decode("ascii", errors="replace") if isinstance(head, bytes) else head
    match = _TRACEPARENT.match(text)
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    rest = text[TRACEPARENT_LENGTH:]
    if rest and (version == "00" or rest != "-"):
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def context_from_traceparent(value: str | bytes | None) -> Context | None:
    """The context a span continues from, or ``None`` when the value is missing or invalid."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not value:
        return None
    context = _PROPAGATOR.extract({TRACEPARENT_HEADER: value})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def caller_context(traceparents: Sequence[str], tracestates: Sequence[str] = ()) -> Context | None:
    """The trace context a caller sent with a request (an API call's HTTP headers or gRPC metadata,
    every value of each name), for :func:`continuing`; None when it sent no valid ``traceparent``,
    or several. A malformed one is ignored, never refused: the call's spans then start a new trace,
    as they would without one. ``tracestate`` goes with a valid ``traceparent`` (its lines joined,
    as W3C allows; the propagator drops one over 8,192 characters or with a malformed member)."""
    traceparent = valid_traceparent(traceparents[0]) if len(traceparents) == 1 else None
    if traceparent is None:
        return None
    carrier: dict[str, str | list[str]] = {TRACEPARENT_HEADER: traceparent}
    if tracestates:
        carrier[TRACESTATE_HEADER] = list(tracestates)
    return _PROPAGATOR.extract(carrier)


@contextmanager
def continuing(caller: Context | None) -> Iterator[None]:
    """Run the block in a caller's trace context (:func:`caller_context`), so that the spans
    :func:`child_span` starts in it are children of the caller's span; None: in the current one."""
    if caller is None:
        yield
        return
    token = otel_context.attach(caller)
    try:
        yield
    finally:
        otel_context.detach(token)


def span_context_from_traceparent(value: str | bytes | None) -> SpanContext | None:
    """The remote span context a ``traceparent`` names, or ``None`` when missing or invalid."""
    context = context_from_traceparent(value)
    return None if context is None else trace.get_current_span(context).get_span_context()


def traceparent_of_span(span: Span) -> str:
    """The span's ``traceparent``; when the span is invalid (a no-op tracer's root), a fresh random
    one on each call. The spans this module starts are never invalid."""
    span_context = span.get_span_context()
    return _compose(span_context if span_context.is_valid else _random_span_context())


def current_traceparent() -> str:
    """The current span's ``traceparent``, or a new trace's when there is no valid current span."""
    return traceparent_of_span(trace.get_current_span())


def new_traceparent() -> str:
    """The ``traceparent`` for a message that starts here: the current span's (a scanner inside
    ``job.scheduling``), or a new trace when no span is current."""
    return current_traceparent()


def run_traceparent(run_id: uuid.UUID) -> str:
    """The ``traceparent`` of a run's job message when it continues no creation's trace: the run's
    own trace, also for a run made inside a span (a trigger inside its API call), since its later
    attempts know only the run's id.

    A run's own trace has the run's id for its trace id, so an operator finds it by the run id,
    and every attempt of the run (retries, an expired lease's next attempt, a replay) lands in it.
    Its parent span id is the run's root span (:func:`_run_root_span_id`), which the relay records
    as the first attempt's ``job.scheduling`` (``message_span``'s ``root_of``); the later attempts'
    spans are its children. Sampled, as a new trace's is.
    """
    return _compose(_run_root(run_id))


def _run_root(run_id: uuid.UUID) -> SpanContext:
    flags = TraceFlags(TraceFlags.SAMPLED if _samples_run(run_id) else TraceFlags.DEFAULT)
    return SpanContext(run_id.int, _run_root_span_id(run_id), is_remote=False, trace_flags=flags)


def _samples_run(run_id: uuid.UUID) -> bool:
    """Whether a run's own trace is recorded: this process's sampler asked as for a new trace whose
    id is the run id (a ratio sampler decides on the id's hash, see :func:`_spread`). Decided the
    same way wherever a run's message is made, and carried in every attempt's ``traceparent``, so
    a run's trace is recorded whole or not at all. Sampled when tracing is not configured here, as
    a new trace's is."""
    provider = _provider
    if provider is None:
        return True
    # An empty context, not the current one: a run made inside a span (a trigger's API call) is
    # not that span's child, and its later attempts, made elsewhere, must decide alike.
    decision = provider.sampler.should_sample(Context(), run_id.int, JOB_SCHEDULING).decision
    return bool(decision.is_sampled())  # type: ignore[no-untyped-call]


def _run_root_span_id(run_id: uuid.UUID) -> int:
    # The run id's last 64 bits (random in a UUIDv7); never the invalid all-zero span id.
    return (run_id.int & 0xFFFF_FFFF_FFFF_FFFF) or 1


def child_traceparent(parent: str | bytes | None) -> str:
    """A ``traceparent`` in the parent's trace, or a new trace when the parent is missing or invalid.

    Inside a valid span of the parent's trace (a worker inside ``job.execution``) that is the
    current span's, so the next hop's parent is a span that was recorded. Otherwise the span id is
    made up: the trace id still ties the messages together, though no recorded span has that id.
    """
    parent_context = span_context_from_traceparent(parent)
    if parent_context is None:
        return current_traceparent()
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == parent_context.trace_id:
        return current_traceparent()
    made_up = SpanContext(
        parent_context.trace_id, _random_span_id(), is_remote=False, trace_flags=parent_context.trace_flags
    )
    return _compose(made_up)


def _compose(span_context: SpanContext) -> str:
    trace_id, span_id = format_trace_id(span_context.trace_id), format_span_id(span_context.span_id)
    return f"00-{trace_id}-{span_id}-{span_context.trace_flags:02x}"


def _random_span_context() -> SpanContext:
    # Sampled, so that a downstream component that does export records the rest of the trace.
    return SpanContext(
        _random_trace_id(), _random_span_id(), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )


# Made-up ids need to be unique, not unguessable: the secrets module's system calls cost a worker a
# twentieth of its CPU at two ids per job. A generator of this module's own, so that a handler
# seeding the global one (random.seed) cannot make them repeat; seeded afresh in a forked child.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def _random_trace_id() -> int:
    # All-zero ids are invalid in W3C trace context: one chance in 2**128, but never on a header.
    while (trace_id := _ids.getrandbits(128)) == trace.INVALID_TRACE_ID:
        pass
    return trace_id


def _random_span_id() -> int:
    while (span_id := _ids.getrandbits(64)) == trace.INVALID_SPAN_ID:
        pass
    return span_id


# --- span names -------------------------------------------------------------------------------

SCHEDULE_CREATE: Final = "schedule.create"
"""A schedule's creation; a one-shot schedule's run continues this trace."""
JOB_SCHEDULING: Final = "job.scheduling"
"""From the run's outbox row's creation to Kafka's acknowledgement of its job message (the relay)."""
JOB_EXECUTION: Final = "job.execution"
"""One attempt: the handler running in a worker."""
JOB_FAILURE: Final = "job.failure"
"""An attempt's failure, recorded by ``record_failure`` under the span that saw it."""

MessagingOperation = Literal["send", "receive", "process"]
"""``messaging.operation.type`` of the current messaging conventions (``send`` replaced
``publish``)."""

# Kafka's own name for each operation type (``messaging.operation.name``, required for Kafka).
_KAFKA_OPERATION_NAME: Final[Mapping[str, str]] = {"send": "send", "receive": "poll", "process": "process"}
_SPAN_KIND: Final[Mapping[str, SpanKind]] = {
    "send": SpanKind.PRODUCER,
    "receive": SpanKind.CONSUMER,
    "process": SpanKind.CONSUMER,
}


def messaging_span_name(operation: MessagingOperation, topic: str) -> str:
    """``{operation} {destination}``, as the messaging conventions name spans: ``send sched.jobs.app``,
    ``process sched.results``. There are a few topics per app, so names stay low-cardinality."""
    return f"{_KAFKA_OPERATION_NAME[operation]} {topic}"


def messaging_span_kind(operation: MessagingOperation) -> SpanKind:
    return _SPAN_KIND[operation]


# --- attributes --------------------------------------------------------------------------------


def job_attributes(
    run_id: uuid.UUID | str,
    handler: str,
    attempt: int,
    scheduled_for: datetime | str | None,
    status: str | Enum | None = None,
    duration_ms: float | None = None,
    app: str | None = None,
    schedule_id: uuid.UUID | str | None = None,
) -> dict[str, AttributeValue]:
    """The ``job.*`` attributes of the system design, plus the app and schedule.

    Ids are fine here, unlike in metric labels: a span attribute is stored once per span, not as a
    series. ``job.retry_count`` counts retries, so the first attempt is 0.
    """
    attributes: dict[str, AttributeValue] = {
        "job.id": str(run_id),
        "job.type": handler,
        "job.retry_count": max(attempt - 1, 0),
    }
    if scheduled_for is not None:
        attributes["job.scheduled_at"] = _iso8601(scheduled_for)
    attributes.update(job_outcome_attributes(status, duration_ms))
    if app is not None:
        attributes["scheduler.app"] = app
    if schedule_id is not None:
        attributes["scheduler.schedule_id"] = str(schedule_id)
    return attributes


def job_outcome_attributes(
    status: str | Enum | None, duration_ms: float | None = None
) -> dict[str, AttributeValue]:
    """What is known only at the end of an attempt: set it on the span when the handler returns."""
    attributes: dict[str, AttributeValue] = {}
    if status is not None:
        attributes["job.status"] = str(status.value) if isinstance(status, Enum) else status
    if duration_ms is not None:
        attributes["job.execution_duration_ms"] = float(duration_ms)
    return attributes


def kafka_attributes(
    operation: MessagingOperation,
    topic: str,
    *,
    partition: int | None = None,
    offset: int | None = None,
    key: str | bytes | uuid.UUID | None = None,
    consumer_group: str | None = None,
    batch_size: int | None = None,
) -> dict[str, AttributeValue]:
    """The messaging conventions' attributes for a Kafka operation on one topic.

    The partition goes in ``messaging.destination.partition.id`` (a string), which replaced
    ``messaging.kafka.destination.partition``. A key without a canonical string form (bytes that
    are not UTF-8) is left out, as the conventions ask; pass a UUID key as the ``UUID``.
    ``batch_size`` is for spans that cover a batch, and only those.
    """
    attributes: dict[str, AttributeValue] = {
        "messaging.system": "kafka",
        "messaging.operation.type": operation,
        "messaging.operation.name": _KAFKA_OPERATION_NAME[operation],
        "messaging.destination.name": topic,
    }
    if partition is not None:
        attributes["messaging.destination.partition.id"] = str(partition)
    if offset is not None:
        attributes["messaging.kafka.offset"] = offset
    key_text = _key_text(key)
    if key_text is not None:
        attributes["messaging.kafka.message.key"] = key_text
    if consumer_group is not None:
        attributes["messaging.consumer.group.name"] = consumer_group
    if batch_size is not None:
        attributes["messaging.batch.message_count"] = batch_size
    return attributes


def _key_text(key: str | bytes | uuid.UUID | None) -> str | None:
    if key is None or isinstance(key, str):
        return key
    if isinstance(key, uuid.UUID):
        return str(key)
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _iso8601(instant: datetime | str) -> str:
    if isinstance(instant, str):
        return instant
    # Naive datetimes in this code base are UTC; the attribute always names its offset.
    aware = instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat()


# --- spans -------------------------------------------------------------------------------------

# A proxy until a provider is set, then the provider's tracer, cached by the API.
_TRACER = trace.get_tracer("scheduler", scheduler.__version__)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@contextmanager
def start_span_from_traceparent(
    name: str,
    traceparent: str | bytes | None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes = None,
    start_time: datetime | int | None = None,
    links: Iterable[Link] = (),
) -> Iterator[Span]:
    """A current span continuing the trace a message's ``traceparent`` names.

    Without a valid ``traceparent`` the span starts a new trace (a scanner's ``job.scheduling`` is
    each run's own trace). Either way its parent is never the enclosing span, which belongs to the
    component's own work (a scan, a batch of outcomes): that span, when valid, is linked instead.
    ``start_time`` (nanoseconds since the epoch, or a datetime) lets a span begin at an instant
    already past, such as the run's creation. An exception leaving the block marks the span failed
    (see ``mark_span_failed``) and propagates.
    """
    all_links = list(links)
    enclosing = trace.get_current_span().get_span_context()
    if enclosing.is_valid:
        all_links.append(Link(enclosing))
    parent = context_from_traceparent(traceparent) or Context()  # an empty context: a root
    span = _TRACER.start_span(
        name, context=parent, kind=kind, attributes=attributes, links=all_links, start_time=_ns(start_time)
    )
    with _activated(span, trace.get_current_span(parent).get_span_context()) as active:
        yield active


def message_span(
    name: str,
    traceparent: str | bytes | None,
    kind: SpanKind,
    attributes: Attributes = None,
    start_time: datetime | int | None = None,
    root_of: uuid.UUID | None = None,
) -> Span:
    """A started, not current, span in the trace a message's ``traceparent`` names, for the spans
    of a batch that are open together (one per message) and end when the batch is done
    (:func:`ending`). Not current, so that they neither parent nor link each other.

    With ``root_of`` (a run's first attempt) and a ``traceparent`` naming that run's own trace
    (:func:`run_traceparent`), the span is the trace's root, with the very ids the ``traceparent``
    names: the parent that the run's later spans name is then a span that was recorded."""
    parent = context_from_traceparent(traceparent)
    if root_of is not None and parent is not None:
        named = trace.get_current_span(parent).get_span_context()
        if (named.trace_id, named.span_id) == (root_of.int, _run_root_span_id(root_of)):
            # Recorded as the header says: the run's later spans follow the same flag.
            token = _CHOSEN_IDS.set((named.trace_id, named.span_id, named.trace_flags.sampled))
            try:
                return _TRACER.start_span(
                    name, context=Context(), kind=kind, attributes=attributes, start_time=_ns(start_time)
                )
            finally:
                _CHOSEN_IDS.reset(token)
    return _TRACER.start_span(
        name, context=parent or Context(), kind=kind, attributes=attributes, start_time=_ns(start_time)
    )


# The trace and span ids the next span started in this context takes, and whether it is sampled,
# for a run's root span; read by the id generator and the sampler configure_tracing gives the SDK.
_CHOSEN_IDS: ContextVar[tuple[int, int, bool] | None] = ContextVar("scheduler_chosen_span_ids", default=None)


def _id_generator() -> IdGenerator:
    """The SDK's random ids, but those of ``_CHOSEN_IDS`` while they are set."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class ChosenOrRandomIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            chosen = _CHOSEN_IDS.get()
            return chosen[0] if chosen is not None else super().generate_trace_id()

        def generate_span_id(self) -> int:
            chosen = _CHOSEN_IDS.get()
            return chosen[1] if chosen is not None else super().generate_span_id()

        def is_trace_id_random(self) -> bool:
            # A run id's first bits are its creation time, not random (W3C's random flag).
            return _CHOSEN_IDS.get() is None

    return ChosenOrRandomIds()


def _spread(trace_id: int) -> int:
    """The trace id with its low 64 bits replaced by a hash of all 128 (splitmix64's finaliser of
    their two halves' exclusive or), for the sampler to decide on. A ratio sampler reads the low 64
    bits as a uniform number, and a run id's are not: its variant bits are always 10, and the next
    ones count up within a millisecond. Left as they are, a rate of 0.5 or below recorded no run's
    trace and one of 0.9 recorded every one. A random id stays uniform, since the hash is one to one."""
    low = (trace_id ^ (trace_id >> 64)) & _LOW_64
    low = ((low ^ (low >> 30)) * 0xBF58476D1CE4E5B9) & _LOW_64
    low = ((low ^ (low >> 27)) * 0x94D049BB133111EB) & _LOW_64
    return (trace_id & ~_LOW_64) | (low ^ (low >> 31))


_LOW_64: Final = (1 << 64) - 1


def _new_provider(resource: Resource | None = None) -> TracerProvider:
    """An SDK provider with the sampler ``OTEL_TRACES_SAMPLER`` names, deciding on the spread trace
    id (:func:`_spread`) and giving a run's root the decision its ``traceparent`` carries, and with
    the id generator that gives a run's root its ids."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class RunAwareSampler(Sampler):
        def __init__(self, configured: Sampler) -> None:
            self._configured = configured

        def should_sample(
            self,
            parent_context: Context | None,
            trace_id: int,
            name: str,
            kind: SpanKind | None = None,
            attributes: Attributes = None,
            links: Sequence[Link] | None = None,
            trace_state: TraceState | None = None,
        ) -> SamplingResult:
            chosen = _CHOSEN_IDS.get()
            if chosen is not None:  # a run's root: recorded exactly when its later spans are
                sampled = chosen[2]
                return SamplingResult(Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP,
                                      attributes if sampled else None)  # fmt: skip
            return self._configured.should_sample(
                parent_context, _spread(trace_id), name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return self._configured.get_description()

    provider = TracerProvider(resource=resource, id_generator=_id_generator())
    # The SDK reads OTEL_TRACES_SAMPLER (and its argument) when no sampler is given; its tracers
    # read the provider's sampler when they are made, and none is made yet.
    provider.sampler = RunAwareSampler(provider.sampler)
    return provider


@contextmanager
def ending(spans: Sequence[Span]) -> Iterator[Sequence[Span]]:
    """Ends every span when the block ends; an exception leaving it marks each one failed first."""
    try:
        yield spans
    except BaseException as exc:
        for span in spans:
            mark_span_failed(span, exc)
        raise
    finally:
        for span in spans:
            span.end()


@contextmanager
def child_span(
    name: str,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes = None,
    start_time: datetime | int | None = None,
    links: Iterable[Link] = (),
) -> Iterator[Span]:
    """A current span under the current one (a new trace when there is none): a step inside a
    component, such as the relay's batch or the reconciler's transaction."""
    parent = trace.get_current_span().get_span_context()
    span = _TRACER.start_span(
        name, kind=kind, attributes=attributes, links=list(links), start_time=_ns(start_time)
    )
    with _activated(span, parent) as active:
        yield active


def links_from_traceparents(values: Iterable[str | bytes | None]) -> list[Link]:
    """Links to the messages a batch span covers; missing and invalid values are skipped."""
    contexts = (span_context_from_traceparent(value) for value in values)
    return [Link(context) for context in contexts if context is not None]


def mark_span_failed(
    span: Span, error: BaseException | str, message: str | None = None, stack_trace: str | None = None
) -> None:
    """Status ERROR, ``error.type`` and an ``exception`` event on ``span``.

    ``error`` is the exception, or an error class name when there is none (with the exception's
    formatted frames in ``stack_trace``, when it was formatted before it went). The text
    (``message``, else the exception's) and the stack trace go through ``redact_text``, as
    everything stored as an error does: exported spans outlive the process and are read by people
    without the secrets.
    """
    if not span.is_recording():
        return
    error_type = error if isinstance(error, str) else _qualified_name(type(error))
    text = message if message is not None or isinstance(error, str) else exception_text(error)
    event: dict[str, AttributeValue] = {"exception.type": error_type}
    if text:
        event["exception.message"] = redact_text(text)
    if isinstance(error, BaseException) and error.__traceback__ is not None:
        stack_trace = "".join(traceback.format_tb(error.__traceback__))
    if stack_trace:
        event["exception.stacktrace"] = redact_text(stack_trace)
    span.set_attribute("error.type", error_type)
    span.add_event("exception", event)
    span.set_status(Status(StatusCode.ERROR, redact_text(text) if text else error_type))


def record_failure(
    error: BaseException | str,
    message: str | None = None,
    attributes: Attributes = None,
    *,
    stack_trace: str | None = None,
) -> None:
    """A ``job.failure`` span under the current span, which is marked failed as well.

    ``error`` is the exception, or the error class name when there is no exception object (an
    outcome message, an expired lease). ``attributes`` are typically ``job_attributes`` with the
    failed status, so that a search for failures finds the run without its parent span.
    """
    mark_span_failed(trace.get_current_span(), error, message, stack_trace)
    span = _TRACER.start_span(JOB_FAILURE, attributes=attributes)
    mark_span_failed(span, error, message, stack_trace)
    span.end()


@contextmanager
def _activated(span: Span, parent: SpanContext) -> Iterator[Span]:
    if not span.get_span_context().is_valid:
        # A no-op tracer (OTEL_SDK_DISABLED, or tracing never configured) gives a root nothing
        # valid; a context of its own keeps the messages sent from inside it in one trace.
        span = NonRecordingSpan(parent if parent.is_valid else _random_span_context())
    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        try:
            yield span
        except Exception as error:
            mark_span_failed(span, error)
            raise


def _ns(instant: datetime | int | None) -> int | None:
    if instant is None or isinstance(instant, int):
        return instant
    aware = instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)
    return (aware - _EPOCH) // timedelta(microseconds=1) * 1000


def _qualified_name(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


# --- configuration -----------------------------------------------------------------------------

_lock = threading.Lock()
_provider: TracerProvider | None = None
_configured = False
_exporting = False


def configure_tracing(component: str, *, export_timeout_s: float | None = None) -> None:
    """Set this process's tracer provider once; later calls do nothing.

    The resource names the service ``OTEL_SERVICE_NAME`` or ``scheduler-<component>``, with the
    package version. The sampler is the SDK's from ``OTEL_TRACES_SAMPLER`` (parent-based, always
    on, by default). Spans are exported only when ``traces_export_requested`` says so, by a batch
    processor and the OTLP/HTTP exporter, which reads the endpoint, headers, timeout, compression
    and certificates from the environment itself. ``export_timeout_s`` replaces the environment's
    timeout (``OTEL_EXPORTER_OTLP_TIMEOUT``): the exporter's own bound on one export, its retries
    included, and so on how long :func:`shutdown_tracing` waits for the collector.
    """
    global _provider, _configured, _exporting
    with _lock:
        if _configured:
            return
        _configured = True
        if _sdk_disabled(os.environ):
            _log.info("tracing: OTEL_SDK_DISABLED is true; no spans are recorded or exported")
            return
        # Imported here, not at the top: every module that puts a traceparent on a message
        # imports this one, and only a component's start needs the SDK (~35 ms to import).
        from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, OTELResourceDetector, Resource

        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over these defaults, as the spec asks;
        # Resource.create alone would let the code's attributes win.
        resource = Resource.create(
            {
                SERVICE_NAME: f"scheduler-{component}",
                SERVICE_VERSION: scheduler.__version__,
                **OTELResourceDetector().detect().attributes,
            }
        )
        service = resource.attributes[SERVICE_NAME]
        provider = _new_provider(resource)
        if traces_export_requested(os.environ):
            # Only a process that exports pays for the exporter and its HTTP stack (~60 ms).
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=export_timeout_s)))
            _exporting = True
            _log.info("tracing: exporting spans of %s over OTLP/HTTP to %s", service, _endpoint(os.environ))
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is not provider:
            _log.warning("tracing: a tracer provider was already set; it stays in use")
            provider.shutdown()
            _exporting = False
            return
        _provider = provider


def shutdown_tracing() -> None:
    """Export the spans still queued and stop exporting; for a component's stop. Idempotent.

    It may take up to the exporter's timeout (``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s by default, or
    ``configure_tracing``'s ``export_timeout_s``) when the collector does not answer: the SDK's
    processor waits out the export under way, and its ``shutdown`` takes no timeout of its own.
    """
    global _provider, _exporting
    with _lock:
        provider, _provider = _provider, None
        _exporting = False
    if provider is not None:
        provider.shutdown()


def tracing_exports() -> bool:
    """Whether this process exports spans (configured, export requested, not shut down)."""
    return _exporting


def traces_export_requested(environ: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables ask for OTLP trace export.

    They do when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER`` names ``otlp`` explicitly
    (then the standard default, localhost:4318, applies) — unless ``OTEL_TRACES_EXPORTER`` is
    ``none`` or names no ``otlp``, ``OTEL_SDK_DISABLED`` is true, or the protocol asked for is not
    ``http/protobuf``, the only one installed.
    """
    if _sdk_disabled(environ):
        return False
    exporters = {name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")} - {""}
    if "none" in exporters:
        return False
    if unsupported := sorted(exporters - {"otlp"}):
        _log.warning("tracing: OTEL_TRACES_EXPORTER %s not supported; only otlp is", unsupported)
    if exporters and "otlp" not in exporters:
        return False
    endpoint_set = bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    if not (endpoint_set or "otlp" in exporters):
        return False
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    ).strip()
    if protocol not in ("", "http/protobuf"):
        _log.error("tracing: OTLP protocol %r is not supported, only http/protobuf; not exporting", protocol)
        return False
    return True


def _endpoint(environ: Mapping[str, str]) -> str:
    # The exporter's own resolution, for the log line only.
    if traces := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    return f"{base.removesuffix('/')}/v1/traces"


def _sdk_disabled(environ: Mapping[str, str]) -> bool:
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
