"""What a schedule is, in the domain's words: its kind, its state and its policies.

These are the values the API accepts, the store persists and the scanner acts on (DESIGN
sections 2 and 4). String enums, so that each value is also its spelling in JSON, SQL and the CLI.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from enum import StrEnum
from typing import NewType

__all__ = [
    "DEFAULT_CATCHUP_WINDOW",
    "MAX_CATCHUP_FIRES",
    "MisfirePolicy",
    "OverlapPolicy",
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


class SkipReason(StrEnum):
    """Why a run was recorded as skipped instead of run."""

    MISFIRE = "misfire"
    OVERLAP = "overlap"
