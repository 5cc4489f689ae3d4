"""The ingestor's Kafka side, run in-process against the real Kafka and PostgreSQL: the Python client,
the rejected topic, the rejections listing, and the Confluent Schema Registry framing."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from confluent_kafka import Producer as RawProducer

from scheduler.client import CommandFormatError, ScheduleClient, spec
from scheduler.config import Settings
from scheduler.ingest.commands import Consumed
from scheduler.ingest.ingestor import Ingestor
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import ScheduleCommand, ScheduleCommandRejected
from scheduler.kafka.registry import SchemaRegistry
from scheduler.kafka.transport import TopicAdmin
from scheduler.store import connect, schedules
from scheduler.store.ingest import Source
from scheduler.wiring import Wiring
from tests.support import SCHEDULER, read_topic, wait_for

pytestmark = pytest.mark.integration

APP = "billing"
CODEC = AvroCodec()


@pytest.fixture
def topics(settings: Settings) -> Settings:
    TopicAdmin(settings.kafka).ensure_topics([settings.schedules_topic, settings.rejected_topic], 3)
    with connect(settings.database_url) as conn:
        schedules.create_app(conn, APP, 3)
        conn.commit()
    return settings


@pytest.fixture
def ingestor(topics: Settings) -> Iterator[Ingestor]:
    yield from running(topics)


def running(settings: Settings) -> Iterator[Ingestor]:
    ingestor = Wiring(settings).ingestor()
    stop = threading.Event()
    thread = threading.Thread(target=ingestor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield ingestor
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "the ingestor did not stop"


def keyed(settings: Settings) -> dict[str, dict[str, Any]]:
    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "select k.schedule_key, s.* from schedule_keys k join schedules s on s.id = k.schedule_id"
        ).fetchall()
    return {str(row["schedule_key"]): row for row in rows}


def rejected_on_topic(settings: Settings, codec: AvroCodec = CODEC) -> list[ScheduleCommandRejected]:
    return [
        codec.decode(ScheduleCommandRejected, value)
        for _, value, _ in read_topic(settings.kafka_bootstrap, settings.rejected_topic)
    ]


def test_commands_from_the_python_client_are_applied_and_bad_ones_reported(
    ingestor: Ingestor, settings: Settings, settings_env: dict[str, str]
) -> None:
    with ScheduleClient(settings.kafka, settings.topic_prefix, actor="billing-service") as client:
        for i in range(20):
            client.create(
                key=f"nightly-{i}",
                app=APP,
                cron=f"{i} 2 * * *",
                tz="Europe/Berlin",
                handler="builtin:noop",
                payload={"n": i},
                jitter_ms=i * 1000,
                backoff_base_ms=100 * i,
                backoff_max_ms=60_000,
            )
        client.pause(key="nightly-0", app=APP)
        client.update(key="nightly-1", app=APP, cron="0 5 * * *", handler="builtin:noop", expected_version=1)
        with pytest.raises(CommandFormatError, match="99"):  # refused before it is sent
            client.create(key="broken", app=APP, cron="99 * * * *", handler="builtin:noop")
        missing = client.cancel(key="no-such-key", app=APP)
        conflict = client.create(key="nightly-3", app=APP, cron="0 1 * * *", handler="builtin:noop")
    # Another producer's (without the client's checks): the ingestor rejects it.
    bad_cron = str(uuid.uuid4())
    broken = ScheduleCommand(
        command_id=bad_cron,
        schedule_key="broken",
        app=APP,
        operation="create",
        spec=spec(cron="99 * * * *", handler="builtin:noop"),
    )
    _produce_unchecked(settings, broken)

    found = wait_for(
        lambda: (k := keyed(settings)) and len(k) == 20 and k["nightly-0"]["state"] == "paused" and k,
        60,
        "20 schedules, one paused",
    )
    assert found["nightly-1"]["cron"] == "0 5 * * *" and found["nightly-1"]["version"] == 2
    assert found["nightly-7"]["payload"] == {"n": 7} and found["nightly-7"]["tz"] == "Europe/Berlin"
    retry = ("jitter_ms", "backoff_base_ms", "backoff_max_ms")
    assert tuple(found["nightly-7"][f] for f in retry) == (7000, 700, 60_000), "settable from a command"

    rejected = wait_for(lambda: len(r := rejected_on_topic(settings)) == 3 and r, 60, "three rejections")
    by_id = {r.command_id: r for r in rejected}
    assert (by_id[bad_cron].code, by_id[missing].code, by_id[conflict].code) == (
        "invalid",
        "not_found",
        "conflict",
    )
    assert all(
        r.schedule_key and r.app == APP and r.source.topic == settings.schedules_topic for r in rejected
    )
    assert CODEC.decode(ScheduleCommand, by_id[missing].original_bytes).command_id == missing

    listed = subprocess.run(
        [SCHEDULER, "schedules", "rejected", "--json"],
        env=settings_env,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(listed.stdout)
    assert {(r["command_id"], r["code"]) for r in rows} == {
        (bad_cron, "invalid"),
        (missing, "not_found"),
        (conflict, "conflict"),
    }
    assert all(
        r["reason"] and r["original_size"] > 10 and r["source_topic"] == settings.schedules_topic
        for r in rows
    )
    only = subprocess.run(
        [SCHEDULER, "schedules", "rejected", "--json", "--code", "conflict", "--limit", "5"],
        env=settings_env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert [r["command_id"] for r in json.loads(only.stdout)] == [conflict]
    table = subprocess.run(
        [SCHEDULER, "schedules", "rejected"], env=settings_env, capture_output=True, text=True, check=True
    )
    assert "not_found" in table.stdout


def test_a_rejection_too_large_for_the_rejected_topic_is_published_without_its_bytes(
    settings: Settings,
) -> None:
    # The commands topic takes 4 MiB messages; the rejected topic keeps Kafka's default (about 1 MB).
    _large_commands_topic(settings, 4 * 1024 * 1024)
    payload = json.dumps({"blob": os.urandom(900 * 1024).hex()})  # random, so compression cannot shrink it
    big = _produce_unchecked(
        settings,
        ScheduleCommand(
            command_id="big",
            schedule_key="big",
            app=APP,
            operation="create",
            spec=dataclasses.replace(_spec(), payload=payload),
        ),
    )
    with ScheduleClient(settings.kafka, settings.topic_prefix) as client:
        client.create(key="after", app=APP, handler="builtin:noop")
    for _ in running(settings):
        [letter] = wait_for(lambda: rejected_on_topic(settings), 60, "the rejection of the big command")
        wait_for(lambda: "after" in keyed(settings), 60, "the command after it applied")
    assert letter.command_id == big and letter.code == "invalid" and "1 MiB" in letter.reason
    assert letter.original_bytes == b"" and "left out" in letter.reason
    with connect(settings.database_url) as conn:
        row = conn.execute("select octet_length(original_bytes) as size from ingest_rejections").fetchone()
    assert row is not None
    size = row["size"]
    assert isinstance(size, int) and size > 1024 * 1024, "PostgreSQL keeps the bytes"


def test_a_command_quoting_megabytes_in_its_error_is_rejected_and_holds_nothing_up(
    settings: Settings,
) -> None:
    """A 3 MB cron expression's error quoted it twice: a rejection too large for its topic even
    without the command's bytes, retried for ever while every later command waited. (A cron
    expression is now refused by its length first; a time zone's name is quoted as it was.)"""
    _large_commands_topic(settings, 8 * 1024 * 1024)
    field = os.urandom(1536 * 1024).hex()  # 3 MiB, random so that compression cannot shrink it
    huge = _produce_unchecked(
        settings,
        ScheduleCommand(
            command_id="huge-cron",
            schedule_key="huge",
            app=APP,
            operation="create",
            spec=dataclasses.replace(_spec(), tz=f"Europe/{field}"),
        ),
    )
    with ScheduleClient(settings.kafka, settings.topic_prefix) as client:
        client.create(key="after", app=APP, handler="builtin:noop")
    for _ in running(settings):
        [letter] = wait_for(lambda: rejected_on_topic(settings), 60, "the rejection of the huge command")
        wait_for(lambda: "after" in keyed(settings), 60, "the command after it applied")
    assert (letter.command_id, letter.code) == (huge, "invalid")
    assert letter.reason.startswith("unknown time zone 'Europe/") and len(letter.reason) < 1024
    assert "more characters)" in letter.reason


