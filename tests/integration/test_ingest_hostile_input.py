"""The ingestor against input a stranger could send, through the real Kafka and PostgreSQL: a command
is judged on its own fields, whatever its message's headers carry, and in the order of its partition,
whatever batch it lands in."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka import Producer as RawProducer

from scheduler.client import spec
from scheduler.config import Settings
from scheduler.ingest.commands import Consumed
from scheduler.ingest.ingestor import Ingestor
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import ScheduleCommand, ScheduleCommandRejected
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec as CliSpec
from scheduler.store import connect
from scheduler.store.ingest import Source
from scheduler.wiring import Wiring
from tests.integration.test_bad_input import command_topics
from tests.integration.test_ingest_kafka import keyed, running
from tests.support import read_topic, wait_for

pytestmark = pytest.mark.integration

APP = "billing"
CODEC = AvroCodec()
# What W3C Trace Context allows in a traceparent header (version 00).
TRACEPARENT_RE = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


@pytest.fixture
def topics(settings: Settings) -> Settings:
    return command_topics(settings)


@pytest.fixture
def ingestor(topics: Settings) -> Iterator[Ingestor]:
    yield from running(topics)


def rejected_on_topic(settings: Settings) -> list[ScheduleCommandRejected]:
    return [
        CODEC.decode(ScheduleCommandRejected, value)
        for _, value, _ in read_topic(settings.kafka_bootstrap, settings.rejected_topic)
    ]


def create(key: str, **fields: Any) -> ScheduleCommand:
    return ScheduleCommand(
        command_id=str(uuid.uuid4()),
        schedule_key=key,
        app=APP,
        operation="create",
        spec=spec(handler="builtin:noop", **fields),
    )


def produce(
    settings: Settings, *messages: tuple[ScheduleCommand, list[tuple[str, str | bytes | None]]]
) -> None:
    """Each command with its headers, as a producer without the client's checks would send it."""
    producer = RawProducer(
        {"bootstrap.servers": settings.kafka_bootstrap, "message.max.bytes": 4 * 1024 * 1024}
    )
    refused: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            refused.append(error)

    for command, headers in messages:
        key = f"{command.app}/{command.schedule_key}".encode()
        producer.produce(
            settings.schedules_topic, CODEC.encode(command), key=key, headers=headers, on_delivery=delivered
        )
    assert producer.flush(30) == 0 and refused == []


def test_a_garbage_traceparent_header_neither_rejects_a_command_nor_rides_along_with_its_schedule(
    ingestor: Ingestor, settings: Settings
) -> None:
    """The header is the producer's trace context, not part of the command. One with a NUL byte
    failed the create's insert ('invalid byte sequence for encoding "UTF8": 0x00', code invalid);
    any other was stored on the schedule as it came, and a one-shot's job message carried it: a
    5 MiB one made the relay quarantine the job (too large for the jobs topic), so the run never ran."""
    with_nul = create("with-nul", cron="0 3 * * *")
    oversized = create("oversized")  # immediate: its run continues the stored trace context
    plain = create("after", cron="0 4 * * *")
    produce(
        settings,
        (with_nul, [("traceparent", b"00-\x00garbage")]),
        (oversized, [("traceparent", b"x" * (1024 * 1024))]),
        (plain, []),
    )

    found = wait_for(lambda: "after" in (k := keyed(settings)) and k, 60, "the command after the two")
    stored = found["oversized"]["traceparent"]
    garbage_kept = stored is not None and not TRACEPARENT_RE.fullmatch(stored)
    assert not garbage_kept, f"the schedule keeps {len(stored)} characters of the header as its trace context"
    rejected = [(r.command_id, r.code, r.reason) for r in rejected_on_topic(settings)]
    assert rejected == [], "a command is not rejected for its trace header"
    assert "with-nul" in found


