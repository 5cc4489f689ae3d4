"""The PostgreSQL a component uses: how to open its connections, its wake-ups, and its probe.

Built once by the composition root from the settings; components receive it and never read a
URL themselves. ``display`` is the connection target without credentials, for log lines.
"""

from __future__ import annotations

import threading
from typing import Any, LiteralString

import psycopg
import psycopg_pool

from scheduler.runtime.service import Check
from scheduler.store import CONNECTION_OPTIONS, connect
from scheduler.store.listen import Wakeup

PROBE_TIMEOUT_S = 2


class Database:
    def __init__(self, conninfo: str, display: str) -> None:
        self.conninfo = conninfo
        self.display = display

    def connect(
        self, *, autocommit: bool = False, connect_timeout: int | None = None
    ) -> psycopg.Connection[dict[str, Any]]:
        return connect(self.conninfo, autocommit=autocommit, connect_timeout=connect_timeout)

    def pool(
        self, size: int, timeout_s: float = 5.0
    ) -> psycopg_pool.ConnectionPool[psycopg.Connection[dict[str, Any]]]:
        """A pool of autocommit connections for request-serving components (the API), opened at
        once; a connection waited for longer than ``timeout_s`` raises ``PoolTimeout``. Its
        connections are made as :meth:`connect` makes them."""
        return psycopg_pool.ConnectionPool(
            self.conninfo,
            min_size=min(2, size),
            max_size=size,
            timeout=timeout_s,
            kwargs={"autocommit": True, **CONNECTION_OPTIONS},
            open=True,
            name="api",
        )

    def wakeup(self, channel: LiteralString) -> Wakeup:
        return Wakeup(self.conninfo, channel)

    def check(self) -> Check:
        """A readiness probe on a connection of its own: one round trip, bounded in time."""

        def probe() -> str | None:
            with psycopg.connect(self.conninfo, connect_timeout=PROBE_TIMEOUT_S, autocommit=True) as conn:
                conn.execute("select 1")
            return None

        return Check("postgresql", probe)

    def __repr__(self) -> str:
        return f"Database({self.display})"


class Session:
    """A service's connection to PostgreSQL (and its LISTEN wake-up, when it has a channel): opened
    on first use, dropped by :meth:`close` after a failure, and so opened afresh by the next use.
    Every database service holds one, so "a broken connection is rebuilt" is written once."""

    def __init__(self, database: Database, channel: LiteralString | None = None) -> None:
        self.database = database
        self.channel = channel
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._wakeup: Wakeup | None = None

    @property
    def conn(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = self.database.connect()
        if self.channel is not None and self._wakeup is None:
            # Listening before the work is read: a NOTIFY that follows is never missed.
            self._wakeup = self.database.wakeup(self.channel)
        return self._conn

    def wait(self, timeout_s: float, stop: threading.Event) -> None:
        """Until the channel is notified, ``timeout_s`` passes, or ``stop`` is set."""
        if self._wakeup is None:
            stop.wait(timeout_s)
        else:
            self._wakeup.wait(timeout_s, stop)

    def close(self) -> None:
        for closable in (self._conn, self._wakeup):
            if closable is not None:
                closable.close()
        self._conn, self._wakeup = None, None
