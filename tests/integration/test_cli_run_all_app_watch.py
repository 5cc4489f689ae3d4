"""`run all`'s watch of the apps without `--app`, against the real PostgreSQL: each app created while
it runs handed over once, on one connection kept open; an outage said once (and its end); a
connection PostgreSQL ended made again without a word; a URL refused for good the end of it, with
`--app` too. The watch reaches the test's own database through a port of the test's, which it
opens (PostgreSQL up) and closes (down: its sessions ended, connections refused)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from scheduler.config import Settings
from scheduler.store import connect
from scheduler.store.schedules import app_names, create_app
from scheduler.wiring import Wiring
from tests.support import PostgreSQLPort, wait_for

pytestmark = pytest.mark.integration

run = importlib.import_module("scheduler.cli.run")  # the package's `run` is the click group


class WatchedPostgreSQL:
    """The test's database as the watch meets it, through :attr:`port`; the apps the test creates
    in it, the sessions PostgreSQL lists for the watch, and how often the watch asked (a connection
    attempt, refused or not, or a listing of the apps), for the test to wait on rather than the clock."""

    def __init__(self, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
        self.settings = settings
        self.port = PostgreSQLPort(settings.database_url)
        self.questions = 0
        self._monkeypatch = monkeypatch

        def counted(conn: psycopg.Connection[dict[str, Any]]) -> list[str]:
            self.questions += 1
            return app_names(conn)

        monkeypatch.setattr(run, "app_names", counted)

    def display(self, dbname: str | None = None) -> str:
        """Where the watch's lines say PostgreSQL is: the port's address, no password."""
        params = conninfo_to_dict(self.settings.database_url)
        return f"postgresql://{params['user']}@127.0.0.1:{self.port.port}/{dbname or params['dbname']}"

    def create_app(self, name: str) -> None:
        """As `scheduler apps create` records it (its topic aside: the watch asks only PostgreSQL),
        straight to the server, whether the port is up or not."""
        with connect(self.settings.database_url, autocommit=True) as conn:
            assert create_app(conn, name, 1) is not None

    def sessions(self) -> list[int]:
        """The server processes of the watch's connections, as ``pg_stat_activity`` lists them."""
        with connect(self.settings.database_url, autocommit=True) as conn:
            rows = conn.execute(
                "select pid from pg_stat_activity where client_port = any(%s) order by pid",
                (self.port.client_ports(),),
            ).fetchall()
        return [int(str(row["pid"])) for row in rows]

    def end_sessions(self) -> None:
        """As PostgreSQL restarted, or an idle session timed out, would end them; the port stays up."""
        with connect(self.settings.database_url, autocommit=True) as conn:
            conn.execute("select pg_terminate_backend(pid) from unnest(%s::int[]) as pid", (self.sessions(),))

    def asked(self, times: int) -> None:
        """Wait until the watch has asked PostgreSQL ``times`` more times (or tried to)."""
        target = self.questions + times
        wait_for(lambda: self.questions >= target, 10, f"{times} more questions", interval_s=0.01)

    @contextmanager
    def watching(self, listed: Sequence[str] | None, every_app: bool = True, **params: str) -> Iterator[Any]:
        """The watch of ``run all``, on the test's database (or another ``dbname``, as another
        ``user``) through the port; stopped and its thread ended after, so that nothing of it
        outlives the test."""
        url = self.port.url(self.settings.database_url, **params)
        wiring = Wiring(dataclasses.replace(self.settings, database_url=url))
        connect_to = wiring.database.connect

        def counted(**options: Any) -> psycopg.Connection[dict[str, Any]]:
            self.questions += 1
            return connect_to(**options)

        self._monkeypatch.setattr(wiring.database, "connect", counted)
        watch = run._AppWatch(wiring, listed=listed, every_app=every_app)
        watch.start()
        try:
            yield watch
        finally:
            watch.stop()
            watch._thread.join(10)
            assert not watch._thread.is_alive(), "the watch still runs"

    @contextmanager
    def answering(self, *apps: str, **params: str) -> Iterator[Any]:
        """The watch of ``run all`` started with ``apps``, which PostgreSQL holds, while it answers."""
        for app in apps:
            self.create_app(app)
        self.port.up()
        with self.watching(list(apps), True, **params) as watch:
            yield watch


