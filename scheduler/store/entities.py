"""Rows to domain entities: the one place that knows both a query's column names and the domain's types.

The domain stays free of PostgreSQL; the store's functions return these entities rather than row
dicts wherever the pipeline acts on what it read. A query that feeds one of these mappings selects
the columns under the names used here (a schedule's or a run's own columns, ``select s.*``,
``select r.*``), so that every query meaning "a schedule" reads the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from scheduler.domain.run import FailedAttempt, Run
from scheduler.domain.run_state import RunId, RunState
from scheduler.domain.schedule import (
    ExecutionSettings,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleId,
    ScheduleKind,
    ScheduleState,
    SkipReason,
)

__all__ = ["execution_from_row", "failed_attempts_from_json", "run_from_row", "schedule_from_row"]


def schedule_from_row(row: Mapping[str, Any]) -> Schedule:
    """A ``schedules`` row (every column) as a :class:`Schedule`."""
    return Schedule(
        id=ScheduleId(row["id"]),
        app=row["app"],
        name=row["name"],
        kind=ScheduleKind(row["kind"]),
        cron=row["cron"],
        tz=row["tz"],
        run_at=row["run_at"],
        start_at=row["start_at"],
        end_at=row["end_at"],
        handler=row["handler"],
        payload=row["payload"],
        max_attempts=row["max_attempts"],
        backoff_base_ms=row["backoff_base_ms"],
        backoff_max_ms=row["backoff_max_ms"],
        timeout_ms=row["timeout_ms"],
        misfire_policy=MisfirePolicy(row["misfire_policy"]),
        overlap_policy=OverlapPolicy(row["overlap_policy"]),
        jitter_ms=row["jitter_ms"],
        state=ScheduleState(row["state"]),
        next_fire_at=row["next_fire_at"],
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        traceparent=row.get("traceparent"),
        error=row.get("error"),
        errored_at=row.get("errored_at"),
        description=row.get("description"),
    )


def run_from_row(row: Mapping[str, Any]) -> Run:
    """A ``runs`` row (every column) as a :class:`Run`."""
    reason = row["skip_reason"]
    return Run(
        id=RunId(row["id"]),
        schedule_id=ScheduleId(row["schedule_id"]),
        app=row["app"],
        scheduled_for=row["scheduled_for"],
        state=RunState(row["state"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        lease_expires_at=row["lease_expires_at"],
        next_attempt_at=row["next_attempt_at"],
        dispatched_at=row["dispatched_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        worker=row["worker"],
        result=row["result"],
        error=row["error"],
        skip_reason=None if reason is None else SkipReason(reason),
        buffered=row["buffered"],
        guarded=row["guarded"],
        created_at=row["created_at"],
        reconciled_at=row["reconciled_at"],
        version=row["version"],
    )


def execution_from_row(row: Mapping[str, Any]) -> ExecutionSettings:
    """The execution settings of a row that selects them under the schedule's column names: a
    schedule row, or a run row joined to its schedule (whose ``app`` and ``max_attempts`` are then
    the run's)."""
    return ExecutionSettings(
        app=row["app"],
        handler=row["handler"],
        payload=row["payload"],
        timeout_ms=row["timeout_ms"],
        max_attempts=row["max_attempts"],
        backoff_base_ms=row["backoff_base_ms"],
        backoff_max_ms=row["backoff_max_ms"],
    )


def failed_attempts_from_json(items: Iterable[Mapping[str, Any]]) -> tuple[FailedAttempt, ...]:
    """The failed attempts a query aggregated with ``jsonb_build_object`` (times as ISO 8601 text)."""
    return tuple(
        FailedAttempt(
            attempt=item["attempt"],
            worker=item["worker"],
            started_at=_instant(item["started_at"]),
            finished_at=_instant(item["finished_at"]),
            error=item["error"],
            error_class=item["error_class"],
        )
        for item in items
    )


def _instant(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)
