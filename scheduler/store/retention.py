"""The history's retention: finished runs, their attempts, and the schedules they leave behind,
deleted once they are older than the retention (``SCHEDULER_HISTORY_RETENTION_DAYS``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from scheduler.store.sql import query

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Deleted:
    """What one batch of the retention deleted."""

    runs: int = 0
    attempts: int = 0
    schedules: int = 0
    keys: int = 0


def delete_expired_history(conn: psycopg.Connection[Row], retention_s: float, limit: int) -> Deleted:
    """Up to ``limit`` finished runs that ended more than ``retention_s`` ago by the database's
    clock, with what goes with them."""
    params = {"retention_s": retention_s, "limit": limit}
    row = conn.execute(query("delete_expired_history"), params).fetchone()
    if row is None:  # an aggregate always answers; nothing deleted is the safe reading
        return Deleted()
    return Deleted(row["runs"], row["attempts"], row["schedules"], row["keys"])
