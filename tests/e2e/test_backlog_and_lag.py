"""Waiting never costs an attempt, and a lagging reconciler never gets a run expired.

The components run as processes against the real stack: a backlog far longer than the jobs'
timeout, a reconciler stopped for longer than the lease window while its jobs succeed, and a
worker killed in the middle of its jobs, whose runs come back within the lease window.
"""

from __future__ import annotations

import socket
import subprocess
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobResult
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule import service
from scheduler.store import connect
from scheduler.wiring import Wiring
from tests.e2e.test_fire_on_time import PUBLISHED
from tests.support import SCHEDULER, Component, attempts_history, components, read_topic, wait_for

pytestmark = pytest.mark.e2e

APP = "lag"
LEASE_WINDOW_S = 10


def init(settings: Settings, settings_env: dict[str, str], partitions: int = 4) -> None:
    subprocess.run([SCHEDULER, "init"], env=settings_env, check=True, capture_output=True)
    with connect(settings.database_url) as conn:
        service.create_app(conn, TopicAdmin(settings.kafka_bootstrap), settings, APP, partitions, "test")


def create_schedules(
    settings: Settings, jobs: int, payload: str, timeout_ms: int, max_attempts: int, late_s: float = 0.0
) -> None:
    """``jobs`` one-shot schedules of ``builtin:sleep``, due ``late_s`` seconds ago."""
    with connect(settings.database_url) as conn:
        conn.execute(
            "insert into schedules (id, app, name, kind, handler, payload, timeout_ms, max_attempts, "
            "                       next_fire_at) "
            "select gen_random_uuid(), %s, 'n' || g, 'immediate', 'builtin:sleep', %s::jsonb, %s, %s, "
            "       now() - %s * interval '1 second' "
            "from generate_series(1, %s) g",
            (APP, payload, timeout_ms, max_attempts, late_s, jobs),
        )
        conn.commit()


def rows(settings: Settings, sql: str, *params: Any) -> list[dict[str, Any]]:
    with connect(settings.database_url) as conn:
        return conn.execute(sql, params).fetchall()


def count(settings: Settings, where: str) -> int:
    [row] = rows(settings, f"select count(*) as n from runs where {where}")
    return int(row["n"])


def database_now(settings: Settings) -> datetime:
    [row] = rows(settings, "select now() as now")
    now: datetime = row["now"]
    return now


def sweeper_rows(settings: Settings) -> int:
    return len(rows(settings, "select 1 from attempts where worker = 'sweeper'"))


