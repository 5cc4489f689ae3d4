"""The bad-input matrix for schedule commands, through the real Kafka ingestor and through the CLI:
every kind of bad value gets one clear rejection naming what is wrong, and the commands after it
are applied at once.

What the matrix covers, and what it cannot: malformed Avro, a record of another schema, invalid
UTF-8 in a string field and unknown command fields are all `undecodable` (Avro carries no field
names, so a command with a field this scheduler does not know was written with a schema it does not
know: its fingerprint is unknown). Unknown fields in the JSON payload are the user's business and
are kept. JSON nested deeper than 30 levels, a payload over 1 MiB encoded (exactly 1 MiB is fine),
a NUL character anywhere (PostgreSQL cannot store it) and text that is not valid Unicode are
`invalid`, each with its reason. A command line cannot carry a NUL at all (the operating system
ends an argument there), so the CLI meets NUL only in a payload file.
"""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as RawProducer
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import to_parsing_canonical_form

from scheduler.config import Settings
from scheduler.ingest.ingestor import Ingestor
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.messages import (
    KafkaSource,
    ScheduleCommand,
    ScheduleCommandRejected,
    ScheduleSpec,
)
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule.spec import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH, MAX_PAYLOAD_VALUES
from scheduler.store import connect, schedules
from scheduler.wiring import Wiring
from tests.support import SCHEDULER, read_topic, wait_for
from tests.unit.test_avro_schemas import wire_fingerprint

pytestmark = pytest.mark.integration

APP = "billing"
CODEC = AvroCodec()
# Room for a command with a payload of 1 MiB and more, on the commands and the rejected topics.
TOPIC_BYTES = 8 * 1024 * 1024
BLOB_ENVELOPE = len('{"blob":""}')


def blob(size: int) -> dict[str, str]:
    """A payload whose encoded JSON is exactly ``size`` bytes."""
    return {"blob": "x" * (size - BLOB_ENVELOPE)}


def create(key: str, **fields: Any) -> ScheduleCommand:
    payload = fields.pop("payload", {})
    values: dict[str, Any] = {"name": "", "kind": "cron", "cron": "0 3 * * *", "handler": "builtin:noop"}
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return ScheduleCommand(
        command_id=f"id-{key}".replace("\x00", "-"),
        schedule_key=key,
        app=APP,
        operation="create",
        spec=ScheduleSpec(**(values | {"payload": text} | fields)),
    )


def with_unknown_field(command: ScheduleCommand) -> bytes:
    """``command`` as a producer with a newer schema (one more field) would write it."""
    schema = json.loads(CODEC.catalog.current("ScheduleCommand").path.read_text())
    schema["fields"].append({"name": "priority", "type": "int", "default": 0})
    parsed = parse_schema(schema, named_schemas={})
    body = io.BytesIO()
    schemaless_writer(body, parsed, command.to_avro() | {"priority": 7})
    return b"\xc3\x01" + wire_fingerprint(to_parsing_canonical_form(parsed)) + body.getvalue()


