"""A thin, typed layer over confluent-kafka: the producers, the consumer and topic admin.

Every client is configured here and only here (librdkafka keys rendered from :class:`Settings`),
so delivery guarantees are decided in one place: producers are idempotent with ``acks=all`` and a
failed delivery raises :class:`DeliveryError` instead of vanishing in a callback; consumers never
auto-commit and read only committed transactional data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer as _Consumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Producer as _Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]


class DeliveryError(RuntimeError):
    """Kafka did not acknowledge every message of a batch; none of it may be treated as sent."""


class KafkaUnavailable(RuntimeError):
    """The cluster did not answer in time."""


@dataclass(frozen=True)
class OutgoingMessage:
    topic: str
    value: bytes
    key: bytes | None = None
    headers: Headers = field(default_factory=list)


def _base_config(bootstrap: str, client_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "socket.keepalive.enable": True,
        # librdkafka logs reconnect attempts at error level; ours are reported by our own errors.
        "log_level": 3,
    }


def producer_config(
    bootstrap: str, client_id: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    config = _base_config(bootstrap, client_id) | {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 500_000,
        "message.timeout.ms": 30_000,
    }
    return config | dict(overrides or {})


def consumer_config(
    bootstrap: str, group_id: str, client_id: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    config = _base_config(bootstrap, client_id) | {
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "partition.assignment.strategy": "cooperative-sticky",
        "fetch.wait.max.ms": 50,
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
    }
    return config | dict(overrides or {})


class Producer:
    """An idempotent producer (acks=all) whose ``send`` returns only once Kafka acknowledged."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._producer = _Producer(dict(config))

    def send(self, messages: Sequence[OutgoingMessage], timeout_s: float = 60.0) -> None:
        """Produce a batch and wait for every acknowledgement; raise :class:`DeliveryError` otherwise."""
        failures: list[str] = []
        acked = 0

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            nonlocal acked
            if err is None:
                acked += 1
            else:
                failures.append(str(err))

        for message in messages:
            self._produce(message, on_delivery)
        remaining = self._producer.flush(timeout_s)
        if failures or remaining or acked != len(messages):
            first = failures[0] if failures else f"{remaining} still unacknowledged after {timeout_s:.0f} s"
            raise DeliveryError(
                f"{len(messages) - acked} of {len(messages)} messages not acknowledged: {first}"
            )

    def _produce(self, message: OutgoingMessage, on_delivery: Any) -> None:
        while True:
            try:
                self._producer.produce(
                    message.topic,
                    value=message.value,
                    key=message.key,
                    headers=message.headers or None,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                # The local queue is full: serve delivery reports to make room, then try again.
                self._producer.poll(0.05)

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)


class TransactionalProducer:
    """Exactly-once batches: everything produced between begin and commit appears, or none of it."""

    def __init__(self, config: Mapping[str, Any], transactional_id: str, timeout_s: float = 30.0) -> None:
        self._producer = _Producer(dict(config) | {"transactional.id": transactional_id})
        self._timeout_s = timeout_s
        self._producer.init_transactions(timeout_s)

    def begin(self) -> None:
        self._producer.begin_transaction()

    def produce(self, message: OutgoingMessage) -> None:
        while True:
            try:
                self._producer.produce(
                    message.topic, value=message.value, key=message.key, headers=message.headers or None
                )
                return
            except BufferError:
                self._producer.poll(0.05)

    def send_offsets(self, offsets: Sequence[TopicPartition], consumer: Consumer) -> None:
        self._producer.send_offsets_to_transaction(list(offsets), consumer.group_metadata(), self._timeout_s)

    def commit(self) -> None:
        self._producer.commit_transaction(self._timeout_s)

    def abort(self) -> None:
        self._producer.abort_transaction(self._timeout_s)


class Consumer:
    """A consumer with manual commits: an offset is committed only when the caller says so."""

    def __init__(self, config: Mapping[str, Any], topics: Sequence[str]) -> None:
        self._consumer = _Consumer(dict(config))
        self._consumer.subscribe(list(topics))

    def poll_batch(self, max_messages: int, timeout_s: float) -> list[Message]:
        """Up to ``max_messages`` messages; transport errors raise, partition EOF is skipped."""
        messages = self._consumer.consume(max_messages, timeout_s)
        good = []
        for message in messages:
            err = message.error()
            if err is None:
                good.append(message)
            elif err.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(err)
        return good

    def commit(self, offsets: Sequence[TopicPartition]) -> None:
        """Synchronously commit ``offsets`` (each the next offset to read, as Kafka expects)."""
        if offsets:
            self._consumer.commit(offsets=list(offsets), asynchronous=False)

    def group_metadata(self) -> Any:
        return self._consumer.consumer_group_metadata()

    def assignment(self) -> list[TopicPartition]:
        return list(self._consumer.assignment())

    def close(self) -> None:
        self._consumer.close()


class TopicAdmin:
    def __init__(self, bootstrap: str) -> None:
        self._admin = AdminClient(_base_config(bootstrap, "scheduler-admin"))

    def ensure_topics(
        self,
        names: Iterable[str],
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> list[str]:
        """Create the topics that do not exist yet; returns the ones created now."""
        existing = self.topics(timeout_s)
        wanted = [n for n in names if n not in existing]
        if not wanted:
            return []
        futures = self._admin.create_topics(
            [
                NewTopic(n, num_partitions=partitions, replication_factor=-1, config=dict(config or {}))
                for n in wanted
            ],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        created = []
        for name, future in futures.items():
            try:
                future.result()
                created.append(name)
            except KafkaException as exc:
                # Another process created it between our look and our create: that is what we wanted.
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        self._wait_visible(wanted, timeout_s)
        return created

    def _wait_visible(self, names: Sequence[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if set(names) <= self.topics(timeout_s):
                return
            time.sleep(0.05)
        raise KafkaUnavailable(f"topics {sorted(names)} not visible after {timeout_s:.0f} s")

    def topics(self, timeout_s: float = 10.0) -> set[str]:
        try:
            metadata = self._admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise KafkaUnavailable(f"Kafka did not answer a metadata request: {exc}") from exc
        return {name for name in metadata.topics if not name.startswith("__")}

    def partitions(self, topic: str, timeout_s: float = 10.0) -> int:
        metadata = self._admin.list_topics(topic, timeout=timeout_s)
        return len(metadata.topics[topic].partitions)

    def delete_topics(self, names: Sequence[str], timeout_s: float = 30.0) -> None:
        if not names:
            return
        for future in self._admin.delete_topics(list(names), operation_timeout=timeout_s).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
