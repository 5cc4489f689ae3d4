"""The ingestor's statements: claim command ids, find schedules by key, create a batch of keyed
schedules, and record rejections.

Each function that takes a batch makes one round trip whatever its size; only the per-command
operations (update and the state changes, through :mod:`scheduler.schedule.service`) touch one
schedule.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import tuple_row

from scheduler.store.sql import query

Row = dict[str, Any]


@dataclass(frozen=True, slots=True, order=True)
class Source:
    """Where a command was consumed: one message is decided once, whatever is replayed."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class CommandClaim:
    command_id: str
    app: str
    schedule_key: str
    operation: str
    source: Source


@dataclass(frozen=True, slots=True)
class NewKeyedSchedule:
    """A validated create command, ready to insert: the columns of ``schedules`` plus its key."""

    id: UUID
    app: str
    schedule_key: str
    name: str
    kind: str
    cron: str | None
    tz: str
    run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    handler: str
    payload: str
    """The payload's JSON text, validated and within the size limit."""
    max_attempts: int
    backoff_base_ms: int
    backoff_max_ms: int
    timeout_ms: int
    misfire_policy: str
    overlap_policy: str
    jitter_ms: int
    next_fire_at: datetime | None
    """None: due at the database's now (immediate)."""
    actor: str
    traceparent: str | None = None  # the command's trace context, which a one-shot's run continues
    description: str | None = None
    enabled: bool = True  # False: created paused


@dataclass(frozen=True, slots=True)
class Rejection:
    code: str  # undecodable | invalid | not_found | conflict
    reason: str
    command_id: str | None
    schedule_key: str | None
    app: str | None
    operation: str | None
    original_bytes: bytes
    source: Source
    source_timestamp_ms: int | None = None


def _tuples(conn: psycopg.Connection[Row], name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The rows of a statement that returns one per command, as tuples: a dict for each showed in
    the ingestor's profile."""
    with conn.cursor(row_factory=tuple_row) as cursor:
        return cursor.execute(query(name), params).fetchall()


def decided_sources(
    conn: psycopg.Connection[Row], messages: Mapping[Source, tuple[bytes, int | None]]
) -> set[Source]:
    """The positions among ``messages`` (position → the bytes consumed there and their Kafka
    timestamp) whose message was rejected before: the same bytes, with the same timestamp, at the
    same position. Another message there, of a topic recreated since (its offsets started again),
    is judged on its own, even with the same bytes (the same input produced again). A row without
    a timestamp (recorded before they were kept) compares by bytes alone."""
    if not messages:
        return set()
    sources = list(messages)
    rows = conn.execute(
        query("decided_sources"),
        {
            "topics": [s.topic for s in sources],
            "partitions": [s.partition for s in sources],
            "offsets": [s.offset for s in sources],
        },
    ).fetchall()
    decided: set[Source] = set()
    for r in rows:
        source = Source(r["topic"], r["partition"], r["offset"])
        value, timestamp_ms = messages[source]
        same_time = r["timestamp_ms"] is None or r["timestamp_ms"] == timestamp_ms
        if same_time and bytes(r["digest"]) == hashlib.sha256(value).digest():
            decided.add(source)
    return decided


def claim_commands(conn: psycopg.Connection[Row], claims: Sequence[CommandClaim]) -> set[str]:
    """The command ids this transaction now owns; every other id of ``claims`` is a duplicate."""
    if not claims:
        return set()
    params = {
        "command_ids": [c.command_id for c in claims],
        "apps": [c.app for c in claims],
        "keys": [c.schedule_key for c in claims],
        "operations": [c.operation for c in claims],
        "topics": [c.source.topic for c in claims],
        "partitions": [c.source.partition for c in claims],
        "offsets": [c.source.offset for c in claims],
    }
    return {command_id for command_id, claimed in _tuples(conn, "claim_commands", params) if claimed}


def unclaim_commands(conn: psycopg.Connection[Row], command_ids: Iterable[str]) -> None:
    ids = list(command_ids)
    if ids:
        conn.execute(query("unclaim_commands"), {"command_ids": ids})


def schedules_by_key(
    conn: psycopg.Connection[Row], keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], UUID]:
    """The ids of the schedules that exist for the given (app, schedule_key) pairs, their keys locked."""
    pairs = sorted(set(keys))
    if not pairs:
        return {}
    rows = conn.execute(
        query("schedules_by_key"), {"apps": [p[0] for p in pairs], "keys": [p[1] for p in pairs]}
    ).fetchall()
    return {(r["app"], r["schedule_key"]): r["schedule_id"] for r in rows}


