"""The Avro codec: every value the scheduler puts on Kafka or takes from it passes through here.

Schemas live in ``schemas/*.avsc`` (the current version of each record) and ``schemas/history/``
(``<Name>.v<N>.avsc``, frozen earlier versions). They are parsed once into a :class:`SchemaCatalog`
that finds a schema by name or by fingerprint. :class:`AvroCodec` writes Avro single-object encoding
(``C3 01``, the 8-byte little-endian CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form,
the binary body), or the Confluent framing (``00``, 4-byte big-endian schema id, body) when given a
schema id. It reads both, resolving the writer's schema (named by fingerprint, or looked up by id
through a pluggable ``schema_for_id``) against the current reader schema, so consumers read what
older producers wrote. Bytes that cannot be decoded raise a :class:`MessageDecodeError` whose text is
fit for a rejection reason, and nothing else: consumers decide between rejecting and dead-lettering
without guessing which exceptions a malformed message can cause.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, TypeVar, cast

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form
from fastavro.validation import ValidationError, validate

SCHEMAS_DIR_ENV = "SCHEDULER_SCHEMAS_DIR"
NAMESPACE = "dev.scheduler.v1"

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
_SINGLE_OBJECT_HEADER_SIZE = len(SINGLE_OBJECT_MAGIC) + 8
_CONFLUENT_HEADER_SIZE = len(CONFLUENT_MAGIC) + 4

_HISTORY_FILE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc")

ParsedSchema = dict[str, Any]
"""A schema as returned by ``fastavro.parse_schema``."""

SchemaLookup = Callable[[int], ParsedSchema]
"""Returns the parsed writer schema registered under a Confluent schema id.

Raises ``LookupError`` for an id the registry does not have; any other exception (the registry is
unreachable) propagates unchanged, because the message itself may be fine. The codec remembers each
answer (registry ids are immutable), so the callable is asked once per id.
"""


class MessageDecodeError(ValueError):
    """The bytes are not a message this scheduler can read; ``str()`` is a one-line reason."""


class UndecodableMessageError(MessageDecodeError):
    """Unknown framing, a truncated or corrupt body, trailing bytes, or an unresolvable writer schema."""


class UnknownSchemaError(MessageDecodeError):
    """The framing names a schema (fingerprint or registry id) that is not known."""


class UnexpectedSchemaError(MessageDecodeError):
    """The message is well framed but is another record than the one expected on this topic."""


class SchemaRegistryRequiredError(MessageDecodeError):
    """A Confluent-framed message arrived but no schema registry lookup is configured."""


class MessageEncodeError(ValueError):
    """A record does not fit its schema (missing or unknown field, wrong type)."""


class SchemaCatalogError(RuntimeError):
    """The schema files are inconsistent; raised when loading them, so at start-up."""


class AvroMessage(Protocol):
    """What :class:`AvroCodec` needs of a typed message (see :mod:`scheduler.kafka.messages`)."""

    SCHEMA: ClassVar[str]

    def to_avro(self) -> dict[str, Any]: ...

    @classmethod
    def from_avro(cls, record: Mapping[str, Any]) -> Self: ...


M = TypeVar("M", bound=AvroMessage)


@dataclass(frozen=True, slots=True)
class AvroSchema:
    """One version of one record schema, parsed, with its single-object header precomputed."""

    name: str
    """The record's short name, which is also its file name: ``JobMessage``."""
    full_name: str
    version: int
    parsed: ParsedSchema
    canonical_form: str
    fingerprint: bytes
    """CRC-64-AVRO of the Parsing Canonical Form, in the little-endian byte order of the wire."""
    header: bytes
    """``C3 01`` and the fingerprint: the first ten bytes of every message this version writes."""
    definition: str
    """The schema file's text, docs included: what to register in a schema registry."""
    path: Path


