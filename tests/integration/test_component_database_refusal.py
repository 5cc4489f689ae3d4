"""A component PostgreSQL refuses for good at start (a role or database that does not exist, a wrong
password) exits 1 with one error line that names the setting and never the password; an outage is
waited out; and once PostgreSQL has answered, even a refusal for good is waited out as an outage,
so that a running pipeline keeps its place until the operator puts the setting right."""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.support import SCHEDULER, Component, json_log_lines, wait_for

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-never-logged"


def with_user(url: str, **changes: str) -> str:
    return make_conninfo(url, **changes)


def errors_of(output: str) -> list[dict[str, object]]:
    return [record for record in json_log_lines(output) if record["level"] == "ERROR"]


@pytest.mark.parametrize("component", ["scanner", "relay", "reconciler", "ingestor", "api"])
def test_a_role_postgresql_does_not_know_is_one_error_line_and_exit_1(
    component: str, settings_env: dict[str, str]
) -> None:
    url = with_user(settings_env["SCHEDULER_DATABASE_URL"], user="nobody_here", password=PASSWORD)
    env = settings_env | {"SCHEDULER_DATABASE_URL": url, "SCHEDULER_JWT_SECRET": "k" * 32}
    # The API's own ports any free ones (0): only PostgreSQL is to refuse it.
    ports = ["--port", "0", "--grpc-port", "0"] if component == "api" else []
    done = subprocess.run(
        [SCHEDULER, "run", component, *ports],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    errors = errors_of(done.stderr)
    assert len(errors) == 1, done.stderr[-3000:]
    message = str(errors[0]["message"])
    assert 'role "nobody_here" does not exist' in message and "SCHEDULER_DATABASE_URL" in message
    assert PASSWORD not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_a_database_that_does_not_exist_is_one_error_line_and_exit_1(settings_env: dict[str, str]) -> None:
    url = with_user(settings_env["SCHEDULER_DATABASE_URL"], dbname="no_such_database")
    done = subprocess.run(
        [SCHEDULER, "run", "scanner"],
        env=settings_env | {"SCHEDULER_DATABASE_URL": url},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    [error] = errors_of(done.stderr)
    assert 'database "no_such_database" does not exist' in str(error["message"])


def test_a_port_nobody_listens_on_is_an_outage_waited_out(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    url = with_user(settings_env["SCHEDULER_DATABASE_URL"], host="127.0.0.1", port="1")
    scanner = Component("scanner", settings_env | {"SCHEDULER_DATABASE_URL": url}, tmp_path)
    try:
        wait_for(lambda: "(attempt 2)" in scanner.output(), 30, "a second attempt")
        assert scanner.proc.poll() is None, scanner.output()[-3000:]
    finally:
        assert scanner.stop() == 0, scanner.output()[-3000:]
    assert errors_of(scanner.output()) == []


def end_sessions(admin: psycopg.Connection[tuple[object, ...]], role: str) -> None:
    admin.execute("select pg_terminate_backend(pid) from pg_stat_activity where usename = %s", [role])


@pytest.fixture
def login_role(settings_env: dict[str, str]) -> Iterator[str]:
    """A role of this test's own that may do what the scheduler's role does (a member of it)."""
    admin_url = settings_env["SCHEDULER_DATABASE_URL"]
    name = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        owner = admin.execute("select current_user").fetchone()
        assert owner is not None
        admin.execute(
            sql.SQL("create role {} login in role {}").format(sql.Identifier(name), sql.Identifier(owner[0]))
        )
    try:
        yield name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            end_sessions(admin, name)
            admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))


def test_a_refusal_for_good_after_postgresql_answered_is_waited_out(
    settings_env: dict[str, str], login_role: str, tmp_path: Path
) -> None:
    admin_url = settings_env["SCHEDULER_DATABASE_URL"]
    env = settings_env | {"SCHEDULER_DATABASE_URL": with_user(admin_url, user=login_role)}
    scanner = Component("scanner", env, tmp_path)
    try:
        with psycopg.connect(admin_url, autocommit=True) as admin:

            def sessions() -> int:
                row = admin.execute(
                    "select count(*) as n from pg_stat_activity where usename = %s", [login_role]
                ).fetchone()
                assert row is not None
                return int(row[0])

            wait_for(lambda: sessions() > 0, 60, "the scanner's session")
            # The role may no longer log in, and its sessions end: the scanner's next connection
            # is refused for good, but PostgreSQL has answered it before.
            admin.execute(sql.SQL("alter role {} nologin").format(sql.Identifier(login_role)))
            end_sessions(admin, login_role)
            wait_for(lambda: "is not permitted to log in" in scanner.output(), 60, "the refused reconnection")
            assert scanner.proc.poll() is None, scanner.output()[-3000:]
            admin.execute(sql.SQL("alter role {} login").format(sql.Identifier(login_role)))
            wait_for(lambda: "recovered after" in scanner.output(), 60, "the scanner's recovery")
    finally:
        scanner.proc.send_signal(signal.SIGTERM)
        code = scanner.proc.wait(30)
    assert code == 0, scanner.output()[-3000:]
    assert errors_of(scanner.output()) == []
