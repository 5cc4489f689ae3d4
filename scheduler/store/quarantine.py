"""What the components set aside instead of stopping on it: an outbox row Kafka refused, an outcome
event PostgreSQL could not store. Written by the relay and the reconciler; read by the operator."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from scheduler.store.sql import query

Row = dict[str, Any]


def list_quarantine(
    conn: psycopg.Connection[Row],
    *,
    component: str | None = None,
    app: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
    with_bytes: bool = False,
) -> list[Row]:
    return conn.execute(
        query("list_quarantine"),
        {"component": component, "app": app, "since": since, "limit": limit, "with_bytes": with_bytes},
    ).fetchall()
