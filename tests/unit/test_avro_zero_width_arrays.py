"""A writer schema from the registry whose arrays hold items that take no bytes (null, a record
without fields, a fixed of size 0) lets a message of a few bytes claim 2^62 items: the decoder
would count them for ever, and the consumer that reads it (the ingestor, a worker, the reconciler)
would stall on it. No schema of this scheduler has such an array, so such a writer is refused and
its messages are undecodable like any other of an unknown schema."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from fastavro.schema import parse_schema

from scheduler.kafka.avro import AvroCodec, ParsedSchema, UnexpectedSchemaError, default_catalog
from scheduler.kafka.messages import ScheduleCommand

CATALOG = default_catalog()
COMMAND = ScheduleCommand(command_id="c", schedule_key="k", app="billing", operation="pause")
BODY = AvroCodec(CATALOG).encode(COMMAND)[10:]


def _varint(value: int) -> bytes:
    zigzag, out = (value << 1) ^ (value >> 63), b""
    while zigzag > 0x7F:
        out, zigzag = out + bytes([zigzag & 0x7F | 0x80]), zigzag >> 7
    return out + bytes([zigzag])


def _codec_registering(extra_type: Any) -> AvroCodec:
    """A codec whose registry has, as id 5, the current ScheduleCommand with one more field."""
    schema = json.loads(CATALOG.current("ScheduleCommand").definition)
    schema["fields"].append({"name": "extra", "type": extra_type, "default": []})
    writer = cast(ParsedSchema, parse_schema(schema, named_schemas={}))
    return AvroCodec(CATALOG, schema_for_id=lambda _id: writer)


@pytest.mark.parametrize(
    "items",
    [
        "null",
        {"type": "record", "name": "Nothing", "fields": []},
        {"type": "fixed", "name": "Empty", "size": 0},
        {"type": "record", "name": "Nulls", "fields": [{"name": "a", "type": "null"}]},
        {"type": "array", "items": {"type": "array", "items": "null"}},
    ],
    ids=["null", "empty record", "empty fixed", "record of nulls", "nested"],
)
def test_an_array_of_items_that_take_no_bytes_is_an_unknown_schema(items: Any) -> None:
    codec = _codec_registering({"type": "array", "items": items})
    # Far fewer than a malicious producer would claim, so that the test ends either way.
    message = b"\x00\x00\x00\x00\x05" + BODY + _varint(20_000_000) + b"\x00"
    with pytest.raises(UnexpectedSchemaError, match="schema id 5 has an array whose items take no bytes"):
        codec.decode(ScheduleCommand, message)


def test_arrays_of_items_that_take_bytes_are_read_as_before() -> None:
    codec = _codec_registering({"type": "array", "items": ["null", "long"]})
    message = b"\x00\x00\x00\x00\x05" + BODY + _varint(3) + b"\x00" * 3 + b"\x00"
    assert codec.decode(ScheduleCommand, message) == COMMAND
