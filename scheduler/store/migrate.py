"""Ordered schema migrations (``store/migrations/NNNN_name.sql``), recorded once applied.

``scheduler init`` calls :func:`migrate`. Two processes may run it at the same moment: a
transaction-level advisory lock serialises them, and the second finds everything applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg.rows import tuple_row

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any constant will do, as long as nothing else in the database uses it.
MIGRATION_LOCK_KEY = 0x5C4ED01E
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    def sql(self) -> LiteralString:
        # Migrations are files of the source tree, never input: LiteralString holds.
        return self.path.read_text()  # type: ignore[return-value,unused-ignore]


def available() -> list[Migration]:
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if match is None:
            raise ValueError(f"migration file {path.name} is not named NNNN_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


def pending(conn: psycopg.Connection[Any]) -> tuple[list[Migration], list[int]]:
    """The migrations this code knows that the database has not applied, and the versions the
    database has that this code does not know (a newer release migrated it: its migrations only add,
    so this code still runs on it). Reads only; before the first ``init`` everything is pending."""
    with conn.cursor(row_factory=tuple_row) as cur:
        exists = cur.execute("select to_regclass('schema_migrations') is not null").fetchone()
        if exists is None or not exists[0]:
            return available(), []
        done = {row[0] for row in cur.execute("select version from schema_migrations").fetchall()}
    known = available()
    known_versions = {m.version for m in known}
    return [m for m in known if m.version not in done], sorted(done - known_versions)


def migrate(conn: psycopg.Connection[Any]) -> list[Migration]:
    """Apply the migrations not yet recorded, in one transaction; returns those applied now."""
    applied_now: list[Migration] = []
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(
            """
            create table if not exists schema_migrations (
                version     integer primary key,
                name        text not null,
                applied_at  timestamptz not null default now()
            )
            """
        )
        with conn.cursor(row_factory=tuple_row) as cur:
            done = {row[0] for row in cur.execute("select version from schema_migrations").fetchall()}
        for migration in available():
            if migration.version in done:
                continue
            conn.execute(migration.sql())
            conn.execute(
                "insert into schema_migrations (version, name) values (%s, %s)",
                (migration.version, migration.name),
            )
            applied_now.append(migration)
    return applied_now
