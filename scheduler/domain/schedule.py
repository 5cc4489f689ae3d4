"""What a schedule is, in the domain's words: the :class:`Schedule` itself, its kind, its state and
its policies, and the :class:`ExecutionSettings` every attempt of its runs carries.

The enums are the values the CLI and the ingestor accept, the store persists and the scanner acts
on. String enums, so that each value is also its spelling in JSON, SQL and the CLI.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NewType

__all__ = [
    "DEFAULT_CATCHUP_WINDOW",
    "MAX_CATCHUP_FIRES",
    "ExecutionSettings",
    "MisfirePolicy",
    "OverlapPolicy",
    "Schedule",
    "ScheduleId",
    "ScheduleKind",
    "ScheduleState",
    "SkipReason",
]

ScheduleId = NewType("ScheduleId", uuid.UUID)

DEFAULT_CATCHUP_WINDOW = timedelta(seconds=60)
"""How late a fire may be found and still count as on time rather than misfired."""

MAX_CATCHUP_FIRES = 100
"""The most runs one scan creates for one schedule, and the most skipped fires it records."""


class ScheduleKind(StrEnum):
    IMMEDIATE = "immediate"  # fires once, now
    DELAYED = "delayed"  # fires once, at run_at
    CRON = "cron"  # fires at the instants its cron expression matches in its time zone


class ScheduleState(StrEnum):
    ACTIVE = "active"  # the scanner fires it when next_fire_at is due
    PAUSED = "paused"  # does not fire; on resume its misfire policy decides about missed fires
    CANCELLED = "cancelled"  # by a user; never fires again
    COMPLETED = "completed"  # a one-shot that fired, or a cron schedule past its end bound
    ERROR = "error"  # its next fire cannot be computed (zone or expression); the reason is kept


class MisfirePolicy(StrEnum):
    """What the scanner does with fires found later than the catch-up window (e.g. after downtime)."""

    FIRE_ONCE = "fire_once"  # one run, for the latest missed time; the others recorded as skipped
    FIRE_ALL = "fire_all"  # a run for every missed time, at most MAX_CATCHUP_FIRES per scan
    SKIP = "skip"  # no run; the missed times recorded as skipped; next fire in the future


class OverlapPolicy(StrEnum):
    """What a fire does while the previous run of the same schedule is not terminal."""

    ALLOW = "allow"  # run anyway
    SKIP = "skip"  # record the fire as skipped
    BUFFER_ONE = "buffer_one"  # keep at most one waiting fire, started when the current run ends

    @property
    def guards_runs(self) -> bool:
        """Whether its schedule's open runs decide its next fires: such runs are made ``guarded``
        (and only guarded open runs are counted, from their own index)."""
        return self is not OverlapPolicy.ALLOW


class SkipReason(StrEnum):
    """Why a run was recorded as skipped instead of run."""

    MISFIRE = "misfire"
    OVERLAP = "overlap"


@dataclass(frozen=True, slots=True)
class ExecutionSettings:
    """What a job message carries from its schedule: where it goes, what runs, and under which limits.

    ``max_attempts`` is the attempt budget the message announces: the schedule's for a first
    attempt, the run's own for a retry, and the raised one for a replay.
    """

    app: str
    handler: str
    payload: Any
    """The handler's argument: any JSON value."""
    timeout_ms: int
    max_attempts: int
    backoff_base_ms: int
    backoff_max_ms: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as stored: when it fires, what each fire runs, and where it stands."""

    id: ScheduleId
    app: str
    name: str
    kind: ScheduleKind
    cron: str | None
    """Set exactly for cron schedules."""
    tz: str
    run_at: datetime | None
    """Set for delayed schedules."""
    start_at: datetime | None
    end_at: datetime | None
    """No fire after this instant (cron schedules)."""
    handler: str
    payload: Any
    max_attempts: int
    backoff_base_ms: int
    backoff_max_ms: int
    timeout_ms: int
    misfire_policy: MisfirePolicy
    overlap_policy: OverlapPolicy
    jitter_ms: int
    state: ScheduleState
    next_fire_at: datetime | None
    """When it is next due; None once it fires no more (completed or cancelled)."""
    version: int
    created_at: datetime
    updated_at: datetime
    traceparent: str | None = None
    """The W3C trace context of the schedule's creation, which a one-shot's run continues."""
    error: str | None = None
    """Why its fires could not be computed, while it is in state error."""
    errored_at: datetime | None = None
    description: str | None = None
    """What the schedule is for, in its owner's words; nothing the scheduler acts on."""

    @property
    def creation_traceparent(self) -> str | None:
        """The trace its runs' attempts continue: a one-shot's creation trace (its one run belongs
        to it); None for a cron schedule, whose every run is a trace of its own. The SQL that
        leases retries and re-dispatches reads it by the same rule."""
        return None if self.kind is ScheduleKind.CRON else self.traceparent

    @property
    def execution(self) -> ExecutionSettings:
        """The settings the first attempt of each of its runs is dispatched with."""
        return ExecutionSettings(
            app=self.app,
            handler=self.handler,
            payload=self.payload,
            timeout_ms=self.timeout_ms,
            max_attempts=self.max_attempts,
            backoff_base_ms=self.backoff_base_ms,
            backoff_max_ms=self.backoff_max_ms,
        )
