"""Per-partition commit watermarks: the worker commits an offset only when every job at or below it
has its outcome acknowledged by Kafka.

Jobs finish out of order (up to ``--concurrency`` run at once), so the committable offset of a
partition is the end of the contiguous run of finished offsets from the last commit. A crash
re-delivers everything above it; nothing below it is ever unfinished.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class PartitionProgress:
    _outstanding: deque[int] = field(default_factory=deque)
    _finished: set[int] = field(default_factory=set)
    committable: int | None = None  # the next offset to read, as Kafka's commit wants it
    committed: int | None = None

    def started(self, offset: int) -> None:
        # A partition delivers offsets in increasing order, so the deque stays sorted.
        self._outstanding.append(offset)

    def finished(self, offset: int) -> None:
        self._finished.add(offset)
        while self._outstanding and self._outstanding[0] in self._finished:
            done = self._outstanding.popleft()
            self._finished.discard(done)
            self.committable = done + 1

    @property
    def in_flight(self) -> int:
        return len(self._outstanding)


class Progress:
    """The watermarks of every partition this worker is assigned."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], PartitionProgress] = {}

    def started(self, topic: str, partition: int, offset: int) -> None:
        self._partitions.setdefault((topic, partition), PartitionProgress()).started(offset)

    def finished(self, topic: str, partition: int, offset: int) -> None:
        progress = self._partitions.get((topic, partition))
        # A partition revoked meanwhile: its new owner re-delivers this job, nothing to commit here.
        if progress is not None:
            progress.finished(offset)

    def to_commit(self) -> list[tuple[str, int, int]]:
        """(topic, partition, offset) for every partition whose watermark moved since the last call."""
        moves = []
        for (topic, partition), progress in self._partitions.items():
            if progress.committable is not None and progress.committable != progress.committed:
                moves.append((topic, partition, progress.committable))
                progress.committed = progress.committable
        return moves

    def forget(self, topic: str, partition: int) -> None:
        self._partitions.pop((topic, partition), None)

    def in_flight(self) -> int:
        return sum(p.in_flight for p in self._partitions.values())
