"""A run, one fire of a schedule, and the failed attempts it carries towards its dead letter.

The run's states and their legal moves are :mod:`scheduler.domain.run_state`'s; this module holds
what a run is at one moment, as the store last saw it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler.domain.run_state import RunId, RunState
from scheduler.domain.schedule import ScheduleId, SkipReason

__all__ = ["FailedAttempt", "Run"]


@dataclass(frozen=True, slots=True)
class Run:
    """One fire of a schedule. ``attempt`` is the fencing token: only outcomes that name it count."""

    id: RunId
    schedule_id: ScheduleId
    app: str
    scheduled_for: datetime
    state: RunState
    attempt: int
    max_attempts: int
    """The run's own budget: its schedule's when created, raised by a dead-letter replay."""
    lease_expires_at: datetime | None
    next_attempt_at: datetime | None
    """When the next attempt is due (``retry_wait``)."""
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    result: Any
    """The handler's JSON result once succeeded, else None."""
    error: str | None
    skip_reason: SkipReason | None
    buffered: bool
    """``buffer_one``: created while the previous run was open, dispatched when that one ends."""
    guarded: bool
    """Its schedule's overlap policy is not ``allow``: while open, the next fires wait or skip."""
    created_at: datetime
    reconciled_at: datetime | None
    """When the reconciler last applied an event or a verdict to it."""
    version: int


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """An attempt that failed (retryably, or for good before a replay): the history a run's later
    attempts carry to its dead letter."""

    attempt: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    error_class: str | None