def _large_commands_topic(settings: Settings, max_bytes: int) -> None:
    """A commands topic of one partition that takes messages of ``max_bytes``, a rejected topic at
    Kafka's default (about 1 MB), and the app."""
    admin = TopicAdmin(settings.kafka)
    admin.ensure_topics([settings.schedules_topic], 1, config={"max.message.bytes": str(max_bytes)})
    admin.ensure_topics([settings.rejected_topic], 1)
    with connect(settings.database_url) as conn:
        schedules.create_app(conn, APP, 1)
        conn.commit()


def test_a_command_whose_operation_index_is_outside_the_enum_is_rejected_not_applied(
    ingestor: Ingestor, settings: Settings
) -> None:
    """An enum travels as its symbol's index: -2 once read as the second symbol from the end, so a
    corrupt pause cancelled the schedule. It is an undecodable command instead, and the ones after it
    are applied."""
    with ScheduleClient(settings.kafka, settings.topic_prefix, actor="billing-service") as client:
        client.create(key="kept", app=APP, cron="0 3 * * *", handler="builtin:noop")
    wait_for(lambda: "kept" in keyed(settings), 60, "the schedule created")
    pause = ScheduleCommand(command_id=str(uuid.uuid4()), schedule_key="kept", app=APP, operation="pause")
    encoded, other = CODEC.encode(pause), CODEC.encode(dataclasses.replace(pause, operation="resume"))
    [position] = [i for i, (a, b) in enumerate(zip(encoded, other, strict=True)) if a != b]
    corrupt = encoded[:position] + b"\x03" + encoded[position + 1 :]  # zigzag -2: "cancel" from the end
    producer = RawProducer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(settings.schedules_topic, corrupt, key=f"{APP}/kept".encode())
    assert producer.flush(30) == 0
    with ScheduleClient(settings.kafka, settings.topic_prefix, actor="billing-service") as client:
        client.create(key="after", app=APP, cron="0 4 * * *", handler="builtin:noop")

    wait_for(lambda: "after" in keyed(settings), 60, "the command after the corrupt one applied")
    [rejection] = wait_for(lambda: rejected_on_topic(settings), 60, "the corrupt command rejected")
    assert rejection.code == "undecodable" and "enum or union index" in rejection.reason
    assert keyed(settings)["kept"]["state"] == "active", "neither cancelled nor paused"


