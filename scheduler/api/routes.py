"""The HTTP/JSON form of each RPC: its verb and path, which request fields come from the path and
the query, and whether the rest comes as the JSON body (as ``google.api.http`` rules would say).

One table, read by the HTTP transport (routing) and by :mod:`.openapi` (the document), so the two
cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Route:
    verb: str
    path: str
    method: str
    """The RPC of ``SchedulerService``."""
    query: tuple[str, ...] = ()
    body: bool = False
    """The request's fields other than the path's and the query's, as a JSON object."""
    summary: str = ""

    @property
    def path_fields(self) -> tuple[str, ...]:
        return tuple(part[1:-1] for part in self.path.replace(":", "/:").split("/") if part.startswith("{"))


# Literal paths before templated ones: `{id}` would otherwise match `abc:trigger` too.
ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/schedules", "CreateSchedule", body=True, summary="Create a schedule"),
    Route("POST", "/v1/schedules:batchCreate", "CreateSchedules", body=True,
          summary="Create up to 1,000 schedules, all or none"),
    Route("GET", "/v1/schedules", "ListSchedules", query=("cursor", "limit", "app", "state", "enabled"),
          summary="List schedules, a page at a time"),
    Route("POST", "/v1/schedules/{id}:trigger", "TriggerSchedule", body=True,
          summary="Fire a schedule now, outside its timetable"),
    Route("POST", "/v1/schedules/{id}:pause", "PauseSchedule", body=True, summary="Pause a schedule"),
    Route("POST", "/v1/schedules/{id}:resume", "ResumeSchedule", body=True, summary="Resume a schedule"),
    Route("GET", "/v1/schedules/{id}/runs", "GetScheduleHistory", query=("cursor", "limit"),
          summary="A schedule's runs with their attempts, newest first"),
    Route("GET", "/v1/schedules/{id}", "GetSchedule", summary="Get a schedule"),
    Route("PATCH", "/v1/schedules/{id}", "UpdateSchedule", body=True,
          summary="Change a schedule's fields (give its version for optimistic locking)"),
    Route("DELETE", "/v1/schedules/{id}", "DeleteSchedule", query=("version",),
          summary="Cancel a schedule (kept with its history until the history retention)"),
    Route("GET", "/v1/runs", "ListRuns", query=("app", "state", "cursor", "limit"),
          summary="List runs with their attempts, newest fire first"),
    Route("GET", "/v1/runs/{id}", "GetRun", summary="Get a run with its attempts"),
    Route("GET", "/v1/dlq", "ListDeadLetters",
          query=("app", "schedule_id", "error_class", "since", "until", "limit"),
          summary="List dead letters, newest first"),
    Route("POST", "/v1/dlq:replay", "ReplayDeadLetters", body=True,
          summary="Send dead runs through the pipeline again"),
    Route("GET", "/v1/audit", "ListAuditEntries",
          query=("app", "entity", "entity_id", "actor", "since", "cursor", "limit"),
          summary="List audit entries, newest first"),
)  # fmt: skip