def default_schemas_dir() -> Path:
    """``$SCHEDULER_SCHEMAS_DIR``, or the package's ``schemas`` folder.

    ``scheduler/schemas`` is a link to the repository's ``schemas/`` in a checkout, and holds copies
    of the files in an installed wheel, so the package finds its schemas either way.
    """
    override = os.environ.get(SCHEMAS_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).parent.parent / "schemas"


def _load(path: Path, name: str, version: int) -> AvroSchema:
    text = path.read_text(encoding="utf-8")
    try:
        # A fresh named_schemas per file: each file is self-contained, as a Java or Go user takes it.
        parsed = parse_schema(json.loads(text), named_schemas={})
    except Exception as exc:  # json and fastavro raise several types for a bad file
        raise SchemaCatalogError(f"{path}: not a valid Avro schema: {exc}") from exc
    full_name = parsed.get("name") if isinstance(parsed, dict) else None
    if not isinstance(parsed, dict) or parsed.get("type") != "record" or full_name != f"{NAMESPACE}.{name}":
        raise SchemaCatalogError(f"{path}: must define the record {NAMESPACE}.{name}, found {full_name!r}")
    canonical = to_parsing_canonical_form(parsed)
    crc = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    return AvroSchema(
        name=name,
        full_name=full_name,
        version=version,
        parsed=parsed,
        canonical_form=canonical,
        fingerprint=crc,
        header=SINGLE_OBJECT_MAGIC + crc,
        definition=text,
        path=path,
    )


class SchemaCatalog:
    """Every known version of every schema, by name and by fingerprint; immutable once loaded."""

    def __init__(self, schemas: list[AvroSchema]) -> None:
        self._versions: dict[str, tuple[AvroSchema, ...]] = {}
        self._by_fingerprint: dict[bytes, AvroSchema] = {}
        for schema in sorted(schemas, key=lambda s: (s.name, s.version)):
            self._versions[schema.name] = (*self._versions.get(schema.name, ()), schema)
            clash = self._by_fingerprint.setdefault(schema.fingerprint, schema)
            if clash is not schema:
                raise SchemaCatalogError(
                    f"{schema.path} and {clash.path} have the same canonical form; a change to docs "
                    "or defaults alone needs no new version"
                )
        for name, versions in self._versions.items():
            if [s.version for s in versions] != list(range(1, len(versions) + 1)):
                raise SchemaCatalogError(
                    f"versions of {name} are not 1..n: {[str(s.path) for s in versions]}"
                )

    @classmethod
    def load(cls, directory: Path | None = None) -> SchemaCatalog:
        """Parse ``<dir>/*.avsc`` (current versions) and ``<dir>/history/<Name>.v<N>.avsc``.

        The current version of a schema is numbered one above its newest history file.
        """
        directory = default_schemas_dir() if directory is None else directory
        current = sorted(directory.glob("*.avsc"))
        if not current:
            raise SchemaCatalogError(f"no *.avsc files in {directory} (set {SCHEMAS_DIR_ENV}?)")
        history: dict[str, list[tuple[int, Path]]] = {}
        for path in sorted((directory / "history").glob("*.avsc")):
            match = _HISTORY_FILE.fullmatch(path.name)
            if match is None:
                raise SchemaCatalogError(f"{path}: history files are named <Name>.v<N>.avsc")
            history.setdefault(match["name"], []).append((int(match["version"]), path))
        schemas: list[AvroSchema] = []
        for path in current:
            old = history.pop(path.stem, [])
            schemas.extend(_load(old_path, path.stem, version) for version, old_path in old)
            schemas.append(_load(path, path.stem, max((v for v, _ in old), default=0) + 1))
        if history:
            raise SchemaCatalogError(f"history without a current schema: {sorted(history)}")
        return cls(schemas)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._versions)

    def current(self, name: str) -> AvroSchema:
        """The newest version: what encoders write and decoders read into."""
        return self.versions(name)[-1]

    def versions(self, name: str) -> tuple[AvroSchema, ...]:
        """Every version of ``name``, oldest first."""
        try:
            return self._versions[name]
        except KeyError:
            raise KeyError(f"no schema named {name!r}; known: {', '.join(self._versions)}") from None

    def find_fingerprint(self, fingerprint: bytes) -> AvroSchema | None:
        """The schema version with this fingerprint (8 bytes, wire order), if known."""
        return self._by_fingerprint.get(fingerprint)

    def by_fingerprint(self, fingerprint: bytes) -> AvroSchema:
        """The schema version with this fingerprint (8 bytes, wire order)."""
        try:
            return self._by_fingerprint[fingerprint]
        except KeyError:
            raise UnknownSchemaError(
                f"unknown schema fingerprint {fingerprint.hex()}: written with a schema version this "
                "scheduler does not know (a newer producer?)"
            ) from None