def _produce_unchecked(settings: Settings, command: ScheduleCommand) -> str:
    """``command`` on the commands topic as a producer without the client's checks would send it
    (the client refuses what the ingestor is certain to reject); its command id."""
    producer = RawProducer(
        {"bootstrap.servers": settings.kafka_bootstrap, "message.max.bytes": 8 * 1024 * 1024}
    )
    key = f"{command.app}/{command.schedule_key}".encode()
    producer.produce(settings.schedules_topic, CODEC.encode(command), key=key)
    assert producer.flush(30) == 0
    return command.command_id


def _spec() -> Any:
    from scheduler.client import spec

    return spec(handler="builtin:noop")


class StubRegistry(BaseHTTPRequestHandler):
    """A stand-in for the third-party Confluent Schema Registry (an HTTP service that is not installable
    here): just the two endpoints the registry client calls, so that the test exercises our framing and
    lookups, not the registry. ``failing`` makes it answer 503, as a registry in an outage would."""

    schemas: ClassVar[list[str]] = []
    lookups: ClassVar[int] = 0
    failing: ClassVar[bool] = False

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # POST /subjects/{subject}/versions
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.failing:
            return self._answer(503, {"error_code": 50003, "message": "unavailable"})
        if body["schema"] not in self.schemas:
            self.schemas.append(body["schema"])
        self._answer(200, {"id": 100 + self.schemas.index(body["schema"])})

    def do_GET(self) -> None:  # GET /schemas/ids/{id}
        type(self).lookups += 1
        if self.failing:
            return self._answer(503, {"error_code": 50003, "message": "unavailable"})
        schema_id = int(self.path.split("?")[0].rsplit("/", 1)[1])
        if not 0 <= schema_id - 100 < len(self.schemas):
            return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
        self._answer(200, {"schema": self.schemas[schema_id - 100]})

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def registry_url() -> Iterator[str]:
    StubRegistry.schemas, StubRegistry.lookups, StubRegistry.failing = [], 0, False
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_with_a_schema_registry_commands_and_rejections_use_the_confluent_framing(
    topics: Settings, registry_url: str
) -> None:
    settings = dataclasses.replace(topics, schema_registry_url=registry_url)
    with ScheduleClient.from_settings(settings) as client:
        client.create(key="framed", app=APP, cron="0 4 * * *", handler="builtin:noop")
        rejected_id = client.pause(key="unknown", app=APP)
    producer = RawProducer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(
        settings.schedules_topic, b"\x00\x00\x00\x03\xe7" + b"\x02", key=b"x"
    )  # id 999: not registered
    assert producer.flush(30) == 0
    assert {value[:5] for _, value, _ in read_topic(settings.kafka_bootstrap, settings.schedules_topic)} >= {
        b"\x00\x00\x00\x00\x64"  # magic 0, schema id 100 (the stub's first)
    }

    registry_codec = AvroCodec(schema_for_id=SchemaRegistry(registry_url).schema_for_id)
    for _ in running(settings):
        wait_for(lambda: "framed" in keyed(settings), 60, "the Confluent-framed create applied")
        rejected = wait_for(
            lambda: len(r := rejected_on_topic(settings, registry_codec)) == 2 and r, 60, "two rejections"
        )
    by_code = {r.code: r for r in rejected}
    assert by_code["not_found"].command_id == rejected_id
    assert "schema id 999 is not in the schema registry" in by_code["undecodable"].reason
    values = [value for _, value, _ in read_topic(settings.kafka_bootstrap, settings.rejected_topic)]
    assert all(v[:1] == b"\x00" for v in values), "rejections are framed for the registry too"
    assert len(StubRegistry.schemas) == 2, "ScheduleCommand and ScheduleCommandRejected registered"


