"""Rate limits per principal and method class: token buckets in PostgreSQL, shared by every replica.

A bucket holds a class's count of tokens (its burst) and refills at count per period; the refill is
computed by the database from its own clock in the statement that takes the token, so replicas
never disagree and two replicas together allow no more than one: the limit plus one burst. An
allowed request costs one statement and one row update (HOT: no indexed column changes); a refused
one costs one statement and writes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from scheduler.api.errors import ApiError, Code
from scheduler.store import api as store

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Limit:
    count: int
    period_s: float

    @property
    def rate_per_s(self) -> float:
        return self.count / self.period_s


class RateLimiter:
    def __init__(self, limits: Iterable[tuple[str, int, float]]) -> None:
        self.limits = {name: Limit(count, period) for name, count, period in limits}

    def take(self, conn: psycopg.Connection[Row], principal: str, bucket: str) -> None:
        """Take a token of ``bucket`` for ``principal`` or raise RATE_LIMITED with when to retry."""
        limit = self.limits[bucket]
        take = store.take_rate_token(conn, principal, bucket, float(limit.count), limit.rate_per_s)
        if take.allowed:
            return
        retry_after = max(1, math.ceil((1 - take.tokens) / limit.rate_per_s))
        raise ApiError(
            Code.RATE_LIMITED,
            f"rate limit of {limit.count} {bucket} requests per {limit.period_s:g} s reached; "
            f"retry in {retry_after} s",
            {"retry_after_seconds": retry_after, "limit": limit.count, "period_seconds": limit.period_s},
        )
