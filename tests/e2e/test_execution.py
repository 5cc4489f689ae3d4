"""Jobs run and their outcomes land: the whole pipeline as processes, against the real stack."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition

from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobDeadLetter, JobMessage, JobRetry
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import connect
from tests.support import (
    SCHEDULER,
    Component,
    attempts_history,
    components,
    read_records,
    read_topic,
    stop_all,
    wait_for,
    watermarks,
)

pytestmark = pytest.mark.e2e

APP = "exec"


@pytest.fixture
def pipeline(settings: Settings, settings_env: dict[str, str], tmp_path: Path) -> Iterator[Settings]:
    """Core topics, an app with 4 partitions, and every component running (2 workers)."""
    subprocess.run([SCHEDULER, "init"], env=settings_env, check=True, capture_output=True)
    with connect(settings.database_url) as conn:
        service.create_app(conn, TopicAdmin(settings.kafka_bootstrap), settings, APP, 4, "test")
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        workers = [Component("worker", env, tmp_path, "--app", APP, "--concurrency", "32") for _ in range(2)]
        try:
            yield settings
        finally:
            stop_all(workers)


def create(settings: Settings, **fields: Any) -> Any:
    fields.setdefault("kind", "immediate")
    with connect(settings.database_url) as conn:
        return service.create_schedule(conn, ScheduleSpec(app=APP, **fields), "test")["id"]


def runs(settings: Settings, sql_filter: str = "true") -> list[dict[str, Any]]:
    with connect(settings.database_url) as conn:
        return conn.execute(f"select * from runs where {sql_filter}").fetchall()


def attempts_of(settings: Settings, schedule_id: Any) -> list[dict[str, Any]]:
    return attempts_history(settings.database_url, "schedule_id = %s", schedule_id)


def terminal(settings: Settings, schedule_id: Any) -> dict[str, Any] | None:
    found = runs(settings, f"schedule_id = '{schedule_id}' and state in ('succeeded', 'dead')")
    return found[0] if found else None


def test_noop_jobs_all_succeed(pipeline: Settings) -> None:
    ids = [create(pipeline, handler="builtin:noop") for _ in range(300)]
    wait_for(lambda: len(runs(pipeline, "state = 'succeeded'")) == len(ids), 60, "300 runs succeeded")
    done = runs(pipeline)
    assert len(done) == 300 and {r["state"] for r in done} == {"succeeded"}
    assert all(r["worker"] and r["finished_at"] >= r["started_at"] for r in done)

    # Each outcome continues the trace its job message started (W3C traceparent, same trace id).
    codec = AvroCodec()
    job_traces = {
        codec.decode(JobMessage, value).run_id.bytes: headers["traceparent"].split(b"-")[1]
        for _, value, _, headers in read_records(pipeline.kafka_bootstrap, pipeline.jobs_topic(APP))
    }
    outcome_traces = {
        key: headers["traceparent"].split(b"-")[1]
        for key, _, _, headers in read_records(pipeline.kafka_bootstrap, pipeline.results_topic)
    }
    assert len(job_traces) == 300 and outcome_traces == job_traces


def test_failing_twice_succeeds_on_the_third_attempt_with_jittered_backoff(pipeline: Settings) -> None:
    sid = create(
        pipeline, handler="builtin:fail", payload={"times": 2}, backoff_base_ms=200, backoff_max_ms=1000
    )
    run = wait_for(lambda: terminal(pipeline, sid), 60, "the run to end")
    assert run is not None
    assert (run["state"], run["attempt"], run["error"]) == ("succeeded", 3, None)
    history = [(a["attempt"], a["kind"], a["outcome"]) for a in attempts_of(pipeline, sid)]
    assert [h for h in history if h[1] != "started"] == [
        (1, "retry", "applied"), (2, "retry", "applied"), (3, "succeeded", "applied"),
    ]  # fmt: skip
    retries = [a for a in attempts_of(pipeline, sid) if a["kind"] == "retry"]
    # Full jitter: the wait after attempt n is drawn from [0, min(max, base * 2^(n-1))], as each
    # retry event says. (The next start comes that long after the failure plus the pipeline's own
    # way round through four processes: on a loaded machine, seconds; not what is tested here.)
    codec = AvroCodec()
    backoffs = {
        event.attempt: event.backoff_ms
        for event in (
            codec.decode(JobRetry, v)
            for _, v, _ in read_topic(pipeline.kafka_bootstrap, pipeline.retry_topic)
        )
        if event.run_id == run["id"]
    }
    for attempt, ceiling_s in ((1, 0.2), (2, 0.4)):
        backoff_ms = backoffs[attempt]
        assert backoff_ms is not None and 0 <= backoff_ms <= ceiling_s * 1000, (attempt, backoff_ms)
        failed = next(a for a in retries if a["attempt"] == attempt)
        next_start = next(
            a["started_at"]
            for a in attempts_of(pipeline, sid)
            if a["attempt"] == attempt + 1 and a["started_at"]
        )
        assert next_start >= failed["finished_at"], (attempt, next_start, failed["finished_at"])


def test_failing_past_max_attempts_is_dead_on_the_dlq_and_listed(
    pipeline: Settings, settings_env: dict[str, str]
) -> None:
    sid = create(pipeline, handler="builtin:fail", payload={"times": 5}, max_attempts=3, backoff_base_ms=100)
    run = wait_for(lambda: terminal(pipeline, sid), 60, "the run to end")
    assert run is not None
    assert (run["state"], run["attempt"]) == ("dead", 3)
    codec = AvroCodec()
    letters = [
        codec.decode(JobDeadLetter, v) for _, v, _ in read_topic(pipeline.kafka_bootstrap, pipeline.dlq_topic)
    ]
    [letter] = [x for x in letters if x.run_id == run["id"]]
    assert letter.cause == "retries_exhausted" and [a.attempt for a in letter.attempts] == [1, 2, 3]
    listed = json.loads(
        subprocess.run(
            [SCHEDULER, "dlq", "list", "--json"], env=settings_env, capture_output=True, check=True
        ).stdout
    )
    assert [d["id"] for d in listed] == [str(run["id"])]


def test_non_retryable_failure_goes_straight_to_dead(pipeline: Settings) -> None:
    sid = create(pipeline, handler="builtin:fail", payload={"times": 1, "retryable": False})
    run = wait_for(lambda: terminal(pipeline, sid), 60, "the run to end")
    assert run is not None
    assert (run["state"], run["attempt"]) == ("dead", 1)


def test_random_bytes_are_dead_lettered_and_the_partition_moves_on(pipeline: Settings) -> None:
    garbage = os.urandom(64)
    producer = RawProducer({"bootstrap.servers": pipeline.kafka_bootstrap})
    topic = pipeline.jobs_topic(APP)
    producer.produce(topic, garbage, partition=0)
    assert producer.flush(30) == 0
    # Jobs behind it: enough schedules that partition 0 surely gets some.
    ids = [create(pipeline, handler="builtin:noop") for _ in range(40)]
    wait_for(lambda: len(runs(pipeline, "state = 'succeeded'")) == len(ids), 60, "the jobs behind it ran")
    codec = AvroCodec()

    def undecodable() -> list[JobDeadLetter]:
        letters = (
            codec.decode(JobDeadLetter, v)
            for _, v, _ in read_topic(pipeline.kafka_bootstrap, pipeline.dlq_topic)
        )
        return [x for x in letters if x.cause == "undecodable"]

    # Its letter and the outcomes of the jobs behind it are produced independently: waited for.
    [letter] = wait_for(undecodable, 60, "the undecodable job's dead letter")
    assert letter.original_bytes == garbage and letter.source is not None and letter.source.partition == 0


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/", "http://169.254.169.254/latest/meta-data/"])
def test_http_job_to_a_private_address_is_dead_and_not_retried(pipeline: Settings, url: str) -> None:
    sid = create(pipeline, handler="builtin:http", payload={"url": url})
    run = wait_for(lambda: terminal(pipeline, sid), 60, "the run to end")
    assert run is not None
    assert (run["state"], run["attempt"]) == ("dead", 1)
    assert "refused" in run["error"]


def test_a_worker_killed_mid_job_loses_nothing(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    subprocess.run([SCHEDULER, "init"], env=settings_env, check=True, capture_output=True)
    with connect(settings.database_url) as conn:
        service.create_app(conn, TopicAdmin(settings.kafka_bootstrap), settings, APP, 4, "test")
    jobs = 200
    _ = [
        create(settings, handler="builtin:sleep", payload={"seconds": 3}, timeout_ms=10_000)
        for _ in range(jobs)
    ]
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        survivor = Component("worker", env, tmp_path, "--app", APP, "--concurrency", "100")
        victim = Component("worker", env, tmp_path, "--app", APP, "--concurrency", "100")
        try:
            victim_name = f"worker-{socket.gethostname()}-{victim.proc.pid}"
            wait_for(
                lambda: len(runs(settings, f"state = 'running' and worker = '{victim_name}'")) >= 20,
                60,
                "the victim to be running jobs",
            )
            victim.kill()
            try:
                wait_for(
                    lambda: len(runs(settings, "state = 'succeeded'")) == jobs, 120, "every run succeeded"
                )
            except AssertionError:
                with connect(settings.database_url) as conn:
                    states = conn.execute(
                        "select state, attempt, count(*) from runs group by 1, 2"
                    ).fetchall()
                raise AssertionError(f"runs by state: {states}\n{survivor.output()[-2000:]}") from None
        finally:
            if victim.proc.poll() is None:  # the test failed before killing it
                victim.kill()
            assert survivor.stop() == 0
    done = runs(settings)
    assert len(done) == jobs and {r["state"] for r in done} == {"succeeded"}
    history = attempts_history(settings.database_url)
    succeeded_elsewhere = {
        a["run_id"]
        for a in history
        if a["kind"] == "succeeded" and a["outcome"] == "applied" and a["worker"] != victim_name
    }
    outcomes = {
        "applied": sum(1 for a in history if a["kind"] == "succeeded" and a["outcome"] == "applied"),
        "extra": sum(1 for a in history if a["kind"] == "succeeded" and a["outcome"] != "applied"),
        "re_executed": len(
            {
                a["run_id"]
                for a in history
                if a["worker"] == victim_name
                and a["kind"] == "started"
                and a["run_id"] in succeeded_elsewhere
            }
        ),
    }
    # Exactly one success applied per run; the re-executions of the victim's jobs are on record.
    assert outcomes["applied"] == jobs
    assert outcomes["re_executed"] > 0
    print(
        f"\nworker kill -9: {outcomes['re_executed']} runs re-executed, "
        f"{outcomes['extra']} extra outcomes fenced"
    )


def test_sigterm_lets_running_jobs_finish_publish_and_commit(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    subprocess.run([SCHEDULER, "init"], env=settings_env, check=True, capture_output=True)
    with connect(settings.database_url) as conn:
        service.create_app(conn, TopicAdmin(settings.kafka_bootstrap), settings, APP, 4, "test")
    jobs = 20
    for _ in range(jobs):
        create(settings, handler="builtin:sleep", payload={"seconds": 3})
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        worker = Component("worker", env, tmp_path, "--app", APP, "--concurrency", "50", "--grace", "30")
        try:
            wait_for(lambda: len(runs(settings, "state = 'running'")) == jobs, 60, "every job running")
        finally:
            assert worker.stop(timeout_s=40) == 0, worker.output()[-3000:]
        # No other worker exists: every success below was published by the one that was stopped.
        wait_for(lambda: len(runs(settings, "state = 'succeeded'")) == jobs, 30, "every run succeeded")
    executions = [a for a in attempts_history(settings.database_url) if a["kind"] == "succeeded"]
    assert [a["outcome"] for a in executions] == ["applied"] * jobs
    # Its offsets were committed up to the end of every partition: nothing would be re-delivered.
    topic = settings.jobs_topic(APP)
    reader = RawConsumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": settings.worker_group(APP)}
    )
    try:
        partitions = [TopicPartition(topic, p) for p in range(4)]
        committed = {tp.partition: tp.offset for tp in reader.committed(partitions, timeout=10)}
        ends = {tp.partition: watermarks(reader, tp)[1] for tp in partitions}
    finally:
        reader.close()
    assert {p: max(o, 0) for p, o in committed.items() if ends[p]} == {p: e for p, e in ends.items() if e}
