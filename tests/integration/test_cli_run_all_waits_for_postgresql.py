"""`scheduler run all` started while PostgreSQL is down waits for it, as every component waits out
an outage: it exited 1 at once ("cannot reach PostgreSQL"). Its components serve their health
endpoints, not ready; the supervisor says in one warning line each time it asks PostgreSQL again
for the apps to run workers for; a signal during the wait stops it all at once, exit 0. (That the
workers start once PostgreSQL answers is tests/e2e/test_operability.py's, with a server of its own.)
A URL PostgreSQL refuses for good (a database or user that does not exist) is no outage: one
line, exit 1, where it was waited out for ever."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.chaos_stack import free_port_range
from tests.support import SCHEDULER, json_log_lines, wait_for

pytestmark = pytest.mark.integration

PIPELINE = ("scanner", "relay", "reconciler", "ingestor")
CLOSED = "postgresql://scheduler:secret@127.0.0.1:1/scheduler"  # port 1 on the loopback: refused at once


def ready(port: int) -> tuple[int, dict[str, Any] | None]:
    """What /ready answers: its status and its JSON (0 and None while nothing listens)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return 0, None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_run_all_started_without_postgresql_waits_for_it_not_ready_and_stops_at_once(
    settings_env: dict[str, str], tmp_path: Path, signum: signal.Signals
) -> None:
    env = {k: v for k, v in settings_env.items() if k not in ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_JWKS")}
    env |= {"SCHEDULER_DATABASE_URL": CLOSED, "SCHEDULER_LOG_FORMAT": "json"}
    base = free_port_range(len(PIPELINE))
    out, err = tmp_path / "run-all.out", tmp_path / "run-all.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [SCHEDULER, "run", "all", "--metrics-port", str(base)],
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    try:

        def supervisor_warnings() -> list[str]:
            return [
                r["message"]
                for r in json_log_lines(err.read_text())
                if r["component"] == "supervisor" and r["level"] == "WARNING"
            ]

        def asked_again() -> bool:
            assert proc.poll() is None, err.read_text()[-3000:]
            return sum("no workers yet" in m for m in supervisor_warnings()) >= 2

        wait_for(asked_again, 30, "the supervisor to ask PostgreSQL again, twice")
        for index, name in enumerate(PIPELINE):
            port = base + index
            wait_for(lambda: ready(port)[0] != 0, 30, f"{name}'s /ready to answer")  # noqa: B023
            code, health = ready(port)
            assert code == 503, (name, code, health)
            assert health is not None and health["components"]["postgresql"]["status"] == "down", health
        assert [line.split()[0] for line in out.read_text().splitlines()] == list(PIPELINE)
        assert proc.poll() is None, "run all is still running, waiting for PostgreSQL"

        signalled = time.monotonic()
        os.kill(proc.pid, signum)
        assert proc.wait(30) == 0, err.read_text()[-3000:]
        assert time.monotonic() - signalled < 10, "run all stopped promptly"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failed test left running
        proc.wait(10)
    text = err.read_text()
    assert "Traceback" not in text, text[-3000:]
    where = "PostgreSQL at postgresql://scheduler@127.0.0.1:1/scheduler is unavailable (connection failed: "
    first, again, *_ = [m for m in supervisor_warnings() if m.startswith("PostgreSQL")]
    assert first.startswith(where) and first.endswith(
        "; the components start and wait for it, the workers once it lists the apps (asking again in 1 s)"
    ), first
    assert again.startswith(where) and again.endswith("; no workers yet (asking again in 2 s)"), again
    assert "secret" not in text


def test_run_all_without_postgresql_refuses_an_app_name_no_app_can_have(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    """Named apps go unchecked while PostgreSQL does not answer, but a name that is no app's name
    needs no database to refuse: it crash-looped its worker ("worker-Bad App!", exit 2 each time)."""
    env = settings_env | {"SCHEDULER_DATABASE_URL": CLOSED}
    base = free_port_range(len(PIPELINE) + 1)
    done = subprocess.run(
        [SCHEDULER, "run", "all", "--app", "Bad App!", "--metrics-port", str(base)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == (
        "error: app name 'Bad App!' must match [a-z0-9][a-z0-9-]{0,47} (lowercase, digits, '-', at most 48)\n"
    )


@pytest.mark.parametrize(
    ("wrong", "why"),
    [
        ({"dbname": "no_such_db_{tag}"}, 'FATAL:  database "no_such_db_{tag}" does not exist'),  # 3D000
        (
            {"user": "no_such_role_{tag}", "password": "secret"},
            'FATAL:  role "no_such_role_{tag}" does not exist',
        ),
    ],
    ids=["database", "user"],
)
@pytest.mark.parametrize("apps", [(), ("billing",)], ids=["every-app", "--app"])
def test_run_all_given_a_url_postgresql_refuses_for_good_stops_at_once_saying_why(
    settings_env: dict[str, str], wrong: dict[str, str], why: str, apps: tuple[str, ...]
) -> None:
    tag = uuid.uuid4().hex[:8]
    url = make_conninfo(
        settings_env["SCHEDULER_DATABASE_URL"], **{k: v.format(tag=tag) for k, v in wrong.items()}
    )
    env = settings_env | {"SCHEDULER_DATABASE_URL": url}
    base = free_port_range(len(PIPELINE) + 1)
    started = time.monotonic()
    done = subprocess.run(
        [SCHEDULER, "run", "all", "--metrics-port", str(base), *(a for app in apps for a in ("--app", app))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (1, ""), done  # nothing started: no table
    params = conninfo_to_dict(url)
    where = f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: cannot use PostgreSQL at {where}: "), line
    assert why.format(tag=tag) in line, line
    assert line.endswith(" (not an outage to wait out: check SCHEDULER_DATABASE_URL)"), line
    assert "secret" not in done.stderr
    assert time.monotonic() - started < 30, "stopped at once, not after a wait"
