"""LISTEN/NOTIFY wake-ups: a component sleeps until its channel is notified or a timeout passes."""

from __future__ import annotations

import threading
import time
from typing import Any, LiteralString

import psycopg

from scheduler.store import connect

STOP_CHECK_S = 0.25


class Wakeup:
    """A dedicated autocommit connection listening on one channel."""

    def __init__(self, url: str, channel: LiteralString) -> None:
        # Made as every connection is (TCP keepalives: a listener on a vanished host notices).
        self._conn: psycopg.Connection[Any] = connect(url, autocommit=True)
        self._conn.execute("listen " + channel)

    def wait(self, timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Block until a notification arrives (True) or ``timeout_s`` passes or ``stop`` is set (False)."""
        deadline = time.monotonic() + timeout_s
        woke = False
        while not woke:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                return False
            # In slices, so that a stop request (SIGTERM) is honoured within a quarter second.
            for _ in self._conn.notifies(timeout=min(remaining, STOP_CHECK_S), stop_after=1):
                woke = True
        # Several commits may have notified at once: one wake-up serves them all.
        for _ in self._conn.notifies(timeout=0.0):
            pass
        return True

    def close(self) -> None:
        self._conn.close()
