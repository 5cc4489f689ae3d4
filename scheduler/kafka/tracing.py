"""W3C trace context on every message: a run's trace starts when it is scheduled, and each message
that follows from it (outcomes, dead letters) carries the same trace id with a span of its own.

The ``traceparent`` values come from ``scheduler.telemetry.tracing`` (the current span's, or a new
trace's); this module only knows where a Kafka message keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.telemetry.tracing import (
    TRACEPARENT_HEADER,
    child_traceparent,
    new_traceparent,
    run_traceparent,
    valid_traceparent,
)

__all__ = ["HEADER", "child_traceparent", "new_traceparent", "run_traceparent", "traceparent_of"]

HEADER = TRACEPARENT_HEADER


def traceparent_of(
    headers: Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]] | None,
) -> str | None:
    """The ``traceparent`` of a message's headers (confluent-kafka's list, or a mapping), when it is
    one (:func:`valid_traceparent`): a client's header is never kept or passed on as it came."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == HEADER and value is not None:
            return valid_traceparent(value)
    return None
