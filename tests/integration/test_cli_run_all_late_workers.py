"""`scheduler run all` without `--app`, started while PostgreSQL does not answer, adds the workers
once PostgreSQL lists the apps. PostgreSQL "comes up" here as a port that refuses connections until
the test forwards it to the shared server (which is never stopped): the workers' lines keep the
columns of the table printed at start (they were as wide as their own names), and a signal that
comes while `run all` checks the workers' metrics ports stops it with 0, as a signal at any other
moment does (it exited 2, as for a port taken). A PostgreSQL that, once it answers, refuses the URL
for good (no such database) stops it with one error line and exit 1, as at start."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from bench.chaos_stack import free_port_range
from scheduler.config import Settings
from tests.support import SCHEDULER, PostgreSQLPort, json_log_lines, wait_for

pytestmark = pytest.mark.integration

PIPELINE = ("scanner", "relay", "reconciler", "ingestor")
TABLE_LINE = "health and metrics on port"

# `run all` as the CLI runs it, but with a signal to itself just as it checks the metrics ports of
# the workers it adds (not those it checks at start): the moment no test could time from outside.
SIGNAL_DURING_THE_PORT_CHECK = r"""
import importlib, signal, sys

from scheduler.cli import main

run = importlib.import_module("scheduler.cli.run")  # the package's `run` is the click group

base = int(sys.argv[1])
checked = run._ports_refused


def signalled_while_checked(first, count):
    if first != base:
        signal.raise_signal(signal.SIGTERM)
    return checked(first, count)


run._ports_refused = signalled_while_checked
sys.argv = ["scheduler", "run", "all", "--metrics-port", str(base)]
main()
"""


@pytest.fixture
def late_postgresql(settings: Settings) -> Iterator[PostgreSQLPort]:
    late = PostgreSQLPort(settings.database_url)
    try:
        yield late
    finally:
        late.down()


@pytest.fixture
def env(settings: Settings, settings_env: dict[str, str], late_postgresql: PostgreSQLPort) -> dict[str, str]:
    """The test's database, with one app of a name longer than any component's, through the late
    port; no JWT key (so no API)."""
    app = f"late-{uuid.uuid4().hex[:12]}"
    done = subprocess.run(
        [SCHEDULER, "apps", "create", app, "--partitions", "1"],
        env=settings_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    url = late_postgresql.url(settings.database_url)
    env = {k: v for k, v in settings_env.items() if k not in ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_JWKS")}
    return env | {"SCHEDULER_DATABASE_URL": url, "SCHEDULER_APP": app}


@contextlib.contextmanager
def started(
    argv: list[str], env: dict[str, str], tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    out, err = tmp_path / "run-all.out", tmp_path / "run-all.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        yield proc, out, err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failed test left running
        proc.wait(10)


def table(out: Path) -> list[str]:
    return [line for line in out.read_text().splitlines() if TABLE_LINE in line]


def test_the_lines_of_the_workers_added_later_keep_the_columns_of_the_start_table(
    env: dict[str, str], late_postgresql: PostgreSQLPort, tmp_path: Path
) -> None:
    base = free_port_range(len(PIPELINE) + 1)
    argv = [SCHEDULER, "run", "all", "--metrics-port", str(base)]
    with started(argv, env, tmp_path) as (proc, out, err):

        def waiting() -> bool:
            assert proc.poll() is None, err.read_text()[-3000:]
            return len(table(out)) == len(PIPELINE) and "no workers yet" in err.read_text()

        wait_for(waiting, 60, "run all to start the pipeline and wait for the apps")
        late_postgresql.up()

        def worker_added() -> bool:
            assert proc.poll() is None, err.read_text()[-3000:]
            return len(table(out)) == len(PIPELINE) + 1

        wait_for(worker_added, 60, "the worker's line")
        lines = table(out)
        assert [line.split()[0] for line in lines] == [*PIPELINE, f"worker-{env['SCHEDULER_APP']}"]
        assert len({line.index(" pid ") for line in lines}) == 1, lines
        assert len({line.index(TABLE_LINE) for line in lines}) == 1, lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, err.read_text()[-3000:]


def test_a_signal_while_the_ports_of_the_workers_added_later_are_checked_stops_run_all_with_0(
    env: dict[str, str], late_postgresql: PostgreSQLPort, tmp_path: Path
) -> None:
    """The worker's port is taken, so the check refuses it: were the signal not there, `run all`
    would stop every component and exit 2 (tests/e2e/test_operability.py); the signal came first."""
    base = free_port_range(len(PIPELINE) + 1)
    script = tmp_path / "run_all.py"
    script.write_text(SIGNAL_DURING_THE_PORT_CHECK)
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", base + len(PIPELINE)))  # the worker's
        holder.listen()
        with started([sys.executable, str(script), str(base)], env, tmp_path) as (proc, _out, err):

            def waiting() -> bool:
                assert proc.poll() is None, err.read_text()[-3000:]
                return "no workers yet" in err.read_text()

            wait_for(waiting, 60, "run all to wait for the apps")
            late_postgresql.up()
            assert proc.wait(60) == 0, err.read_text()[-3000:]
    log = err.read_text()
    assert "received SIGTERM, stopping every component" in log, log[-3000:]
    assert "stopping every component" not in log.replace("received SIGTERM, stopping every component", "")
    assert "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("given_apps", [False, True], ids=["every-app", "--app"])
def test_a_url_postgresql_refuses_for_good_once_it_answers_stops_run_all_with_1(
    env: dict[str, str], late_postgresql: PostgreSQLPort, tmp_path: Path, given_apps: bool
) -> None:
    """Started while PostgreSQL does not answer, then answered by a server that has no such
    database: one line, exit 1. With the apps given, nothing asked PostgreSQL again, and the
    components waited for a database that does not exist for ever."""
    missing = f"no_such_db_{uuid.uuid4().hex[:8]}"
    env = env | {"SCHEDULER_DATABASE_URL": make_conninfo(env["SCHEDULER_DATABASE_URL"], dbname=missing)}
    base = free_port_range(len(PIPELINE) + 1)
    argv = [SCHEDULER, "run", "all", "--metrics-port", str(base)]
    argv += ["--app", env["SCHEDULER_APP"]] if given_apps else []
    with started(argv, env, tmp_path) as (proc, out, err):

        def waiting() -> bool:
            assert proc.poll() is None, err.read_text()[-3000:]
            if given_apps:
                return len(table(out)) == len(PIPELINE) + 1 and "not checked" in err.read_text()
            return "no workers yet" in err.read_text()

        wait_for(waiting, 60, "run all to wait for PostgreSQL")
        late_postgresql.up()
        assert proc.wait(60) == 1, err.read_text()[-3000:]
    errors = [
        r["message"]
        for r in json_log_lines(err.read_text())
        if r["component"] == "supervisor" and r["level"] == "ERROR"
    ]
    where = f"postgresql://scheduler@127.0.0.1:{late_postgresql.port}/{missing}"
    assert len(errors) == 1 and errors[0].startswith(f"cannot use PostgreSQL at {where}: "), errors
    assert errors[0].endswith(
        f'FATAL:  database "{missing}" does not exist (not an outage to wait out: check '
        "SCHEDULER_DATABASE_URL): stopping every component"
    ), errors
    if given_apps:
        assert "no workers yet" not in err.read_text(), "its workers run"
    else:
        assert [line.split()[0] for line in table(out)] == list(PIPELINE), "no worker was added"