@cache
def default_catalog() -> SchemaCatalog:
    """The catalog of :func:`default_schemas_dir`, loaded on first use and shared by the process."""
    return SchemaCatalog.load()


_SchemaCopy = Callable[[ParsedSchema], ParsedSchema]
"""What the codec makes of a schema for reading, once per schema (see :meth:`AvroCodec._copy`)."""


class AvroCodec:
    """Encodes and decodes messages; holds only parsed schemas, so one instance serves every thread."""

    def __init__(
        self, catalog: SchemaCatalog | None = None, *, schema_for_id: SchemaLookup | None = None
    ) -> None:
        self.catalog = default_catalog() if catalog is None else catalog
        self._schema_for_id = schema_for_id
        self._registry_schemas: dict[int, ParsedSchema] = {}
        # (id(schema), what was made of it) -> (schema, the copy made): its copy without logical
        # types, and its copy refusing an enum or union index out of range (see _Indexed). The
        # schema is kept so its id stays its.
        self._copies: dict[tuple[int, _SchemaCopy], tuple[ParsedSchema, ParsedSchema]] = {}

    def encode(self, message: AvroMessage, *, confluent_schema_id: int | None = None) -> bytes:
        """The message in single-object encoding, or in Confluent framing under ``confluent_schema_id``.

        A Confluent schema id must be the registry's id of this codec's current schema for the message.
        """
        try:
            record = message.to_avro()
        except ValueError as exc:
            raise MessageEncodeError(f"cannot encode {message.SCHEMA}: {exc}") from exc
        return self.encode_record(message.SCHEMA, record, confluent_schema_id=confluent_schema_id)

    def decode(self, message_type: type[M], data: bytes) -> M:
        """The message of type ``message_type`` in ``data``, written with any known schema version."""
        return message_type.from_avro(self.decode_record(message_type.SCHEMA, data))

    def encode_record(
        self, schema_name: str, record: Mapping[str, Any], *, confluent_schema_id: int | None = None
    ) -> bytes:
        """Like :meth:`encode` for a plain dict (fields with defaults may be left out)."""
        schema = self.catalog.current(schema_name)
        stream = io.BytesIO()
        if confluent_schema_id is None:
            stream.write(schema.header)
        else:
            if not 0 <= confluent_schema_id < 2**32:
                raise MessageEncodeError(f"Confluent schema id {confluent_schema_id} is not a 32-bit id")
            stream.write(CONFLUENT_MAGIC + confluent_schema_id.to_bytes(4, "big"))
        try:
            # strict_allow_default: a misspelt or missing field is an error, not a silently dropped value.
            schemaless_writer(stream, schema.parsed, record, strict_allow_default=True)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise MessageEncodeError(
                f"cannot encode {schema_name}: {_misfit(schema.parsed, record, exc)}"
            ) from None
        return stream.getvalue()

    def decode_record(self, schema_name: str, data: bytes, *, logical_types: bool = True) -> dict[str, Any]:
        """The record in ``data`` as a dict shaped by the current schema of ``schema_name``.

        With ``logical_types=False`` a timestamp stays the long and a uuid the string Avro carries:
        for naming a message whose value Python's types cannot hold (a time past year 9999), which the
        normal decoding refuses as a whole. The error path's alone: it copies the schemas once each.
        """
        reader = self.catalog.current(schema_name)
        writer, offset = self._writer_schema(reader, data)
        # Without a reader schema fastavro skips resolution, the common case of an up-to-date writer.
        resolved: ParsedSchema | None = None if writer is reader.parsed else reader.parsed
        if not logical_types:
            writer = self._plain(writer)
            resolved = None if resolved is None else self._plain(resolved)
        stream = io.BytesIO(data)
        stream.seek(offset)
        try:
            record = schemaless_reader(stream, self._for_reading(writer), resolved)
        except Exception as exc:
            # Arbitrary bytes break the reader in many ways (EOFError, UnicodeDecodeError, IndexError for a
            # union branch, ValueError for a uuid, resolution errors): each means the same to a consumer.
            raise UndecodableMessageError(
                f"corrupt or truncated {schema_name} body ({type(exc).__name__}: {exc})"
            ) from exc
        trailing = len(data) - stream.tell()
        if trailing:
            raise UndecodableMessageError(f"{trailing} unexpected bytes after the {schema_name} record")
        # A record schema (the catalog admits no other) always reads as a dict.
        return cast(dict[str, Any], record)

    def _plain(self, schema: ParsedSchema) -> ParsedSchema:
        return self._copy(schema, _plain_copy)

    def _for_reading(self, writer: ParsedSchema) -> ParsedSchema:
        return self._copy(writer, _with_checked_indexes)

    def _copy(self, schema: ParsedSchema, make: _SchemaCopy) -> ParsedSchema:
        """``make(schema)``, made once per schema."""
        key = (id(schema), make)
        known = self._copies.get(key)
        if known is None:
            known = self._copies[key] = (schema, make(schema))
        return known[1]

    def _writer_schema(self, reader: AvroSchema, data: bytes) -> tuple[ParsedSchema, int]:
        """The writer's parsed schema named by the framing, and where the body starts."""
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < _SINGLE_OBJECT_HEADER_SIZE:
                raise UndecodableMessageError(f"truncated single-object header ({len(data)} bytes)")
            known = self.catalog.by_fingerprint(data[2:_SINGLE_OBJECT_HEADER_SIZE])
            if known.full_name != reader.full_name:
                raise UnexpectedSchemaError(f"expected a {reader.name}, got a {known.name}")
            return known.parsed, _SINGLE_OBJECT_HEADER_SIZE
        if data[:1] == CONFLUENT_MAGIC:
            if len(data) < _CONFLUENT_HEADER_SIZE:
                raise UndecodableMessageError(f"truncated Confluent header ({len(data)} bytes)")
            schema_id = int.from_bytes(data[1:_CONFLUENT_HEADER_SIZE], "big")
            if self._schema_for_id is None:
                raise SchemaRegistryRequiredError(
                    f"Confluent-framed message (schema id {schema_id}) but no schema registry is configured"
                )
            writer = self._registry_schemas.get(schema_id)
            if writer is None:
                writer = self._registry_schema(schema_id, self._schema_for_id)
            writer_name = writer.get("name")
            if writer_name != reader.full_name:
                raise UnexpectedSchemaError(
                    f"expected a {reader.name}, got schema id {schema_id} for {writer_name or 'a non-record'}"
                )
            return writer, _CONFLUENT_HEADER_SIZE
        if not data:
            raise UndecodableMessageError(f"empty message where a {reader.name} was expected")
        raise UndecodableMessageError(
            f"unknown framing (first byte 0x{data[0]:02x}): "
            "neither Avro single-object encoding (c3 01) nor Confluent (00)"
        )

    def _registry_schema(self, schema_id: int, schema_for_id: SchemaLookup) -> ParsedSchema:
        try:
            parsed = schema_for_id(schema_id)
        except LookupError:
            raise UnknownSchemaError(f"schema id {schema_id} is not in the schema registry") from None
        if not isinstance(parsed, dict):
            raise UnexpectedSchemaError(f"schema id {schema_id} is not a record schema")
        if _has_zero_width_array(parsed):
            # A few bytes could then claim 2^62 items, which the reader would count for ever.
            raise UnexpectedSchemaError(
                f"schema id {schema_id} has an array whose items take no bytes, as no scheduler schema has"
            )
        # A registered copy of a schema we know decodes with our own parse of it, so that the current
        # version skips schema resolution exactly as in single-object encoding.
        known = self.catalog.find_fingerprint(
            bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
        )
        writer = parsed if known is None else known.parsed
        self._registry_schemas[schema_id] = writer
        return writer


