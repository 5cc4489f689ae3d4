"""PostgreSQL: connections, migrations and the named queries every database client uses.

SQL lives in ``.sql`` files (``migrations/`` for the schema, ``queries/`` for the statements);
the Python here only binds parameters and maps rows. Times for leases and due checks come from
the database's ``now()``, never from a process clock.
"""

from __future__ import annotations

import sys
from typing import Any

import psycopg
from psycopg.rows import dict_row

from scheduler.store.sql import query

__all__ = ["CONNECTION_OPTIONS", "connect", "query"]


def connect(
    url: str, *, autocommit: bool = False, connect_timeout: int | None = None
) -> psycopg.Connection[dict[str, object]]:
    """``connect_timeout`` (whole seconds, libpq's) bounds a server that accepts and never answers;
    None leaves the URL's own, or none."""
    # Keyword arguments are merged into the connection string, over the URL's own.
    extra: dict[str, Any] = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
    return psycopg.connect(url, autocommit=autocommit, **CONNECTION_OPTIONS, **extra)


# How every connection is made, alone (connect) or in a pool (Database.pool).
CONNECTION_OPTIONS: dict[str, Any] = {
    "row_factory": dict_row,
    "application_name": "scheduler",
    # No statement is prepared by repetition: a cached generic plan built on "1 row" estimates can
    # cost seconds a large batch. Only a statement that asks (execute(..., prepare=True), and
    # executemany, which none of ours uses) is, where a small batch's plan costs more than the
    # batch: see store.reconcile.apply_outcomes.
    "prepare_threshold": sys.maxsize,
}
