"""Retry maths: whether a failed attempt gets another, and how long it waits first.

The reconciler applies this when a worker reports a failure: a retryable failure with attempts
left moves the run to ``retry_wait`` with ``next_attempt_at`` = failure time + backoff, and the
scanner re-dispatches it when due; anything else is dead. Backoff is exponential with full jitter,
which spreads a burst of failures instead of retrying it in lockstep. The
random source is injectable so that tests and replays are deterministic.

``attempt`` here is the attempt's place in its budget. A worker passes the run's attempt number,
which a ``dlq replay`` does not reset (it is the fencing token); the reconciler scales a replayed
run's wait to the attempt's place in the replay's fresh budget (``apply_outcomes``), so that its
first failure after the replay waits as a new run's first does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["RetryPolicy", "http_status_is_retryable"]

# Shared by default so that every process draws independent delays without seeding by hand.
_DEFAULT_RANDOM = random.Random()


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts a run gets (the first included) and how backoff grows between them.

    Attempts are numbered from 1. The wait after attempt ``n`` fails is drawn uniformly from
    ``[0, min(max_backoff_seconds, base_seconds * 2 ** (n - 1))]``.
    """

    max_attempts: int = 3
    base_seconds: float = 1.0
    max_backoff_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not self.base_seconds >= 0:
            raise ValueError(f"base_seconds must be >= 0, got {self.base_seconds}")
        if not self.max_backoff_seconds >= 0:
            raise ValueError(f"max_backoff_seconds must be >= 0, got {self.max_backoff_seconds}")

    def should_retry(self, attempt: int, retryable: bool) -> bool:
        """Whether the failure of attempt number ``attempt`` earns another attempt."""
        _check_attempt(attempt)
        return retryable and attempt < self.max_attempts

    def backoff_ceiling_seconds(self, attempt: int) -> float:
        """The largest wait after attempt ``attempt`` fails: min(max, base * 2^(attempt-1))."""
        _check_attempt(attempt)
        # Past 2**1023 a float overflows; long before that the cap has taken over anyway.
        exponent = min(attempt - 1, 1023)
        return min(self.max_backoff_seconds, self.base_seconds * 2.0**exponent)

    def backoff_seconds(self, attempt: int, rng: random.Random | None = None) -> float:
        """A full-jitter wait after attempt ``attempt`` fails, in seconds."""
        ceiling = self.backoff_ceiling_seconds(attempt)
        return (rng or _DEFAULT_RANDOM).uniform(0.0, ceiling)

    def next_attempt_at(
        self, failed_at: datetime, attempt: int, rng: random.Random | None = None
    ) -> datetime:
        """When the attempt after ``attempt`` becomes due, given the time the failure was seen."""
        return failed_at + timedelta(seconds=self.backoff_seconds(attempt, rng))


def http_status_is_retryable(status: int) -> bool:
    """Whether an HTTP job's failure status is worth retrying.

    A 4xx says the request itself is wrong and will be wrong again, except 408 (timeout) and 429
    (rate limited), which are about timing; server errors are retried.
    """
    if 400 <= status < 500:
        return status in (408, 429)
    return True


def _check_attempt(attempt: int) -> None:
    if attempt < 1:
        raise ValueError(f"attempts are numbered from 1, got {attempt}")
