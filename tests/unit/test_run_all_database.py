"""What `run all` makes of PostgreSQL's failure to answer at start: a URL refused for good (a wrong
password, user or database) stops it, where an outage is waited out.
psycopg gives a failed connection no SQLSTATE, so these are the messages libpq and PostgreSQL write,
each with the SQLSTATE the server sent (tests/integration/test_cli_run_all_waits_for_postgresql.py
has the real ones of the shared server).

And its watch of the apps without `--app`: each app created while it runs handed over once, an
outage said once (and its end), a URL refused for good the end of it."""

from __future__ import annotations

import importlib
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import psycopg
import pytest

from scheduler.schedule.spec import validate_app_name
from tests.support import wait_for

run = importlib.import_module("scheduler.cli.run")  # the package's `run` is the click group

AT = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


@pytest.mark.parametrize(
    "message",
    [
        AT + 'FATAL:  password authentication failed for user "scheduler"',  # 28P01
        AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "scheduler", database "scheduler", '
        "no encryption",  # 28000
        AT + 'FATAL:  pg_hba.conf rejects connection for host "10.0.0.7", user "scheduler"',  # 28000
        AT + 'FATAL:  role "schedular" does not exist',  # 28000
        AT + 'FATAL:  role "scheduler" is not permitted to log in',  # 28000
        AT + 'FATAL:  Peer authentication failed for user "scheduler"',  # 28000
        AT + 'FATAL:  database "schedular" does not exist',  # 3D000
        AT + 'FATAL:  permission denied for database "scheduler"',  # 42501
        AT + "fe_sendauth: no password supplied",
        'connection is bad: invalid port number: "99999"',
        # Several addresses: the last one's failure comes first, and decides.
        AT + 'FATAL:  database "schedular" does not exist\nMultiple connection attempts failed. All '
        "failures were:\n- host: 'db', port: None, hostaddr: '10.0.0.6': connection failed: connection to "
        'server at "10.0.0.6", port 5432 failed: Connection refused',
    ],
)
def test_a_wrong_url_is_refused_for_good(message: str) -> None:
    assert run.refused_for_good(psycopg.OperationalError(message))


@pytest.mark.parametrize(
    "message",
    [
        AT + "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?",
        "connection timeout expired",
        AT + "FATAL:  the database system is starting up",  # 57P03
        AT + "FATAL:  the database system is shutting down",  # 57P03
        AT + "FATAL:  the database system is not yet accepting connections",  # 57P03
        AT + "FATAL:  sorry, too many clients already",  # 53300
        AT + 'FATAL:  too many connections for role "scheduler"',  # 53300
        AT + "FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute",
        AT + "server closed the connection unexpectedly",
        'connection is bad: connection to server on socket "/run/postgresql/.s.PGSQL.5432" failed: No '
        "such file or directory",  # a local server not started yet
        f"failed to resolve host 'db': [Errno {socket.EAI_AGAIN}] Temporary failure in name resolution",
        # A service not up yet has no name either (compose, Kubernetes): waited out as well.
        f"failed to resolve host 'db': [Errno {socket.EAI_NONAME}] Name or service not known",
        AT + "FATAL:  la base de données « schedular » n'existe pas",  # worded in another language
    ],
)
def test_an_outage_is_waited_out(message: str) -> None:
    assert not run.refused_for_good(psycopg.OperationalError(message))


def test_the_app_name_the_table_keeps_room_for_is_an_app_name() -> None:
    """The width the table reserves for the workers added later is that of an app with this name."""
    assert validate_app_name("a" * run.RESERVED_APP_CHARS)


# --- the watch of the apps, against a PostgreSQL of the test's making -------------------------

REFUSED = AT + "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?"


class FakePostgreSQL:
    """The apps, what a connection attempt meets (``down``: refused; ``refusal``: that message), and
    how often it was connected to and asked; :meth:`end_sessions` ends the connections made."""

    display = "postgresql://scheduler@10.0.0.5:5432/scheduler"

    def __init__(self, apps: list[str]) -> None:
        self.apps = apps
        self.down = False
        self.refusal: str | None = None
        self.connections = 0
        self.questions = 0
        self.attempts = 0
        self._ended = 0  # sessions numbered up to this one are ended

    def connect(self, **_options: object) -> FakeSession:
        self.attempts += 1
        if self.refusal is not None:
            raise psycopg.OperationalError(self.refusal)
        if self.down:
            raise psycopg.OperationalError(REFUSED)
        self.connections += 1
        return FakeSession(self, self.connections)

    def end_sessions(self) -> None:
        self._ended = self.connections

    def ask(self, session: int) -> list[dict[str, str]]:
        if self.down or session <= self._ended:
            raise psycopg.OperationalError("consuming input failed: server closed the connection")
        self.questions += 1
        return [{"name": name} for name in sorted(self.apps)]


