"""The worker against the real Kafka: it runs only registered handlers, no handler ends its job loop,
every outcome is delivered (capped, or compact when Kafka refuses its size), a stuck synchronous
handler holds up neither the next job nor the exit, and its commits end where its work ended.

Jobs are produced straight onto the app's topic and outcomes read from the outcome topics with an
independent client: no PostgreSQL component runs, so what is seen is the worker's doing alone.
"""

from __future__ import annotations

import gc
import json
import os
import re
import secrets
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka import Producer as RawProducer
from prometheus_client import CollectorRegistry

from scheduler.config import Settings
from scheduler.domain.storable import MAX_ERROR_CHARS, MAX_HISTORY_ERROR_CHARS, MAX_RESULT_BYTES
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobDeadLetter, JobMessage, JobResult, JobRetry
from scheduler.kafka.transport import Consumer, TopicAdmin, consumer_config
from scheduler.runtime.health import Health
from scheduler.runtime.service import Check
from scheduler.wiring import Wiring
from scheduler.worker.handlers import HandlerRegistry, JobContext
from scheduler.worker.metrics import REGISTRY
from scheduler.worker.worker import LOOP_STALL_S, Worker, WorkerTopics
from tests.support import Component, job_message, read_records, wait_for, watermarks
from tests.unit.handler_fixtures import EXECUTED

pytestmark = pytest.mark.integration

APP = "robust"
FIXTURES = "tests.unit.handler_fixtures"
CODEC = AvroCodec()
# The app's topic takes big jobs; the dead-letter topic keeps the broker's default limit (about
# 1 MB), so that a letter carrying a big job is refused for its size.
BIG_TOPIC = {"max.message.bytes": str(8 * 1024 * 1024)}


@dataclass
class Outcomes:
    """What the outcome topics hold, by run id."""

    started: dict[uuid.UUID, list[JobResult]] = field(default_factory=dict)
    succeeded: dict[uuid.UUID, JobResult] = field(default_factory=dict)
    retried: dict[uuid.UUID, JobRetry] = field(default_factory=dict)
    dead: dict[uuid.UUID, JobDeadLetter] = field(default_factory=dict)

    def ended(self) -> set[uuid.UUID]:
        return set(self.succeeded) | set(self.retried) | set(self.dead)


def read_outcomes(settings: Settings) -> Outcomes:
    found = Outcomes()
    bootstrap = settings.kafka_bootstrap
    for _, value, _, _ in read_records(bootstrap, settings.results_topic):
        result = CODEC.decode(JobResult, value)
        if result.status == "succeeded":
            found.succeeded[result.run_id] = result
        elif result.status == "started":
            found.started.setdefault(result.run_id, []).append(result)
    for _, value, _, _ in read_records(bootstrap, settings.retry_topic):
        retry = CODEC.decode(JobRetry, value)
        found.retried[retry.run_id] = retry
    for _, value, _, _ in read_records(bootstrap, settings.dlq_topic):
        letter = CODEC.decode(JobDeadLetter, value)
        assert letter.run_id is not None
        found.dead[letter.run_id] = letter
    return found


def job(handler: str, payload: Any = None, *, max_attempts: int = 1, timeout_ms: int = 30_000) -> JobMessage:
    return job_message(APP, handler, payload, max_attempts=max_attempts, timeout_ms=timeout_ms)


def publish(settings: Settings, jobs: Sequence[JobMessage], partition: int | None = None) -> None:
    producer = RawProducer({"bootstrap.servers": settings.kafka_bootstrap, "message.max.bytes": 8 << 20})
    count = partitions_of(settings)
    for index, message in enumerate(jobs):
        where = partition if partition is not None else index % count
        producer.produce(settings.jobs_topic(APP), CODEC.encode(message), partition=where)
    assert producer.flush(30) == 0


def partitions_of(settings: Settings) -> int:
    return TopicAdmin(settings.kafka_bootstrap).partitions(settings.jobs_topic(APP))


def group_offsets(settings: Settings) -> tuple[dict[int, int], dict[int, int]]:
    """(committed offset, high watermark) of every partition of the app's topic, for its workers' group."""
    topic = settings.jobs_topic(APP)
    reader = RawConsumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": settings.worker_group(APP)}
    )
    try:
        partitions = [TopicPartition(topic, p) for p in range(partitions_of(settings))]
        committed = {tp.partition: max(tp.offset, 0) for tp in reader.committed(partitions, timeout=10)}
        ends = {tp.partition: watermarks(reader, tp)[1] for tp in partitions}
    finally:
        reader.close()
    return committed, ends


