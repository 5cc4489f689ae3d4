"""LISTEN/NOTIFY wake-ups: a component sleeps until its channel is notified or a timeout passes."""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg


class Wakeup:
    """A dedicated autocommit connection listening on one channel."""

    def __init__(self, url: str, channel: LiteralString) -> None:
        self._conn: psycopg.Connection[Any] = psycopg.connect(url, autocommit=True)
        self._conn.execute("listen " + channel)

    def wait(self, timeout_s: float) -> bool:
        """Block until a notification arrives (True) or ``timeout_s`` passes (False)."""
        if timeout_s <= 0:
            return False
        woke = False
        for _ in self._conn.notifies(timeout=timeout_s, stop_after=1):
            woke = True
        if woke:
            # Several commits may have notified at once: one wake-up serves them all.
            for _ in self._conn.notifies(timeout=0.0):
                pass
        return woke

    def close(self) -> None:
        self._conn.close()