def known_apps(conn: psycopg.Connection[Row], names: Iterable[str]) -> dict[str, list[str] | None]:
    """The apps among ``names`` that exist, each with the handlers it declares (None: not declared)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    rows = conn.execute(query("known_apps"), {"names": wanted}).fetchall()
    return {r["name"]: r["handlers"] for r in rows}


def create_keyed_schedules(conn: psycopg.Connection[Row], new: Sequence[NewKeyedSchedule]) -> set[UUID]:
    """Insert the schedules, their keys and audit rows; returns the ids created (a key taken
    concurrently leaves its schedule out)."""
    if not new:
        return set()
    params = {
        "ids": [n.id for n in new],
        "apps": [n.app for n in new],
        "keys": [n.schedule_key for n in new],
        "names": [n.name for n in new],
        "kinds": [n.kind for n in new],
        "crons": [n.cron for n in new],
        "tzs": [n.tz for n in new],
        "run_at": [n.run_at for n in new],
        "start_at": [n.start_at for n in new],
        "end_at": [n.end_at for n in new],
        "handlers": [n.handler for n in new],
        "payloads": [n.payload for n in new],
        "max_attempts": [n.max_attempts for n in new],
        "backoff_base_ms": [n.backoff_base_ms for n in new],
        "backoff_max_ms": [n.backoff_max_ms for n in new],
        "timeout_ms": [n.timeout_ms for n in new],
        "misfire_policies": [n.misfire_policy for n in new],
        "overlap_policies": [n.overlap_policy for n in new],
        "jitter_ms": [n.jitter_ms for n in new],
        "next_fire_at": [n.next_fire_at for n in new],
        "actors": [n.actor for n in new],
        "traceparents": [n.traceparent for n in new],
        "descriptions": [n.description for n in new],
        "enabled": [n.enabled for n in new],
    }
    return {schedule_id for (schedule_id,) in _tuples(conn, "create_keyed_schedules", params)}


def record_rejections(
    conn: psycopg.Connection[Row], rejections: Sequence[Rejection]
) -> dict[Source, datetime]:
    """Record rejections; returns the newly recorded ones (position → rejection time)."""
    if not rejections:
        return {}
    rows = conn.execute(
        query("record_rejections"),
        {
            "codes": [r.code for r in rejections],
            "reasons": [r.reason for r in rejections],
            "command_ids": [r.command_id for r in rejections],
            "keys": [r.schedule_key for r in rejections],
            "apps": [r.app for r in rejections],
            "operations": [r.operation for r in rejections],
            "original_bytes": [r.original_bytes for r in rejections],
            "topics": [r.source.topic for r in rejections],
            "partitions": [r.source.partition for r in rejections],
            "offsets": [r.source.offset for r in rejections],
            "timestamps": [r.source_timestamp_ms for r in rejections],
        },
    ).fetchall()
    return {
        Source(r["source_topic"], r["source_partition"], r["source_offset"]): r["rejected_at"] for r in rows
    }


def list_rejections(
    conn: psycopg.Connection[Row], *, code: str | None = None, app: str | None = None, limit: int = 100
) -> list[Row]:
    """Rejected commands, newest first, without their bytes (``original_size`` tells how many)."""
    return conn.execute(query("list_rejections"), {"code": code, "app": app, "limit": limit}).fetchall()
