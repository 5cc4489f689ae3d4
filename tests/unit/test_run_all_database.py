"""What `run all` and every component make of PostgreSQL's failure to answer at start: a URL refused
for good (a wrong password, user or database) stops them, where an outage is waited out.
psycopg gives a failed connection no SQLSTATE, so these are the messages libpq and PostgreSQL write,
each with the SQLSTATE the server sent (tests/integration/test_cli_run_all_waits_for_postgresql.py
has the real ones of the shared server). Its watch of the apps, which asks PostgreSQL for as long
as it runs, is tested against the real one: tests/integration/test_cli_run_all_app_watch.py."""

from __future__ import annotations

import importlib
import socket

import psycopg
import pytest

from scheduler.schedule.spec import validate_app_name
from scheduler.store.refusals import refused_for_good

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
        AT + "server does not support SSL, but SSL was required",
        AT + "channel binding required, but server authenticated client without channel binding",
        AT + 'authentication method requirement "scram-sha-256" failed: server did not complete '
        "authentication",
        AT + 'FATAL:  unrecognized configuration parameter "foo"',  # 42704, options=-cfoo=bar
        AT + 'FATAL:  invalid value for parameter "work_mem": "banana"',  # 22023
        # Several addresses: the last one's failure comes first, and decides.
        AT + 'FATAL:  database "schedular" does not exist\nMultiple connection attempts failed. All '
        "failures were:\n- host: 'db', port: None, hostaddr: '10.0.0.6': connection failed: connection to "
        'server at "10.0.0.6", port 5432 failed: Connection refused',
    ],
)
def test_a_wrong_url_is_refused_for_good(message: str) -> None:
    assert refused_for_good(psycopg.OperationalError(message))


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
        AT + "session is not read-only",  # target_session_attrs: a failover may make it one
        AT + "server is not in hot standby mode",
    ],
)
def test_an_outage_is_waited_out(message: str) -> None:
    assert not refused_for_good(psycopg.OperationalError(message))


def test_the_app_name_the_table_keeps_room_for_is_an_app_name() -> None:
    """The width the table reserves for the workers added later is that of an app with this name."""
    assert validate_app_name("a" * run.RESERVED_APP_CHARS)


@pytest.mark.parametrize(
    "conninfo",
    [
        "host=127.0.0.1,127.0.0.2 port=5432,5433,5434 dbname=scheduler",  # 3 ports for 2 hosts
        "host=db hostaddr=10.0.0.5,10.0.0.6 dbname=scheduler",  # 2 addresses for 1 host name
    ],
)
def test_host_and_port_lists_that_do_not_match_are_refused_for_good(conninfo: str) -> None:
    """psycopg splits the host, hostaddr and port lists itself, before libpq sees them, and words the
    mismatch without libpq's "connection is bad: " (psycopg/_conninfo_utils.py): the real error,
    raised before any address is tried, is a URL that can never work."""
    with pytest.raises(psycopg.OperationalError) as raised:
        psycopg.connect(conninfo, connect_timeout=1)
    assert refused_for_good(raised.value), str(raised.value)