def until(workers: Sequence[Component], condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """:func:`wait_for`, failing with the workers' logs."""
    try:
        wait_for(lambda: bool(condition()), timeout_s, what)
    except AssertionError as exc:
        logs = "\n".join(f"--- {w.name} {w.proc.pid}\n{w.output()[-3000:]}" for w in workers)
        raise AssertionError(f"{exc}\n{logs}") from None


def caught_up(settings: Settings) -> bool:
    committed, ends = group_offsets(settings)
    return committed == ends


@pytest.fixture
def topics(settings: Settings) -> Settings:
    admin = TopicAdmin(settings.kafka_bootstrap)
    admin.ensure_topics([settings.results_topic, settings.retry_topic, settings.dlq_topic], partitions=2)
    admin.ensure_topics([settings.jobs_topic(APP)], partitions=4, config=BIG_TOPIC)
    return settings


@pytest.fixture
def start_worker(topics: Settings, settings_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """Starts ``scheduler run worker`` processes of the app; stops the ones still running at the end."""
    started: list[Component] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Component:
        worker = Component("worker", env or settings_env, tmp_path, "--app", APP, *args)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait(10)


def in_process_worker(
    settings: Settings,
    name: str,
    *,
    concurrency: int,
    grace_s: float,
    producer: Mapping[str, Any] | None = None,
    consumer: Mapping[str, Any] | None = None,
) -> Worker:
    """A worker of the test app run in this process (its checks and metrics are the test's to read),
    with the fixture handlers registered and librdkafka settings overridden as the test needs."""
    worker_topics = WorkerTopics(
        settings.jobs_topic(APP),
        settings.worker_group(APP),
        settings.results_topic,
        settings.retry_topic,
        settings.dlq_topic,
    )
    wiring = Wiring(settings)
    config = consumer_config(settings.kafka, worker_topics.group, name, consumer)
    return Worker(
        APP,
        worker_topics,
        codec=wiring.codec,
        handlers=HandlerRegistry(registered=[FIXTURES], entry_points=()),
        producer=wiring.producer(name, producer),
        consumers=lambda **callbacks: Consumer(config, [worker_topics.jobs], **callbacks),
        kafka_check=Check("kafka", lambda: None),
        concurrency=concurrency,
        grace_s=grace_s,
        name=name,
    )


def test_refused_and_crashing_handlers_never_end_the_job_loop(
    topics: Settings, settings_env: dict[str, str], tmp_path: Path, start_worker: Any
) -> None:
    # An importable module with an import side effect, which nobody registered.
    imported = tmp_path / "imported"
    (tmp_path / "side_effect_handlers.py").write_text(
        f"open({str(imported)!r}, 'w').write('imported')\ndef run(ctx): return 'ran'\n"
    )
    env = settings_env | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{settings_env['PYTHONPATH']}"}
    jobs = {
        "sys:exit": job("sys:exit"),
        "side effect": job("side_effect_handlers:run"),
        "SystemExit": job(f"{FIXTURES}:exit_now"),
        "KeyboardInterrupt": job(f"{FIXTURES}:interrupt", max_attempts=2),
        "async SystemExit": job(f"{FIXTURES}:exit_async"),
        "after them": job("builtin:noop"),
    }
    # One partition, one slot: the last job runs only if the loop survived every one before it.
    publish(topics, list(jobs.values()), partition=0)
    worker = start_worker("--concurrency", "1", env=env)
    until(
        [worker],
        lambda: jobs["after them"].run_id in read_outcomes(topics).succeeded,
        60,
        "the last job to run",
    )
    found = read_outcomes(topics)
    for name in ("sys:exit", "side effect"):
        letter = found.dead[jobs[name].run_id]
        assert (letter.cause, letter.error_class) == ("non_retryable", "HandlerNotRegistered"), name
        assert "does not run handler" in letter.error and f"registered: {FIXTURES}" in letter.error
    assert not imported.exists(), "an unregistered module was imported"
    assert found.dead[jobs["SystemExit"].run_id].error_class == "SystemExit"
    assert found.dead[jobs["SystemExit"].run_id].error == "the handler raised SystemExit(3)"
    assert found.dead[jobs["async SystemExit"].run_id].error_class == "SystemExit"
    assert found.retried[jobs["KeyboardInterrupt"].run_id].error_class == "KeyboardInterrupt"
    # Every job reported its start, the refused ones too.
    assert {run_id for run_id, starts in found.started.items() if len(starts) == 1} == {
        j.run_id for j in jobs.values()
    }
    assert worker.proc.poll() is None, worker.output()[-3000:]
    assert worker.stop() == 0, worker.output()[-3000:]


def test_a_payload_nested_too_deeply_to_decode_fails_for_good_not_retried(
    topics: Settings, start_worker: Any
) -> None:
    """Only a job made by other means than a schedule can hold one; it was retried, failing the
    same way each time."""
    nested = replace(job("builtin:noop", max_attempts=3), payload="[" * 200_000 + "]" * 200_000)
    after = job("builtin:noop")
    publish(topics, [nested, after], partition=0)
    worker = start_worker("--concurrency", "1")
    until([worker], lambda: after.run_id in read_outcomes(topics).succeeded, 60, "the next job to run")
    found = read_outcomes(topics)
    letter = found.dead[nested.run_id]
    assert (letter.cause, letter.error) == ("non_retryable", "the payload is nested too deeply to decode")
    assert nested.run_id not in found.retried
    assert worker.stop() == 0, worker.output()[-3000:]


def test_oversized_outcomes_are_delivered_capped_or_compact(topics: Settings, start_worker: Any) -> None:
    huge_result = job(f"{FIXTURES}:sized_result", {"bytes": 1024 * 1024})
    huge_retry = job(f"{FIXTURES}:sized_error", {"chars": 2 * 1024 * 1024}, max_attempts=2)
    huge_dead = job(f"{FIXTURES}:sized_error", {"chars": 2 * 1024 * 1024})
    # Its dead letter would carry the job's 2 MB (that do not compress): the letter topic refuses
    # that, and the compact letter (without the job's copy) is delivered instead.
    pad = secrets.token_urlsafe(1_500_000)
    big_job = job("builtin:fail", {"times": 1, "retryable": False, "pad": pad})
    publish(topics, [huge_result, huge_retry, huge_dead, big_job])
    worker = start_worker("--concurrency", "4")
    runs = {j.run_id for j in (huge_result, huge_retry, huge_dead, big_job)}
    until([worker], lambda: read_outcomes(topics).ended() >= runs, 60, "every outcome delivered")
    found = read_outcomes(topics)

    result = found.succeeded[huge_result.run_id].result
    assert result is not None and len(result.encode()) <= MAX_RESULT_BYTES
    capped = json.loads(result)
    assert capped["truncated"] is True and capped["limit_bytes"] == MAX_RESULT_BYTES
    assert capped["size_bytes"] == 1024 * 1024 + 2 and capped["head"].startswith('"rrr')

    retry = found.retried[huge_retry.run_id]
    assert len(retry.error) <= MAX_ERROR_CHARS and retry.error.endswith(" characters]")
    assert retry.error.startswith("\\u0000eee")  # NUL escaped: storable as PostgreSQL text
    assert retry.backoff_ms is not None and 0 <= retry.backoff_ms <= 100
    assert retry.not_before >= retry.finished_at
    letter = found.dead[huge_dead.run_id]
    assert len(letter.error) <= MAX_ERROR_CHARS and "[truncated" in letter.error
    assert len(letter.attempts[-1].error) <= MAX_HISTORY_ERROR_CHARS
    assert letter.original_bytes == CODEC.encode(huge_dead)

    compact = found.dead[big_job.run_id]
    assert (compact.cause, compact.error_class, compact.original_bytes) == (
        "non_retryable",
        "PlannedFailure",
        b"",
    )
    assert compact.source is not None and compact.source.topic == topics.jobs_topic(APP)
    assert worker.stop() == 0, worker.output()[-3000:]


def test_a_stuck_sync_handler_blocks_neither_the_next_job_nor_the_exit(
    topics: Settings, start_worker: Any
) -> None:
    timed_out = job(f"{FIXTURES}:stuck", {"seconds": 120}, timeout_ms=1000, max_attempts=2)
    after = job("builtin:noop")
    running = job(f"{FIXTURES}:stuck", {"seconds": 120}, timeout_ms=120_000)
    publish(topics, [timed_out, after, running], partition=0)
    # One slot: the job after the stuck one runs only if the stuck thread gave its slot back.
    worker = start_worker("--concurrency", "1", "--grace", "2")
    until([worker], lambda: running.run_id in read_outcomes(topics).started, 60, "the third job to start")
    found = read_outcomes(topics)
    assert found.retried[timed_out.run_id].error_class == "Timeout"
    assert after.run_id in found.succeeded
    assert "left behind" in worker.output()

    # SIGTERM: it leaves after its 2 s grace, not after the stuck handlers' 120 s (stop() fails past
    # 60 s, with the log). How much past the grace is the machine's load, not the worker's doing.
    assert worker.stop(timeout_s=60) == 0, worker.output()[-3000:]
    # The job cut off by the stop is not committed: whoever owns the partition next runs it.
    committed, _ = group_offsets(topics)
    assert committed[0] == 2
    assert running.run_id not in read_outcomes(topics).ended()


def test_after_a_drain_commits_equal_the_work_done_and_a_restart_runs_nothing(
    topics: Settings, start_worker: Any
) -> None:
    jobs = [job("builtin:noop") for _ in range(150)]
    jobs += [job("builtin:fail", {"times": 1}, max_attempts=2) for _ in range(20)]
    jobs += [job("builtin:sleep", {"seconds": 0.2}) for _ in range(30)]
    publish(topics, jobs)
    worker = start_worker("--concurrency", "8")
    runs = {j.run_id for j in jobs}
    until([worker], lambda: read_outcomes(topics).ended() >= runs, 60, "every outcome delivered")
    # Asynchronous commits are confirmed while the worker runs, on every partition.
    until([worker], lambda: caught_up(topics), 20, "the commits to reach the ends")
    assert worker.stop() == 0, worker.output()[-3000:]
    committed, ends = group_offsets(topics)
    assert committed == ends and sum(ends.values()) == len(jobs)

    # A restart runs nothing again: one sentinel per partition runs, and nothing else does.
    again = start_worker("--concurrency", "8")
    sentinels = [job("builtin:noop") for _ in range(partitions_of(topics))]
    publish(topics, sentinels)
    until(
        [again],
        lambda: {s.run_id for s in sentinels} <= set(read_outcomes(topics).succeeded),
        60,
        "the sentinels to run",
    )
    found = read_outcomes(topics)
    assert sorted(len(starts) for starts in found.started.values()) == [1] * (len(jobs) + len(sentinels))
    assert again.stop() == 0, again.output()[-3000:]
    committed, ends = group_offsets(topics)
    assert committed == ends


def test_a_rebalance_lets_running_jobs_finish_before_their_partitions_go(
    topics: Settings, start_worker: Any
) -> None:
    # Every job runs at once on the first worker, and is still running when a second one joins.
    jobs = [job("builtin:sleep", {"seconds": 4}) for _ in range(80)]
    publish(topics, jobs)
    first = start_worker("--concurrency", "100")
    until([first], lambda: len(read_outcomes(topics).started) == len(jobs), 60, "every job to start")
    second = start_worker("--concurrency", "100")
    until([second], lambda: re.search(r"assigned partitions \[\d", second.output()), 60, "the rebalance")
    # Work for both after the rebalance.
    later = [job("builtin:noop") for _ in range(40)]
    publish(topics, later)
    runs = {j.run_id for j in jobs + later}
    until([first, second], lambda: set(read_outcomes(topics).succeeded) >= runs, 60, "every job to run")
    found = read_outcomes(topics)
    assert {starts[0].worker for starts in found.started.values()} == {
        f"worker-{socket.gethostname()}-{w.proc.pid}" for w in (first, second)
    }
    twice = [run for run, starts in found.started.items() if len(starts) > 1]
    assert twice == [], f"{len(twice)} jobs ran twice"
    assert "waited" in first.output()  # for the running jobs of the partitions it gave up
    assert first.stop() == 0 and second.stop() == 0
    assert caught_up(topics)


def test_no_job_runs_while_kafka_refuses_its_start_and_all_run_once_after(
    settings: Settings,
) -> None:
    # The outcome topics do not exist yet: every outcome fails to be delivered until they do.
    TopicAdmin(settings.kafka_bootstrap).ensure_topics([settings.jobs_topic(APP)], partitions=4)
    jobs = [job(f"{FIXTURES}:record") for _ in range(300)]
    publish(settings, jobs)
    concurrency = 4
    # Kafka gives up on each delivery after a second, instead of retrying it itself for minutes.
    worker = in_process_worker(
        settings,
        "robust-worker",
        concurrency=concurrency,
        grace_s=10,
        producer={"message.timeout.ms": 1000, "topic.metadata.refresh.interval.ms": 500},
    )
    EXECUTED.clear()
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:

        def failures() -> float:
            value = REGISTRY.get_sample_value("scheduler_worker_start_delivery_failures_total", {"app": APP})
            return value or 0.0

        before = failures()
        # Every slot's start failed at least twice: the worker had all the time it wanted to run
        # handlers whose execution it could not report, and ran none.
        wait_for(lambda: failures() - before >= 2 * concurrency, 60, "starts to fail")
        assert EXECUTED == [], "a handler ran before Kafka held its start"
        TopicAdmin(settings.kafka_bootstrap).ensure_topics(
            [settings.results_topic, settings.retry_topic, settings.dlq_topic], partitions=2
        )

        def all_succeeded() -> bool:
            try:
                return set(read_outcomes(settings).succeeded) == {j.run_id for j in jobs}
            except KafkaException:  # a broker may refuse topics this new for a moment
                return False

        wait_for(all_succeeded, 90, "every outcome")
    finally:
        stop.set()
        thread.join(30)
    assert sorted(EXECUTED) == sorted(j.run_id for j in jobs), "a job ran twice, or never"
    assert caught_up(settings)


def owned(worker: Component) -> set[int]:
    """The partitions a worker holds now, by its log's assignments and revocations."""
    held: set[int] = set()
    for change, numbers in re.findall(r"(assigned|revoked|lost) partitions \[([\d, ]*)\]", worker.output()):
        partitions = {int(n) for n in numbers.split(",") if n.strip()}
        held = held | partitions if change == "assigned" else held - partitions
    return held


def test_a_worker_restarted_with_its_static_identity_takes_its_partitions_back_alone(
    topics: Settings, settings_env: dict[str, str], start_worker: Any
) -> None:
    stable = settings_env | {"SCHEDULER_GROUP_INSTANCE_ID": f"{topics.topic_prefix}-worker-1"}
    restarted = start_worker("--concurrency", "4", env=stable)
    other = start_worker("--concurrency", "4")
    members = [restarted, other]

    def balanced() -> bool:
        mine, theirs = owned(restarted), owned(other)
        return bool(mine and theirs) and mine | theirs == {0, 1, 2, 3}

    until(members, balanced, 60, "the group to share the partitions")
    before, mine = other.output(), owned(restarted)
    restarted.kill()  # no goodbye to the group: only its static identity tells who is back
    again = start_worker("--concurrency", "4", env=stable)
    until([again, other], lambda: owned(again), 30, "the restarted member's partitions")
    assert owned(again) == mine
    # Work for the whole group runs; the other member's partitions never moved.
    jobs = [job("builtin:noop") for _ in range(20)]
    publish(topics, jobs)
    runs = {j.run_id for j in jobs}
    until([again, other], lambda: set(read_outcomes(topics).succeeded) >= runs, 60, "every job to run")
    assert "partitions" not in other.output()[len(before) :]
    assert again.stop() == 0 and other.stop() == 0


def test_handler_heartbeats_are_collapsed_and_a_returned_coroutine_is_awaited(
    topics: Settings, start_worker: Any
) -> None:
    chatty = job(f"{FIXTURES}:chatty", {"calls": 200_000})
    awaited = job(f"{FIXTURES}:returns_coroutine")
    awaited_failure = job(f"{FIXTURES}:returns_coroutine", {"fail": True})
    publish(topics, [chatty, awaited, awaited_failure])
    worker = start_worker("--concurrency", "4")
    runs = {chatty.run_id, awaited.run_id, awaited_failure.run_id}
    until([worker], lambda: read_outcomes(topics).ended() >= runs, 60, "every outcome delivered")
    found = read_outcomes(topics)
    assert found.succeeded[chatty.run_id].result == "200000"
    beats = [
        event
        for _, value, _, _ in read_records(topics.kafka_bootstrap, topics.results_topic)
        if (event := CODEC.decode(JobResult, value)).status == "heartbeat" and event.run_id == chatty.run_id
    ]
    # At most one a second reaches Kafka (and PostgreSQL's attempts), not one per call.
    assert 1 <= len(beats) <= 3, f"{len(beats)} heartbeats for 200,000 calls"
    # The coroutine a sync handler returned ran: its result, and its failure, are the job's.
    assert json.loads(found.succeeded[awaited.run_id].result or "null") == {"awaited": True}
    letter = found.dead[awaited_failure.run_id]
    assert (letter.error_class, letter.error) == ("ValueError", "the awaited work failed")
    assert worker.stop() == 0, worker.output()[-3000:]


def test_an_undecodable_job_with_its_run_headers_is_dead_lettered_for_that_run(
    topics: Settings, start_worker: Any
) -> None:
    run_id = uuid.uuid4()
    garbage = b"\xff\x00 not an Avro job \xfe"
    producer = RawProducer({"bootstrap.servers": topics.kafka_bootstrap})
    sent: list[list[tuple[str, str | bytes | None]]] = [
        [("scheduler-run-id", str(run_id).encode()), ("scheduler-attempt", b"3")],
        # Headers that do not name a run and an attempt: a letter without a run, as before.
        [("scheduler-run-id", b"not-a-uuid"), ("scheduler-attempt", b"1")],
        [("scheduler-run-id", str(uuid.uuid4()).encode()), ("scheduler-attempt", b"0")],
    ]
    for headers in sent:
        producer.produce(topics.jobs_topic(APP), garbage, partition=0, headers=headers)
    assert producer.flush(30) == 0
    worker = start_worker("--concurrency", "2")

    def letters() -> list[JobDeadLetter]:
        return [
            CODEC.decode(JobDeadLetter, v)
            for _, v, _, _ in read_records(topics.kafka_bootstrap, topics.dlq_topic)
        ]

    until([worker], lambda: len(letters()) == len(sent), 60, "three dead letters")
    by_run = {letter.run_id: letter for letter in letters()}
    letter = by_run[run_id]
    # The reconciler ends attempt 3 of that run as dead, with the decode error.
    assert (letter.cause, letter.attempt, letter.schedule_id, letter.error_class) == (
        "undecodable",
        3,
        None,
        "UndecodableMessage",
    )
    assert letter.original_bytes == garbage and letter.worker is not None and letter.error
    assert letter.source is not None and (letter.source.partition, letter.source.offset) == (0, 0)
    assert set(by_run) == {run_id, None}
    assert worker.stop() == 0, worker.output()[-3000:]


def test_a_job_of_another_app_on_this_apps_topic_is_not_run_and_its_letter_is_this_apps(
    topics: Settings, start_worker: Any
) -> None:
    """This app's handlers are not the other app's, and an outcome about the other app's run would
    end it: the job is dead-lettered as this app's poison, without that run."""
    foreign = replace(job("builtin:noop"), app="other")
    own = job("builtin:noop")
    producer = RawProducer({"bootstrap.servers": topics.kafka_bootstrap})
    headers: list[tuple[str, str | bytes | None]] = [
        ("scheduler-run-id", str(foreign.run_id).encode()),
        ("scheduler-attempt", b"1"),
    ]
    producer.produce(topics.jobs_topic(APP), CODEC.encode(foreign), partition=0, headers=headers)
    assert producer.flush(30) == 0
    publish(topics, [own], partition=0)
    worker = start_worker()

    def letters() -> list[JobDeadLetter]:
        return [
            CODEC.decode(JobDeadLetter, v)
            for _, v, _, _ in read_records(topics.kafka_bootstrap, topics.dlq_topic)
        ]

    def results() -> list[JobResult]:
        return [
            CODEC.decode(JobResult, v)
            for _, v, _, _ in read_records(topics.kafka_bootstrap, topics.results_topic)
        ]

    until(
        [worker],
        lambda: own.run_id in {r.run_id for r in results() if r.status == "succeeded"},
        60,
        "own job",
    )
    until([worker], lambda: len(letters()) == 1, 60, "the foreign job's letter")
    [letter] = letters()
    assert (letter.app, letter.cause, letter.error_class) == (APP, "undecodable", "UndecodableMessage")
    assert letter.error == f"a job of app 'other' on the topic of app {APP!r}: not run"
    # Without the run its headers name: kept with its bytes among this app's dead letters.
    assert (letter.run_id, letter.attempt, letter.original_bytes) == (None, None, CODEC.encode(foreign))
    assert foreign.run_id not in {result.run_id for result in results()}, "never started"
    assert worker.stop() == 0, worker.output()[-3000:]


def test_a_job_due_in_year_one_runs_at_once(topics: Settings, start_worker: Any) -> None:
    """The earliest instant Avro and Python hold is long past: started now, like any job due
    already, and succeeded, rather than an OverflowError that left its run without an outcome."""
    ancient = replace(job("builtin:noop"), scheduled_for=datetime(1, 1, 1, tzinfo=UTC))
    publish(topics, [ancient], partition=0)
    worker = start_worker()

    def succeeded() -> set[Any]:
        return {
            r.run_id
            for r in (
                CODEC.decode(JobResult, v)
                for _, v, _, _ in read_records(topics.kafka_bootstrap, topics.results_topic)
            )
            if r.status == "succeeded"
        }

    until([worker], lambda: ancient.run_id in succeeded(), 60, "the job due in year 1")
    assert "OverflowError" not in worker.output()
    assert worker.stop() == 0, worker.output()[-3000:]


def _start_lags() -> dict[str, float]:
    """The worker's start lag histogram of the test app: its count, and its count within 30 s."""

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"app": APP, **labels}) or 0.0

    return {
        "count": sample("scheduler_worker_start_lag_seconds_count"),
        "within_30s": sample("scheduler_worker_start_lag_seconds_bucket", le="30.0"),
    }