def _has_zero_width_array(schema: ParsedSchema) -> bool:
    """Whether ``schema`` (a parsed schema: a named type is defined once, then named) holds an array
    whose items encode in zero bytes: null, a fixed of size 0, a record of nothing else."""
    named: dict[str, Any] = {}

    def define(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("record", "error", "fixed", "enum") and isinstance(node.get("name"), str):
                named.setdefault(node["name"], node)
            for value in node.values():
                define(value)
        elif isinstance(node, list):
            for value in node:
                define(value)

    def zero_width(node: object, seen: frozenset[str]) -> bool:
        if isinstance(node, str):
            if node == "null":
                return True
            target = named.get(node)
            return target is not None and node not in seen and zero_width(target, seen | {node})
        if not isinstance(node, dict):
            return False  # a union: its branch index takes a byte
        kind = node.get("type")
        if kind == "fixed":
            return node.get("size") == 0
        if kind in ("record", "error"):
            inner = seen | {node["name"]} if isinstance(node.get("name"), str) else seen
            return all(zero_width(f.get("type"), inner) for f in node.get("fields", ()))
        if isinstance(kind, str | dict) and kind not in ("array", "map", "enum"):
            return zero_width(kind, seen)  # {"type": "null"}, a logical type over a primitive
        return False

    def arrays(node: object) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "array" and zero_width(node.get("items"), frozenset()):
                return True
            return any(arrays(value) for value in node.values())
        if isinstance(node, list):
            return any(arrays(value) for value in node)
        return False

    define(schema)
    return arrays(schema)


class _Indexed(list[Any]):
    """An enum's symbols or a union's branches as the reader looks an index up in them: 0 to n - 1
    only.

    Avro writes an enum value as its symbol's index and a union value after its branch's index,
    both longs, and fastavro's compiled reader (1.13) looks them up in the writer's schema as Python
    indexes a list: -2 read as the second symbol from the end, so a corrupt or forged command's
    ``operation`` of -2 read as ``cancel``, and its ``expected_version`` branch -2 as null, dropping
    the version check, rather than failing as undecodable. The reader indexes anything but an exact
    list through the sequence protocol, which adds the sequence's length to a negative index first:
    a length of 0 leaves it negative, for ``__getitem__`` to refuse along with one past the end.
    Only the reader's copies of the writers' schemas hold these (:func:`_with_checked_indexes`);
    writing, validating and the reader's own schema use plain lists.
    """

    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int) and not 0 <= index < list.__len__(self):
            raise IndexError(f"enum or union index {index} is not between 0 and {list.__len__(self) - 1}")
        return list.__getitem__(self, index)