def test_a_registry_outage_delays_commands_but_never_rejects_them(
    topics: Settings, registry_url: str
) -> None:
    settings = dataclasses.replace(topics, schema_registry_url=registry_url)
    with ScheduleClient.from_settings(settings) as client:
        client.create(key="patient", app=APP, cron="0 4 * * *", handler="builtin:noop")
    StubRegistry.failing = True
    for _ in running(settings):
        wait_for(lambda: StubRegistry.lookups >= 3, 60, "the ingestor asking the registry again and again")
        assert keyed(settings) == {}
        StubRegistry.failing = False
        wait_for(lambda: "patient" in keyed(settings), 60, "the command applied once the registry is back")
    with connect(settings.database_url) as conn:
        assert conn.execute("select count(*) as n from ingest_rejections").fetchone() == {"n": 0}


def test_a_command_the_ingestor_fails_on_is_rejected_and_the_rest_of_its_batch_applied(
    topics: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("a bug nobody foresaw")

    # A stand-in for a bug: the one command that reaches it must not stall its partition.
    monkeypatch.setattr("scheduler.schedule.service.trigger", broken)
    commands = [
        ScheduleCommand(command_id="1", schedule_key="a", app=APP, operation="create", spec=_spec()),
        ScheduleCommand(command_id="2", schedule_key="a", app=APP, operation="trigger"),
        ScheduleCommand(command_id="3", schedule_key="b", app=APP, operation="create", spec=_spec()),
    ]
    batch = [Consumed(Source(topics.schedules_topic, 0, i), CODEC.encode(c)) for i, c in enumerate(commands)]
    with connect(topics.database_url) as conn:
        result = Wiring(topics).ingestor().ingest(conn, batch)
    assert result.applied == 2 and set(keyed(topics)) == {"a", "b"}
    [letter] = wait_for(lambda: rejected_on_topic(topics), 60, "the rejection on the topic")
    assert (letter.command_id, letter.code) == ("2", "invalid")
    assert letter.reason == "the ingestor failed on this command (RuntimeError: a bug nobody foresaw)"


def applied_commands(settings: Settings) -> dict[str, Any]:
    with connect(settings.database_url) as conn:
        row = conn.execute(
            "select (select count(*) from applied_commands) as applied,"
            "       (select coalesce(sum(duplicates), 0) from applied_commands) as duplicates,"
            "       (select count(*) from ingest_rejections) as rejected"
        ).fetchone()
    assert row is not None
    return dict(row)


def test_a_stopped_ingestor_leaves_nothing_for_the_next_one_to_read_again(topics: Settings) -> None:
    with ScheduleClient(topics.kafka, topics.topic_prefix) as client:
        for i in range(300):
            client.create(key=f"first-{i}", app=APP, cron="0 0 1 1 *", handler="builtin:noop")
    for _ in running(topics):
        wait_for(lambda: len(keyed(topics)) == 300, 60, "the first 300 creates")
    # The ingestor stopped right after its last batch: that batch's offsets are committed too, so the
    # next ingestor starts after it (a re-read would show as duplicates).
    with ScheduleClient(topics.kafka, topics.topic_prefix) as client:
        client.create(key="after-restart", app=APP, cron="0 0 1 1 *", handler="builtin:noop")
    for _ in running(topics):
        wait_for(lambda: "after-restart" in keyed(topics), 60, "the create sent after the restart")
    assert applied_commands(topics) == {"applied": 301, "duplicates": 0, "rejected": 0}


def test_creates_read_again_after_the_database_connection_dropped_are_applied_once(
    ingestor: Ingestor, topics: Settings
) -> None:
    count = 4000
    with ScheduleClient(topics.kafka, topics.topic_prefix) as client:
        for i in range(count):
            client.create(key=f"bulk-{i}", app=APP, cron="0 0 1 1 *", handler="builtin:noop")
    wait_for(lambda: keyed(topics), 60, "the first batch")
    # Mid-stream, the ingestor's connection drops: the batch it was applying is rolled back, and
    # every batch not yet committed on Kafka is read again, its creates now found applied.
    with connect(topics.database_url) as conn:
        conn.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity"
            " where datname = current_database() and pid <> pg_backend_pid()"
        )
    wait_for(lambda: len(keyed(topics)) == count, 120, f"all {count} creates")
    figures = applied_commands(topics)
    assert (figures["applied"], figures["rejected"]) == (count, 0), "none applied twice, none a conflict"
