"""When a created topic counts as ready: listed, with a leader for every partition (not_led)."""

from __future__ import annotations

from confluent_kafka import KafkaError
from confluent_kafka.admin import PartitionMetadata, TopicMetadata  # type: ignore[attr-defined]

from scheduler.kafka.transport import not_led


def topic(name: str, leaders: dict[int, int], error: KafkaError | None = None) -> TopicMetadata:
    """Metadata as the admin client returns it: partition id -> leader broker id (-1: none)."""
    meta = TopicMetadata()
    meta.topic, meta.error = name, error
    for pid, leader in leaders.items():
        partition = PartitionMetadata()
        partition.id, partition.leader = pid, leader
        meta.partitions[pid] = partition
    return meta


def test_a_topic_whose_partitions_all_have_leaders_is_ready() -> None:
    assert not_led({"a.jobs": topic("a.jobs", {0: 1, 1: 2, 2: 1})}, ["a.jobs"]) == []


def test_a_topic_not_listed_yet_is_named() -> None:
    assert not_led({}, ["a.jobs"]) == ["topic a.jobs is not listed"]


def test_partitions_without_a_leader_are_named_and_the_led_ones_are_not() -> None:
    listed = {"a.jobs": topic("a.jobs", {0: 1, 1: -1, 2: -1}), "a.dlq": topic("a.dlq", {0: 1})}
    assert not_led(listed, ["a.jobs", "a.dlq"]) == ["topic a.jobs has no leader for partitions [1, 2]"]


def test_a_topic_listed_with_an_error_or_without_partitions_is_not_ready() -> None:
    listed = {
        "a.jobs": topic("a.jobs", {}, KafkaError(KafkaError.LEADER_NOT_AVAILABLE)),
        "a.retry": topic("a.retry", {}),
    }
    pending = not_led(listed, ["a.jobs", "a.retry"])
    assert pending[0].startswith("topic a.jobs is listed with an error (")
    assert pending[1] == "topic a.retry has no partitions"


def test_only_the_topics_asked_about_count() -> None:
    assert not_led({"other": topic("other", {0: -1})}, []) == []