# Where a parsed schema holds a union (a list of branches): a field's type, an array's items, a
# map's values. Every other list in it is a record's fields, an enum's symbols or aliases.
_UNION_KEYS = ("type", "items", "values")


def _with_checked_indexes(schema: ParsedSchema) -> ParsedSchema:
    """A copy of a parsed writer schema whose enums' symbols and unions' branches are
    :class:`_Indexed` (the copy keeps the schema's shared and named types shared, as ``deepcopy``
    does). Parsed first if it is not: fastavro would parse the copy again on every read, and its
    parser takes the wrapped lists for empty ones."""
    if not isinstance(schema, dict) or not {"__fastavro_parsed", "__named_schemas"} <= schema.keys():
        # fastavro reads a schema as parsed only with both keys; without them it parses it again.
        schema = cast(ParsedSchema, parse_schema(schema, named_schemas={}))
    copied = copy.deepcopy(schema)
    seen: set[int] = set()

    def check(node: object) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, dict):
            if node.get("type") == "enum" and isinstance(node.get("symbols"), list):
                node["symbols"] = _Indexed(node["symbols"])
            for key in _UNION_KEYS:
                if isinstance(node.get(key), list):
                    node[key] = _Indexed(node[key])
            for value in node.values():
                check(value)
        elif isinstance(node, list):
            for value in node:
                check(value)

    check(copied)
    return copied


