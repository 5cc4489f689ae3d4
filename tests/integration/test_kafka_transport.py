"""The Kafka guarantees the design leans on, checked against the real broker through the transport."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from scheduler.config import Settings
from scheduler.kafka.connection import KafkaConnection
from scheduler.kafka.transport import (
    Consumer,
    DeliveryError,
    KafkaUnavailable,
    Offset,
    OutgoingMessage,
    Partition,
    Producer,
    Received,
    TopicAdmin,
    consumer_config,
    producer_config,
)
from tests.support import wait_for, watermarks

pytestmark = pytest.mark.integration


def drain(consumer: Consumer, expected: int, timeout_s: float = 30.0) -> list[Received]:
    """Read until ``expected`` messages arrived, then keep reading briefly to catch extras."""
    received: list[Received] = []
    deadline = time.monotonic() + timeout_s
    while len(received) < expected and time.monotonic() < deadline:
        received.extend(consumer.consume(500, 0.5))
    # Anything beyond the expected count must show up within a few more empty polls.
    for _ in range(4):
        received.extend(consumer.consume(500, 0.5))
    return received


def high_watermarks(settings: Settings, topic: str, partitions: int) -> int:
    raw = RawConsumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"g-{uuid.uuid4()}"})
    try:
        return sum(
            high - low for low, high in (watermarks(raw, TopicPartition(topic, p)) for p in range(partitions))
        )
    finally:
        raw.close()


def test_idempotent_producer_acknowledges_every_message(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.acks"
    TopicAdmin(settings.kafka).ensure_topics([topic], partitions=4)
    producer = Producer(producer_config(settings.kafka, "test-acks"))
    producer.send([OutgoingMessage(topic, str(i).encode(), key=str(i).encode()) for i in range(2000)])
    assert high_watermarks(settings, topic, 4) == 2000


def test_delivery_failure_surfaces_as_an_error(settings: Settings) -> None:
    # The topic does not exist and the broker does not auto-create topics: nothing can be acked.
    producer = Producer(producer_config(settings.kafka, "test-fail", {"message.timeout.ms": 2000}))
    with pytest.raises(DeliveryError, match="1 of 1 messages not acknowledged") as raised:
        producer.send([OutgoingMessage(f"{settings.topic_prefix}.missing", b"x")], timeout_s=10)
    assert len(raised.value.failures) == 1 and not raised.value.too_large


def test_a_message_too_large_is_told_apart_whether_the_client_or_the_broker_refuses_it(
    settings: Settings,
) -> None:
    topic = f"{settings.topic_prefix}.small"
    TopicAdmin(settings.kafka).ensure_topics([topic], partitions=1, config={"max.message.bytes": "10000"})
    producer = Producer(producer_config(settings.kafka, "test-size", {"message.max.bytes": 100_000}))
    # Over the client's own limit: refused at once, no delivery report.
    with pytest.raises(DeliveryError) as refused:
        producer.produce(OutgoingMessage(topic, bytes(200_000)))
    assert refused.value.too_large and topic in str(refused.value)
    # Under the client's limit, over the topic's: the broker refuses it in the delivery report.
    outcomes: list[DeliveryError | None] = []
    producer.produce(OutgoingMessage(topic, os.urandom(50_000)), outcomes.append)  # incompressible
    assert producer.flush(30) == 0
    # Not in the same produce request: the broker refuses a record batch as a whole.
    producer.produce(OutgoingMessage(topic, b"fits"), outcomes.append)
    assert producer.flush(30) == 0
    assert len(outcomes) == 2 and outcomes[1] is None
    assert isinstance(outcomes[0], DeliveryError) and outcomes[0].too_large


def test_a_full_queue_served_from_another_thread_loses_nothing(settings: Settings) -> None:
    # The worker produces from its jobs thread while its main thread polls: with a queue this small
    # every produce() waits for room, polling from the producing thread at the same time.
    topic = f"{settings.topic_prefix}.full"
    TopicAdmin(settings.kafka).ensure_topics([topic], partitions=2)
    producer = Producer(
        producer_config(settings.kafka, "test-full", {"queue.buffering.max.messages": 5, "linger.ms": 0})
    )
    outcomes: list[DeliveryError | None] = []
    lock = threading.Lock()

    def delivered(error: DeliveryError | None) -> None:
        with lock:
            outcomes.append(error)

    def produce_all() -> None:
        for i in range(500):
            producer.produce(OutgoingMessage(topic, str(i).encode()), delivered)

    thread = threading.Thread(target=produce_all)
    thread.start()
    while thread.is_alive():
        producer.poll(0.01)
    thread.join()
    assert producer.flush(30) == 0
    assert len(outcomes) == 500 and all(o is None for o in outcomes)
    assert high_watermarks(settings, topic, 2) == 500


def test_received_messages_carry_key_headers_and_position(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.shape"
    TopicAdmin(settings.kafka).ensure_topics([topic], partitions=1)
    Producer(producer_config(settings.kafka, "p")).send(
        [OutgoingMessage(topic, b"v", b"k", [("traceparent", "00-abc"), ("empty", None)])]
    )
    consumer = Consumer(consumer_config(settings.kafka, f"g-{uuid.uuid4()}", "c"), [topic])
    try:
        [message] = drain(consumer, expected=1)
    finally:
        consumer.close()
    assert (message.topic, message.partition, message.offset, message.key, message.value) == (
        topic,
        0,
        0,
        b"k",
        b"v",
    )
    assert message.header("traceparent") == b"00-abc" and message.header("empty") is None
    assert message.header("missing") is None


def test_manual_commit_resumes_after_the_committed_offset(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.commits"
    TopicAdmin(settings.kafka).ensure_topics([topic], partitions=1)
    Producer(producer_config(settings.kafka, "p")).send(
        [OutgoingMessage(topic, str(i).encode()) for i in range(10)]
    )
    group = f"g-{uuid.uuid4()}"
    first = Consumer(consumer_config(settings.kafka, group, "c1"), [topic])
    got = drain(first, expected=10)
    assert [m.value for m in got] == [str(i).encode() for i in range(10)]
    # Commit only up to offset 4: the next member of the group must start at message 4.
    first.commit([Offset(topic, 0, 4)])
    first.close()
    first.close()  # a second close does nothing
    second = Consumer(consumer_config(settings.kafka, group, "c2"), [topic])
    try:
        assert [m.value for m in drain(second, expected=6)] == [str(i).encode() for i in range(4, 10)]
    finally:
        second.close()


def test_a_batch_bounded_in_bytes_ends_past_them_and_the_rest_follows_in_order(settings: Settings) -> None:
    """The ingestor's and the reconciler's batches end once their bytes pass the bound (holding at
    least one message, however large); what was read past it comes next, none lost or repeated."""
    topic = f"{settings.topic_prefix}.bytes"
    TopicAdmin(settings.kafka).ensure_topics([topic], partitions=1)
    sizes = [300_000] * 12 + [1_200_000] + [100] * 500
    Producer(producer_config(settings.kafka, "p")).send(
        [OutgoingMessage(topic, str(i).encode().ljust(size, b".")) for i, size in enumerate(sizes)]
    )
    consumer = Consumer(consumer_config(settings.kafka, f"g-{uuid.uuid4()}", "c"), [topic])
    batches: list[list[Received]] = []

    def all_read() -> bool:
        batches.append(consumer.consume(2000, 0.5, 1_000_000))
        return sum(map(len, batches)) >= len(sizes)

    try:
        wait_for(all_read, 60, "every message")
        batches.append(consumer.consume(2000, 0.5, 1_000_000))
    finally:
        consumer.close()
    got = [message for batch in batches for message in batch]
    assert [message.offset for message in got] == list(range(len(sizes)))
    assert [len(message.value) for message in got] == sizes
    for batch in batches:
        # Within the bound, but for the message that passed it (and a batch of one).
        assert len(batch) <= 1 or sum(len(m.value) for m in batch[:-1]) <= 1_000_000, [
            len(m.value) for m in batch
        ]
    assert [len(batch) for batch in batches if batch and len(batch[0].value) == 1_200_000] == [1]


def test_lag_is_the_distance_from_the_position_to_the_end_of_the_log(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.lag"
    TopicAdmin(settings.kafka).ensure_topics([topic], partitions=1)
    Producer(producer_config(settings.kafka, "p")).send(
        [OutgoingMessage(topic, str(i).encode()) for i in range(10)]
    )
    consumer = Consumer(consumer_config(settings.kafka, f"g-{uuid.uuid4()}", "c"), [topic])
    try:
        taken = wait_for(lambda: consumer.consume(4, 0.5), 30, "the first messages")
        assert [m.offset for m in taken] == list(range(len(taken)))
        lag = wait_for(consumer.lag, 10, "watermarks from a fetch response")
        assert lag == {Partition(topic, 0): 10 - len(taken)}
    finally:
        consumer.close()


def test_cooperative_rebalance_hands_over_partitions_through_the_callbacks(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.rebalance"
    TopicAdmin(settings.kafka).ensure_topics([topic], partitions=4)
    group = f"g-{uuid.uuid4()}"
    events: list[tuple[str, str, list[Partition], list[Partition]]] = []
    consumers: dict[str, Consumer] = {}

    def member(name: str) -> Consumer:
        def assigned(partitions: list[Partition]) -> None:
            # Assigned before the callback runs, so that it can pause what it was given.
            consumers[name].pause(partitions)
            events.append(("assign", name, partitions, consumers[name].assignment()))

        def revoked(partitions: list[Partition]) -> None:
            # Still assigned while the callback runs, so that it can commit what it finished.
            events.append(("revoke", name, partitions, consumers[name].assignment()))

        consumer = Consumer(
            consumer_config(settings.kafka, group, name), [topic], on_assign=assigned, on_revoke=revoked
        )
        consumers[name] = consumer
        return consumer

    first = member("first")
    wait_for(lambda: first.consume(1, 0.2) == [] and len(first.assignment()) == 4, 30, "all four partitions")
    second = member("second")

    def balanced() -> bool:
        first.poll(0.1)
        second.poll(0.1)
        return len(first.assignment()) == 2 and len(second.assignment()) == 2

    wait_for(balanced, 60, "two partitions each")
    assert set(first.assignment()) | set(second.assignment()) == {Partition(topic, p) for p in range(4)}
    revokes = [e for e in events if e[0] == "revoke" and e[1] == "first"]
    # Cooperative: the first member gives up only the two partitions that move, not all four.
    assert len(revokes) == 1 and len(revokes[0][2]) == 2
    assert set(revokes[0][2]) <= set(revokes[0][3])
    assert all(set(given) <= set(held) for kind, _, given, held in events if kind == "assign")
    second.close()
    first.close()


def test_ping_measures_a_round_trip_and_a_dead_cluster_is_unavailable(settings: Settings) -> None:
    assert 0 < TopicAdmin(settings.kafka).ping(5) < 5
    with pytest.raises(KafkaUnavailable, match="did not answer"):
        TopicAdmin(KafkaConnection("127.0.0.1:1"), quiet=True).ping(1)


def test_topics_asked_in_short_requests_until_the_timeout(settings: Settings) -> None:
    """What `scheduler produce` asks before it reads: the same topics as one long request, and from a
    dead cluster, KafkaUnavailable once the whole timeout has passed (not after the first request)."""
    admin = TopicAdmin(settings.kafka)
    topic = f"{settings.topic_prefix}.asked"
    admin.ensure_topics([topic])
    assert topic in admin.topics_interruptibly(10)
    started = time.monotonic()
    with pytest.raises(KafkaUnavailable, match="did not answer"):
        TopicAdmin(KafkaConnection("127.0.0.1:1"), quiet=True).topics_interruptibly(2.5)
    assert time.monotonic() - started >= 2.5


def test_a_failed_metadata_request_logs_why_kafka_did_not_answer(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The relay's first look at Kafka is a metadata request: a refused SASL handshake must be named,
    not only "Broker transport failure" (list_topics does not serve the client's error callback)."""
    sasl = KafkaConnection(
        settings.kafka_bootstrap,  # a PLAINTEXT listener: the handshake fails
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="someone",
        sasl_password="not-shown-anywhere",
    )
    caplog.set_level(logging.WARNING, logger="scheduler.kafka.transport")
    with pytest.raises(KafkaUnavailable):
        # A name of its own: errors are logged once a minute per client name and kind.
        TopicAdmin(sasl, client_id=f"sasl-{uuid.uuid4().hex[:8]}", logs_why=True).topics(5.0)
    said = " ".join(record.getMessage() for record in caplog.records)
    assert "SASL" in said, said
    assert "not-shown-anywhere" not in said


def test_clients_of_one_name_share_one_log_of_errors() -> None:
    """A worker's consumer and producer share a name, and a broker they both cannot reach reached
    each: one log of errors per name says it once a minute, not once per client."""
    connection = KafkaConnection("127.0.0.1:1")
    name = f"same-name-{uuid.uuid4().hex[:8]}"
    producing = producer_config(connection, name)["error_cb"]
    consuming = consumer_config(connection, "group", name)["error_cb"]
    assert producing is consuming
    assert producer_config(connection, f"{name}-other")["error_cb"] is not producing


def test_a_quiet_admin_says_nothing_of_a_cluster_that_does_not_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`dev up` and `dev status` probe a cluster that may not be up yet: that is no warning."""
    caplog.set_level(logging.WARNING, logger="scheduler.kafka.transport")
    with pytest.raises(KafkaUnavailable):
        # Long enough for librdkafka's first connection attempt and its error; a name of its own.
        TopicAdmin("127.0.0.1:1", quiet=True, client_id=f"quiet-{uuid.uuid4().hex[:8]}", logs_why=True).ping(
            3.0
        )
    assert [r.getMessage() for r in caplog.records if r.name == "scheduler.kafka.transport"] == []
