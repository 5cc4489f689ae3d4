"""Retry maths: attempts, and exponential backoff with full jitter."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.domain.retry import RetryPolicy, http_status_is_retryable


def test_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.base_seconds, policy.max_backoff_seconds) == (3, 1.0, 300.0)


def test_should_retry_until_the_last_attempt_and_never_a_non_retryable_error() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert [policy.should_retry(attempt, retryable=True) for attempt in (1, 2, 3, 4)] == [
        True,
        True,
        False,
        False,
    ]
    assert not policy.should_retry(1, retryable=False)
    assert not RetryPolicy(max_attempts=1).should_retry(1, retryable=True)


def test_backoff_ceiling_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(base_seconds=1.0, max_backoff_seconds=300.0)
    assert [policy.backoff_ceiling_seconds(n) for n in range(1, 11)] == [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0,
    ]  # fmt: skip
    assert policy.backoff_ceiling_seconds(10_000) == 300.0


class Extreme(random.Random):
    """A random source that always draws one end of the interval."""

    def __init__(self, high: bool) -> None:
        super().__init__()
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


def test_full_jitter_spans_zero_to_the_ceiling() -> None:
    policy = RetryPolicy(base_seconds=2.0)
    assert policy.backoff_seconds(3, Extreme(high=False)) == 0.0
    assert policy.backoff_seconds(3, Extreme(high=True)) == 8.0
    delays = [policy.backoff_seconds(3, random.Random(seed)) for seed in range(2000)]
    assert 0.0 <= min(delays) < 0.1 and 7.9 < max(delays) <= 8.0
    assert 3.6 < sum(delays) / len(delays) < 4.4  # uniform: mean is half the ceiling


def test_an_injected_random_makes_backoff_reproducible() -> None:
    policy = RetryPolicy()
    assert policy.backoff_seconds(4, random.Random(7)) == policy.backoff_seconds(4, random.Random(7))


def test_next_attempt_at() -> None:
    failed_at = datetime(2027, 1, 1, tzinfo=UTC)
    due = RetryPolicy(base_seconds=10.0).next_attempt_at(failed_at, 2, Extreme(high=True))
    assert due == failed_at + timedelta(seconds=20)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_seconds": -1.0},
        {"max_backoff_seconds": -1.0},
        {"base_seconds": float("nan")},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_attempts_are_numbered_from_one() -> None:
    with pytest.raises(ValueError, match="numbered from 1"):
        RetryPolicy().backoff_seconds(0)
    with pytest.raises(ValueError, match="numbered from 1"):
        RetryPolicy().should_retry(0, retryable=True)


def test_http_statuses() -> None:
    assert [http_status_is_retryable(s) for s in (400, 401, 404, 408, 422, 429, 500, 502, 503)] == [
        False, False, False, True, False, True, True, True, True,
    ]  # fmt: skip


@settings(max_examples=300)
@given(
    attempt=st.integers(min_value=1, max_value=2000),
    base=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    cap=st.floats(min_value=0.0, max_value=1e7, allow_nan=False),
    seed=st.integers(),
)
def test_backoff_stays_within_bounds(attempt: int, base: float, cap: float, seed: int) -> None:
    policy = RetryPolicy(max_attempts=5, base_seconds=base, max_backoff_seconds=cap)
    delay = policy.backoff_seconds(attempt, random.Random(seed))
    ceiling = policy.backoff_ceiling_seconds(attempt)
    assert 0.0 <= delay <= ceiling <= cap
    assert ceiling == min(cap, base * 2.0 ** min(attempt - 1, 1023))
