"""The PostgreSQL a component uses: how to open its connections, its wake-ups, and its probe.

Built once by the composition root from the settings; components receive it and never read a
URL themselves. ``display`` is the connection target without credentials, for log lines.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg

from scheduler.runtime.service import Check
from scheduler.store import connect
from scheduler.store.listen import Wakeup

PROBE_TIMEOUT_S = 2


class Database:
    def __init__(self, conninfo: str, display: str) -> None:
        self.conninfo = conninfo
        self.display = display

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[dict[str, Any]]:
        return connect(self.conninfo, autocommit=autocommit)

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
