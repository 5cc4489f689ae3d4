"""What a user finds on the dead-letter topic and in `scheduler dlq list` for jobs that failed: each
letter's attempt history against the run's attempts in PostgreSQL, through a replay; a run replayed
again and again, whose history a job message carries bounded (the newest 100 attempts), so that it
stays under what the producers send; and the letter of a job no worker could decode, found by the
error class its worker gave it."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as RawProducer

from scheduler.config import Settings
from scheduler.domain.run_state import RunState
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobDeadLetter
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, scan
from scheduler.store.scan import NewRun
from tests.integration.test_schedules_cli import Cli
from tests.support import SCHEDULER, Component, attempts_history, components, read_topic, stop_all, wait_for

pytestmark = pytest.mark.e2e

APP = "payments"
BUDGET = 100  # the largest max_attempts a schedule takes
REPLAYS = 40
# What a failing handler's error typically is: a line and a stack's worth of text. Each attempt
# keeps it, and a job message carries the first 1,024 characters of each (MAX_HISTORY_ERROR_CHARS).
ERROR = "ConnectionError: upstream refused the connection; " + "x" * 1100


@pytest.fixture
def cli(settings: Settings, settings_env: dict[str, str], tmp_path: Path) -> Iterator[Cli]:
    """Core topics, an app, and every component running (one worker of the app)."""
    subprocess.run([SCHEDULER, "init"], env=settings_env, check=True, capture_output=True)
    cli = Cli(settings_env)
    assert cli("apps", "create", APP, "--partitions", "1").returncode == 0
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        worker = Component("worker", env, tmp_path, "--app", APP)
        try:
            yield cli
        finally:
            stop_all([worker])


def letters(settings: Settings) -> list[JobDeadLetter]:
    codec = AvroCodec()
    topic = read_topic(settings.kafka_bootstrap, settings.dlq_topic)
    return [codec.decode(JobDeadLetter, value) for _, value, _ in topic]


def dead_run(settings: Settings, schedule_id: Any, attempt: int) -> dict[str, Any] | None:
    with connect(settings.database_url) as conn:
        row: dict[str, Any] | None = conn.execute(
            "select * from runs where schedule_id = %s and state = 'dead' and attempt = %s",
            (schedule_id, attempt),
        ).fetchone()
        return row


def test_the_dead_letter_of_a_replayed_run_holds_every_attempt_of_the_run(
    cli: Cli, settings: Settings
) -> None:
    """A job that fails every time, 2 attempts a budget: dead at attempt 2, replayed, dead again at
    attempt 4. Its second letter on the dead-letter topic must list every attempt of the run, as the
    schema says ("Every attempt of the run, oldest first, the last one included") and as PostgreSQL
    has them (`scheduler runs get`). It lists 1, 3 and 4: the attempt that died before the replay is
    missing, because the replayed job message is built with no previous attempts and a retry's
    history is read from the retries only."""
    with connect(settings.database_url) as conn:
        spec = ScheduleSpec(
            app=APP,
            handler="builtin:fail",
            kind="immediate",
            payload={"times": 100, "retryable": True},
            max_attempts=2,
            backoff_base_ms=10,
            backoff_max_ms=50,
        )
        schedule_id = service.create_schedule(conn, spec, "test")["id"]
    first = wait_for(lambda: dead_run(settings, schedule_id, 2), 60, "the run dead at attempt 2")
    replay = cli("dlq", "replay", "--run", str(first["id"]))
    assert replay.returncode == 0 and replay.stdout.startswith("replayed 1 run in "), replay
    wait_for(lambda: dead_run(settings, schedule_id, 4), 60, "the replayed run dead at attempt 4")

    in_postgresql = sorted(
        a["attempt"] for a in attempts_history(settings.database_url, "id = %s", first["id"])
    )
    assert in_postgresql == [1, 2, 3, 4], in_postgresql
    last = wait_for(
        lambda: next((d for d in letters(settings) if d.run_id == first["id"] and d.attempt == 4), None),
        60,
        "the dead letter of attempt 4 on the topic",
    )
    assert [a.attempt for a in last.attempts] == in_postgresql


def test_the_dead_letter_of_a_run_replayed_after_dying_at_once_lists_both_deaths(
    cli: Cli, settings: Settings
) -> None:
    """A job whose handler no worker runs dies at its first attempt (non-retryable, so no retry
    row); replayed, it dies again at attempt 2. Its second letter lists both attempts, as
    PostgreSQL has them, not the last one alone."""
    with connect(settings.database_url) as conn:
        spec = ScheduleSpec(app=APP, handler="sys:exit", kind="immediate", max_attempts=3)
        schedule_id = service.create_schedule(conn, spec, "test")["id"]
    first = wait_for(lambda: dead_run(settings, schedule_id, 1), 60, "the run dead at attempt 1")
    replay = cli("dlq", "replay", "--run", str(first["id"]))
    assert replay.returncode == 0, replay
    wait_for(lambda: dead_run(settings, schedule_id, 2), 60, "the replayed run dead at attempt 2")
    in_postgresql = sorted(
        a["attempt"] for a in attempts_history(settings.database_url, "id = %s", first["id"])
    )
    assert in_postgresql == [1, 2], in_postgresql
    last = wait_for(
        lambda: next((d for d in letters(settings) if d.run_id == first["id"] and d.attempt == 2), None),
        60,
        "the dead letter of attempt 2 on the topic",
    )
    assert [(a.attempt, a.error_class) for a in last.attempts] == [
        (1, "HandlerNotRegistered"),
        (2, "HandlerNotRegistered"),
    ]


def test_an_undecodable_job_is_listed_by_the_error_class_its_letter_has(cli: Cli, settings: Settings) -> None:
    """Bytes on the job topic that are no job: the worker dead-letters them with an error class
    (on the topic), and `dlq list` lists the letter (kind undecodable). Filtering the list by that
    class (`--error-class`, "only dead letters whose error is of this class") must find it; it finds
    nothing, as the class is dropped when the letter is mirrored into PostgreSQL, and the filter
    reads the text before the letter's first ':' instead (here "unknown framing (first byte 0xff)")."""
    producer = RawProducer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(settings.jobs_topic(APP), b"\xff not a job", partition=0)
    assert producer.flush(30) == 0
    listed = wait_for(
        lambda: [d for d in cli.json("dlq", "list", "--app", APP, "--json") if d["kind"] == "undecodable"],
        60,
        "the undecodable letter listed",
    )
    (letter,) = [d for d in letters(settings) if d.cause == "undecodable"]
    assert listed[0]["id"] == str(letter.event_id)
    by_class = cli.json("dlq", "list", "--app", APP, "--error-class", letter.error_class, "--json")
    assert [d["id"] for d in by_class] == [str(letter.event_id)], (letter.error_class, listed)


