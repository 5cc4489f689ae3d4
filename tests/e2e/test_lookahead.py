"""Look-ahead dispatch through the components as processes: a fire is leased and dispatched before
its instant, its worker holds the job until that instant, and starts it then, never earlier. The
start is announced to Kafka just ahead of the instant, so that the handler itself can run at it:
the run records the instant as its start, and the handler is never entered before it.

A held job is not started: a worker killed while holding one loses nothing (the group redelivers
it to another worker, which runs it once), and its attempt's timeout counts from its start, not from
the moment it was fetched.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.chaos_stack import free_port
from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobMessage, JobResult
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect, schedules
from tests.e2e.health import get, sample_values
from tests.support import (
    SCHEDULER,
    Component,
    attempts_history,
    components,
    read_topic,
    stop_all,
    wait_for,
)

pytestmark = pytest.mark.e2e

APP = "ahead"
ENTERED_AT = "tests.unit.handler_fixtures:entered_at"


def init(settings: Settings, settings_env: dict[str, str]) -> None:
    subprocess.run([SCHEDULER, "init"], env=settings_env, check=True, capture_output=True)
    with connect(settings.database_url) as conn:
        service.create_app(conn, TopicAdmin(settings.kafka_bootstrap), settings, APP, 2, "test")


def database_now(settings: Settings) -> datetime:
    with connect(settings.database_url) as conn:
        return schedules.db_now(conn)


def create_delayed(settings: Settings, run_at: datetime, **fields: Any) -> Any:
    fields.setdefault("handler", "builtin:noop")
    with connect(settings.database_url) as conn:
        spec = ScheduleSpec(app=APP, kind="delayed", run_at=run_at, **fields)
        return service.create_schedule(conn, spec, "test")["id"]


def runs(settings: Settings) -> list[dict[str, Any]]:
    """The delayed schedules' runs (not the warm-up's), in fire order."""
    with connect(settings.database_url) as conn:
        return conn.execute(
            "select r.* from runs r join schedules s on s.id = r.schedule_id "
            "where s.kind = 'delayed' order by r.scheduled_for"
        ).fetchall()


def started_attempts(settings: Settings) -> list[dict[str, Any]]:
    delayed = "schedule_id in (select id from schedules where kind = 'delayed')"
    return [a for a in attempts_history(settings.database_url, delayed) if a["kind"] == "started"]


def succeeded(settings: Settings, count: int) -> list[dict[str, Any]] | None:
    found = runs(settings)
    done = len(found) == count and all(r["state"] == "succeeded" for r in found)
    return found if done else None


def warm_up(settings: Settings) -> None:
    """One job through the whole pipeline: every component is up and the workers have partitions."""
    with connect(settings.database_url) as conn:
        spec = ScheduleSpec(app=APP, kind="immediate", handler="builtin:noop")
        schedule_id = service.create_schedule(conn, spec, "test")["id"]

    def done() -> bool:
        with connect(settings.database_url) as conn:
            row = conn.execute("select state from runs where schedule_id = %s", (schedule_id,)).fetchone()
        return row is not None and row["state"] == "succeeded"

    wait_for(done, 60, "the warm-up job to succeed")


def on_kafka_at(settings: Settings) -> dict[Any, datetime]:
    """When each run's job message reached the app's topic (its Kafka timestamp), by run id."""
    codec = AvroCodec()
    return {
        codec.decode(JobMessage, value).run_id: datetime.fromtimestamp(timestamp / 1000, UTC)
        for _, value, timestamp in read_topic(settings.kafka_bootstrap, settings.jobs_topic(APP))
    }


def started_on_kafka_at(settings: Settings) -> dict[Any, datetime]:
    """When each run's start event was produced (its Kafka timestamp), by run id."""
    codec = AvroCodec()
    events = (
        (codec.decode(JobResult, value), timestamp)
        for _, value, timestamp in read_topic(settings.kafka_bootstrap, settings.results_topic)
    )
    return {
        event.run_id: datetime.fromtimestamp(timestamp / 1000, UTC)
        for event, timestamp in events
        if event.status == "started"
    }


def held_jobs(port: int) -> float:
    answer = get(port, "/metrics")
    values = sample_values(answer.text, "scheduler_worker_held_jobs") if answer.status == 200 else []
    return sum(value for labels, value in values if labels.get("app") == APP)