@dataclass
class FakeSession:
    server: FakePostgreSQL
    number: int

    def execute(self, _query: str) -> list[dict[str, str]]:
        return self.server.ask(self.number)

    def close(self) -> None:
        pass


@dataclass
class FakeWiring:
    database: FakePostgreSQL


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked every 10 ms, and again as often in an outage: the conditions, not the clock, are tested."""
    monkeypatch.setattr(run, "APPS_WATCH_S", 0.01)
    monkeypatch.setattr(run, "DATABASE_RETRY_INITIAL_S", 0.01)
    monkeypatch.setattr(run, "DATABASE_RETRY_MAX_S", 0.01)


@contextmanager
def watching(server: FakePostgreSQL, listed: list[str] | None, every_app: bool = True) -> Iterator[Any]:
    watch = run._AppWatch(cast(Any, FakeWiring(server)), listed=listed, every_app=every_app)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


def asked(server: FakePostgreSQL, times: int) -> None:
    """Wait until PostgreSQL has been asked ``times`` more times (or tried to be)."""
    target = server.attempts + server.questions + times
    wait_for(lambda: server.attempts + server.questions >= target, 10, f"{times} more questions")


def supervisor_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "scheduler.run"]


@pytest.mark.usefixtures("quick")
def test_an_app_created_while_run_all_runs_is_handed_over_once_on_one_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    server = FakePostgreSQL(["billing"])
    with watching(server, ["billing"]) as watch:
        asked(server, 3)
        assert watch.apps() is None, "nothing new: the apps listed at start have their workers"
        server.apps.append("audit")
        assert wait_for(watch.apps, 10, "the new app") == ("audit",)
        asked(server, 3)
        assert watch.apps() is None, "each app handed over once"
    assert server.connections == 1, "one connection kept open"
    assert supervisor_lines(caplog) == []


@pytest.mark.usefixtures("quick")
def test_started_while_postgresql_was_down_it_hands_over_every_app_first_then_the_new_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FakePostgreSQL([])
    server.down = True
    with watching(server, None) as watch:
        asked(server, 2)
        server.down = False
        handed: list[tuple[str, ...]] = []

        def listed() -> bool:
            found = watch.apps()
            if found is not None:
                handed.append(found)
            return bool(handed)

        wait_for(listed, 10, "the first listing")
        assert handed == [()], "no apps yet: handed over all the same, for run all to say so"
        server.apps.append("billing")
        assert wait_for(watch.apps, 10, "the new app") == ("billing",)
    warnings = [m for level, m in supervisor_lines(caplog) if level == "WARNING"]
    assert len(warnings) >= 2 and all(m.endswith(" s)") and "; no workers yet (asking" in m for m in warnings)


@pytest.mark.usefixtures("quick")
def test_an_outage_once_the_workers_run_is_said_once_and_so_is_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    server = FakePostgreSQL(["billing"])
    with watching(server, ["billing"]) as watch:
        asked(server, 2)
        server.down = True
        asked(server, 10)
        server.apps.append("audit")  # created meanwhile
        server.down = False
        assert wait_for(watch.apps, 10, "the app created during the outage") == ("audit",)
        asked(server, 3)
    where = FakePostgreSQL.display
    assert supervisor_lines(caplog) == [
        (
            "WARNING",
            f"PostgreSQL at {where} is unavailable ({REFUSED.splitlines()[0]}); the workers run on, those "
            "of an app created meanwhile once it answers (asking again, quietly)",
        ),
        ("INFO", f"PostgreSQL at {where} answers again"),
    ]


@pytest.mark.usefixtures("quick")
def test_a_connection_ended_while_postgresql_answers_is_made_again_without_a_word(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL restarted between two questions, or ended an idle session: no outage to report."""
    caplog.set_level(logging.INFO)
    server = FakePostgreSQL(["billing"])
    with watching(server, ["billing"]):
        asked(server, 2)
        server.end_sessions()
        wait_for(lambda: server.connections == 2, 10, "a new connection")
        asked(server, 2)
    assert supervisor_lines(caplog) == []


@pytest.mark.usefixtures("quick")
@pytest.mark.parametrize("every_app", [True, False], ids=["every app", "--app"])
def test_a_url_refused_for_good_while_run_all_runs_ends_the_watch_with_its_line(every_app: bool) -> None:
    server = FakePostgreSQL(["billing"])
    server.down = True
    with watching(server, ["billing"] if every_app else None, every_app=every_app) as watch:
        asked(server, 2)
        server.refusal = AT + 'FATAL:  database "scheduler" does not exist'
        wrong = wait_for(watch.wrong_url, 10, "the error line")
        watch._thread.join(10)
        assert not watch._thread.is_alive(), "not asked again"
    assert wrong == (
        f'cannot use PostgreSQL at {FakePostgreSQL.display}: {AT}FATAL:  database "scheduler" does not '
        "exist (not an outage to wait out: check SCHEDULER_DATABASE_URL)"
    )
