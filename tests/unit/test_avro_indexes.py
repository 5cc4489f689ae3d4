"""An enum is written as its symbol's index, a union value after its branch's index: one outside
the symbols or branches (negative, or past the end) is an undecodable message, never a symbol or
branch read from the end of the list (fastavro's compiled reader indexed a negative one as Python
does, so -1 read as the last symbol)."""

from __future__ import annotations

import dataclasses
import io
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID

import pytest
from fastavro import parse_schema, schemaless_reader

from scheduler.domain.schedule import MisfirePolicy, ScheduleKind
from scheduler.kafka import messages as m
from scheduler.kafka.avro import (
    AvroCodec,
    ParsedSchema,
    UndecodableMessageError,
    _with_checked_indexes,
    default_catalog,
)

CODEC = AvroCodec(default_catalog())
AT = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
STARTED = m.JobResult(
    event_id=UUID(int=1),
    status="started",
    run_id=UUID(int=2),
    schedule_id=UUID(int=3),
    app="billing",
    attempt=1,
    worker="worker-1",
    started_at=AT,
)
CREATE = m.ScheduleCommand(
    command_id="cmd-1",
    schedule_key="billing:once",
    app="billing",
    operation="create",
    spec=m.ScheduleSpec(name="once", kind=ScheduleKind.IMMEDIATE, handler="builtin:noop"),
)


def zigzag(index: int) -> bytes:
    """Avro's one-byte varint of a small int: 0 -> 00, 1 -> 02, -1 -> 01, -2 -> 03."""
    assert -64 <= index < 64
    return bytes([2 * index if index >= 0 else -2 * index - 1])


def enum_position(first: Any, second: Any) -> int:
    """Where the enum's index is in ``first``'s encoding: the one byte that differs from ``second``,
    the same message with another symbol (indexes below 64 take one byte)."""
    a, b = CODEC.encode(first), CODEC.encode(second)
    assert len(a) == len(b)
    differing = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    assert len(differing) == 1
    return differing[0]


def with_index(message: Any, position: int, index: int) -> bytes:
    data = bytearray(CODEC.encode(message))
    data[position : position + 1] = zigzag(index)
    return bytes(data)


def test_a_results_status_index_outside_its_symbols_is_undecodable() -> None:
    position = enum_position(STARTED, dataclasses.replace(STARTED, status="heartbeat"))
    assert CODEC.decode(m.JobResult, with_index(STARTED, position, 2)).status == "succeeded"
    for index in (-1, -2, -3, 3):
        with pytest.raises(UndecodableMessageError, match="enum or union index"):
            CODEC.decode(m.JobResult, with_index(STARTED, position, index))


def test_a_commands_operation_index_outside_its_symbols_is_undecodable() -> None:
    # -2 read as the second symbol from the end: a cancel instead of a create.
    position = enum_position(CREATE, dataclasses.replace(CREATE, operation="update"))
    for index in (-1, -2, 6):
        with pytest.raises(UndecodableMessageError, match="enum or union index"):
            CODEC.decode(m.ScheduleCommand, with_index(CREATE, position, index))


def test_an_enum_inside_a_union_branch_is_checked_too() -> None:
    assert CREATE.spec is not None
    skipping = dataclasses.replace(CREATE.spec, misfire=MisfirePolicy.SKIP)
    position = enum_position(CREATE, dataclasses.replace(CREATE, spec=skipping))
    with pytest.raises(UndecodableMessageError, match="enum or union index"):
        CODEC.decode(m.ScheduleCommand, with_index(CREATE, position, -1))


def test_without_logical_types_the_index_is_checked_as_well() -> None:
    position = enum_position(STARTED, dataclasses.replace(STARTED, status="heartbeat"))
    with pytest.raises(UndecodableMessageError, match="enum or union index"):
        CODEC.decode_record("JobResult", with_index(STARTED, position, -1), logical_types=False)


def test_writing_is_untouched_by_the_readers_checked_copies() -> None:
    # The reader's copies of the schemas are its own: encoding after decoding still validates and
    # writes every symbol.
    CODEC.decode(m.JobResult, CODEC.encode(STARTED))
    for status in ("started", "heartbeat", "succeeded"):
        event = dataclasses.replace(STARTED, status=status)
        assert CODEC.decode(m.JobResult, CODEC.encode(event)) == event


def test_a_union_branch_index_outside_its_branches_is_undecodable() -> None:
    """-2 read the null branch of expected_version ["null", "long"], a pause without its version
    check."""
    pause = m.ScheduleCommand(
        command_id="cmd-2", schedule_key="billing:once", app="billing", operation="pause", expected_version=1
    )
    position = enum_position(pause, dataclasses.replace(pause, expected_version=2)) - 1
    encoded = CODEC.encode(pause)
    assert encoded[position : position + 2] == zigzag(1) + zigzag(1), "branch 1 (long), then the version 1"
    assert CODEC.decode(m.ScheduleCommand, encoded).expected_version == 1
    for index in (-1, -2, 2):
        with pytest.raises(UndecodableMessageError, match="enum or union index"):
            CODEC.decode(m.ScheduleCommand, with_index(pause, position, index))


def test_a_schema_given_unparsed_or_half_parsed_is_parsed_before_its_indexes_are_checked() -> None:
    """fastavro parses a schema again unless it has both of its parse marks, and its parser takes
    the checked lists for empty ones: every read would fail."""
    plain = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["a", "b"]}},
            {"name": "u", "type": ["null", "long"]},
        ],
    }
    half = dict(cast(ParsedSchema, parse_schema(plain, named_schemas={})))
    del half["__named_schemas"]
    for given in (plain, half):
        checked = _with_checked_indexes(given)
        assert schemaless_reader(io.BytesIO(b"\x02\x02\x04"), checked, None) == {"e": "b", "u": 2}
        with pytest.raises(IndexError, match="enum or union index -1"):
            schemaless_reader(io.BytesIO(b"\x01\x00"), checked, None)