def test_the_start_lag_counts_first_attempts_late_as_late_and_leaves_later_attempts_out(
    topics: Settings,
) -> None:
    """A first attempt due a minute ago started a minute late; a retry of a run due an hour ago is
    late by its backoff's design (as a replay or a lease expiry's next attempt is), and an operator
    watching the start lag must not read it as lateness."""
    due = datetime.now(UTC) - timedelta(minutes=1)
    late = replace(job("builtin:noop"), scheduled_for=due)
    retried = replace(job("builtin:noop"), scheduled_for=due - timedelta(hours=1), attempt=2)
    before = _start_lags()
    worker = in_process_worker(topics, "lag-worker", concurrency=2, grace_s=5)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        publish(topics, [late, retried], partition=0)
        wanted = {late.run_id, retried.run_id}
        wait_for(lambda: wanted <= set(read_outcomes(topics).succeeded), 60, "both jobs to succeed")
    finally:
        stop.set()
        thread.join(30)
    after = _start_lags()
    assert after["count"] - before["count"] == 1, "the first attempt counted, the retry not"
    assert after["within_30s"] == before["within_30s"], "the first attempt counted a minute late"


def test_a_fenced_worker_rebuilds_its_consumer_and_takes_its_partitions_back(
    topics: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    identity = f"{topics.topic_prefix}-fenced"
    worker = in_process_worker(
        topics, "fenced-worker", concurrency=4, grace_s=5, consumer={"group.instance.id": identity}
    )
    worker_topics = worker.topics
    group_check = worker.checks()[1]

    def ready() -> str | None:
        try:
            return group_check.probe()
        except Exception:
            return None

    EXECUTED.clear()
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    # Another process started by mistake with the same static identity.
    intruder = RawConsumer(
        {
            "bootstrap.servers": topics.kafka_bootstrap,
            "group.id": worker_topics.group,
            "group.instance.id": identity,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1_000,
            "log_level": 0,
        }
    )
    try:
        wait_for(lambda: ready() == "4 partitions assigned", 60, "the worker to own the partitions")
        intruder.subscribe([worker_topics.jobs])

        def intruder_joined() -> bool:
            intruder.consume(10, 0.2)
            return bool(intruder.assignment())

        wait_for(intruder_joined, 30, "the intruder to take the worker's place")
        wait_for(lambda: "uses this worker's group.instance.id" in caplog.text, 30, "the worker to be fenced")

        def intruder_fenced() -> bool:
            # The worker's new consumer rejoined with its identity, and fenced the intruder in turn.
            return any(
                (error := message.error()) is not None and "fenced" in error.str()
                for message in intruder.consume(10, 0.2)
            )

        wait_for(intruder_fenced, 30, "the rebuilt consumer to take the identity back")
        wait_for(lambda: ready() == "4 partitions assigned", 30, "the partitions back")
        jobs = [job(f"{FIXTURES}:record") for _ in range(8)]
        publish(topics, jobs)
        wait_for(lambda: set(read_outcomes(topics).succeeded) >= {j.run_id for j in jobs}, 60, "the jobs")
        assert sorted(EXECUTED) == sorted(j.run_id for j in jobs)
    finally:
        stop.set()
        thread.join(30)
        intruder.close()


def test_an_async_handler_blocking_the_job_loop_makes_the_worker_not_ready_until_it_lets_go(
    topics: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Not ready after LOOP_STALL_S, and not live once blocked past /live's timeout (here set to
    LOOP_STALL_S, 90 s in service), so that whoever probes /live restarts a worker blocked for good."""
    worker = in_process_worker(topics, "blocked-worker", concurrency=2, grace_s=5)
    [loop_check] = [check for check in worker.checks() if check.name == "job_loop"]
    health = Health("worker", [worker], CollectorRegistry(), live_timeout_s=LOOP_STALL_S)

    def loop_answers() -> bool:
        try:
            loop_check.probe()
        except RuntimeError:
            return False
        return True

    blocker = job(f"{FIXTURES}:blocks_the_loop", {"seconds": LOOP_STALL_S + 4})
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        assert loop_answers()
        wait_for(health.live, 10, "the worker to be live")
        publish(topics, [blocker])
        wait_for(lambda: not loop_answers(), 60, "the worker to say its job loop is blocked")
        wait_for(lambda: not health.live(), 10, "the blocked worker to stop being live")
        assert health.document()["components"]["loop:worker"]["status"] == "down"
        wait_for(lambda: "an async handler is blocking it" in caplog.text, 10, "the worker to say so")
        wait_for(loop_answers, 30, "the job loop to answer again")
        wait_for(health.live, 10, "the worker to be live again")
        wait_for(lambda: blocker.run_id in read_outcomes(topics).succeeded, 30, "the blocker's outcome")
    finally:
        stop.set()
        thread.join(30)


@pytest.mark.parametrize("blocked", ["before the stop", "in the drain"])
def test_a_worker_stopped_with_its_job_loop_blocked_commits_past_the_blocking_job(
    topics: Settings, caplog: pytest.LogCaptureFixture, blocked: str
) -> None:
    """Stopped (a liveness restart) while an async handler blocks its job loop, the worker commits
    past the started job: the next member does not run that attempt again and block in turn (the
    lease sweeper gives the run its next attempt), and the jobs behind it on its partition run. So
    too when the blocking job starts in the drain (due within its first half)."""
    blocker = job(f"{FIXTURES}:blocks_the_loop", {"seconds": LOOP_STALL_S + 40})
    if blocked == "in the drain":
        blocker = replace(blocker, scheduled_for=datetime.now(UTC) + timedelta(seconds=6))
    behind = [job(f"{FIXTURES}:record") for _ in range(3)]
    first = in_process_worker(topics, "wedged-worker", concurrency=1, grace_s=24)
    [loop_check] = [check for check in first.checks() if check.name == "job_loop"]

    def loop_blocked() -> bool:
        try:
            loop_check.probe()
        except RuntimeError:
            return True
        return False

    def held() -> float:
        return REGISTRY.get_sample_value("scheduler_worker_held_jobs", {"app": APP}) or 0.0

    EXECUTED.clear()
    stop = threading.Event()
    thread = threading.Thread(target=first.run, args=(stop,))
    thread.start()
    try:
        publish(topics, [blocker], partition=0)
        if blocked == "before the stop":
            wait_for(lambda: blocker.run_id in read_outcomes(topics).started, 60, "the blocker to start")
            wait_for(loop_blocked, 60, "the job loop to be blocked")
            publish(topics, behind, partition=0)  # fetched, and held up behind the blocker
        else:
            wait_for(lambda: held() == 1, 60, "the blocker to be held until its instant")
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    if blocked == "in the drain":
        publish(topics, behind, partition=0)
    assert "committing past the 1 jobs whose handlers it started" in caplog.text
    committed, _ = group_offsets(topics)
    assert committed[0] == 1, "past the blocker, not past the jobs it held up"

    second = in_process_worker(topics, "next-worker", concurrency=2, grace_s=5)
    stop = threading.Event()
    thread = threading.Thread(target=second.run, args=(stop,))
    thread.start()
    try:
        ran = {j.run_id for j in behind}
        wait_for(lambda: ran <= set(read_outcomes(topics).succeeded), 60, "the jobs behind it")
        assert len(read_outcomes(topics).started[blocker.run_id]) == 1, "the blocker ran once, not again"
    finally:
        stop.set()
        thread.join(30)


def test_a_failed_job_is_freed_at_once_not_left_to_the_cycle_collector(topics: Settings) -> None:
    """A failure's traceback must not tie the job's context (and its payload) into a reference cycle:
    such cycles wait for the collector, and a run of failures with big payloads would pile up there."""
    failing = [job("builtin:fail", {"pad": "x" * 1000}) for _ in range(10)]
    failing += [job(f"{FIXTURES}:fail_async", {"pad": "y" * 1000}) for _ in range(10)]
    failing += [job(f"{FIXTURES}:refuse", {"pad": "z" * 1000}) for _ in range(10)]
    worker = in_process_worker(topics, "freeing-worker", concurrency=4, grace_s=5)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    gc.collect()
    gc.disable()
    try:
        thread.start()
        publish(topics, failing)
        wanted = {j.run_id for j in failing}
        wait_for(lambda: wanted <= set(read_outcomes(topics).dead), 60, "every job's dead letter")
        # Only a cycle keeps a finished job's context alive once its outcome is out.
        wait_for(lambda: not _contexts_of(wanted), 10, "the failed jobs' contexts to be freed")
    finally:
        gc.enable()
        stop.set()
        thread.join(30)


def _contexts_of(run_ids: set[uuid.UUID]) -> list[JobContext]:
    return [o for o in gc.get_objects() if isinstance(o, JobContext) and o.run_id in run_ids]


# The second handler empties the payload it was given before it quotes it: the values masked are
# the job's, not what the handler left of them.
@pytest.mark.parametrize("handler", ["quotes_payload", "pops_and_quotes_payload"])
def test_payload_values_a_handler_error_quotes_are_masked_in_its_outcome_and_log(
    topics: Settings, start_worker: Any, handler: str
) -> None:
    card = "4111-1111-1111-1111"
    quoting = job(f"{FIXTURES}:{handler}", {"card": card, "amount": 12345})
    publish(topics, [quoting])
    worker = start_worker()
    until([worker], lambda: quoting.run_id in read_outcomes(topics).dead, 60, "its dead letter")
    letter = read_outcomes(topics).dead[quoting.run_id]
    assert (letter.error_class, letter.error) == ("ValueError", "card *** declined for *** (try 3 of 3)")
    assert worker.stop() == 0
    logged = worker.output()
    assert "card *** declined" in logged
    assert card not in logged and "12345" not in logged


def test_payload_values_a_handler_logs_are_masked_in_its_lines(topics: Settings, start_worker: Any) -> None:
    card = "5500-0055-5555-5559"
    logging_job = job(f"{FIXTURES}:logs_payload", {"card": card, "amount": 12345})
    publish(topics, [logging_job])
    worker = start_worker()
    until([worker], lambda: logging_job.run_id in read_outcomes(topics).succeeded, 60, "its success")
    assert worker.stop() == 0
    logged = worker.output()
    [line] = [line for line in logged.splitlines() if "charging card" in line]
    assert "charging card *** for ***" in line and str(logging_job.run_id) in line, line
    assert card not in logged and "12345" not in logged