def with_invalid_utf8(command: ScheduleCommand, marker: str) -> bytes:
    """``command`` encoded, with the bytes of ``marker`` in a string field replaced by invalid UTF-8."""
    value = CODEC.encode(command)
    assert value.count(marker.encode()) == 1
    return value.replace(marker.encode(), b"\xff" * len(marker))


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# name -> (the message's value, its rejection code, a part of the reason)
BAD: dict[str, tuple[bytes, str, str]] = {
    "malformed avro": (
        CODEC.catalog.current("ScheduleCommand").header + b"\x7f\xff\xff\xff\xff\xff",
        "undecodable",
        "corrupt or truncated ScheduleCommand",
    ),
    "another schema": (
        CODEC.encode(
            ScheduleCommandRejected(
                rejected_at=datetime(2027, 1, 1, tzinfo=UTC),
                code="invalid",
                reason="misrouted",
                command_id="c",
                schedule_key="k",
                app=APP,
                original_bytes=b"",
                source=KafkaSource(topic="t", partition=0, offset=0),
            )
        ),
        "undecodable",
        "expected a ScheduleCommand, got a ScheduleCommandRejected",
    ),
    "invalid utf-8": (
        with_invalid_utf8(create("utf8", name="NAME-TO-BREAK"), "NAME-TO-BREAK"),
        "undecodable",
        "UnicodeDecodeError",
    ),
    "unknown command field": (
        with_unknown_field(create("newer")),
        "undecodable",
        "unknown schema fingerprint",
    ),
    "deep json": (
        CODEC.encode(create("deep", payload=nested(10_000))),
        "invalid",
        f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels",
    ),
    "one level too deep": (
        CODEC.encode(create("deep-over", payload=nested(MAX_PAYLOAD_DEPTH + 1))),
        "invalid",
        f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels",
    ),
    "1 MiB + 1 byte": (
        CODEC.encode(create("too-big", payload=blob(MAX_PAYLOAD_BYTES + 1))),
        "invalid",
        f"payload is {MAX_PAYLOAD_BYTES + 1} bytes encoded; the limit is 1048576 (1 MiB)",
    ),
    # Each is printed a line at a time by `audit list` and `quarantine list`: a line break could
    # forge a line, an invisible character hide who made the change.
    "actor with a line break": (
        CODEC.encode(dataclasses.replace(create("actor-nl"), actor="ops\n2027-01-01 admin")),
        "invalid",
        "actor 'ops\\n2027-01-01 admin' must be letters, digits, punctuation and symbols",
    ),
    "command id with a zero-width space": (
        CODEC.encode(dataclasses.replace(create("id-zw"), command_id="id-\u200bzw")),
        "invalid",
        "command_id",
    ),
    "100,001 values": (
        CODEC.encode(create("values", payload=[0] * MAX_PAYLOAD_VALUES)),
        "invalid",
        "payload holds more than 100,000 values",
    ),
    "numbers that grow as stored": (
        CODEC.encode(create("expand", payload=[1e-300] * 3500)),
        "invalid",
        "bytes with its numbers written out in full, as they are stored",
    ),
    "NUL in a payload string": (
        CODEC.encode(create("nul-value", payload={"a": "x\x00y"})),
        "invalid",
        "payload contains a NUL character, which PostgreSQL cannot store",
    ),
    "NUL in a payload key": (
        CODEC.encode(create("nul-key", payload={"a\x00": 1})),
        "invalid",
        "payload contains a NUL character",
    ),
    "lone surrogate in the payload": (
        CODEC.encode(create("surrogate", payload='{"a": "\\ud800"}')),
        "invalid",
        "payload is not valid Unicode",
    ),
    "NUL in the name": (
        CODEC.encode(create("nul-name", name="nightly\x00")),
        "invalid",
        "name contains a NUL character",
    ),
    "NUL in the handler": (
        CODEC.encode(create("nul-handler", handler="billing.jobs:run\x00")),
        "invalid",
        "handler contains a NUL character",
    ),
    "NUL in the cron expression": (
        CODEC.encode(create("nul-cron", cron="0 3 * * *\x00")),
        "invalid",
        "cron contains a NUL character",
    ),
    "NUL in the time zone": (
        CODEC.encode(create("nul-tz", tz="Europe/Berlin\x00")),
        "invalid",
        "tz contains a NUL character",
    ),
    "NUL in the schedule key": (
        CODEC.encode(create("nul\x00key")),
        "invalid",
        "schedule_key contains a NUL character",
    ),
}

# name -> (schedule key, payload): legal, however unusual, and applied.
GOOD: dict[str, tuple[str, Any]] = {
    "exactly 1 MiB": ("one-mib", blob(MAX_PAYLOAD_BYTES)),
    "unknown fields in the payload": ("unknown-fields", {"anything": {"nested": [1, 2]}, "extra": True}),
    "the deepest allowed": ("deep-max", json.loads(nested(MAX_PAYLOAD_DEPTH))),
}


@pytest.fixture
def topics(settings: Settings) -> Settings:
    return command_topics(settings)


def command_topics(settings: Settings) -> Settings:
    """The commands' topics of one partition, as `scheduler init` makes them (messages of up to
    8 MiB), and the app APP."""
    admin = TopicAdmin(settings.kafka)
    config = {"max.message.bytes": str(TOPIC_BYTES)}
    admin.ensure_topics([settings.schedules_topic, settings.rejected_topic], 1, config=config)
    with connect(settings.database_url) as conn:
        schedules.create_app(conn, APP, 1)
        conn.commit()
    return settings


