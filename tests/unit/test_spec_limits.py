"""A schedule's numeric limits are the spec's: validation refuses a number outside them with a
:class:`LimitExceeded` naming the spec's field, its bounds and the value, in milliseconds, and the
API words that same refusal in its own fields and seconds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.api.errors import ApiError
from scheduler.api.messages import spec_of_create, spec_of_update
from scheduler.schedule.spec import (
    MAX_ATTEMPTS,
    MAX_DELAY_MS,
    MAX_PAYLOAD_VALUES,
    MAX_TIMEOUT_MS,
    InvalidSchedule,
    LimitExceeded,
    ScheduleSpec,
    check_limits,
    validate,
)
from scheduler.v1 import scheduler_pb2 as pb

SPEC = ScheduleSpec(app="billing", handler="builtin:noop", kind="cron", cron="0 9 * * *")


def spec_with(numbers: Mapping[str, Any]) -> ScheduleSpec:
    return dataclasses.replace(SPEC, **numbers)


def refusal(**numbers: int) -> LimitExceeded:
    with pytest.raises(LimitExceeded) as refused:
        validate(spec_with(numbers))
    return refused.value


@pytest.mark.parametrize(
    ("field", "value", "low", "high", "message"),
    [
        ("max_attempts", 0, 1, MAX_ATTEMPTS, "max_attempts must be 1 to 100, got 0"),
        ("max_attempts", 101, 1, MAX_ATTEMPTS, "max_attempts must be 1 to 100, got 101"),
        ("timeout_ms", 0, 1, MAX_TIMEOUT_MS, "timeout must be 1 ms to 24 h, got 0 ms"),
        ("timeout_ms", 86_400_001, 1, MAX_TIMEOUT_MS, "timeout must be 1 ms to 24 h, got 86400001 ms"),
        ("backoff_base_ms", -1, 0, MAX_DELAY_MS,
         "backoff must satisfy 0 <= base <= max <= 24 h, got base -1 ms and max 300000 ms"),
        ("backoff_max_ms", 86_400_001, 0, MAX_DELAY_MS,
         "backoff must satisfy 0 <= base <= max <= 24 h, got base 1000 ms and max 86400001 ms"),
        ("jitter_ms", -1, 0, MAX_DELAY_MS, "jitter must be 0 to 24 h, got -1 ms"),
        ("jitter_ms", 86_400_001, 0, MAX_DELAY_MS, "jitter must be 0 to 24 h, got 86400001 ms"),
    ],
)  # fmt: skip
def test_a_number_out_of_its_limits_is_refused_with_its_field_bounds_and_value(
    field: str, value: int, low: int, high: int, message: str
) -> None:
    refused = refusal(**{field: value})
    assert isinstance(refused, InvalidSchedule)
    assert (refused.field, refused.low, refused.high, refused.value) == (field, low, high, value)
    assert refused.bounded_by is None
    assert str(refused) == message  # as the CLI and Kafka commands have always said it


def test_a_backoff_base_over_its_max_is_bounded_by_the_max() -> None:
    refused = refusal(backoff_base_ms=10_000, backoff_max_ms=5_000)
    assert (refused.field, refused.low, refused.high, refused.value) == ("backoff_base_ms", 0, 5_000, 10_000)
    assert refused.bounded_by == "backoff_max_ms"
    assert str(refused) == "backoff must satisfy 0 <= base <= max <= 24 h, got base 10000 ms and max 5000 ms"


def test_the_limits_themselves_are_accepted() -> None:
    for numbers in (
        {"max_attempts": 1, "timeout_ms": 1, "backoff_base_ms": 0, "backoff_max_ms": 0, "jitter_ms": 0},
        {"max_attempts": MAX_ATTEMPTS, "timeout_ms": MAX_TIMEOUT_MS, "backoff_base_ms": MAX_DELAY_MS,
         "backoff_max_ms": MAX_DELAY_MS, "jitter_ms": MAX_DELAY_MS},
    ):  # fmt: skip
        spec = spec_with(numbers)
        assert validate(spec) is spec


NUMBERS = st.integers(min_value=-2 * MAX_DELAY_MS, max_value=2 * MAX_DELAY_MS)


@given(
    max_attempts=st.integers(min_value=-5, max_value=2 * MAX_ATTEMPTS),
    timeout_ms=NUMBERS,
    backoff_base_ms=NUMBERS,
    backoff_max_ms=NUMBERS,
    jitter_ms=NUMBERS,
)
def test_a_refusal_names_a_value_the_spec_holds_and_bounds_it_breaks(**numbers: int) -> None:
    spec = spec_with(numbers)
    try:
        check_limits(spec)
    except LimitExceeded as refused:
        assert getattr(spec, refused.field) == refused.value
        assert not refused.low <= refused.value <= refused.high
        if refused.bounded_by is not None:
            assert getattr(spec, refused.bounded_by) == refused.high
    else:
        assert numbers["backoff_base_ms"] <= numbers["backoff_max_ms"]


def api_refusal(call: Callable[[], ScheduleSpec]) -> ApiError:
    with pytest.raises(ApiError) as refused:
        call()
    return refused.value


def test_the_api_says_a_limit_in_its_field_and_seconds() -> None:
    request = pb.CreateScheduleRequest(app="billing", handler="builtin:noop", timeout_seconds=90_000)
    refused = api_refusal(lambda: spec_of_create(request))
    assert (refused.message, refused.details) == (
        "timeout_seconds must be 0.001 to 86400, got 90000",
        {"field": "timeout_seconds"},
    )
    too_many = pb.CreateScheduleRequest(
        app="billing", handler="builtin:noop", retry_config=pb.RetryConfig(max_attempts=1_000_000)
    )
    refused = api_refusal(lambda: spec_of_create(too_many))
    assert refused.message == "retry_config.max_attempts must be 1 to 100, got 1000000"


def test_the_api_names_the_backoff_an_update_leaves_out_as_stored() -> None:
    stored = dataclasses.replace(SPEC, backoff_base_ms=10_000, backoff_max_ms=60_000)
    request = pb.UpdateScheduleRequest(retry_config=pb.RetryConfig(max_backoff_seconds=5))
    refused = api_refusal(lambda: spec_of_update(stored, request))
    assert (refused.message, refused.details) == (
        "retry_config.backoff_seconds (as stored or by default) (10) must not be over "
        "retry_config.max_backoff_seconds (5)",
        {"field": "retry_config.max_backoff_seconds"},
    )


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(86_400.001, "86400.001"), (123_456.789, "123456.789"), (1e9, "1000000000")],
)
def test_the_api_says_the_value_given_not_one_rounded_to_six_digits(seconds: float, said: str) -> None:
    """It said `timeout_seconds must be 0.001 to 86400, got 86400` for 86400.001, and `got 1e+09`."""
    request = pb.CreateScheduleRequest(app="billing", handler="builtin:noop", timeout_seconds=seconds)
    refused = api_refusal(lambda: spec_of_create(request))
    assert refused.message == f"timeout_seconds must be 0.001 to 86400, got {said}"


def test_a_payload_of_more_values_than_the_limit_is_refused_naming_the_payload() -> None:
    """Validation's own rule, for the CLI and the ingestor as for the API."""
    validate(dataclasses.replace(SPEC, payload=[0] * (MAX_PAYLOAD_VALUES - 1)))
    with pytest.raises(InvalidSchedule, match="more than 100,000 values") as refused:
        validate(dataclasses.replace(SPEC, payload={"ids": [0] * (MAX_PAYLOAD_VALUES - 1)}))
    assert refused.value.field == "payload"
