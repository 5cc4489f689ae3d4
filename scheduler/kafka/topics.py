"""What every topic the scheduler creates is configured with, and the one way to create or upgrade it.

Everything validation accepts must be deliverable: a 1 MiB payload becomes a job message (with
the schedule's fields and the attempt history), and its dead letter carries that job's bytes again
with the errors of every attempt. Broker and topic defaults (about 1 MB) refuse those, so each
topic is created with room for any record batch the producers build, and a topic created before
this setting existed is raised to it (never lowered) by the same call: ``scheduler init`` and
``scheduler apps create`` upgrade a cluster. Consumers need nothing: librdkafka returns a batch
larger than its fetch sizes anyway and grows them until the message fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from scheduler.kafka.transport import (
    DEFAULT_MAX_MESSAGE_BYTES,
    TopicAdmin,
    TransportError,
    _from_exception,
)

MAX_MESSAGE_BYTES_KEY = "max.message.bytes"
# The producers refuse a single message over DEFAULT_MAX_MESSAGE_BYTES (4 MiB, three times the
# largest the scheduler writes: a dead letter of a 1 MiB payload after 100 attempts is about
# 1.3 MiB). A record batch may exceed the producer's limit by one message (librdkafka's framing
# estimate), and the broker refuses a batch as a whole, so the topic allows twice the limit:
# whatever a producer accepts, the broker accepts too.
TOPIC_MAX_MESSAGE_BYTES = 2 * DEFAULT_MAX_MESSAGE_BYTES
TOPIC_CONFIG = {MAX_MESSAGE_BYTES_KEY: str(TOPIC_MAX_MESSAGE_BYTES)}


def ensure_sized_topics(
    admin: TopicAdmin, names: Sequence[str], partitions: int, timeout_s: float = 30.0
) -> tuple[list[str], list[str]]:
    """Create the missing topics with :data:`TOPIC_CONFIG`, raise the message limit of existing
    ones that allow less; returns (created, resized)."""
    created = admin.ensure_topics(names, partitions=partitions, config=TOPIC_CONFIG, timeout_s=timeout_s)
    existing = [name for name in names if name not in created]
    return created, _raise_message_limits(admin, existing, timeout_s)


def _raise_message_limits(admin: TopicAdmin, names: Iterable[str], timeout_s: float) -> list[str]:
    # TopicAdmin's own client: transport.py decides how clients are configured (TLS, SASL), this
    # module what topics are configured with.
    client = admin._admin
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    if not resources:
        return []
    small = []
    for resource, future in client.describe_configs(resources, request_timeout=timeout_s).items():
        entries = _result(future, f"reading the configuration of topic {resource.name}")
        entry = entries.get(MAX_MESSAGE_BYTES_KEY)
        if entry is None or int(entry.value) < TOPIC_MAX_MESSAGE_BYTES:
            small.append(resource.name)
    if not small:
        return []
    changes = [
        ConfigResource(
            ResourceType.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(
                    MAX_MESSAGE_BYTES_KEY,
                    str(TOPIC_MAX_MESSAGE_BYTES),
                    incremental_operation=AlterConfigOpType.SET,
                )
            ],
        )
        for name in small
    ]
    for resource, future in client.incremental_alter_configs(changes, request_timeout=timeout_s).items():
        _result(future, f"raising {MAX_MESSAGE_BYTES_KEY} of topic {resource.name}")
    return sorted(small)


def _result(future: Future[Any], what: str) -> Any:
    try:
        return future.result()
    except KafkaException as exc:
        raise _from_exception(TransportError, f"{what} failed: ", exc) from None