def test_a_one_shot_with_a_run_at_years_ahead_is_not_fired_now(
    ingestor: Ingestor, settings: Settings
) -> None:
    """kind immediate with run_at set: run_at was stored and ignored, and the run fired at once, years
    before the time its producer gave. The validation already refuses start_at and end_at on a
    one-shot for that very reason ('taken and ignored, they would let a one-shot fire after the end
    its owner set'); a run_at that an immediate schedule ignores lets it fire long before."""
    contradictory = create("in-2035", kind="immediate", run_at=datetime(2035, 1, 1, tzinfo=UTC))
    produce(settings, (contradictory, []), (create("after", cron="0 4 * * *"), []))

    wait_for(lambda: "after" in keyed(settings), 60, "the command after it")
    schedule = keyed(settings).get("in-2035")
    fires_now = schedule is not None and schedule["kind"] == "immediate"
    assert not fires_now, f"stored as an immediate schedule with run_at {schedule and schedule['run_at']}"
    [rejection] = wait_for(lambda: rejected_on_topic(settings), 60, "its rejection")
    assert (rejection.command_id, rejection.code) == (contradictory.command_id, "invalid")
    assert "run_at" in rejection.reason


def test_a_rejected_command_sent_again_in_the_same_batch_is_judged_again(topics: Settings) -> None:
    """'A rejected command may be sent again with the same id; it is judged again', and commands of a
    partition apply in order. A pause sent before its create is rejected (not found); sent again after
    the create, it applies when the three land in separate batches, but in one batch the resend was
    folded into the first copy as a duplicate, and the first copy's rejection then released the
    claim: the resend was neither applied nor rejected, and applied_commands kept no trace of it."""
    pause = ScheduleCommand(command_id="pause-1", schedule_key="nightly", app=APP, operation="pause")
    commands = [
        pause,
        ScheduleCommand(
            command_id="create-1",
            schedule_key="nightly",
            app=APP,
            operation="create",
            spec=spec(handler="builtin:noop", cron="0 3 * * *"),
        ),
        pause,  # the producer's resend, after the create
    ]
    batch = [Consumed(Source(topics.schedules_topic, 0, i), CODEC.encode(c)) for i, c in enumerate(commands)]
    with connect(topics.database_url) as conn:
        result = Wiring(topics).ingestor().ingest(conn, batch)

    assert [r.rejection.source.offset for r in result.rejected] == [0], "only the first pause rejected"
    assert keyed(topics)["nightly"]["state"] == "paused", "the resent pause applied after the create"
    assert result.applied == 2


def waiting_for_a_lock(settings: Settings) -> bool:
    with connect(settings.database_url, autocommit=True) as conn:
        row = conn.execute(
            "select count(*) as n from pg_stat_activity"
            " where datname = current_database() and wait_event_type = 'Lock'"
        ).fetchone()
    return row is not None and row["n"] != 0


def test_an_operation_after_a_create_that_lost_its_key_to_another_writer_acts_on_that_key(
    topics: Settings,
) -> None:
    """A create whose key another writer (the API, the CLI) takes while the batch waits for it is a
    conflict, rightly; but the operations after it in the batch were run against the id that create
    would have had: the pause was rejected as not found, naming a schedule that never existed, and
    the key's schedule stayed active, as if the pause had come before the other writer's create."""
    create = ScheduleCommand(
        command_id="create-1",
        schedule_key="nightly",
        app=APP,
        operation="create",
        spec=spec(handler="builtin:noop", cron="0 3 * * *"),
    )
    pause = ScheduleCommand(command_id="pause-1", schedule_key="nightly", app=APP, operation="pause")
    batch = [
        Consumed(Source(topics.schedules_topic, 0, i), CODEC.encode(c)) for i, c in enumerate([create, pause])
    ]
    ingestor = Wiring(topics).ingestor()
    with (
        connect(topics.database_url) as other,
        connect(topics.database_url) as conn,
        ThreadPoolExecutor(1) as applying,
    ):
        with other.transaction():
            cli_spec = CliSpec(app=APP, kind="cron", cron="0 5 * * *", handler="builtin:noop")
            taken = service.create_schedule(other, cli_spec, "api", schedule_key="nightly")
            outcome = applying.submit(ingestor.ingest, conn, batch)
            wait_for(lambda: waiting_for_a_lock(topics), 30, "the batch waiting for the other writer's key")
        result = outcome.result(60)

    reasons = [(r.rejection.command_id, r.rejection.code, r.rejection.reason) for r in result.rejected]
    assert [(command_id, code) for command_id, code, _ in reasons] == [("create-1", "conflict")], reasons
    schedule = keyed(topics)["nightly"]
    assert (schedule["id"], schedule["state"]) == (taken["id"], "paused")
