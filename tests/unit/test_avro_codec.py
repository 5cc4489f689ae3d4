"""The codec: round trips, wire framing, schema evolution, and what malformed bytes turn into."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, cast
from uuid import UUID

import pytest
from fastavro import schemaless_writer
from fastavro.schema import parse_schema
from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind
from scheduler.kafka import messages as m
from scheduler.kafka.avro import (
    AvroCodec,
    MessageDecodeError,
    MessageEncodeError,
    ParsedSchema,
    SchemaRegistryRequiredError,
    UndecodableMessageError,
    UnexpectedSchemaError,
    UnknownSchemaError,
    default_catalog,
)
from tests.unit.test_avro_schemas import wire_fingerprint

CATALOG = default_catalog()
CODEC = AvroCodec(CATALOG)

RUN = UUID("0193a1c2-5f00-7000-8000-000000000001")
SCHEDULE = UUID("0193a1c2-5f00-7000-8000-0000000000aa")
AT = datetime(2026, 10, 25, 0, 30, 0, 123456, tzinfo=UTC)

JOB = m.JobMessage(
    run_id=RUN,
    schedule_id=SCHEDULE,
    app="billing",
    attempt=2,
    idempotency_key=m.idempotency_key_for(RUN),
    scheduled_for=AT,
    handler="builtin:http",
    payload='{"url": "https://example.com/hook", "method": "POST"}',
    timeout_ms=300_000,
    deadline=AT + timedelta(minutes=6),
    retry=m.RetryPolicy(max_attempts=3, backoff_base_ms=1_000, backoff_max_ms=60_000),
    previous_attempts=(
        m.AttemptSummary(
            attempt=1,
            worker="worker-1",
            started_at=AT,
            finished_at=AT + timedelta(seconds=2),
            error="HTTP 503 from https://example.com/hook",
            error_class="HttpStatus503",
        ),
    ),
)
FAILED_1 = JOB.previous_attempts[0]
FAILED_2 = m.AttemptSummary(
    attempt=2, finished_at=AT + timedelta(minutes=6), error="lease expired", error_class="LeaseExpired"
)
SOURCE = m.KafkaSource(topic="sched.jobs.billing", partition=3, offset=1_234_567)


def _examples() -> list[Any]:
    return [
        JOB,
        m.JobResult(
            event_id=UUID(int=1),
            status="started",
            run_id=RUN,
            schedule_id=SCHEDULE,
            app="billing",
            attempt=2,
            worker="worker-2",
            started_at=AT,
        ),
        m.JobResult(
            event_id=UUID(int=2),
            status="succeeded",
            run_id=RUN,
            schedule_id=SCHEDULE,
            app="billing",
            attempt=2,
            worker="worker-2",
            started_at=AT,
            finished_at=AT + timedelta(seconds=1),
            result='{"status": 200}',
        ),
        m.JobRetry(
            event_id=UUID(int=3),
            run_id=RUN,
            schedule_id=SCHEDULE,
            app="billing",
            attempt=1,
            worker="worker-1",
            started_at=AT,
            finished_at=AT + timedelta(seconds=2),
            error="HTTP 503",
            error_class="HttpStatus503",
            not_before=AT + timedelta(seconds=2, milliseconds=740),
        ),
        m.JobDeadLetter(
            event_id=UUID(int=4),
            cause="retries_exhausted",
            app="billing",
            run_id=RUN,
            schedule_id=SCHEDULE,
            attempt=2,
            worker=None,
            started_at=None,
            finished_at=AT + timedelta(minutes=6),
            error="lease expired",
            error_class="LeaseExpired",
            attempts=(FAILED_1, FAILED_2),
            original_bytes=CODEC.encode(JOB),
            source=None,
        ),
        m.JobDeadLetter(
            event_id=UUID(int=5),
            cause="undecodable",
            app="billing",
            run_id=None,
            schedule_id=None,
            attempt=None,
            worker="worker-1",
            started_at=None,
            finished_at=AT,
            error="unknown framing (first byte 0x7b)",
            error_class="UndecodableMessage",
            attempts=(),
            original_bytes=b'{"not": "avro"}',
            source=SOURCE,
        ),
        m.ScheduleCommand(
            command_id="cmd-1",
            schedule_key="billing:nightly",
            app="billing",
            operation="create",
            spec=m.ScheduleSpec(
                name="nightly invoices",
                kind=ScheduleKind.CRON,
                handler="billing.jobs:invoice",
                payload='{"dry_run": false}',
                cron="30 2 * * *",
                tz="Europe/Berlin",
                end_at=datetime(2027, 1, 1, tzinfo=timezone(timedelta(hours=1))),
                max_attempts=5,
                timeout_seconds=60,
                misfire=MisfirePolicy.SKIP,
                overlap=OverlapPolicy.BUFFER_ONE,
            ),
            actor="alice",
        ),
        m.ScheduleCommand(
            command_id="cmd-2",
            schedule_key="billing:nightly",
            app="billing",
            operation="pause",
            expected_version=7,
        ),
        m.ScheduleCommandRejected(
            rejected_at=AT,
            code="invalid",
            reason="unknown time zone 'Mars/Olympus'",
            command_id="cmd-3",
            schedule_key="x",
            app="billing",
            original_bytes=b"\xc3\x01" + bytes(20),
            source=m.KafkaSource(topic="sched.schedules", partition=0, offset=42),
        ),
    ]


@pytest.mark.parametrize("message", _examples(), ids=lambda msg: type(msg).__name__)
def test_every_message_round_trips(message: Any) -> None:
    data = CODEC.encode(message)
    assert CODEC.decode(type(message), data) == message


def test_single_object_header_is_c301_then_the_spec_fingerprint() -> None:
    for message in _examples():
        schema = CATALOG.current(message.SCHEMA)
        data = CODEC.encode(message)
        assert data[:2] == b"\xc3\x01"
        assert data[2:10] == wire_fingerprint(schema.canonical_form)


def test_times_come_back_in_utc_with_microseconds() -> None:
    spec_end = datetime(2027, 1, 1, 0, 0, 0, 1, tzinfo=timezone(timedelta(hours=1)))
    command = m.ScheduleCommand(
        command_id="c",
        schedule_key="k",
        app="a",
        operation="create",
        spec=m.ScheduleSpec(name="n", kind=ScheduleKind.DELAYED, handler="builtin:noop", run_at=spec_end),
    )
    decoded = CODEC.decode(m.ScheduleCommand, CODEC.encode(command))
    assert decoded.spec is not None and decoded.spec.run_at is not None
    assert decoded.spec.run_at == spec_end
    assert decoded.spec.run_at.utcoffset() == timedelta(0)
    assert decoded.spec.run_at.microsecond == 1


def test_naive_times_are_refused_rather_than_read_as_local_time() -> None:
    naive = dataclasses.replace(_examples()[3], not_before=datetime(2026, 1, 1))
    with pytest.raises(MessageEncodeError, match="naive datetime"):
        CODEC.encode(naive)
    # Also inside a record inside a list: the attempt history a job carries.
    attempt = dataclasses.replace(FAILED_1, finished_at=datetime(2026, 1, 1))
    with pytest.raises(MessageEncodeError, match="naive datetime"):
        CODEC.encode(dataclasses.replace(JOB, previous_attempts=(attempt,)))


def test_plain_records_may_omit_defaulted_fields_but_not_misspell_them() -> None:
    minimal = {"command_id": "c", "schedule_key": "k", "app": "a", "operation": "resume"}
    assert CODEC.decode(
        m.ScheduleCommand, CODEC.encode_record("ScheduleCommand", minimal)
    ) == m.ScheduleCommand(command_id="c", schedule_key="k", app="a", operation="resume")
    with pytest.raises(MessageEncodeError, match="expected_verison"):
        CODEC.encode_record("ScheduleCommand", {**minimal, "expected_verison": 3})
    with pytest.raises(MessageEncodeError, match="app"):
        CODEC.encode_record(
            "ScheduleCommand", {"command_id": "c", "schedule_key": "k", "operation": "resume"}
        )
    with pytest.raises(MessageEncodeError):
        CODEC.encode_record("ScheduleCommand", {**minimal, "operation": "delete"})


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("max_attempts", 2**31, "ScheduleSpec.max_attempts is not int (32 bits"),
        ("timeout_seconds", "soon", "ScheduleSpec.timeout_seconds is not int"),
        ("payload", 5, "ScheduleSpec.payload is not string"),
    ],
)
def test_a_value_that_does_not_fit_is_named_by_its_field_never_shown(
    field: str, value: Any, reason: str
) -> None:
    """fastavro's text quotes the whole record: a payload's secrets with it, on one 5 KB line."""
    secret = "https://user:PASSWORD-SECRET@example.com/?token=TOKEN-SECRET"
    spec = {
        "name": "",
        "kind": "immediate",
        "handler": "builtin:http",
        "payload": json.dumps({"url": secret}),
    }
    spec[field] = value
    record = {"command_id": "c", "schedule_key": "k", "app": "a", "operation": "create", "spec": spec}
    with pytest.raises(MessageEncodeError) as raised:
        CODEC.encode_record("ScheduleCommand", record)
    text = str(raised.value)
    assert text == f"cannot encode ScheduleCommand: {text.split(': ', 1)[1]}" and reason in text
    assert "SECRET" not in text and len(text) < 200


def test_a_message_of_another_type_is_refused_by_name() -> None:
    with pytest.raises(UnexpectedSchemaError, match="expected a JobMessage, got a JobRetry"):
        CODEC.decode(m.JobMessage, CODEC.encode(_examples()[3]))


def test_an_unknown_fingerprint_is_an_unknown_schema() -> None:
    data = b"\xc3\x01" + bytes.fromhex("0102030405060708") + CODEC.encode(JOB)[10:]
    with pytest.raises(UnknownSchemaError, match="0102030405060708"):
        CODEC.decode(m.JobMessage, data)


# --- schema evolution -------------------------------------------------------------------------------


def _write_with(schema: ParsedSchema, record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    schemaless_writer(body, schema, record)
    return body.getvalue()


def test_job_written_with_version_1_is_read_by_the_current_reader() -> None:
    v1 = CATALOG.versions("JobMessage")[0]
    old_record = {k: v for k, v in JOB.to_avro().items() if k != "previous_attempts"}
    data = v1.header + _write_with(v1.parsed, old_record)
    assert data[2:10] != CATALOG.current("JobMessage").fingerprint
    decoded = CODEC.decode(m.JobMessage, data)
    assert decoded == dataclasses.replace(JOB, previous_attempts=())


def test_data_of_every_historical_version_is_readable() -> None:
    examples = {type(msg).SCHEMA: msg for msg in _examples()}
    for name in CATALOG.names:
        for old in CATALOG.versions(name)[:-1]:
            fields = {f["name"] for f in old.parsed["fields"]}
            record = {k: v for k, v in examples[name].to_avro().items() if k in fields}
            CODEC.decode_record(name, old.header + _write_with(old.parsed, record))


# --- Confluent framing ------------------------------------------------------------------------------


def _codec_with_registry() -> tuple[AvroCodec, list[int]]:
    """A codec whose registry knows ids 1 (JobMessage v1), 2 (JobMessage v2) and 3 (JobResult)."""
    registered = {
        1: CATALOG.versions("JobMessage")[0],
        2: CATALOG.current("JobMessage"),
        3: CATALOG.current("JobResult"),
    }
    # Parsed from the registered text, as a registry client would, not shared with the catalog.
    schemas = {
        i: cast(ParsedSchema, parse_schema(json.loads(s.definition), named_schemas={}))
        for i, s in registered.items()
    }
    asked: list[int] = []

    def schema_for_id(schema_id: int) -> ParsedSchema:
        asked.append(schema_id)
        return schemas[schema_id]  # KeyError for an unknown id, as a LookupError

    return AvroCodec(CATALOG, schema_for_id=schema_for_id), asked


def test_confluent_framing_is_magic_zero_and_a_big_endian_id() -> None:
    codec, asked = _codec_with_registry()
    data = codec.encode(JOB, confluent_schema_id=2)
    assert data[:5] == b"\x00\x00\x00\x00\x02"
    assert data[5:] == CODEC.encode(JOB)[10:]
    assert codec.decode(m.JobMessage, data) == JOB
    assert codec.decode(m.JobMessage, data) == JOB
    assert asked == [2]  # registry ids are immutable: asked once


def test_confluent_framed_old_version_is_resolved_to_the_current_one() -> None:
    codec, _ = _codec_with_registry()
    old_record = {k: v for k, v in JOB.to_avro().items() if k != "previous_attempts"}
    data = (
        b"\x00" + (1).to_bytes(4, "big") + _write_with(CATALOG.versions("JobMessage")[0].parsed, old_record)
    )
    assert codec.decode(m.JobMessage, data).previous_attempts == ()


def test_confluent_framing_errors() -> None:
    codec, _ = _codec_with_registry()
    body = CODEC.encode(JOB)[10:]
    with pytest.raises(UnknownSchemaError, match="schema id 99"):
        codec.decode(m.JobMessage, b"\x00\x00\x00\x00\x63" + body)
    with pytest.raises(UnexpectedSchemaError, match="expected a JobMessage"):
        codec.decode(m.JobMessage, b"\x00\x00\x00\x00\x03" + body)
    with pytest.raises(SchemaRegistryRequiredError, match="no schema registry"):
        CODEC.decode(m.JobMessage, b"\x00\x00\x00\x00\x02" + body)
    with pytest.raises(MessageEncodeError):
        codec.encode(JOB, confluent_schema_id=2**32)


def test_registry_outage_is_not_a_decode_error() -> None:
    def unreachable(schema_id: int) -> ParsedSchema:
        raise ConnectionError("registry down")

    # The message may be fine: a consumer must retry, not reject or dead-letter it.
    with pytest.raises(ConnectionError):
        AvroCodec(CATALOG, schema_for_id=unreachable).decode(
            m.JobMessage, CODEC.encode(JOB, confluent_schema_id=2)
        )


# --- malformed input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "error", "reason"),
    [
        (b"", UndecodableMessageError, "empty message"),
        (b'{"run_id": 1}', UndecodableMessageError, "unknown framing \\(first byte 0x7b\\)"),
        (b"\xc3\x02" + bytes(20), UndecodableMessageError, "unknown framing \\(first byte 0xc3\\)"),
        (b"\xc3\x01\x00", UndecodableMessageError, "truncated single-object header"),
        (b"\x00\x00\x01", UndecodableMessageError, "truncated Confluent header"),
        (CODEC.encode(JOB)[:-1], UndecodableMessageError, "corrupt or truncated JobMessage body"),
        (CODEC.encode(JOB) + b"\x00", UndecodableMessageError, "1 unexpected bytes after the JobMessage"),
    ],
)
def test_malformed_messages_raise_a_reason(data: bytes, error: type[Exception], reason: str) -> None:
    with pytest.raises(error, match=reason) as raised:
        CODEC.decode(m.JobMessage, data)
    assert isinstance(raised.value, MessageDecodeError)
    assert isinstance(raised.value, ValueError)


def _decodes_or_rejects(codec: AvroCodec, message_type: type[Any], data: bytes) -> None:
    """Decoding may succeed (random bytes can be a valid message); any error must be a MessageDecodeError."""
    with contextlib.suppress(MessageDecodeError):
        codec.decode(message_type, data)


MESSAGE_TYPES = [type(msg) for msg in _examples()]
REGISTRY_CODEC, _ = _codec_with_registry()


@given(data=st.binary(max_size=200), message_type=st.sampled_from(MESSAGE_TYPES))
def test_random_bytes_only_ever_raise_decode_errors(data: bytes, message_type: type[Any]) -> None:
    for codec in (CODEC, REGISTRY_CODEC):
        _decodes_or_rejects(codec, message_type, data)


@given(body=st.binary(max_size=200), message=st.sampled_from(_examples()), confluent=st.booleans())
def test_random_bodies_behind_valid_headers_only_ever_raise_decode_errors(
    body: bytes, message: Any, confluent: bool
) -> None:
    header = b"\x00\x00\x00\x00\x02" if confluent else CATALOG.current(message.SCHEMA).header
    _decodes_or_rejects(REGISTRY_CODEC, type(message), header + body)


@given(message=st.sampled_from(_examples()), data=st.data())
def test_every_truncation_of_a_valid_message_is_undecodable(message: Any, data: st.DataObject) -> None:
    encoded = CODEC.encode(message)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(MessageDecodeError):
        CODEC.decode(type(message), encoded[:cut])


@given(message=st.sampled_from(_examples()), data=st.data())
def test_flipped_bytes_only_ever_raise_decode_errors(message: Any, data: st.DataObject) -> None:
    encoded = bytearray(CODEC.encode(message))
    position = data.draw(st.integers(min_value=10, max_value=len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(min_value=1, max_value=255))
    _decodes_or_rejects(CODEC, type(message), bytes(encoded))


# --- property-based round trips ---------------------------------------------------------------------

ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text(max_size=40)
times = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-9, minutes=-30))]),
)
attempt_summaries = st.builds(
    m.AttemptSummary,
    attempt=ints,
    finished_at=times,
    error=texts,
    error_class=texts,
    worker=st.none() | texts,
    started_at=st.none() | times,
)
jobs = st.builds(
    m.JobMessage,
    run_id=st.uuids(),
    schedule_id=st.uuids(),
    app=texts,
    attempt=ints,
    idempotency_key=texts,
    scheduled_for=times,
    handler=texts,
    payload=texts,
    timeout_ms=longs,
    deadline=times,
    retry=st.builds(m.RetryPolicy, max_attempts=ints, backoff_base_ms=longs, backoff_max_ms=longs),
    previous_attempts=st.lists(attempt_summaries, max_size=3).map(tuple),
)
dead_letters = st.builds(
    m.JobDeadLetter,
    event_id=st.uuids(),
    cause=st.sampled_from(["non_retryable", "retries_exhausted", "undecodable"]),
    app=texts,
    run_id=st.none() | st.uuids(),
    schedule_id=st.none() | st.uuids(),
    attempt=st.none() | ints,
    worker=st.none() | texts,
    started_at=st.none() | times,
    finished_at=times,
    error=texts,
    error_class=texts,
    attempts=st.lists(attempt_summaries, max_size=3).map(tuple),
    original_bytes=st.binary(max_size=64),
    source=st.none() | st.builds(m.KafkaSource, topic=texts, partition=ints, offset=longs),
)
commands = st.builds(
    m.ScheduleCommand,
    command_id=texts,
    schedule_key=texts,
    app=texts,
    operation=st.sampled_from(["create", "update", "pause", "resume", "cancel", "trigger"]),
    spec=st.none()
    | st.builds(
        m.ScheduleSpec,
        name=texts,
        kind=st.sampled_from(ScheduleKind),
        handler=texts,
        payload=texts,
        cron=st.none() | texts,
        tz=texts,
        run_at=st.none() | times,
        start_at=st.none() | times,
        end_at=st.none() | times,
        max_attempts=ints,
        timeout_seconds=ints,
        misfire=st.sampled_from(MisfirePolicy),
        overlap=st.sampled_from(OverlapPolicy),
    ),
    expected_version=st.none() | longs,
    actor=st.none() | texts,
)


@given(message=jobs | dead_letters | commands)
def test_arbitrary_messages_round_trip(message: Any) -> None:
    assert CODEC.decode(type(message), CODEC.encode(message)) == message