def _plain_copy(schema: ParsedSchema) -> ParsedSchema:
    return cast(ParsedSchema, _without_logical_types(schema))


def _without_logical_types(schema: object) -> object:
    """A copy of a parsed schema (fastavro's dicts and lists) in which no type has a ``logicalType``:
    fastavro converts a value by that key alone, so without it the plain long or string is read."""
    if isinstance(schema, dict):
        return {key: _without_logical_types(value) for key, value in schema.items() if key != "logicalType"}
    if isinstance(schema, list):
        return [_without_logical_types(value) for value in schema]
    return schema


def _misfit(schema: ParsedSchema, record: Mapping[str, Any], exc: Exception) -> str:
    """Which field of ``record`` does not fit ``schema``, never with its value: fastavro's own text
    quotes the whole record, a payload's secrets with it."""
    try:
        validate(_with_defaults(record, schema), schema, raise_errors=True)
    except ValidationError as invalid:
        # The deepest misfits are those whose schema is a type's name (a union's branches are tried
        # first, and the record as a whole fails with them); a union's "null" branch is no news.
        errors = [e for e in invalid.errors if e.field and e.schema != "null"]
        errors = [e for e in errors if isinstance(e.schema, str)] or errors
        reasons = []
        for error in errors:
            field = ".".join(str(error.field).split(".")[-2:])
            kind = error.schema if isinstance(error.schema, str) else None
            if isinstance(error.schema, dict) and error.schema.get("type") == "enum":
                kind = f"one of {', '.join(error.schema.get('symbols', ()))}"
            elif kind == "int":
                kind = "int (32 bits: -2147483648 to 2147483647)"
            reasons.append(f"{field} is not {kind}" if kind else f"{field} does not fit its schema")
        if reasons:
            return "; ".join(dict.fromkeys(reasons))
    except Exception:  # the validator failing too is no reason to lose the encode error
        pass
    text = str(exc)
    # fastavro's messages for a missing or an unknown field name the field alone.
    if text.startswith(("record contains more fields than the schema specifies", "Field ")):
        return text
    return f"a value does not fit its field's type ({type(exc).__name__})"


def _with_defaults(datum: object, schema: object) -> object:
    """``datum`` with the defaults of the record fields it leaves out, as the writer fills them
    (``strict_allow_default``): fastavro's validator stops at the first missing field."""
    if isinstance(schema, list):  # a union: a mapping datum is one of its records
        records = [branch for branch in schema if isinstance(branch, dict) and branch.get("type") == "record"]
        return _with_defaults(datum, records[0]) if len(records) == 1 else datum
    if not (isinstance(schema, dict) and schema.get("type") == "record" and isinstance(datum, Mapping)):
        return datum
    filled = dict(datum)
    for field in schema["fields"]:
        name = field["name"]
        if name in filled:
            filled[name] = _with_defaults(filled[name], field["type"])
        elif "default" in field:
            filled[name] = field["default"]
    return filled
