"""What the chaos report reads from Kafka with a client of its own, outside the pipeline: a
consumer group's committed offsets against the partitions' ends, the dead letters on ``.dlq``, and
how often each job was published.

Neither joins a group: ``committed`` asks the group coordinator, and the reader is assigned its
partitions, so the workers' group is looked at, never changed.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from scheduler.kafka.avro import AvroCodec, MessageDecodeError
from scheduler.kafka.messages import JobDeadLetter, JobMessage


def group_lag(bootstrap: str, group: str, topic: str, timeout_s: float = 20.0) -> dict[int, int]:
    """Per partition of ``topic``: its end offset minus what ``group`` committed there (the whole
    partition when the group never committed on it)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
        lag: dict[int, int] = {}
        for tp in committed:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=timeout_s, cached=False
            )
            position = tp.offset if tp.offset is not None and tp.offset >= 0 else low
            lag[tp.partition] = max(0, high - position)
        return lag
    finally:
        consumer.close()


def _values(bootstrap: str, topic: str, timeout_s: float) -> Iterator[bytes]:
    """Every message value on ``topic``, from the beginning to the ends as they are now."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-report-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "log_level": 2,
            # A job carries up to a 1 MiB payload, and a worker's dead letter the job besides.
            "fetch.message.max.bytes": 16 * 1024 * 1024,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in partitions
        }
        remaining = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error():
                    continue
                partition, offset = message.partition(), message.offset()
                if partition is not None and offset is not None and offset + 1 >= ends[partition]:
                    remaining.discard(partition)
                yield message.value() or b""
        if remaining:
            raise TimeoutError(f"could not read {topic} to its end within {timeout_s:.0f} s")
    finally:
        consumer.close()


def dead_letter_runs(bootstrap: str, topic: str, timeout_s: float = 60.0) -> dict[str, set[uuid.UUID]]:
    """The run ids on the dead-letter topic, by who wrote the letter (``worker`` or ``sweeper``),
    plus ``undecodable`` letters (no run) counted as ids of their own."""
    codec = AvroCodec()
    found: dict[str, set[uuid.UUID]] = {"worker": set(), "sweeper": set(), "undecodable": set()}
    for value in _values(bootstrap, topic, timeout_s):
        try:
            letter = codec.decode(JobDeadLetter, value)
        except MessageDecodeError:
            found["undecodable"].add(uuid.uuid4())
            continue
        if letter.run_id is None:
            found["undecodable"].add(uuid.uuid4())
        else:
            found["worker" if letter.worker is not None else "sweeper"].add(letter.run_id)
    return found


def job_messages(bootstrap: str, topic: str, timeout_s: float = 120.0) -> Counter[tuple[str, int]]:
    """How many times each (run, attempt) was published on an app's job topic: more than once
    when a relay died between publishing a batch and recording it (its claim lapses, another relay
    publishes the rows again)."""
    codec = AvroCodec()
    published: Counter[tuple[str, int]] = Counter()
    for value in _values(bootstrap, topic, timeout_s):
        try:
            job = codec.decode(JobMessage, value)
        except MessageDecodeError:
            continue
        published[(str(job.run_id), job.attempt)] += 1
    return published
