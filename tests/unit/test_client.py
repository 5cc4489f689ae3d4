"""The client side of schedule commands: the JSON shape `scheduler produce` reads, and the README's
wire-format section, which other languages implement from and so must match the codec byte for byte."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli.produce import CommandIds, derived_command_id
from scheduler.client import CommandFormatError, command_from_json, spec
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind
from scheduler.kafka.avro import AvroCodec, default_catalog
from scheduler.kafka.messages import ScheduleCommand, ScheduleSpec
from tests.unit.test_avro_schemas import crc64_avro

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
CODEC = AvroCodec()
SCHEMA = default_catalog().current("ScheduleCommand")


def test_a_full_json_command_becomes_the_avro_command() -> None:
    document = {
        "command_id": "7f0c", "schedule_key": "billing:nightly", "app": "billing", "operation": "create",
        "spec": {
            "name": "nightly invoices", "kind": "cron", "cron": "30 2 * * *", "tz": "Europe/Berlin",
            "handler": "builtin:noop", "payload": {"invoice_run": True}, "run_at": None,
            "start_at": "2027-01-01T00:00:00+01:00", "end_at": "2028-01-01T00:00:00Z", "max_attempts": 5,
            "timeout_seconds": 60, "misfire": "skip", "overlap": "buffer_one",
        },
        "expected_version": None, "actor": "billing-service",
    }  # fmt: skip
    assert command_from_json(document, default_command_id="unused") == ScheduleCommand(
        command_id="7f0c",
        schedule_key="billing:nightly",
        app="billing",
        operation="create",
        spec=ScheduleSpec(
            name="nightly invoices",
            kind=ScheduleKind.CRON,
            handler="builtin:noop",
            payload='{"invoice_run":true}',
            cron="30 2 * * *",
            tz="Europe/Berlin",
            start_at=datetime(2027, 1, 1, tzinfo=timezone(timedelta(hours=1))),
            end_at=datetime(2028, 1, 1, tzinfo=UTC),
            max_attempts=5,
            timeout_seconds=60,
            misfire=MisfirePolicy.SKIP,
            overlap=OverlapPolicy.BUFFER_ONE,
        ),
        actor="billing-service",
    )


def test_a_minimal_json_command_takes_the_defaults_and_the_given_command_id() -> None:
    command = command_from_json(
        {"schedule_key": "k", "app": "a", "operation": "pause"}, default_command_id="d"
    )
    assert command == ScheduleCommand(command_id="d", schedule_key="k", app="a", operation="pause")
    created = command_from_json(
        {"schedule_key": "k", "app": "a", "operation": "create", "spec": {"handler": "builtin:noop"}},
        default_command_id="d",
    )
    assert created.spec == ScheduleSpec(
        name="", kind=ScheduleKind.IMMEDIATE, handler="builtin:noop", payload="{}"
    )


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"cron": "@daily"}, "cron"),
        ({"run_at": datetime(2027, 1, 1, tzinfo=UTC)}, "delayed"),
        ({}, "immediate"),
    ],
)
def test_the_kind_follows_from_cron_or_run_at(fields: dict[str, Any], kind: str) -> None:
    assert spec(handler="builtin:noop", **fields).kind == kind


def _create(**spec_fields: Any) -> dict[str, Any]:
    return {"schedule_key": "k", "app": "a", "operation": "create", "spec": {"handler": "h"} | spec_fields}


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ([1, 2], "a command must be a JSON object"),
        ({"app": "a", "operation": "pause"}, "schedule_key is required"),
        ({"schedule_key": "k", "app": "", "operation": "pause"}, "app is required"),
        ({"schedule_key": "k", "app": "a", "operation": "delete"}, "operation 'delete' must be one of"),
        ({"schedule_key": "k", "app": "a", "operation": "pause", "colour": 1}, "unknown field(s): colour"),
        ({"schedule_key": "k", "app": "a", "operation": "update"}, "the update command needs a spec"),
        ({"schedule_key": "k", "app": "a", "operation": "pause", "spec": {"handler": "x"}}, "takes no spec"),
        ({"schedule_key": "k", "app": "a", "operation": "create", "spec": "x"}, "spec must be a JSON object"),
        ({"schedule_key": "k", "app": "a", "operation": "create", "spec": {}}, "spec.handler is required"),
        (_create(max_attempts="3"), "spec.max_attempts has the wrong type (str)"),
        (_create(max_attempts=True), "spec.max_attempts has the wrong type (bool)"),
        (_create(run_at="tomorrow"), "spec.run_at 'tomorrow' is not an ISO 8601 time"),
        (_create(misfire="never"), "'never' is not a valid MisfirePolicy"),
        (_create(payload=float("nan")), "Out of range float values are not JSON compliant"),
        ({"schedule_key": "k", "app": "a", "operation": "pause", "expected_version": "2"},
         "expected_version has the wrong type (str)"),
    ],
)  # fmt: skip
def test_json_commands_of_the_wrong_shape_fail_with_one_line(document: Any, error: str) -> None:
    with pytest.raises(CommandFormatError) as raised:
        command_from_json(document, default_command_id="d")
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_a_derived_command_id_depends_only_on_the_line_text() -> None:
    line = '{"schedule_key": "k", "app": "a", "operation": "pause"}'
    assert derived_command_id(line) == derived_command_id(f"  {line}\n")
    assert derived_command_id(line) != derived_command_id(line.replace("pause", "resume"))


# ---- The README's wire format section ----


def _readme_code_blocks() -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", README, flags=re.DOTALL)


def test_the_readme_gives_the_current_fingerprint_in_each_of_its_spellings() -> None:
    wire = SCHEMA.fingerprint
    number = int.from_bytes(wire, "little")
    assert f"**`{wire.hex(' ')}`**" in README
    assert f"`{wire.hex()}`" in README
    assert f"`0x{number:016x}`" in README and f"`{number}`" in README
    assert f"`{(SCHEMA.header).hex(' ')}`" in README
    assert crc64_avro(SCHEMA.canonical_form.encode()) == number


def test_the_readme_shows_the_parsing_canonical_form_of_the_schema_file() -> None:
    assert SCHEMA.canonical_form + "\n" in _readme_code_blocks()
    assert "[`schemas/ScheduleCommand.avsc`](schemas/ScheduleCommand.avsc)" in README


def test_the_readme_byte_dumps_are_what_the_codec_writes() -> None:
    examples = [block for block in _readme_code_blocks() if block.startswith("c3 01")]
    assert len(examples) == 2
    pause = ScheduleCommand(command_id="c-1", schedule_key="nightly", app="billing", operation="pause")
    create = ScheduleCommand(
        command_id="c-2",
        schedule_key="once",
        app="billing",
        operation="create",
        spec=spec(handler="builtin:noop", run_at=datetime(2027, 1, 1, 9, tzinfo=UTC)),
    )
    dumps = [
        bytes.fromhex(" ".join(re.findall(r"^((?:[0-9a-f]{2} )*[0-9a-f]{2})", b, re.M))) for b in examples
    ]
    assert dumps == [CODEC.encode(pause), CODEC.encode(create)]
    assert CODEC.decode(ScheduleCommand, dumps[1]) == create


@pytest.mark.parametrize(("value", "encoded"), [(0, "00"), (-1, "01"), (1, "02"), (3, "06"), (300, "d8 04")])
def test_the_readme_zigzag_examples_hold(value: int, encoded: str) -> None:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    assert out.hex(" ") == encoded
    assert f"{value} → `{encoded}`" in README


def test_a_line_repeated_in_one_input_gets_a_command_id_of_its_own_each_time() -> None:
    # pause, resume, pause: the second pause must not be a duplicate of the first.
    pause = '{"schedule_key": "k", "app": "a", "operation": "pause"}'
    resume = '{"schedule_key": "k", "app": "a", "operation": "resume"}'
    ids = CommandIds()
    first, second, third = ids.derive(pause), ids.derive(resume), ids.derive(pause + "\n")
    assert len({first, second, third}) == 3
    assert first == derived_command_id(pause), "the first occurrence keeps the id it always had"
    again = CommandIds()
    assert [again.derive(pause), again.derive(resume), again.derive(pause)] == [first, second, third], (
        "producing the same input twice gives the same ids"
    )