def test_a_ten_minute_backlog_with_a_five_second_timeout_costs_no_attempt(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    jobs = 60
    init(settings, settings_env)
    # Fires found ten minutes late: every job message's deadline (fire + 5 s) is long past when a
    # worker gets to it, as after a relay outage or behind a backlog.
    create_schedules(settings, jobs, '{"seconds": 0.2}', 5_000, 1, late_s=11 * 60)
    with connect(settings.database_url) as conn:
        Wiring(settings).scanner().scan_once(conn, now=database_now(settings) - timedelta(minutes=10))
    assert count(settings, "state = 'pending'") == jobs

    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    with components(env, tmp_path, "relay"):
        wait_for(lambda: count(settings, PUBLISHED) == jobs, 60, "every run's message published")
    # Ten more minutes waiting on the topic: nothing a sweeper could expire.
    with connect(settings.database_url) as conn:
        swept = (
            Wiring(settings).lease_sweeper().sweep(conn, now=database_now(settings) + timedelta(minutes=10))
        )
    assert swept.swept == 0 and count(settings, f"state = 'pending' and {PUBLISHED}") == jobs

    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        worker = Component("worker", env, tmp_path, "--app", APP, "--concurrency", "8")
        try:
            wait_for(lambda: count(settings, "state = 'succeeded'") == jobs, 90, "the backlog drained")
        finally:
            assert worker.stop() == 0, worker.output()[-3000:]
    done = rows(settings, "select state, attempt, count(*) as n from runs group by 1, 2")
    assert done == [{"state": "succeeded", "attempt": 1, "n": jobs}]
    assert sweeper_rows(settings) == 0
    executions = [a for a in attempts_history(settings.database_url) if a["kind"] == "started"]
    assert len(executions) == jobs, "each job ran exactly once"


def test_a_reconciler_stopped_past_the_lease_window_while_jobs_succeed_reruns_and_kills_nothing(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    jobs = 20
    init(settings, settings_env)
    create_schedules(settings, jobs, '{"seconds": 4}', 60_000, 2)
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2", "SCHEDULER_LEASE_WINDOW_S": str(LEASE_WINDOW_S)}
    with components(env, tmp_path, "scanner", "relay"):
        worker = Component("worker", env, tmp_path, "--app", APP, "--concurrency", str(jobs))
        try:
            reconciler = Component("reconciler", env, tmp_path)
            try:
                wait_for(lambda: count(settings, "state = 'running'") == jobs, 60, "every job running")
            finally:
                reconciler.kill()
            # While it is down every job succeeds: the successes wait, unread, in .results.
            codec = AvroCodec()

            def successes() -> int:
                results = read_topic(settings.kafka_bootstrap, settings.results_topic)
                return sum(codec.decode(JobResult, value).status == "succeeded" for _, value, _ in results)

            wait_for(lambda: successes() == jobs, 60, "every job to succeed while the reconciler is down")
            [lease] = rows(settings, "select max(lease_expires_at) as until from runs")
            wait_for(lambda: database_now(settings) > lease["until"], 30, "every lease to pass")
            assert count(settings, "state = 'running'") == jobs

            with components(env, tmp_path, "reconciler"):
                wait_for(lambda: count(settings, "state = 'succeeded'") == jobs, 60, "every success applied")
        finally:
            assert worker.stop() == 0, worker.output()[-3000:]
    done = rows(settings, "select state, attempt, count(*) as n from runs group by 1, 2")
    assert done == [{"state": "succeeded", "attempt": 1, "n": jobs}], "nothing re-run, nothing killed"
    assert sweeper_rows(settings) == 0
    # (A batch applied just before the kill and read again after it is recorded as duplicates.)
    outcomes = Counter(
        (a["kind"], a["outcome"])
        for a in attempts_history(settings.database_url)
        if a["kind"] != "heartbeat" and a["outcome"] != "duplicate"
    )
    assert outcomes == {("started", "applied"): jobs, ("succeeded", "applied"): jobs}


def test_a_worker_killed_mid_job_has_its_runs_back_within_the_lease_window(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    jobs, concurrency = 48, 12  # more than one worker can hold: both get some
    init(settings, settings_env)
    create_schedules(settings, jobs, '{"seconds": 4}', 120_000, 3)
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2", "SCHEDULER_LEASE_WINDOW_S": str(LEASE_WINDOW_S)}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        survivor = Component("worker", env, tmp_path, "--app", APP, "--concurrency", str(concurrency))
        victim = Component("worker", env, tmp_path, "--app", APP, "--concurrency", str(concurrency))
        try:
            victim_name = f"worker-{socket.gethostname()}-{victim.proc.pid}"
            on_victim = f"state = 'running' and worker = '{victim_name}'"
            wait_for(lambda: count(settings, on_victim) >= 5, 60, "the victim to be running jobs")
            lost = [r["id"] for r in rows(settings, f"select id from runs where {on_victim}")]
            victim.kill()
            killed_at = database_now(settings)

            def recovered() -> bool:
                # Running again on the survivor, or done: nothing left with the dead worker.
                return not rows(settings, f"select 1 from runs where {on_victim}")

            wait_for(recovered, LEASE_WINDOW_S + 15, "the victim's runs back within the lease window")
            back_at = database_now(settings)
            wait_for(lambda: count(settings, "state = 'succeeded'") == jobs, 90, "every run succeeded")
        finally:
            if victim.proc.poll() is None:
                victim.kill()
            assert survivor.stop() == 0, survivor.output()[-3000:]
    # A lost run that another worker finished ran a second time, and that is on record: a second
    # start of its attempt (Kafka redelivered the job) or the sweeper's expiry of it.
    [finished_elsewhere] = rows(
        settings, "select count(*) as n from runs where id = any(%s) and worker <> %s", lost, victim_name
    )
    [on_record] = rows(
        settings,
        "select count(distinct run_id) as n from attempts "
        "where run_id = any(%s) and (outcome = 'reexecution' or worker = 'sweeper')",
        lost,
    )
    print(
        f"\nworker kill -9: {len(lost)} runs lost with it, back after "
        f"{(back_at - killed_at).total_seconds():.1f} s (lease window {LEASE_WINDOW_S} s); "
        f"{on_record['n']} second executions on record"
    )
    assert finished_elsewhere["n"] > 0 and on_record["n"] >= finished_elsewhere["n"]