def test_fires_dispatched_ahead_start_at_their_instant_never_before(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    init(settings, settings_env)
    env = settings_env | {"SCHEDULER_LOOKAHEAD_S": "1"}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        workers = [Component("worker", env, tmp_path, "--app", APP) for _ in range(2)]
        try:
            warm_up(settings)
            fires = []
            for i in range(40):
                # Each 1 to 2 s ahead of its creation: leased at once or within the second.
                fires.append(database_now(settings) + timedelta(seconds=1, milliseconds=25 * i))
                create_delayed(settings, fires[-1], handler=ENTERED_AT)
            done = wait_for(lambda: succeeded(settings, len(fires)), 90, "every run succeeded")
        finally:
            stop_all(workers)
    assert [r["scheduled_for"] for r in done] == sorted(fires)
    early = [r for r in done if r["started_at"] < r["scheduled_for"]]
    assert early == [], "a job started before its instant"
    # The handler's own clock (this machine's, as the database's): never entered before its
    # instant, nor before the start its run records.
    entered = {r["id"]: datetime.fromtimestamp(r["result"]["entered_at"], UTC) for r in done}
    entered_early = [r for r in done if entered[r["id"]] < max(r["scheduled_for"], r["started_at"])]
    assert entered_early == [], "a handler ran before its instant or before its recorded start"
    # Announced ahead: a start was produced before its instant, and no handler ran before its
    # start was produced (Kafka's acknowledgement comes later still).
    start_produced = started_on_kafka_at(settings)
    # (Kafka's timestamps are whole milliseconds: ahead by more than a few of them.)
    margin = timedelta(milliseconds=5)
    announced_ahead = [r for r in done if start_produced[r["id"]] < r["scheduled_for"] - margin]
    assert announced_ahead, "no start announced ahead"
    before_start = [r for r in done if entered[r["id"]] < start_produced[r["id"]]]
    assert before_start == [], "a handler ran before its start was produced"
    # Dispatched ahead: Kafka had the job before its instant, so a worker held it until then.
    published = on_kafka_at(settings)
    ahead = [r for r in done if published[r["id"]] < r["scheduled_for"] - timedelta(milliseconds=100)]
    assert ahead, "no fire was on Kafka before its instant"
    assert len(started_attempts(settings)) == len(fires), "each job started once"


@contextmanager
def holding_worker(
    settings: Settings, env: dict[str, str], tmp_path: Path, due_in: timedelta
) -> Iterator[tuple[Component, datetime]]:
    """A worker (and the pipeline around it) holding one job, due ``due_in`` from now; the worker
    is killed on the way out if the test left it running."""
    port = free_port()
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        holder = Component("worker", env | {"SCHEDULER_METRICS_PORT": str(port)}, tmp_path, "--app", APP)
        try:
            warm_up(settings)
            at = database_now(settings) + due_in
            create_delayed(settings, at)
            # Held until it is due, and only then: no use waiting longer.
            wait_for(lambda: held_jobs(port) == 1, due_in.total_seconds(), "the worker to hold the job")
            yield holder, at
        finally:
            if holder.proc.poll() is None:
                holder.kill()


def test_a_worker_killed_while_holding_a_job_loses_nothing(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    init(settings, settings_env)
    # A long look-ahead, so that the job is surely held when the worker dies.
    env = settings_env | {"SCHEDULER_LOOKAHEAD_S": "20"}
    with holding_worker(settings, env, tmp_path, timedelta(seconds=10)) as (holder, at):
        holder.kill()
        assert database_now(settings) < at, "the worker was killed too late to prove anything"
        assert started_attempts(settings) == []
        other = Component("worker", env, tmp_path, "--app", APP)
        try:
            # The group gives the dead member's partitions away after its session timeout (10 s).
            [run] = wait_for(lambda: succeeded(settings, 1), 90, "the run to succeed elsewhere")
        finally:
            assert other.stop() == 0, other.output()[-3000:]
    [start] = started_attempts(settings)
    assert start["worker"] == run["worker"], "started once, by the worker that finished it"
    assert run["attempt"] == 1 and run["started_at"] >= run["scheduled_for"] == at


def test_a_held_job_has_its_whole_timeout_from_its_start(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    init(settings, settings_env)
    env = settings_env | {"SCHEDULER_LOOKAHEAD_S": "10"}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        worker = Component("worker", env, tmp_path, "--app", APP)
        try:
            warm_up(settings)
            at = database_now(settings) + timedelta(seconds=4)
            create_delayed(
                settings,
                at,
                handler="builtin:sleep",
                payload={"seconds": 0.5},
                timeout_ms=1000,
                max_attempts=1,
            )
            [run] = wait_for(lambda: succeeded(settings, 1), 60, "the run to succeed")
        finally:
            assert worker.stop() == 0, worker.output()[-3000:]
    assert run["attempt"] == 1 and run["started_at"] >= run["scheduled_for"]
    # On Kafka, and so with the worker, for longer than the job's timeout before it started.
    assert run["started_at"] - on_kafka_at(settings)[run["id"]] > timedelta(seconds=1)
    assert run["finished_at"] - run["started_at"] >= timedelta(seconds=0.5)


def test_a_worker_stopped_while_holding_a_job_due_soon_runs_it_before_it_exits(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    # Dropping it would keep the offsets of the finished jobs after it uncommitted, and the next
    # owner would run those again: a job due within the first half of the grace (30 s) is run
    # instead. Due in 10 s: time for the pipeline to bring it to the worker, on a loaded machine too.
    init(settings, settings_env)
    env = settings_env | {"SCHEDULER_LOOKAHEAD_S": "20"}
    with holding_worker(settings, env, tmp_path, timedelta(seconds=10)) as (holder, at):
        assert database_now(settings) < at, "the job was no longer held when the worker was stopped"
        assert holder.stop() == 0, holder.output()[-3000:]
        [run] = wait_for(lambda: succeeded(settings, 1), 30, "the held run to be reconciled")
    [start] = started_attempts(settings)
    assert start["worker"] == run["worker"], "run by the stopping worker, once"
    assert run["started_at"] >= run["scheduled_for"] == at
