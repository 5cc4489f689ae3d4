"""Sizes hold end to end: whatever validation accepts is delivered (a payload of exactly 1 MiB, and
the dead letter that carries it back), one byte more is refused with one line, a result too big for
an outcome is stored cut with a marker, and ``scheduler init`` raises the message limit of topics
made before it existed."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]

from scheduler.config import Settings
from scheduler.domain.storable import MAX_RESULT_BYTES
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import ATTEMPT_HEADER, RUN_ID_HEADER, JobDeadLetter, JobMessage
from scheduler.kafka.topics import TOPIC_MAX_MESSAGE_BYTES
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule.spec import MAX_PAYLOAD_BYTES
from scheduler.store import connect
from tests.support import SCHEDULER, Component, components, read_records, read_topic, wait_for

pytestmark = pytest.mark.e2e

APP = "sizes"
# Kafka's own default for a topic (the broker's message.max.bytes): what topics had before.
KAFKA_DEFAULT_LIMIT = 1_048_588


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, *args], env=env, capture_output=True, text=True, check=False, timeout=60
    )


def payload_file(directory: Path, size: int, **fields: Any) -> Path:
    """A JSON object of exactly ``size`` bytes as encoded for storage, ``fields`` plus a random
    ``blob`` that lz4 cannot shorten (so the message really is that big on the wire)."""
    head = json.dumps(fields | {"blob": ""}, separators=(",", ":"))[:-2]  # up to the blob's opening quote
    room = size - len(head) - 2  # its closing quote and brace
    text = head + base64.b64encode(os.urandom(room)).decode()[:room] + '"}'
    assert len(text.encode()) == size
    path = directory / f"payload-{size}.json"
    path.write_text(text)
    return path


def run_of(settings: Settings, schedule_id: str) -> dict[str, Any] | None:
    with connect(settings.database_url) as conn:
        found: dict[str, Any] | None = conn.execute(
            "select state, attempt, error, result from runs where schedule_id = %s", (schedule_id,)
        ).fetchone()
    return found


def ended(settings: Settings, schedule_id: str) -> dict[str, Any] | None:
    run = run_of(settings, schedule_id)
    return run if run is not None and run["state"] in ("succeeded", "dead") else None


@pytest.fixture
def pipeline(settings: Settings, settings_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """Topics made by the CLI, as an operator makes them, and every component running."""
    for args in (("init",), ("apps", "create", APP, "--partitions", "2")):
        done = cli(settings_env, *args)
        assert done.returncode == 0, done.stderr
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    with components(env, tmp_path, "scanner", "relay", "reconciler"):
        worker = Component("worker", env, tmp_path, "--app", APP)
        try:
            yield env
        finally:
            assert worker.stop() == 0, worker.output()[-3000:]


def test_a_payload_of_exactly_1_mib_runs_its_dead_letter_arrives_and_one_byte_more_is_refused(
    settings: Settings, pipeline: dict[str, str], tmp_path: Path
) -> None:
    over = cli(
        pipeline, "schedules", "create", "--app", APP, "--now", "--handler", "builtin:noop",
        "--payload", f"@{payload_file(tmp_path, MAX_PAYLOAD_BYTES + 1)}",
    )  # fmt: skip
    assert over.returncode != 0
    assert len(over.stderr.strip().splitlines()) == 1, over.stderr
    assert f"{MAX_PAYLOAD_BYTES + 1} bytes" in over.stderr and not over.stdout

    def create(handler: str, **fields: Any) -> str:
        done = cli(
            pipeline, "schedules", "create", "--app", APP, "--now", "--handler", handler,
            "--max-attempts", "1", "--payload", f"@{payload_file(tmp_path, MAX_PAYLOAD_BYTES, **fields)}",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout)["id"])

    succeeds = create("builtin:noop")
    # Its dead letter carries the 1 MiB job again, through .dlq to the reconciler.
    dies = create("builtin:fail", times=1, retryable=False)

    assert wait_for(lambda: ended(settings, succeeds), 90, "the 1 MiB job to end")["state"] == "succeeded"
    dead = wait_for(lambda: ended(settings, dies), 90, "the failing 1 MiB job to end")
    assert dead["state"] == "dead" and "RelayRefused" not in (dead["error"] or "")
    with connect(settings.database_url) as conn:
        assert conn.execute("select count(*) as n from quarantine").fetchone() == {"n": 0}

    records = read_records(settings.kafka_bootstrap, settings.jobs_topic(APP))
    jobs = [value for _, value, _, _ in records]
    assert len(jobs) == 2 and all(len(v) > KAFKA_DEFAULT_LIMIT for v in jobs), "over Kafka's default"
    # Outside the body, for a worker that cannot decode it: the run and attempt it is for.
    for _, value, _, headers in records:
        job = AvroCodec().decode(JobMessage, value)
        assert (headers[RUN_ID_HEADER], headers[ATTEMPT_HEADER]) == (str(job.run_id).encode(), b"1")
    [letter] = [
        AvroCodec().decode(JobDeadLetter, value)
        for _, value, _ in read_topic(settings.kafka_bootstrap, settings.dlq_topic)
    ]
    assert str(letter.schedule_id) == dies and len(letter.original_bytes) > MAX_PAYLOAD_BYTES


def test_a_result_of_a_megabyte_is_stored_cut_with_a_marker(
    settings: Settings, pipeline: dict[str, str]
) -> None:
    done = cli(
        pipeline, "schedules", "create", "--app", APP, "--now",
        "--handler", "tests.unit.handler_fixtures:big_result", "--payload", json.dumps({"bytes": 1_000_000}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    schedule_id = str(json.loads(done.stdout)["id"])

    run = wait_for(lambda: ended(settings, schedule_id), 90, "the big-result job to end")

    assert (run["state"], run["attempt"]) == ("succeeded", 1), run["error"]
    result = run["result"]
    assert result["truncated"] is True and result["size_bytes"] > 1_000_000
    assert len(json.dumps(result).encode()) <= MAX_RESULT_BYTES


def test_init_and_apps_create_raise_the_message_limit_of_topics_made_before_it(
    settings: Settings, settings_env: dict[str, str]
) -> None:
    # An upgrade: the topics exist with Kafka's default limit, as older versions made them.
    jobs, other = settings.jobs_topic(APP), settings.jobs_topic("other")
    TopicAdmin(settings.kafka).ensure_topics([*settings.core_topics, jobs, other], partitions=1)
    assert limits(settings, [jobs]) == {KAFKA_DEFAULT_LIMIT}
    with connect(settings.database_url) as conn:
        conn.execute("insert into apps (name, partitions) values (%s, 1)", (APP,))
        conn.commit()

    done = cli(settings_env, "init")
    assert done.returncode == 0, done.stderr
    assert "topics resized" in done.stdout and jobs in done.stdout and other not in done.stdout
    assert limits(settings, [*settings.core_topics, jobs]) == {TOPIC_MAX_MESSAGE_BYTES}
    again = cli(settings_env, "init")
    assert again.returncode == 0 and "resized" not in again.stdout, "nothing left to change"

    # `apps create` of an app whose topic is already there (made by hand, or by an older version).
    assert cli(settings_env, "apps", "create", "other").returncode == 0
    assert limits(settings, [other]) == {TOPIC_MAX_MESSAGE_BYTES}


def limits(settings: Settings, topics: list[str]) -> set[int]:
    """Each topic's max.message.bytes, read with a plain admin client."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics])
    return {int(f.result(timeout=30)["max.message.bytes"].value) for f in futures.values()}