@pytest.fixture
def postgresql(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Iterator[WatchedPostgreSQL]:
    """Asked every 10 ms, and again as often in an outage: the conditions, not the clock, are tested.
    The port starts down; the watch's lines are kept from INFO up."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(run, "APPS_WATCH_S", 0.01)
    monkeypatch.setattr(run, "DATABASE_RETRY_INITIAL_S", 0.01)
    monkeypatch.setattr(run, "DATABASE_RETRY_MAX_S", 0.01)
    watched = WatchedPostgreSQL(settings, monkeypatch)
    try:
        yield watched
    finally:
        watched.port.down()


def supervisor_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "scheduler.run"]


def test_an_app_created_while_run_all_runs_is_handed_over_once_on_one_connection(
    postgresql: WatchedPostgreSQL, caplog: pytest.LogCaptureFixture
) -> None:
    with postgresql.answering("billing") as watch:
        postgresql.asked(3)
        assert watch.apps() is None, "nothing new: the apps listed at start have their workers"
        [session] = postgresql.sessions()
        postgresql.create_app("audit")
        assert wait_for(watch.apps, 10, "the new app") == ("audit",)
        postgresql.asked(3)
        assert watch.apps() is None, "each app handed over once"
        assert postgresql.sessions() == [session], "one connection kept open"
    assert supervisor_lines(caplog) == []


def test_started_while_postgresql_was_down_it_hands_over_every_app_first_then_the_new_ones(
    postgresql: WatchedPostgreSQL, caplog: pytest.LogCaptureFixture
) -> None:
    with postgresql.watching(None) as watch:
        postgresql.asked(2)
        postgresql.port.up()
        handed: list[tuple[str, ...]] = []

        def listed() -> bool:
            found = watch.apps()
            if found is not None:
                handed.append(found)
            return bool(handed)

        wait_for(listed, 10, "the first listing")
        assert handed == [()], "no apps yet: handed over all the same, for run all to say so"
        postgresql.create_app("billing")
        assert wait_for(watch.apps, 10, "the new app") == ("billing",)
    warnings = [m for level, m in supervisor_lines(caplog) if level == "WARNING"]
    said = (
        f"PostgreSQL at {postgresql.display()} is unavailable (connection failed: connection to server at "
        f'"127.0.0.1", port {postgresql.port.port} failed: Connection refused); no workers yet (asking '
        "again in "
    )
    assert len(warnings) >= 2, warnings
    assert all(m.startswith(said) and m.endswith(" s)") for m in warnings), warnings


def test_an_outage_once_the_workers_run_is_said_once_and_so_is_its_end(
    postgresql: WatchedPostgreSQL, caplog: pytest.LogCaptureFixture
) -> None:
    with postgresql.answering("billing") as watch:
        postgresql.asked(2)
        postgresql.port.down()
        postgresql.asked(10)
        postgresql.create_app("audit")  # created meanwhile
        postgresql.port.up()
        assert wait_for(watch.apps, 10, "the app created during the outage") == ("audit",)
        postgresql.asked(3)
    where = postgresql.display()
    assert supervisor_lines(caplog) == [
        (
            "WARNING",
            f'PostgreSQL at {where} is unavailable (connection failed: connection to server at "127.0.0.1", '
            f"port {postgresql.port.port} failed: Connection refused); the workers run on, those of an app "
            "created meanwhile once it answers (asking again, quietly)",
        ),
        ("INFO", f"PostgreSQL at {where} answers again"),
    ]


def test_a_connection_ended_while_postgresql_answers_is_made_again_without_a_word(
    postgresql: WatchedPostgreSQL, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL restarted between two questions, or ended an idle session: no outage to report."""
    with postgresql.answering("billing") as watch:
        postgresql.asked(2)
        [ended] = postgresql.sessions()
        postgresql.end_sessions()

        def made_again() -> bool:
            sessions = postgresql.sessions()
            return len(sessions) == 1 and ended not in sessions

        wait_for(made_again, 10, "a new connection")
        postgresql.asked(2)
        assert watch.apps() is None, "no app handed over again"
    assert supervisor_lines(caplog) == []


@pytest.mark.parametrize("every_app", [True, False], ids=["every app", "--app"])
def test_a_url_refused_for_good_while_run_all_runs_ends_the_watch_with_its_line(
    postgresql: WatchedPostgreSQL, every_app: bool
) -> None:
    """Down at first, then answered by a server that has no such database."""
    missing = f"no_such_db_{uuid.uuid4().hex[:8]}"
    listed = ["billing"] if every_app else None
    with postgresql.watching(listed, every_app=every_app, dbname=missing) as watch:
        postgresql.asked(2)
        postgresql.port.up()
        wrong = wait_for(watch.wrong_url, 10, "the error line")
        watch._thread.join(10)
        assert not watch._thread.is_alive(), "not asked again"
    assert wrong == (
        f"cannot use PostgreSQL at {postgresql.display(missing)}: connection failed: connection to server "
        f'at "127.0.0.1", port {postgresql.port.port} failed: FATAL:  database "{missing}" does not exist '
        "(not an outage to wait out: check SCHEDULER_DATABASE_URL)"
    )


@pytest.fixture
def nologin_later(settings: Settings) -> Iterator[str]:
    """A role of the test's own that may do what the scheduler's role does (a member of it), until
    the test forbids it to log in."""
    name = f"r_{uuid.uuid4().hex[:12]}"
    with connect(settings.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} login in role current_user").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with connect(settings.database_url, autocommit=True) as conn:
            conn.execute("select pg_terminate_backend(pid) from pg_stat_activity where usename = %s", [name])
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))


