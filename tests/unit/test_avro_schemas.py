"""The schema files: complete, documented, consistent with the Python messages, fingerprinted per spec."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any, get_args

import pytest
from fastavro import schemaless_writer
from fastavro.schema import parse_schema, to_parsing_canonical_form

from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind
from scheduler.kafka import messages
from scheduler.kafka.avro import (
    SCHEMAS_DIR_ENV,
    AvroCodec,
    SchemaCatalog,
    SchemaCatalogError,
    UnknownSchemaError,
    default_schemas_dir,
)

SCHEMAS = default_schemas_dir()
MESSAGE_TYPES = messages.RECORDS

# The fingerprints of the current schemas. A failure here means a schema's canonical form changed: if
# the old version ever reached a topic, copy the old file to schemas/history/<Name>.v<N>.avsc first (so
# its data stays readable), then update the fingerprint here. Docs and field order of defaults aside,
# every change of names, types or field order changes the fingerprint.
CURRENT_FINGERPRINTS = {
    "JobDeadLetter": "8b1d60d559ce0da7",
    "JobMessage": "fa543296c0dda854",
    "JobResult": "4488bc799c6b173f",
    "JobRetry": "66c14d83b828b742",
    "ScheduleCommand": "f93a707630ee844f",
    "ScheduleCommandRejected": "ee3ce1a9ff3951ab",
}

_CRC64_EMPTY = 0xC15D213AA4D7A795


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO (Rabin), written from the Avro specification, independently of fastavro."""
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    fp = _CRC64_EMPTY
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def wire_fingerprint(canonical_form: str) -> bytes:
    """The 8 bytes after C3 01: little-endian, as Java's BinaryMessageEncoder writes them."""
    return crc64_avro(canonical_form.encode()).to_bytes(8, "little")


@pytest.fixture(scope="module")
def catalog() -> SchemaCatalog:
    return SchemaCatalog.load(SCHEMAS)


# Published by Apache Avro (share/test/data/schema-tests.txt) as Java's signed 64-bit values.
@pytest.mark.parametrize(
    ("schema", "canonical", "java_fingerprint"),
    [
        ('"null"', '"null"', 7195948357588979594),
        ('{"type": "boolean"}', '"boolean"', -6970731678124411036),
        (
            '{"type":"fixed","name":"foo","size":15}',
            '{"name":"foo","type":"fixed","size":15}',
            1756455273707447556,
        ),
        (
            '{"type":"record","name":"foo","doc":"x","fields":[{"name":"f1","type":"boolean","default":true}]}',
            '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}',
            7843277075252814651,
        ),
    ],
)
def test_canonical_form_and_crc_match_the_avro_test_vectors(
    schema: str, canonical: str, java_fingerprint: int
) -> None:
    assert to_parsing_canonical_form(parse_schema(json.loads(schema), named_schemas={})) == canonical
    assert crc64_avro(canonical.encode()) == java_fingerprint % 2**64


def test_every_schema_fingerprint_is_crc64_avro_of_its_canonical_form(catalog: SchemaCatalog) -> None:
    for name in catalog.names:
        for schema in catalog.versions(name):
            assert schema.fingerprint == wire_fingerprint(schema.canonical_form), schema.path
            assert schema.header == b"\xc3\x01" + schema.fingerprint
            assert '"doc"' not in schema.canonical_form


def test_catalog_holds_one_current_schema_per_message(catalog: SchemaCatalog) -> None:
    assert set(catalog.names) == {t.SCHEMA for t in MESSAGE_TYPES}
    for name in catalog.names:
        current = catalog.current(name)
        assert current.full_name == f"dev.scheduler.v1.{name}"
        assert current.path == SCHEMAS / f"{name}.avsc"
        assert catalog.by_fingerprint(current.fingerprint) is current


def test_current_fingerprints_change_only_on_purpose(catalog: SchemaCatalog) -> None:
    assert {name: catalog.current(name).fingerprint.hex() for name in catalog.names} == CURRENT_FINGERPRINTS


