"""A user's own handler module, outside the project, registered on a real worker process: what the
handler raises and how its module fails to load reach the outcome topics and the worker's output
as the documentation says (operations.md, Handlers and Logs).

Jobs are produced straight onto the app's topic and outcomes read from the outcome topics with an
independent client: no PostgreSQL component runs, so what is seen is the worker's doing alone.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as RawProducer

from scheduler.config import Settings
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import JobDeadLetter, JobMessage, JobRetry
from scheduler.kafka.transport import TopicAdmin
from tests.support import SCHEDULER, Component, job_message, read_records, wait_for

pytestmark = pytest.mark.integration

APP = "userjobs"
MODULE = "userjobs_handlers"
CODEC = AvroCodec()

# The user's module: a handler whose exception cannot be put into words (its __str__ raises, as a
# careless exception class's may), and one that fails as plainly as can be, for comparison.
HANDLERS = """
class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("this exception has no text")


def unprintable(ctx):
    raise UnprintableError()


async def unprintable_async(ctx):
    raise UnprintableError()


def plain(ctx):
    raise ValueError("plain failure")
"""

# A module whose import fails with a secret in the exception's text, as a module that connects to
# its database at import time does when the database is down.
SECRET = "s3cr3t-pw-7781"
BROKEN = f"""
raise RuntimeError("cannot reach postgresql://billing:{SECRET}@db.internal/billing (password={SECRET})")
"""


@pytest.fixture
def user_env(settings: Settings, settings_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The worker's environment with the user's module importable, and the app's topics made."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / f"{MODULE}.py").write_text(HANDLERS)
    (tmp_path / "code" / "userjobs_broken.py").write_text(BROKEN)
    admin = TopicAdmin(settings.kafka_bootstrap)
    admin.ensure_topics([settings.results_topic, settings.retry_topic, settings.dlq_topic], partitions=1)
    admin.ensure_topics([settings.jobs_topic(APP)], partitions=1)
    return settings_env | {
        "PYTHONPATH": f"{tmp_path / 'code'}:{settings_env['PYTHONPATH']}",
        "SCHEDULER_HANDLERS": MODULE,
    }


@pytest.fixture
def worker(user_env: dict[str, str], tmp_path: Path) -> Iterator[Component]:
    started = Component("worker", user_env, tmp_path, "--app", APP, "--grace", "5")
    try:
        yield started
    finally:
        if started.proc.poll() is None:
            started.proc.kill()
            started.proc.wait(10)


def job(handler: str, *, max_attempts: int) -> JobMessage:
    return job_message(APP, handler, {"card": "4111222233334444"}, max_attempts=max_attempts)


def publish(settings: Settings, *jobs: JobMessage) -> None:
    producer = RawProducer({"bootstrap.servers": settings.kafka_bootstrap})
    for message in jobs:
        producer.produce(settings.jobs_topic(APP), CODEC.encode(message))
    assert producer.flush(30) == 0


def failures(settings: Settings) -> dict[uuid.UUID, Any]:
    """The retries and dead letters on the outcome topics, by run id."""
    found: dict[uuid.UUID, Any] = {}
    for _, value, _, _ in read_records(settings.kafka_bootstrap, settings.retry_topic):
        retry = CODEC.decode(JobRetry, value)
        found[retry.run_id] = retry
    for _, value, _, _ in read_records(settings.kafka_bootstrap, settings.dlq_topic):
        letter = CODEC.decode(JobDeadLetter, value)
        if letter.run_id is not None:
            found[letter.run_id] = letter
    return found


def test_a_handler_exception_whose_text_cannot_be_formatted_fails_its_attempt_as_its_class(
    settings: Settings, worker: Component
) -> None:
    """Defect: an exception whose __str__ raises is taken for a fault of the worker ("the worker failed on
    the job …; its offset moves on"): no outcome is published, and the run ends only by its lease as
    `LeaseExpired` ("the worker … went silent"), where the docs promise that whatever a handler raises
    fails its attempt (a retryable failure of its class)."""
    sync_job = job(f"{MODULE}:unprintable", max_attempts=1)
    async_job = job(f"{MODULE}:unprintable_async", max_attempts=2)
    plain_job = job(f"{MODULE}:plain", max_attempts=1)
    publish(settings, sync_job, async_job, plain_job)
    try:
        # The plain failure comes last on the partition: once it is out, the others have had their turn.
        wait_for(lambda: plain_job.run_id in failures(settings), 60, "the plain failure's dead letter")
        found = wait_for(
            lambda: (f := failures(settings)) and {sync_job.run_id, async_job.run_id} <= set(f) and f,
            10,
            "an outcome for each job whose exception has no text",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.output()[-3000:]}") from None
    letter = found[sync_job.run_id]
    assert isinstance(letter, JobDeadLetter)
    assert letter.error_class == "UnprintableError"
    retry = found[async_job.run_id]
    assert isinstance(retry, JobRetry)
    assert retry.error_class == "UnprintableError"
    assert "the worker failed on the job" not in worker.output()


@pytest.mark.parametrize("command", [["run", "worker", "--app", APP], ["run", "all", "--app", APP]])
def test_a_handler_module_failing_to_import_stops_with_one_line_that_keeps_its_secret(
    user_env: dict[str, str], command: list[str]
) -> None:
    """Defect: the one error line quotes the import's exception text as it is, so the password in it
    (a URL's, a `password=` value) reaches the terminal and the pod's log, where the docs say secrets
    in any text are redacted."""
    env = user_env | {"SCHEDULER_HANDLERS": "userjobs_broken"}
    done = subprocess.run([SCHEDULER, *command], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "error: handler registration 'userjobs_broken' (SCHEDULER_HANDLERS or --handler): "
        "cannot import 'userjobs_broken': RuntimeError: cannot reach postgresql://billing:"
    ), lines[0]
    assert SECRET not in lines[0]
