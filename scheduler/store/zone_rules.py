"""The statements that move stored next fires to newer zone rules (``scheduler/scan/zone_rules.py``):
the record of the zone database release the fires follow, and the batches that compute them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from scheduler.domain.schedule import ScheduleState
from scheduler.store.sql import query

Row = dict[str, Any]
NO_ID = UUID(int=0)
"""Before every id: where the keyset starts."""


@dataclass(frozen=True, slots=True)
class RecordedZoneRules:
    """The release the stored fires follow (None: none recorded yet), and whether a scanner
    finished moving them to it."""

    version: str | None
    done: bool


@dataclass(frozen=True, slots=True)
class StoredFire:
    """An active cron schedule's next fire, as read (locked) for computing it again."""

    schedule_id: UUID
    version: int
    cron: str
    tz: str
    start_at: datetime | None
    end_at: datetime | None
    next_fire_at: datetime
    horizon: datetime
    """The look-ahead's end when it was read: the fire is computed again from there."""


@dataclass(frozen=True, slots=True)
class MovedFire:
    """A fire computed again: its new instant, None when none is left (the schedule completes)."""

    read: StoredFire
    next_fire_at: datetime | None


def recorded_zone_rules(conn: psycopg.Connection[Row]) -> RecordedZoneRules:
    row = conn.execute(query("recorded_zone_rules")).fetchone()
    if row is None:
        return RecordedZoneRules(None, False)
    return RecordedZoneRules(row["version"], row["done"])


def claim_zone_rules(conn: psycopg.Connection[Row], version: str, seen: str | None) -> bool:
    """Record ``version`` as the release the fires are being moved to, if the record is still
    ``seen``; False when another process changed it meanwhile."""
    return conn.execute(query("claim_zone_rules"), {"version": version, "seen": seen}).fetchone() is not None


def finish_zone_rules(conn: psycopg.Connection[Row], version: str) -> None:
    conn.execute(query("finish_zone_rules"), {"version": version})


def zone_rules_for_batch(conn: psycopg.Connection[Row]) -> str | None:
    """The recorded release, held until the transaction ends (a claim waits for it)."""
    row = conn.execute(query("zone_rules_for_batch")).fetchone()
    return None if row is None else row["version"]


def cron_schedules_after(
    conn: psycopg.Connection[Row], after: UUID, limit: int, lookahead_s: float
) -> list[UUID]:
    """The ids after ``after`` of active cron schedules whose next fire is after the look-ahead."""
    params = {"after": after, "limit": limit, "lookahead_s": lookahead_s}
    rows = conn.execute(query("cron_schedules_after"), params).fetchall()
    return [row["id"] for row in rows]


def lock_fires_to_recompute(
    conn: psycopg.Connection[Row], schedule_ids: Sequence[UUID], lookahead_s: float
) -> list[StoredFire]:
    """Of ``schedule_ids``, the active cron schedules whose next fire is after the look-ahead and
    that no other transaction holds, locked until the transaction ends."""
    rows = conn.execute(
        query("lock_fires_to_recompute"), {"ids": list(schedule_ids), "lookahead_s": lookahead_s}
    ).fetchall()
    return [
        StoredFire(
            schedule_id=row["id"],
            version=row["version"],
            cron=row["cron"],
            tz=row["tz"],
            start_at=row["start_at"],
            end_at=row["end_at"],
            next_fire_at=row["next_fire_at"],
            horizon=row["horizon"],
        )
        for row in rows
    ]


def move_next_fires(conn: psycopg.Connection[Row], moves: Sequence[MovedFire]) -> int:
    """Write the fires computed again where their rows are as read; how many were written."""
    if not moves:
        return 0
    rows = conn.execute(
        query("move_next_fires"),
        {
            "ids": [m.read.schedule_id for m in moves],
            "versions": [m.read.version for m in moves],
            "read_fires": [m.read.next_fire_at for m in moves],
            "next_fire_at": [m.next_fire_at for m in moves],
            "states": [
                ScheduleState.ACTIVE if m.next_fire_at is not None else ScheduleState.COMPLETED for m in moves
            ],
        },
    ).fetchall()
    return len(rows)