def test_a_refusal_for_good_once_postgresql_answered_is_an_outage_said_once(
    postgresql: WatchedPostgreSQL, nologin_later: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The role's login taken away under a running run all: its workers run on, as every component
    does, until the operator puts it right."""
    with postgresql.answering("billing", user=nologin_later) as watch:
        wait_for(postgresql.sessions, 10, "the watch's session")
        with connect(postgresql.settings.database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("alter role {} nologin").format(sql.Identifier(nologin_later)))
        postgresql.end_sessions()
        postgresql.asked(5)
        assert watch.wrong_url() is None and watch._thread.is_alive()
        with connect(postgresql.settings.database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("alter role {} login").format(sql.Identifier(nologin_later)))
        postgresql.create_app("audit")
        assert wait_for(watch.apps, 10, "the app created meanwhile") == ("audit",)
    lines = supervisor_lines(caplog)
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert f'role "{nologin_later}" is not permitted to log in' in lines[0][1]


def test_a_bug_in_the_watch_is_said_with_its_traceback_and_the_watch_goes_on(
    postgresql: WatchedPostgreSQL, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    listing = run.app_names
    bugs = [RuntimeError("a bug in the listing")]

    def buggy(conn: psycopg.Connection[dict[str, Any]]) -> list[str]:
        if bugs:
            raise bugs.pop()
        names: list[str] = listing(conn)
        return names

    monkeypatch.setattr(run, "app_names", buggy)
    with postgresql.answering("billing") as watch:
        postgresql.create_app("audit")
        assert wait_for(watch.apps, 10, "the new app, after the bug") == ("audit",)
    [record] = [r for r in caplog.records if r.name == "scheduler.run"]
    assert record.levelname == "ERROR" and record.getMessage().startswith("the watch of the apps failed")
    assert record.exc_info is not None and "a bug in the listing" in str(record.exc_info[1])