@pytest.fixture
def ingestor(topics: Settings) -> Iterator[Ingestor]:
    ingestor = Wiring(topics).ingestor()
    stop = threading.Event()
    thread = threading.Thread(target=ingestor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield ingestor
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "the ingestor did not stop"


def keys(settings: Settings) -> dict[str, dict[str, Any]]:
    with connect(settings.database_url) as conn:
        rows: list[dict[str, Any]] = conn.execute(
            "select k.schedule_key, s.payload from schedule_keys k join schedules s on s.id = k.schedule_id"
        ).fetchall()
    return {row["schedule_key"]: row for row in rows}


def test_every_bad_command_gets_its_rejection_and_the_next_command_is_applied(
    ingestor: Ingestor, settings: Settings
) -> None:
    producer = RawProducer({"bootstrap.servers": settings.kafka_bootstrap, "message.max.bytes": TOPIC_BYTES})
    # One partition, in this order: every bad command and every unusual good one, then a plain one.
    for value, _, _ in BAD.values():
        producer.produce(settings.schedules_topic, value)
    for key, payload in GOOD.values():
        producer.produce(settings.schedules_topic, CODEC.encode(create(key, payload=payload)))
    producer.produce(settings.schedules_topic, CODEC.encode(create("after-all")))
    assert producer.flush(30) == 0

    applied = wait_for(lambda: "after-all" in (k := keys(settings)) and k, 60, "the command after the matrix")
    assert set(applied) == {"after-all", *(key for key, _ in GOOD.values())}, "nothing bad was stored"
    for key, payload in GOOD.values():
        assert applied[key]["payload"] == payload, key

    rejected = wait_for(lambda: len(r := rejections(settings)) == len(BAD) and r, 60, "every rejection")
    by_bytes = {r.original_bytes: r for r in rejected}
    for name, (value, code, reason) in BAD.items():
        found = by_bytes[value]
        assert (found.code, reason in found.reason) == (code, True), f"{name}: {found.code}: {found.reason}"
        assert "\x00" not in found.reason and "\n" not in found.reason, name
    nul_key = by_bytes[BAD["NUL in the schedule key"][0]]
    assert nul_key.schedule_key == "nul\\u0000key", "a rejection shows the NUL, escaped"
    with connect(settings.database_url) as conn:
        stored = conn.execute("select code, reason from ingest_rejections").fetchall()
    assert sorted((r["code"], r["reason"]) for r in stored) == sorted((r.code, r.reason) for r in rejected)


def rejections(settings: Settings) -> list[ScheduleCommandRejected]:
    return [
        CODEC.decode(ScheduleCommandRejected, value)
        for _, value, _ in read_topic(settings.kafka_bootstrap, settings.rejected_topic)
    ]


def cli(env: dict[str, str], *args: str | bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDULER, *args], env=env, capture_output=True, text=True, errors="replace", check=False, timeout=60
    )


def test_the_cli_refuses_each_bad_payload_and_name_with_one_line(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    assert cli(settings_env, "apps", "create", APP, "--partitions", "1").returncode == 0

    def payload_file(name: str, content: str | bytes) -> str:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return f"@{path}"

    def create_with(*args: str | bytes) -> subprocess.CompletedProcess[str]:
        return cli(
            settings_env, "schedules", "create", "--app", APP, "--now", "--handler", "builtin:noop", *args
        )

    refused: dict[str, tuple[list[str | bytes], str]] = {
        "deep": (
            ["--payload", payload_file("deep.json", nested(10_000))],
            f"nests deeper than {MAX_PAYLOAD_DEPTH} levels",
        ),
        "too big": (
            ["--payload", payload_file("big.json", json.dumps(blob(MAX_PAYLOAD_BYTES + 1)))],
            "the limit is 1048576 (1 MiB)",
        ),
        # 21 KB as written, 1.05 MB as PostgreSQL keeps it (each a 1 and 300 zeros).
        "numbers written out": (
            ["--payload", payload_file("expand.json", "[" + ",".join(["1e300"] * 3500) + "]")],
            "bytes with its numbers written out in full",
        ),
        # 200 KB, but 100,001 values: each costs the API about 2 µs to convert.
        "too many values": (
            ["--payload", payload_file("values.json", json.dumps([0] * MAX_PAYLOAD_VALUES))],
            "payload holds more than 100,000 values",
        ),
        "NUL": (
            ["--payload", payload_file("nul.json", '{"a": "\\u0000"}')],
            "payload contains a NUL character",
        ),
        "surrogate": (["--payload", '{"a": "\\udc80"}'], "payload is not valid Unicode"),
        "not UTF-8": (["--payload", payload_file("latin1.json", b'{"a": "\xe9"}')], "is not UTF-8 text"),
        # Read up to 16 MiB, not to the end: an endless file is one line, not all the memory.
        "endless": (["--payload", "@/dev/zero"], "/dev/zero is over 16 MiB; a payload is at most 1 MiB"),
        "invalid UTF-8 name": (["--name", b"nightly-\xff"], "'--name': 'nightly-\\xff' is not valid UTF-8"),
    }
    for what, (args, reason) in refused.items():
        done = create_with(*args)
        assert done.returncode == 2, f"{what}: {done.stderr}"
        assert reason in done.stderr and done.stderr.strip().count("\n") == 0, f"{what}: {done.stderr}"

    exact = create_with("--payload", payload_file("exact.json", json.dumps(blob(MAX_PAYLOAD_BYTES))))
    assert exact.returncode == 0, exact.stderr
    listed = json.loads(cli(settings_env, "schedules", "list", "--json").stdout)
    assert [len(json.dumps(s["payload"], separators=(",", ":"))) for s in listed] == [MAX_PAYLOAD_BYTES]
