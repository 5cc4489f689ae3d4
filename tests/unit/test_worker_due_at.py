"""When a first attempt was due to start, as the worker reads it from its job's headers: what its
start lag counts from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.kafka.messages import DUE_AT_HEADER
from scheduler.worker.worker import _due_at

INSTANT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RELEASED = INSTANT + timedelta(seconds=7, microseconds=250)


def test_a_job_let_go_after_its_instant_is_due_when_its_headers_say() -> None:
    headers = [("traceparent", b"00-x"), (DUE_AT_HEADER, RELEASED.isoformat().encode())]
    assert _due_at(headers, INSTANT) == RELEASED
    # Another offset names the same instant.
    other = RELEASED.astimezone(UTC).replace(tzinfo=None).isoformat() + "-05:00"
    assert _due_at([(DUE_AT_HEADER, other.encode())], INSTANT) == RELEASED + timedelta(hours=5)


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"yesterday",
        b"\xff\xfe",
        RELEASED.replace(tzinfo=None).isoformat().encode(),  # no offset: whose clock?
        b"2026-03-01T12:00:07+00:00" + b" " * 100,
    ],
)
def test_without_a_valid_header_a_job_is_due_at_its_instant(value: bytes | None) -> None:
    assert _due_at([(DUE_AT_HEADER, value)], INSTANT) == INSTANT
    assert _due_at([], INSTANT) == INSTANT, "a job from an older scanner"


def test_a_job_is_never_due_before_its_instant_and_the_first_header_counts() -> None:
    earlier = (INSTANT - timedelta(hours=1)).isoformat().encode()
    assert _due_at([(DUE_AT_HEADER, earlier)], INSTANT) == INSTANT
    twice = [(DUE_AT_HEADER, RELEASED.isoformat().encode()), (DUE_AT_HEADER, earlier)]
    assert _due_at(twice, INSTANT) == RELEASED
