"""Apps, schedules and the audit log in PostgreSQL: the statements behind the CLI and the ingestor.

Every change a person or a service makes to a schedule goes through here with the version it
read (optimistic locking) and leaves an ``audit_log`` row with the old and new values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from scheduler.domain.schedule import ScheduleState
from scheduler.store.api import schedules_page
from scheduler.store.sql import query

Row = dict[str, Any]
# How a read holds the schedule's row until its transaction ends.
RowLock = Literal["share", "update"]


class VersionConflict(RuntimeError):
    """The schedule changed since it was read; nothing was written."""


def db_now(conn: psycopg.Connection[Row]) -> datetime:
    row = conn.execute(query("db_now")).fetchone()
    assert row is not None
    return row["now"]  # type: ignore[no-any-return]


def create_app(
    conn: psycopg.Connection[Row], name: str, partitions: int, handlers: Sequence[str] | None = None
) -> Row | None:
    """The new app, or None when an app of that name exists already. ``handlers``: what its
    schedules may name (None: not declared)."""
    declared = None if handlers is None else list(handlers)
    return conn.execute(
        query("create_app"), {"name": name, "partitions": partitions, "handlers": declared}
    ).fetchone()


def set_app_handlers(conn: psycopg.Connection[Row], name: str, handlers: Sequence[str] | None) -> Row | None:
    """The app with its new declaration, or None when there is no such app."""
    params = {"name": name, "handlers": None if handlers is None else list(handlers)}
    return conn.execute(query("set_app_handlers"), params).fetchone()


def get_app(conn: psycopg.Connection[Row], name: str) -> Row | None:
    return conn.execute(query("get_app"), {"name": name}).fetchone()


def list_apps(conn: psycopg.Connection[Row]) -> list[Row]:
    return conn.execute(query("list_apps")).fetchall()


def app_names(conn: psycopg.Connection[Row]) -> list[str]:
    """Every app's name, in name order."""
    return [row["name"] for row in conn.execute(query("app_names"))]


def replace_schedule_spec(conn: psycopg.Connection[Row], values: Row) -> Row | None:
    """Every spec column of ``values`` written on ``values['version']``; None if that version is gone.

    A schedule in error is active again: its new spec was validated and its next fire computed.
    """
    return conn.execute(query("replace_schedule_spec"), values).fetchone()


def insert_schedule(conn: psycopg.Connection[Row], values: Row) -> Row:
    params = {"traceparent": None, "enabled": True} | values | {"payload": Jsonb(values["payload"])}
    row = conn.execute(query("insert_schedule"), params).fetchone()
    assert row is not None
    return row


def get_schedule(
    conn: psycopg.Connection[Row], schedule_id: UUID, *, lock: RowLock | None = None
) -> Row | None:
    """``lock``: ``"share"`` holds the row against updates until the transaction ends; ``"update"``
    holds it as the transaction's own update of it would (see the SQL)."""
    name = "get_schedule" if lock is None else f"get_schedule_for_{lock}"
    return conn.execute(query(name), {"id": schedule_id}).fetchone()


def latest_fire(conn: psycopg.Connection[Row], schedule_id: UUID) -> Row | None:
    """The schedule's latest run (id, state, scheduled_for) that a fire made, not a trigger; or None."""
    return conn.execute(query("latest_fire"), {"id": schedule_id}).fetchone()


def guard_open_runs(conn: psycopg.Connection[Row], schedule_id: UUID) -> None:
    """Count the schedule's open runs for its overlap policy from now on (see the SQL)."""
    conn.execute(query("guard_open_runs"), {"id": schedule_id})


def insert_schedule_key(
    conn: psycopg.Connection[Row], app: str, schedule_key: str, schedule_id: UUID
) -> bool:
    """False when the app already has a schedule of that key."""
    row = conn.execute(
        query("insert_schedule_key"), {"app": app, "schedule_key": schedule_key, "schedule_id": schedule_id}
    ).fetchone()
    return row is not None


def schedule_key(conn: psycopg.Connection[Row], schedule_id: UUID) -> str | None:
    """The schedule's key (None when there is no such schedule)."""
    row = conn.execute(query("schedule_key"), {"id": schedule_id}).fetchone()
    return None if row is None else str(row["schedule_key"])


def schedule_with_key(conn: psycopg.Connection[Row], schedule_id: UUID) -> Row | None:
    """The schedule's row with its ``schedule_key``."""
    return conn.execute(query("schedule_with_key"), {"id": schedule_id}).fetchone()


def lock_schedule_with_key(conn: psycopg.Connection[Row], schedule_id: UUID) -> Row | None:
    """The schedule with its key, locked until the transaction ends."""
    return conn.execute(query("lock_schedule_with_key"), {"id": schedule_id}).fetchone()


def schedules_with_keys(conn: psycopg.Connection[Row], ids: Sequence[UUID]) -> list[Row]:
    """The schedules of ``ids``, with their keys, in no particular order."""
    return conn.execute(query("schedules_with_keys"), {"ids": list(ids)}).fetchall()


def schedule_id_by_key(conn: psycopg.Connection[Row], app: str, schedule_key: str) -> UUID | None:
    row = conn.execute(query("schedule_id_by_key"), {"app": app, "schedule_key": schedule_key}).fetchone()
    return None if row is None else UUID(str(row["schedule_id"]))


def list_schedules(
    conn: psycopg.Connection[Row], app: str | None = None, state: str | None = None, limit: int = 1000
) -> list[Row]:
    """The first ``limit`` schedules in creation order, each with its key (the API's first page)."""
    return schedules_page(
        conn, apps=None if app is None else [app], state=state, enabled=None, after=None, limit=limit
    )


def set_schedule_state(
    conn: psycopg.Connection[Row],
    schedule_id: UUID,
    version: int,
    state: ScheduleState,
    next_fire_at: datetime | None,
) -> Row:
    row = conn.execute(
        query("set_schedule_state"),
        {"id": schedule_id, "version": version, "state": state, "next_fire_at": next_fire_at},
    ).fetchone()
    if row is None:
        raise VersionConflict(
            f"schedule {schedule_id} was changed by someone else (expected version {version}); read it again"
        )
    return row


def audit(
    conn: psycopg.Connection[Row],
    actor: str,
    action: str,
    entity: str,
    entity_id: str,
    old: Row | None,
    new: Row | None,
    *,
    app: str,
) -> None:
    """An audit entry, with the app it concerns (a scoped listing finds it by that)."""
    conn.execute(
        query("insert_audit"),
        {
            "app": app,
            "actor": actor,
            "action": action,
            "entity": entity,
            "entity_id": entity_id,
            "old_value": None if old is None else Jsonb(_jsonable(old)),
            "new_value": None if new is None else Jsonb(_jsonable(new)),
        },
    )


def notify_due(conn: psycopg.Connection[Row]) -> None:
    conn.execute(query("notify_due"))


def _jsonable(row: Row) -> Any:
    return json.loads(json.dumps(row, default=str))