def test_job_message_keeps_version_1_for_old_data(catalog: SchemaCatalog) -> None:
    v1, v2 = catalog.versions("JobMessage")
    assert (v1.version, v2.version) == (1, 2)
    assert v1.path == SCHEMAS / "history" / "JobMessage.v1.avsc"
    assert catalog.by_fingerprint(v1.fingerprint) is v1
    added = {f["name"] for f in v2.parsed["fields"]} - {f["name"] for f in v1.parsed["fields"]}
    assert added == {"previous_attempts"}


def _walk_records(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, list):
        return [r for item in node for r in _walk_records(item)]
    if not isinstance(node, dict):
        return []
    found = [node] if node.get("type") == "record" else []
    for key in ("type", "items", "values", "fields"):
        if key in node:
            found += _walk_records(node[key])
    return found


def _records_by_name() -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    by_name: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for path in sorted(SCHEMAS.glob("*.avsc")):
        for record in _walk_records(json.loads(path.read_text())):
            by_name.setdefault(record["name"], []).append((path, record))
    return by_name


def test_every_record_and_field_is_documented() -> None:
    for path in sorted(SCHEMAS.rglob("*.avsc")):
        for record in _walk_records(json.loads(path.read_text())):
            assert record.get("doc"), f"{path}: record {record['name']} has no doc"
            for field in record["fields"]:
                assert field.get("doc"), f"{path}: {record['name']}.{field['name']} has no doc"


def test_records_shared_between_files_are_defined_identically() -> None:
    # Each file is self-contained for users of other languages, so a shared record is repeated; a
    # difference would give two incompatible types one name.
    shared = {name: defs for name, defs in _records_by_name().items() if len(defs) > 1}
    assert set(shared) == {"AttemptSummary", "KafkaSource"}
    for name, definitions in shared.items():
        first_path, first = definitions[0]
        for path, other in definitions[1:]:
            # The record-level doc may say "an attempt" or "an earlier attempt"; the fields may not differ.
            assert other["fields"] == first["fields"], f"{name} differs between {first_path} and {path}"


def test_python_messages_have_exactly_the_schema_fields() -> None:
    records = {name: defs[0][1] for name, defs in _records_by_name().items()}
    python_types: dict[str, type] = {t.SCHEMA: t for t in MESSAGE_TYPES} | {
        "RetryPolicy": messages.RetryPolicy,
        "AttemptSummary": messages.AttemptSummary,
        "KafkaSource": messages.KafkaSource,
        "ScheduleSpec": messages.ScheduleSpec,
    }
    assert set(python_types) == set(records)
    for name, python_type in python_types.items():
        python_fields = {f.name for f in dataclasses.fields(python_type)}
        assert python_fields == {f["name"] for f in records[name]["fields"]}, name


def _enum_symbols() -> dict[str, list[str]]:
    symbols: dict[str, list[str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            if node.get("type") == "enum":
                symbols[node["name"]] = node["symbols"]
            for key in ("type", "items", "fields"):
                walk(node.get(key))

    for path in SCHEMAS.glob("*.avsc"):
        walk(json.loads(path.read_text()))
    return symbols


def test_enum_symbols_are_the_words_of_the_domain_and_of_the_python_messages() -> None:
    symbols = _enum_symbols()
    for domain_enum in (ScheduleKind, MisfirePolicy, OverlapPolicy):
        assert symbols[domain_enum.__name__] == [member.value for member in domain_enum]
    literals = {
        "JobResultStatus": messages.JobResultStatus,
        "DeadLetterCause": messages.DeadLetterCause,
        "ScheduleOperation": messages.ScheduleOperation,
        "RejectionCode": messages.RejectionCode,
    }
    for name, literal in literals.items():
        assert symbols[name] == list(get_args(literal)), name
    assert set(symbols) == {e.__name__ for e in (ScheduleKind, MisfirePolicy, OverlapPolicy)} | set(literals)


def test_schemas_dir_can_be_overridden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(SCHEMAS_DIR_ENV, str(tmp_path))
    assert default_schemas_dir() == tmp_path
    monkeypatch.delenv(SCHEMAS_DIR_ENV)
    assert default_schemas_dir().resolve() == Path(__file__).resolve().parents[2] / "schemas"


def _write(path: Path, name: str, fields: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"type": "record", "name": name, "namespace": "dev.scheduler.v1", "fields": fields})
    )


