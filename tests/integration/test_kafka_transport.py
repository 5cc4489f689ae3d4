"""The Kafka guarantees the design leans on, checked against the real broker."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from scheduler.config import Settings
from scheduler.kafka.transport import (
    Consumer,
    DeliveryError,
    OutgoingMessage,
    Producer,
    TopicAdmin,
    TransactionalProducer,
    consumer_config,
    producer_config,
)

pytestmark = pytest.mark.integration


def drain(consumer: Consumer, expected: int, timeout_s: float = 30.0) -> list[bytes]:
    """Read until ``expected`` messages arrived, then keep reading briefly to catch extras."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < expected and time.monotonic() < deadline:
        values.extend(m.value() for m in consumer.poll_batch(500, 0.5))
    # Anything beyond the expected count must show up within a few more empty polls.
    for _ in range(4):
        values.extend(m.value() for m in consumer.poll_batch(500, 0.5))
    return values


def test_read_committed_consumer_sees_exactly_the_committed_batch(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.tx"
    TopicAdmin(settings.kafka_bootstrap).ensure_topics([topic], partitions=3)
    producer = TransactionalProducer(
        producer_config(settings.kafka_bootstrap, "test-tx"), transactional_id=f"tx-{uuid.uuid4()}"
    )
    producer.begin()
    for i in range(50):
        producer.produce(OutgoingMessage(topic, f"committed-{i}".encode(), key=str(i).encode()))
    producer.commit()
    producer.begin()
    for i in range(50):
        producer.produce(OutgoingMessage(topic, f"aborted-{i}".encode(), key=str(i).encode()))
    producer.abort()
    # A marker after the aborted batch proves the consumer read past it rather than stopping short.
    producer.begin()
    producer.produce(OutgoingMessage(topic, b"after-abort"))
    producer.commit()

    consumer = Consumer(consumer_config(settings.kafka_bootstrap, f"g-{uuid.uuid4()}", "test"), [topic])
    try:
        values = drain(consumer, expected=51)
    finally:
        consumer.close()
    assert sorted(values) == sorted([f"committed-{i}".encode() for i in range(50)] + [b"after-abort"])


def test_idempotent_producer_acknowledges_every_message(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.acks"
    admin = TopicAdmin(settings.kafka_bootstrap)
    admin.ensure_topics([topic], partitions=4)
    producer = Producer(producer_config(settings.kafka_bootstrap, "test-acks"))
    producer.send([OutgoingMessage(topic, str(i).encode(), key=str(i).encode()) for i in range(2000)])

    raw = RawConsumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"g-{uuid.uuid4()}"})
    try:
        total = 0
        for partition in range(4):
            low, high = raw.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            total += high - low
    finally:
        raw.close()
    assert total == 2000


def test_delivery_failure_surfaces_as_an_error(settings: Settings) -> None:
    # The topic does not exist and the broker does not auto-create topics: nothing can be acked.
    producer = Producer(producer_config(settings.kafka_bootstrap, "test-fail", {"message.timeout.ms": 2000}))
    with pytest.raises(DeliveryError, match="not acknowledged"):
        producer.send([OutgoingMessage(f"{settings.topic_prefix}.missing", b"x")], timeout_s=10)


def test_manual_commit_resumes_after_the_committed_offset(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.commits"
    TopicAdmin(settings.kafka_bootstrap).ensure_topics([topic], partitions=1)
    Producer(producer_config(settings.kafka_bootstrap, "p")).send(
        [OutgoingMessage(topic, str(i).encode()) for i in range(10)]
    )
    group = f"g-{uuid.uuid4()}"
    first = Consumer(consumer_config(settings.kafka_bootstrap, group, "c1"), [topic])
    got = drain(first, expected=10)
    assert got == [str(i).encode() for i in range(10)]
    # Commit only up to offset 4: the next member of the group must start at message 4.
    first.commit([TopicPartition(topic, 0, 4)])
    first.close()
    second = Consumer(consumer_config(settings.kafka_bootstrap, group, "c2"), [topic])
    try:
        assert drain(second, expected=6) == [str(i).encode() for i in range(4, 10)]
    finally:
        second.close()
