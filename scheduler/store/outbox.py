"""The transactional outbox as the relay sees it: lock a batch, then complete, release or
quarantine each of its rows, all in the transaction that locked them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from scheduler.store.sql import query

Row = dict[str, Any]

MAX_BATCH_BYTES = 16 * 1024 * 1024
"""Message bytes a relay batch takes after its first row: the batch is held in memory a few times
over (the rows, the producer's copies) while it is published, and a relay's limit is a few hundred MB."""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    topic: str
    key: bytes | None
    value: bytes
    headers: dict[str, str]
    run_id: UUID | None
    attempt: int | None
    publish_count: int
    age_s: float  # since the row was written, by the database clock, when it was locked

    @classmethod
    def from_row(cls, row: Row) -> OutboxRow:
        return cls(
            id=row["id"],
            topic=row["topic"],
            key=None if row["key"] is None else bytes(row["key"]),
            value=bytes(row["value"]),
            headers=row["headers"] or {},
            run_id=row["run_id"],
            attempt=row["attempt"],
            publish_count=row["publish_count"],
            age_s=row["age_s"],
        )


@dataclass(frozen=True, slots=True)
class Completion:
    published: int
    republished: int


def bound_transaction(conn: psycopg.Connection[Row], timeout_s: float) -> None:
    """End this session, and release its locks, should it idle inside the transaction this long."""
    conn.execute(query("bound_relay_transaction"), {"timeout_ms": max(1, int(timeout_s * 1000))})


def lock(
    conn: psycopg.Connection[Row], limit: int, now: datetime | None = None, max_bytes: int = MAX_BATCH_BYTES
) -> list[OutboxRow]:
    """Up to ``limit`` publishable rows, oldest first, and no more than ``max_bytes`` of messages
    after the first, locked until the transaction ends."""
    rows = conn.execute(query("lock_outbox"), {"limit": limit, "now": now, "max_bytes": max_bytes}).fetchall()
    return [OutboxRow.from_row(row) for row in rows]


def drop_obsolete_republishes(
    conn: psycopg.Connection[Row], ids: Sequence[int], jobs_prefix: str
) -> set[int]:
    """Of the rows ``ids`` being published again, delete (and return) the job messages whose
    attempt a worker already started or that a later attempt replaced."""
    rows = conn.execute(
        query("drop_obsolete_republishes"), {"ids": list(ids), "jobs_prefix": jobs_prefix}
    ).fetchall()
    return {row["id"] for row in rows}


def complete(conn: psycopg.Connection[Row], ids: list[int]) -> Completion:
    row = conn.execute(query("complete_outbox"), {"ids": ids}).fetchone()
    assert row is not None
    return Completion(row["published"], row["republished"])


def release(
    conn: psycopg.Connection[Row],
    ids: list[int],
    *,
    produced: bool,
    back_off: bool = False,
    now: datetime | None = None,
) -> None:
    """Hand rows back unpublished; ``produced`` ones count as published once more (one of them may
    be on the topic after all); with ``back_off`` each waits before it may be taken again."""
    conn.execute(
        query("release_outbox"), {"ids": ids, "produced": produced, "back_off": back_off, "now": now}
    )


@dataclass(frozen=True, slots=True)
class Quarantine:
    quarantined: int
    dead: int  # runs that were waiting for a quarantined message


def quarantine(
    conn: psycopg.Connection[Row], reasons: dict[int, str], now: datetime | None = None
) -> Quarantine:
    """Move the refused rows (id -> reason) to ``quarantine`` and their waiting runs to ``dead``."""
    ids = list(reasons)
    row = conn.execute(
        query("quarantine_outbox"), {"ids": ids, "reasons": [reasons[i] for i in ids], "now": now}
    ).fetchone()
    assert row is not None
    return Quarantine(row["quarantined"], row["dead"])


def topic_apps(conn: psycopg.Connection[Row], jobs_prefix: str, topics: Sequence[str]) -> dict[str, int]:
    """Of the job topics ``topics``, those whose app exists: topic -> the app's partitions."""
    rows = conn.execute(
        query("outbox_topic_apps"), {"jobs_prefix": jobs_prefix, "topics": list(topics)}
    ).fetchall()
    return {row["topic"]: row["partitions"] for row in rows}


def next_available_in(conn: psycopg.Connection[Row], now: datetime | None = None) -> float | None:
    """Seconds until the first row held back by its ``available_at`` may be claimed; None if none is."""
    row = conn.execute(query("outbox_next_available"), {"now": now}).fetchone()
    return None if row is None or row["wait_s"] is None else max(0.0, float(row["wait_s"]))


@dataclass(frozen=True, slots=True)
class OutboxStats:
    depth: int
    oldest_age_s: float


def stats(conn: psycopg.Connection[Row]) -> OutboxStats:
    row = conn.execute(query("outbox_stats")).fetchone()
    assert row is not None
    return OutboxStats(row["depth"], row["oldest_age_s"])