def test_catalog_numbers_versions_from_history(tmp_path: Path) -> None:
    _write(tmp_path / "Thing.avsc", "Thing", [{"name": "a", "type": "int"}, {"name": "b", "type": "int"}])
    _write(tmp_path / "history" / "Thing.v1.avsc", "Thing", [{"name": "a", "type": "int"}])
    catalog = SchemaCatalog.load(tmp_path)
    assert [s.version for s in catalog.versions("Thing")] == [1, 2]
    with pytest.raises(UnknownSchemaError, match="00000000"):
        catalog.by_fingerprint(bytes(8))
    with pytest.raises(KeyError, match="Thing"):
        catalog.current("Other")


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({"Thing.avsc": ("Other", "int")}, "must define the record dev.scheduler.v1.Thing"),
        ({"Thing.avsc": ("Thing", "int"), "history/Thing.v1.avsc": ("Thing", "int")}, "same canonical form"),
        ({"Thing.avsc": ("Thing", "int"), "history/Thing.v2.avsc": ("Thing", "long")}, "not 1..n"),
        ({"Thing.avsc": ("Thing", "int"), "history/Gone.v1.avsc": ("Gone", "int")}, "without a current"),
        ({"Thing.avsc": ("Thing", "int"), "history/Thing-1.avsc": ("Thing", "long")}, "<Name>.v<N>.avsc"),
        ({"Thing.avsc": ("Thing", "no-such-type")}, "not a valid Avro schema"),
        ({}, "no \\*.avsc files"),
    ],
)
def test_inconsistent_schema_files_fail_at_load(
    tmp_path: Path, files: dict[str, tuple[str, str]], error: str
) -> None:
    for relative, (name, field_type) in files.items():
        _write(tmp_path / relative, name, [{"name": "a", "type": field_type}])
    with pytest.raises(SchemaCatalogError, match=error):
        SchemaCatalog.load(tmp_path)


def test_schedule_command_keeps_version_1_and_reads_it_with_the_defaults(catalog: SchemaCatalog) -> None:
    v1, v2 = catalog.versions("ScheduleCommand")
    assert v1.path == SCHEMAS / "history" / "ScheduleCommand.v1.avsc"

    def spec_fields(schema: Any) -> set[str]:
        [spec] = [f for f in schema.parsed["fields"] if f["name"] == "spec"]
        return {f["name"] for f in spec["type"][1]["fields"]}

    assert spec_fields(v2) - spec_fields(v1) == {"backoff_base_ms", "backoff_max_ms", "jitter_ms"}
    old = {
        "command_id": "c-1", "schedule_key": "k", "app": "billing", "operation": "create",
        "spec": {
            "name": "", "kind": "cron", "handler": "builtin:noop", "payload": "{}", "cron": "0 3 * * *",
            "tz": "UTC", "run_at": None, "start_at": None, "end_at": None, "max_attempts": 3,
            "timeout_seconds": 300, "misfire": "fire_once", "overlap": "allow",
        },
        "expected_version": None, "actor": None,
    }  # fmt: skip
    body = io.BytesIO()
    schemaless_writer(body, v1.parsed, old)
    command = AvroCodec(catalog).decode(messages.ScheduleCommand, v1.header + body.getvalue())
    assert command.spec is not None
    assert (command.spec.backoff_base_ms, command.spec.backoff_max_ms, command.spec.jitter_ms) == (
        1000,
        300_000,
        0,
    )
