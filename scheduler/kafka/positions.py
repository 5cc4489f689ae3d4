"""Where a consumer group stands on its topics, read from outside the group.

The lease sweeper may give up on a run only once the reconciler has read every outcome that was on
the outcome topics when it looked: otherwise a success still unread in ``.results`` (reconciler
downtime, lag) would look like a silent worker. :class:`GroupPositions` answers that with the admin
API alone: the end of each partition (what a ``read_committed`` reader can read now) and the offsets
the group committed. It never joins the group, so asking costs the group no rebalance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from scheduler.kafka.connection import KafkaConnection
from scheduler.kafka.transport import KafkaUnavailable, Partition, TransportError, _base_config

# librdkafka's "no offset" (a partition the group never committed).
_NO_OFFSET = -1001


class GroupPositions:
    """The end offsets of ``topics`` and what consumer group ``group`` committed on them."""

    def __init__(
        self,
        connection: KafkaConnection,
        group: str,
        topics: Sequence[str],
        client_id: str,
        timeout_s: float = 5.0,
    ) -> None:
        self.group = group
        self.topics = tuple(topics)
        self.timeout_s = timeout_s
        self._admin = AdminClient(_base_config(connection, client_id))

    def ends(self) -> dict[Partition, int]:
        """Per partition of the topics, the offset a reader that read everything there now would
        commit (the last stable offset: the high watermark, short of open transactions). A topic
        that does not exist has no partitions, hence nothing to read."""
        return self._offsets(OffsetSpec.latest(), self._partitions())  # type: ignore[no-untyped-call]

    def unread(self, ends: Mapping[Partition, int]) -> dict[Partition, int]:
        """Per partition of ``ends`` that the group has not consumed up to its end, how many of
        those messages it has not committed yet. Empty: the group has read everything up to ``ends``.

        A partition the group never committed (or committed below what retention kept) counts from
        the partition's first offset, where the group would start reading it.
        """
        committed = self._committed(list(ends))
        behind = {p: end for p, end in ends.items() if committed.get(p, _NO_OFFSET) < end}
        if not behind:
            return {}
        starts = self._offsets(OffsetSpec.earliest(), list(behind))  # type: ignore[no-untyped-call]
        unread = {p: end - max(committed.get(p, _NO_OFFSET), starts.get(p, 0)) for p, end in behind.items()}
        return {p: n for p, n in unread.items() if n > 0}

    def _partitions(self) -> list[Partition]:
        try:
            metadata = self._admin.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            raise KafkaUnavailable(f"Kafka did not answer a metadata request: {exc}") from None
        partitions: list[Partition] = []
        for topic in self.topics:
            found = metadata.topics.get(topic)
            if found is not None and found.error is None:
                partitions.extend(Partition(topic, p) for p in found.partitions)
        return sorted(partitions)

    def _offsets(self, spec: Any, partitions: Sequence[Partition]) -> dict[Partition, int]:
        if not partitions:
            return {}
        futures = self._admin.list_offsets(
            {TopicPartition(p.topic, p.partition): spec for p in partitions},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=self.timeout_s,
        )
        offsets = {}
        for tp, future in futures.items():
            offsets[Partition(tp.topic, tp.partition)] = int(_result(future, "listing offsets").offset)
        return offsets

    def _committed(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        if not partitions:
            return {}
        request = ConsumerGroupTopicPartitions(
            self.group, [TopicPartition(p.topic, p.partition) for p in partitions]
        )
        futures = self._admin.list_consumer_group_offsets([request], request_timeout=self.timeout_s)
        committed: dict[Partition, int] = {}
        for future in futures.values():
            for tp in _result(future, f"reading the offsets of group {self.group}").topic_partitions:
                if tp.error is not None:
                    raise TransportError(
                        f"reading the offset of {tp.topic}[{tp.partition}] for {self.group}: {tp.error}"
                    )
                committed[Partition(tp.topic, tp.partition)] = int(tp.offset)
        return committed


def _result(future: Any, what: str) -> Any:
    try:
        return future.result()
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        code = err.name() if err is not None and hasattr(err, "name") else None
        raise KafkaUnavailable(f"{what} failed: {exc}", code=code) from None
