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
    """The release the stored fires follow (None: none recorded yet), whether a scanner finished
    moving them to it, and the pass that moves them."""

    version: str | None
    done: bool
    pass_id: UUID | None = None
    leased: bool = False
    """Whether the pass's owner renewed its lease in time: a pass under way, not to be taken over."""
    lease_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class ClaimedPass:
    """A pass this scanner now owns: where it resumes (the schedule id up to which an earlier owner's
    batches moved every fire), None to start from the first schedule."""

    resume_after: UUID | None


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
    return RecordedZoneRules(row["version"], row["done"], row["pass_id"], row["leased"], row["lease_until"])


def claim_zone_rules(
    conn: psycopg.Connection[Row],
    version: str,
    pass_id: UUID,
    seen: RecordedZoneRules,
    lease_s: float,
) -> ClaimedPass | None:
    """Record ``version`` as the release the fires are being moved to, by the pass ``pass_id``, if
    the record is still ``seen`` (and, for the same release, its pass is neither done nor leased);
    None when not."""
    row = conn.execute(
        query("claim_zone_rules"),
        {
            "version": version,
            "pass_id": pass_id,
            "lease_s": lease_s,
            "seen": seen.version,
            "seen_pass_id": seen.pass_id,
        },
    ).fetchone()
    return None if row is None else ClaimedPass(row["resume_after"])


def renew_zone_rules_pass(
    conn: psycopg.Connection[Row], pass_id: UUID, resume_after: UUID, lease_s: float
) -> bool:
    """Renew the pass's lease and store its position, holding the record until the transaction
    ends (a claim waits for it); False when the pass is no longer the record's (done, or another
    claimed since)."""
    params = {"pass_id": pass_id, "resume_after": resume_after, "lease_s": lease_s}
    return conn.execute(query("renew_zone_rules_pass"), params).fetchone() is not None


def finish_zone_rules(conn: psycopg.Connection[Row], pass_id: UUID) -> None:
    conn.execute(query("finish_zone_rules"), {"pass_id": pass_id})


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


def move_next_fires(conn: psycopg.Connection[Row], moves: Sequence[MovedFire]) -> set[UUID]:
    """Write the fires computed again where their rows are as read; the schedules written."""
    if not moves:
        return set()
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
    return {row["id"] for row in rows}
