"""PostgreSQL: connections, migrations and the named queries every database client uses.

SQL lives in ``.sql`` files (``migrations/`` for the schema, ``queries/`` for the statements);
the Python here only binds parameters and maps rows. Times for leases and due checks come from
the database's ``now()``, never from a process clock.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, LiteralString

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from scheduler.store.sql import query

__all__ = ["CONNECTION_OPTIONS", "connect", "connection_options", "execute_prepared", "query"]

log = logging.getLogger(__name__)


def connect(
    url: str, *, autocommit: bool = False, connect_timeout: int | None = None
) -> psycopg.Connection[dict[str, object]]:
    """``connect_timeout`` (whole seconds, libpq's) bounds a server that accepts and never answers;
    None leaves the URL's own, else ``PGCONNECT_TIMEOUT``'s, else 10 s (see :data:`TCP_OPTIONS`)."""
    # Keyword arguments are merged into the connection string, over the URL's own.
    extra: dict[str, Any] = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
    return psycopg.connect(url, autocommit=autocommit, **(connection_options(url) | extra))


def connection_options(url: str) -> dict[str, Any]:
    """:data:`CONNECTION_OPTIONS`, and :data:`TCP_OPTIONS` but those the URL sets itself."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.ProgrammingError:  # psycopg.connect says what is wrong with it
        given = {}
    # libpq ranks a keyword over the environment: the operator's PGCONNECT_TIMEOUT stands.
    env = {"connect_timeout"} if os.environ.get("PGCONNECT_TIMEOUT") else set()
    return CONNECTION_OPTIONS | {
        name: value for name, value in TCP_OPTIONS.items() if name not in given and name not in env
    }


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

# How a connection notices that PostgreSQL's host is gone without a word (a crash, a network cut):
# a keepalive after 30 s of silence, and sent data unacknowledged for 30 s, end it with an error
# the component retries on a new connection. Left to the system (keepalives after two hours), a
# statement would wait that long. A server that takes the connection but never answers it (its
# process stopped, or swamped) fails a connect after 10 s instead of holding it for good; libpq
# has no default. A URL's own values win; over a Unix socket only connect_timeout does anything.
TCP_OPTIONS: dict[str, Any] = {
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms
    "connect_timeout": 10,  # s
}

# Whether the server keeps this process's prepared statements; a pooler in transaction mode (or an
# older PgBouncer) does not, and then the process plans every statement, as it did before.
_prepared = {"kept": True}


def execute_prepared(
    conn: psycopg.Connection[Any], sql: LiteralString, params: Any = None, *, prepare: bool = True
) -> psycopg.Cursor[Any]:
    """``conn.execute`` as a server-side prepared statement when ``prepare`` is true and the server
    keeps them. A prepared statement the server does not know (26000) or already has under that
    name (42P05) means another server connection answered: preparing stops for the process, and the
    error is raised as an ``OperationalError``, which the components retry on a new connection."""
    try:
        return conn.execute(sql, params, prepare=prepare and _prepared["kept"])
    except (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement) as exc:
        if not prepare:
            raise
        _prepared["kept"] = False
        log.warning("prepared statements are not kept by the server (a pooler?): planning every statement")
        raise psycopg.OperationalError(f"prepared statement lost ({exc.sqlstate})") from exc
