"""The outcomes a worker owes Kafka: each is produced until Kafka acknowledges it, never dropped.

An outcome (success, retry or dead letter) is what lets a job's offset finish, so losing one would
either freeze its partition's commit point or, after a restart, run the job again with no record
of the first execution. A delivery that fails (Kafka down longer than the producer's own retries,
a produce that raised) is produced again after a capped, jittered backoff, until it is
acknowledged or the worker stops (then its offset stays uncommitted and the job is re-delivered).
An outcome Kafka refuses for its size is produced in its compact form (shorter texts, no copy of
the job's bytes), which always fits.

:class:`Owed` is one outcome; :class:`Redeliveries` holds the ones waiting for their next try.
Both belong to the worker's consumer thread, which settles delivery reports.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 10.0

D = TypeVar("D")


@dataclass(eq=False)
class Owed(Generic[D]):
    """An outcome and what it finishes: ``delivery`` (the consumed job), ``topic``, ``key`` and its
    encoded ``value``; ``compact`` builds the smaller form for a size refusal (once)."""

    delivery: D
    topic: str
    key: bytes | None
    value: bytes
    compact: Callable[[], bytes] | None = None
    failures: int = 0
    due: float = 0.0

    def failed(self, now: float, *, too_large: bool, rng: random.Random | None = None) -> None:
        """Schedule the next try: at once in compact form after a size refusal, else after backoff."""
        self.failures += 1
        if too_large and self.compact is not None:
            self.value, self.compact = self.compact(), None
            self.due = now
            return
        ceiling = min(RETRY_MAX_S, RETRY_INITIAL_S * 2 ** min(self.failures - 1, 30))
        self.due = now + (rng or random).uniform(ceiling / 2, ceiling)


@dataclass
class Redeliveries(Generic[D]):
    """Outcomes whose delivery failed, until their next try is due."""

    _waiting: list[Owed[D]] = field(default_factory=list)

    def add(self, owed: Owed[D]) -> None:
        self._waiting.append(owed)

    def due(self, now: float) -> list[Owed[D]]:
        """The outcomes to produce again now, taken out (a new failure adds them back)."""
        ready = [o for o in self._waiting if o.due <= now]
        if ready:
            self._waiting = [o for o in self._waiting if o.due > now]
        return ready

    def __len__(self) -> int:
        return len(self._waiting)
