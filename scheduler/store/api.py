"""The API's statements: rate-limit buckets, idempotency keys, and the pages it lists.

Every replica of the API shares these rows, so a limit or an idempotency key holds across replicas
exactly as it does within one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from scheduler.store.runs import with_attempts
from scheduler.store.sql import query

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Take:
    allowed: bool
    tokens: float
    """What the bucket holds after the take (allowed), or now (refused)."""


def take_rate_token(
    conn: psycopg.Connection[Row], principal: str, bucket: str, capacity: float, rate_per_s: float
) -> Take:
    """Take one token (one round trip; a write only when allowed). ``conn`` is in autocommit."""
    params = {"principal": principal, "bucket": bucket, "capacity": capacity, "rate": rate_per_s}
    row = conn.execute(query("take_rate_token"), params).fetchone()
    # No row at all cannot happen (the insert or the read answers), but refusing is the safe side.
    return Take(False, 0.0) if row is None else Take(bool(row["allowed"]), float(row["tokens"]))


def claim_idempotency_key(
    conn: psycopg.Connection[Row], principal: str, method: str, key: str, request_hash: str, ttl_s: float
) -> bool:
    """True: this transaction owns the key and must record its response; False: a first response
    exists (read it with :func:`first_response`)."""
    params = {
        "principal": principal,
        "method": method,
        "idempotency_key": key,
        "request_hash": request_hash,
        "ttl_s": ttl_s,
    }
    return conn.execute(query("claim_idempotency_key"), params).fetchone() is not None


def first_response(conn: psycopg.Connection[Row], principal: str, method: str, key: str) -> Row | None:
    params = {"principal": principal, "method": method, "idempotency_key": key}
    return conn.execute(query("first_response"), params).fetchone()


def record_response(
    conn: psycopg.Connection[Row], principal: str, method: str, key: str, response: Any
) -> None:
    params = {"principal": principal, "method": method, "idempotency_key": key, "response": Jsonb(response)}
    conn.execute(query("record_response"), params)


def delete_expired_idempotency_keys(conn: psycopg.Connection[Row], limit: int) -> int:
    return len(conn.execute(query("delete_expired_idempotency_keys"), {"limit": limit}).fetchall())


def delete_idle_rate_buckets(conn: psycopg.Connection[Row], idle_s: float, limit: int) -> int:
    return len(conn.execute(query("delete_idle_rate_buckets"), {"idle_s": idle_s, "limit": limit}).fetchall())


def _apps(apps: Sequence[str] | None) -> list[str] | None:
    return None if apps is None else list(apps)


def schedules_page(
    conn: psycopg.Connection[Row],
    *,
    apps: Sequence[str] | None,
    state: str | None,
    enabled: bool | None,
    after: tuple[datetime, UUID] | None,
    limit: int,
    max_bytes: int | None = None,
) -> list[Row]:
    """Up to ``limit`` schedules after ``after`` (created_at, id), each with its key, ending with
    the first whose ``page_bytes`` (its payload's and those before it) pass ``max_bytes`` (None:
    however many bytes)."""
    params = {
        "apps": _apps(apps),
        "state": state,
        "enabled": enabled,
        "after_created": None if after is None else after[0],
        "after_id": None if after is None else after[1],
        "limit": limit,
        "max_bytes": max_bytes,
    }
    return _sizes_dropped(conn.execute(query("schedules_page"), params).fetchall(), max_bytes)


def runs_page(
    conn: psycopg.Connection[Row], schedule_id: UUID, before: datetime | None, limit: int
) -> list[Row]:
    """Up to ``limit`` runs of the schedule fired before ``before``, newest first, with attempts."""
    rows = conn.execute(
        query("runs_page"), {"schedule_id": schedule_id, "before": before, "limit": limit}
    ).fetchall()
    return with_attempts(conn, rows)


def app_runs_page(
    conn: psycopg.Connection[Row],
    *,
    apps: Sequence[str] | None,
    state: str | None,
    after: tuple[datetime, UUID] | None,
    limit: int,
) -> list[Row]:
    """Up to ``limit`` runs of ``apps`` (None: every app) after the position ``after`` (fire time
    and id), newest fire first, with their attempts."""
    params = {
        "apps": _apps(apps),
        "state": state,
        "after_fired": None if after is None else after[0],
        "after_id": None if after is None else after[1],
        "limit": limit,
    }
    page = query("app_runs_page") if state is None else query("app_runs_page_in_state")
    return with_attempts(conn, conn.execute(page, params).fetchall())


def audit_page(
    conn: psycopg.Connection[Row],
    *,
    apps: Sequence[str] | None,
    entity: str | None,
    entity_id: str | None,
    actor: str | None,
    since: datetime | None,
    before_id: int | None,
    limit: int,
    max_bytes: int | None = None,
) -> list[Row]:
    """Up to ``limit`` audit entries older than ``before_id``, newest first, each with its app,
    ending with the first whose ``page_bytes`` (its values' and those before it) pass ``max_bytes``
    (None: however many bytes)."""
    params = {
        "max_bytes": max_bytes,
        "apps": _apps(apps),
        "entity": entity,
        "entity_id": entity_id,
        "actor": actor,
        "since": since,
        "before_id": before_id,
        "limit": limit,
    }
    return _sizes_dropped(conn.execute(query("audit_page"), params).fetchall(), max_bytes)


def _sizes_dropped(rows: list[Row], max_bytes: int | None) -> list[Row]:
    """The rows without the columns the byte-bounded pages add, but ``page_bytes`` when bounded."""
    for row in rows:
        row.pop("position", None)
        if max_bytes is None:
            del row["page_bytes"]
    return rows
