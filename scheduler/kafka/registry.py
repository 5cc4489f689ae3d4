"""The Confluent Schema Registry, for deployments that set ``SCHEDULER_SCHEMA_REGISTRY_URL``.

Without a registry every message is in Avro single-object encoding and needs nothing from here.
With one, producers register the current schema of what they write under the topic's subject
(``<topic>-value``, Confluent's TopicNameStrategy) and frame messages with the id it returns
(``00``, 4-byte big-endian id, body), while consumers look the writer's schema up by that id. Both
go through ``confluent_kafka.schema_registry.SchemaRegistryClient``, which caches each answer.
:class:`~scheduler.kafka.avro.AvroCodec` itself decodes both framings by their first byte; this
module only supplies the ids and the lookup.

A registry that cannot be reached raises :class:`RegistryUnavailable`, never ``LookupError``: the
message is probably fine and must be retried, whereas an id the registry does not know is the
message's fault and rejects it.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import TYPE_CHECKING

from fastavro.schema import parse_schema

from scheduler.kafka.avro import AvroSchema, ParsedSchema, SchemaCatalog, default_catalog

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

_NOT_FOUND = 404


class RegistryUnavailable(RuntimeError):
    """The schema registry did not answer, or answered with a server error."""


def subject_for(topic: str) -> str:
    """The subject of a topic's values under Confluent's default TopicNameStrategy."""
    return f"{topic}-value"


class SchemaRegistry:
    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        # Imported only here: the registry's client brings an HTTP and OAuth stack that takes a
        # quarter of a second to import, which every command of the CLI paid without a registry.
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        self.url = url
        self._refused = SchemaRegistryError
        # Few retries: the ingestor retries the whole batch with its own backoff anyway.
        self._client: SchemaRegistryClient = SchemaRegistryClient(
            {"url": url, "timeout": timeout_s, "max.retries": 1}
        )

    def register(self, schema: AvroSchema, subject: str) -> int:
        """The registry's id of ``schema`` under ``subject``, registering it if it is new there."""
        from confluent_kafka.schema_registry import Schema

        try:
            return int(self._client.register_schema(subject, Schema(schema.definition, "AVRO")))
        except self._refused as exc:
            raise RegistryUnavailable(f"schema registry {self.url} refused {schema.name}: {exc}") from exc
        except Exception as exc:  # the HTTP client's errors: connection refused, timeout, bad JSON
            raise RegistryUnavailable(f"schema registry {self.url} is unreachable: {exc}") from exc

    def schema_for_id(self, schema_id: int) -> ParsedSchema:
        """The parsed schema registered under ``schema_id``: a :data:`~scheduler.kafka.avro.SchemaLookup`.

        Raises ``LookupError`` for an id the registry does not have or that is not an Avro schema.
        """
        try:
            registered = self._client.get_schema(schema_id)
        except self._refused as exc:
            if exc.http_status_code == _NOT_FOUND:
                raise LookupError(f"schema id {schema_id} is not registered") from exc
            raise RegistryUnavailable(f"schema registry {self.url} failed for id {schema_id}: {exc}") from exc
        except Exception as exc:
            raise RegistryUnavailable(f"schema registry {self.url} is unreachable: {exc}") from exc
        if (registered.schema_type or "AVRO") != "AVRO" or registered.schema_str is None:
            raise LookupError(f"schema id {schema_id} is a {registered.schema_type} schema, not Avro")
        try:
            parsed = parse_schema(json.loads(registered.schema_str), named_schemas={})
        except Exception as exc:  # json and fastavro raise several types for a bad schema
            raise LookupError(f"schema id {schema_id} is not a valid Avro schema: {exc}") from exc
        if not isinstance(parsed, dict):
            raise LookupError(f"schema id {schema_id} is not a record schema")
        return parsed


class Framing:
    """How one producer frames one record type on one topic.

    ``schema_id`` is None for single-object encoding (no registry configured); otherwise the
    registry's id of the current schema, registered on first use and then remembered.
    """

    def __init__(
        self,
        registry: SchemaRegistry | None,
        schema_name: str,
        topic: str,
        catalog: SchemaCatalog | None = None,
    ) -> None:
        self.registry = registry
        self.schema = (catalog or default_catalog()).current(schema_name)
        self.topic = topic

    @cached_property
    def schema_id(self) -> int | None:
        if self.registry is None:
            return None
        return self.registry.register(self.schema, subject_for(self.topic))


def registry_for(url: str | None) -> SchemaRegistry | None:
    return None if url is None else SchemaRegistry(url)
