"""Metric label values with a bound: no run or schedule ids, and at most a fixed number of
distinct values of a label that comes from user code (a handler's error class)."""

from __future__ import annotations

import threading

OTHER = "other"


class BoundedLabel:
    """The first ``limit`` distinct values pass through; any later one is reported as ``other``."""

    def __init__(self, limit: int = 50) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER
