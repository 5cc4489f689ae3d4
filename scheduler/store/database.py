"""The PostgreSQL a component uses: how to open its connections, its wake-ups, and its probe.

Built once by the composition root from the settings; components receive it and never read a
URL themselves. ``display`` is the connection target without credentials, for log lines.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, LiteralString

import psycopg
import psycopg_pool
from psycopg import sql

from scheduler.runtime.service import Check
from scheduler.store import connect, connection_options
from scheduler.store.listen import Wakeup
from scheduler.store.refusals import first_line, refused_for_good

PROBE_TIMEOUT_S = 2
# A pooled connection idle for longer is checked before use (see Database.pool).
CHECK_IDLE_S = 1.0
Conn = psycopg.Connection[dict[str, Any]]


class Database:
    def __init__(self, conninfo: str, display: str) -> None:
        self.conninfo = conninfo
        self.display = display
        # Whether PostgreSQL has taken a connection of this process yet (see refusal).
        self.answered = False

    def connect(
        self, *, autocommit: bool = False, connect_timeout: int | None = None
    ) -> psycopg.Connection[dict[str, Any]]:
        conn = connect(self.conninfo, autocommit=autocommit, connect_timeout=connect_timeout)
        self.answered = True
        return conn

    def refusal(self, error: BaseException) -> str | None:
        """The error line when ``error`` is PostgreSQL refusing this URL for good before it ever
        took a connection of this process: a wrong password, user or database is a setting to
        fix, and a component that waited on it would only look unready for good. Once PostgreSQL
        has answered, every refusal is waited out as an outage is (a password changed under a
        running component, say): the component keeps its place until it is restarted with the
        new setting or the old one works again."""
        if self.answered or not refused_for_good(error):
            return None
        return self.wrong_url(error)

    def wrong_url(self, error: BaseException) -> str:
        """The error line for a URL PostgreSQL refused for good (no password in it)."""
        return (
            f"cannot use PostgreSQL at {self.display}: {first_line(error)} "
            "(not an outage to wait out: check SCHEDULER_DATABASE_URL)"
        )

    def pool(
        self, size: int, timeout_s: float = 5.0, statement_timeout_s: float = 0.0, lock_timeout_s: float = 0.0
    ) -> psycopg_pool.ConnectionPool[Conn]:
        """A pool of autocommit connections for request-serving components (the API), opened at
        once; a connection waited for longer than ``timeout_s`` raises ``PoolTimeout``. Its
        connections are made as :meth:`connect` makes them, with PostgreSQL's
        ``statement_timeout`` and ``lock_timeout`` set for the session when given (0: none).

        A connection idle for over :data:`CHECK_IDLE_S` is checked (one empty round trip) before
        it is handed out: after PostgreSQL restarted, or its backends were ended, each pooled
        connection would otherwise fail the next call made on it. One in steady use is not, so
        the check costs at most a round trip per connection a second."""
        returned: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()

        def configure(conn: Conn) -> None:
            self.answered = True  # a pooled connection is one PostgreSQL took too (see refusal)
            # SET rather than libpq's `options`, which PgBouncer refuses ("unsupported startup
            # parameter in options").
            for name, seconds in (
                ("statement_timeout", statement_timeout_s),
                ("lock_timeout", lock_timeout_s),
            ):
                if seconds > 0:
                    conn.execute(
                        sql.SQL("set {} = {}").format(
                            sql.Identifier(name), sql.Literal(f"{round(seconds * 1000)}ms")
                        )
                    )

        def check(conn: Conn) -> None:
            if time.monotonic() - returned.get(conn, 0.0) > CHECK_IDLE_S:
                psycopg_pool.ConnectionPool.check_connection(conn)

        def reset(conn: Conn) -> None:
            returned[conn] = time.monotonic()

        return psycopg_pool.ConnectionPool(
            self.conninfo,
            min_size=min(2, size),
            max_size=size,
            timeout=timeout_s,
            kwargs={"autocommit": True, **connection_options(self.conninfo)},
            configure=configure,
            check=check,
            reset=reset,
            open=True,
            name="api",
        )

    def wakeup(self, channel: LiteralString) -> Wakeup:
        return Wakeup(self.conninfo, channel)

    def check(self) -> Check:
        """A readiness probe on a connection of its own: one round trip, bounded in time.

        It stalls steps: a PostgreSQL that stops answering without closing anything (its processes
        stopped, a frozen VM, a storage stall) holds a statement under way for good. Its kernel
        still acknowledges the bytes sent and answers keepalives, so neither keepalives nor
        ``tcp_user_timeout`` end the connection, and ``statement_timeout`` is the frozen server's
        to enforce; psycopg has no client-side bound. Cutting such a statement off from another
        thread would need a deadline on every statement, longer than the longest legitimate one,
        and gain nothing: the retry would wait on the same server. So the service's loop is left
        waiting, and ``/live`` is told that it waits on PostgreSQL (while this probe fails) rather
        than wedged, which a restart could not cure."""

        def probe() -> str | None:
            # As every connection (keepalives, tcp_user_timeout): a host gone without a word ends
            # the probe within a minute, not the system's two hours.
            with connect(self.conninfo, autocommit=True, connect_timeout=PROBE_TIMEOUT_S) as conn:
                conn.execute("select 1")
            return None

        return Check("postgresql", probe, stalls_steps=True)

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
