"""The migrations build the schema the code expects, once, however many `init`s run."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from scheduler.config import Settings
from scheduler.store import connect
from scheduler.store.migrate import available, migrate
from scheduler.store.sql import queries

pytestmark = pytest.mark.integration

SCHEDULER = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "scheduler")
_PARAM_RE = re.compile(r"%\((\w+)\)[sbt]")


def schema_of(url: str) -> dict[str, Any]:
    """Tables, columns, constraints and indexes: what two schemas must share to be the same."""
    with connect(url) as conn:
        columns = conn.execute(
            "select table_name, column_name, data_type, is_nullable, column_default "
            "from information_schema.columns where table_schema = 'public' order by 1, 2"
        ).fetchall()
        constraints = conn.execute(
            "select conrelid::regclass::text as tbl, pg_get_constraintdef(oid) as def "
            "from pg_constraint where connamespace = 'public'::regnamespace order by 1, 2"
        ).fetchall()
        indexes = conn.execute(
            "select indexdef from pg_indexes where schemaname = 'public' order by 1"
        ).fetchall()
        versions = conn.execute("select version, name from schema_migrations order by 1").fetchall()
    return {"columns": columns, "constraints": constraints, "indexes": indexes, "versions": versions}


def test_migrations_apply_once_and_record_themselves(empty_database_url: str) -> None:
    with connect(empty_database_url) as conn:
        first = migrate(conn)
        second = migrate(conn)
    assert [m.version for m in first] == [m.version for m in available()]
    assert second == []
    tables = {row["table_name"] for row in schema_of(empty_database_url)["columns"]}
    assert {"apps", "schedules", "runs", "attempts", "outbox", "audit_log", "schema_migrations"} <= tables


def test_every_query_the_code_runs_is_valid_against_the_migrated_schema(database_url: str) -> None:
    with connect(database_url) as conn:
        for name, sql in queries().items():
            params = {p: None for p in _PARAM_RE.findall(sql)}
            try:
                # EXPLAIN plans without executing: column, type and syntax errors all surface here.
                conn.execute("explain " + sql, params)
            except Exception as exc:
                pytest.fail(f"query {name!r} does not fit the schema: {exc}")
            finally:
                conn.rollback()


def test_two_inits_at_the_same_moment_both_succeed_with_the_schema_of_one(
    settings_env: dict[str, str], empty_database_url: str, stack: Any
) -> None:
    env = settings_env | {"SCHEDULER_DATABASE_URL": empty_database_url}
    procs = [
        subprocess.Popen(
            [SCHEDULER, "init"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    assert [code for code, _ in results] == [0, 0], results

    reference = stack.url_for(empty_database_url.rsplit("/", 1)[1] + "_ref")
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute(f'create database "{reference.rsplit("/", 1)[1]}"')
    try:
        with connect(reference) as conn:
            migrate(conn)
        concurrent, single = schema_of(empty_database_url), schema_of(reference)
        assert concurrent == single
    finally:
        with psycopg.connect(stack.database_url, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{reference.rsplit("/", 1)[1]}" with (force)')


def test_init_creates_the_core_topics(settings_env: dict[str, str], settings: Settings) -> None:
    done = subprocess.run([SCHEDULER, "init"], env=settings_env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    # Listed by a plain client, independent of our transport layer.
    topics = set(AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(timeout=10).topics)
    assert set(settings.core_topics) <= topics
    assert settings.core_topics == tuple(
        f"{settings.topic_prefix}.{suffix}"
        for suffix in ("schedules", "schedules.rejected", "results", "retry", "dlq")
    )


def _migrations_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, "migrations", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"SCHEDULER_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
    )


def test_migrations_status_tells_a_pending_schema_from_a_current_one(empty_database_url: str) -> None:
    before = _migrations_cli(empty_database_url, "status", "--json")
    assert before.returncode == 1
    assert before.stdout and not before.stderr
    pending = json.loads(before.stdout)
    assert pending["up_to_date"] is False
    assert pending["pending"] == [f"{m.version:04d}_{m.name}" for m in available()]
    with connect(empty_database_url) as conn:
        migrate(conn)
        # A later release's migration already applied (its Job ran first): this release still runs.
        conn.execute("insert into schema_migrations (version, name) values (9999, 'from_the_future')")
        conn.commit()
    after = _migrations_cli(empty_database_url, "status")
    assert after.returncode == 0, after.stderr
    assert "schema up to date" in after.stdout and "9999" in after.stdout


def test_migrations_status_tells_an_unreachable_database_from_a_pending_migration() -> None:
    """Exit 1 is its answer "pending" (a script runs `scheduler init` on it); a database it could not
    ask is exit 2, one line that names it without its password."""
    for args in (("status",), ("status", "--json")):
        done = _migrations_cli("postgresql://sched:hunter2@127.0.0.1:1/scheduler", *args)
        assert done.returncode == 2, done
        assert done.stdout == "", done.stdout
        assert done.stderr.startswith(
            "error: cannot read the schema version from PostgreSQL at postgresql://sched@127.0.0.1:1/"
        ), done.stderr
        assert done.stderr.count("\n") == 1 and "hunter2" not in done.stderr, done.stderr


def test_migrations_wait_returns_once_another_process_migrates(empty_database_url: str) -> None:
    waiting = subprocess.Popen(
        [SCHEDULER, "migrations", "wait", "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"SCHEDULER_DATABASE_URL": empty_database_url, "PATH": "/usr/bin:/bin"},
    )
    try:
        # It says what it waits for before anything is migrated.
        assert waiting.stderr is not None
        assert "waiting for migrations: 0001_" in waiting.stderr.readline()
        assert waiting.poll() is None
        with connect(empty_database_url) as conn:
            migrate(conn)
        out, _ = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0 and "schema up to date" in out


def test_migrations_wait_gives_up_on_an_unreachable_database_in_one_line_without_its_password() -> None:
    done = _migrations_cli("postgresql://sched:hunter2@127.0.0.1:1/scheduler", "wait", "--timeout", "1")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "error: gave up after 1 s waiting for PostgreSQL at postgresql://sched@127.0.0.1:1/"
    )
    assert "hunter2" not in done.stderr + done.stdout


def _migrated_up_to(conn: psycopg.Connection[Any], count: int) -> None:
    """The schema as the first ``count`` migrations left it, recorded as applied."""
    conn.execute(
        "create table schema_migrations (version integer primary key, name text not null, "
        "applied_at timestamptz not null default now())"
    )
    for migration in available()[:count]:
        conn.execute(migration.sql())
        conn.execute("insert into schema_migrations values (%s, %s)", (migration.version, migration.name))
    conn.execute("insert into apps (name, partitions) values ('old', 1)")


def test_schedules_made_before_keys_were_given_to_all_get_their_id_as_key(empty_database_url: str) -> None:
    with connect(empty_database_url) as conn:
        _migrated_up_to(conn, 5)
        keyless = conn.execute(
            "insert into schedules (id, app, name, kind, handler) "
            "values (gen_random_uuid(), 'old', 'a', 'immediate', 'builtin:noop') returning id"
        ).fetchone()
        keyed = conn.execute(
            "insert into schedules (id, app, name, kind, handler) "
            "values (gen_random_uuid(), 'old', 'b', 'immediate', 'builtin:noop') returning id"
        ).fetchone()
        assert keyless is not None and keyed is not None
        conn.execute("insert into schedule_keys values ('old', 'from-kafka', %s)", (keyed["id"],))
        conn.commit()
        assert [m.version for m in migrate(conn)] == [m.version for m in available()[5:]]
        rows = conn.execute("select schedule_id, schedule_key from schedule_keys").fetchall()
    keys = {row["schedule_id"]: row["schedule_key"] for row in rows}
    assert keys == {keyless["id"]: str(keyless["id"]), keyed["id"]: "from-kafka"}


def test_schedules_in_posix_or_right_zones_get_the_iana_zone_they_copy(empty_database_url: str) -> None:
    zones = ["posix/Europe/Berlin", "right/Asia/Tokyo", "Europe/Paris", "localtime"]
    with connect(empty_database_url) as conn:
        _migrated_up_to(conn, 15)
        for zone in zones:
            conn.execute(
                "insert into schedules (id, app, name, kind, cron, tz, handler) "
                "values (gen_random_uuid(), 'old', %s, 'cron', '0 3 * * *', %s, 'builtin:noop')",
                (zone, zone),
            )
        conn.commit()
        assert [m.version for m in migrate(conn)] == [m.version for m in available()[15:]]
        rows = conn.execute("select name, tz from schedules").fetchall()
    assert {row["name"]: row["tz"] for row in rows} == {
        "posix/Europe/Berlin": "Europe/Berlin",
        "right/Asia/Tokyo": "Asia/Tokyo",
        "Europe/Paris": "Europe/Paris",
        "localtime": "localtime",  # no IANA name to give it: state error at its next scan, fixed by update
    }