def run_row(settings: Settings, run_id: uuid.UUID) -> dict[str, Any]:
    with connect(settings.database_url) as conn:
        row = conn.execute("select state, attempt, error from runs where id = %s", (run_id,)).fetchone()
    assert row is not None
    return dict(row)


def test_a_run_replayed_many_times_is_still_delivered(cli: Cli, settings: Settings) -> None:
    """A job that failed its 100 attempts, was replayed, and failed again, 40 times over (an
    operator replaying a flaky upstream's dead letters each day for a month and more): PostgreSQL
    holds its 4,000 failed attempts as the reconciler left them, each with its error. The upstream
    is fixed, the operator replays it once more (the handler now succeeds): the run runs and
    succeeds. (Its replayed job message once carried all 4,000 attempts' errors, about 4.4 MB, over
    what the producer sends, 4 MiB: the relay quarantined it and the run died again, RelayRefused,
    at every replay.)"""
    with connect(settings.database_url) as conn:
        spec = ScheduleSpec(app=APP, handler="builtin:noop", kind="immediate", max_attempts=BUDGET)
        schedule = service.create_schedule(conn, spec, "test")
        run_id = uuid.uuid4()
        scan.create_runs(
            conn, [NewRun(run_id, schedule["id"], APP, schedule["next_fire_at"], RunState.PENDING, BUDGET)]
        )
        conn.execute("delete from outbox")
        attempts = BUDGET * REPLAYS
        conn.execute(
            "insert into attempts (run_id, attempt, kind, outcome, worker, started_at, finished_at, error,"
            " error_class)"
            " select %(run)s, n, case when n %% %(budget)s = 0 then 'dead' else 'retry' end, 'applied',"
            "        'payments-worker-7f9c', now() - interval '1 day', now() - interval '1 day', %(error)s,"
            "        'ConnectionError'"
            "   from generate_series(1, %(attempts)s) n",
            {"run": run_id, "budget": BUDGET, "error": ERROR, "attempts": attempts},
        )
        conn.execute(
            "update runs set state = 'dead', attempt = %s, max_attempts = %s, finished_at = now(),"
            " error = %s where id = %s",
            (attempts, attempts, ERROR, run_id),
        )
        conn.commit()

    replay = cli("dlq", "replay", "--run", str(run_id), "--force")
    assert replay.returncode == 0, replay
    ended = wait_for(
        lambda: (r := run_row(settings, run_id))["state"] in ("succeeded", "dead") and r,
        120,
        "the replayed run to end",
    )
    assert ended["state"] == "succeeded", ended
