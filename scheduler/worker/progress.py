"""Per-partition commit watermarks: the worker commits an offset only when every job at or below it
has its outcome acknowledged by Kafka, and counts a commit as done only once Kafka confirmed it.

Jobs finish out of order (up to ``--concurrency`` run at once), so the committable offset of a
partition is the end of the contiguous run of finished offsets. A crash re-delivers everything
above the last confirmed commit; nothing below it is ever unfinished.

Commits go out asynchronously while the worker runs. One is *sent* until Kafka's answer arrives:
confirmed, it moves the partition's confirmed offset; failed (a broker restart, a rebalance), or
unanswered for :data:`RESEND_AFTER_S`, it is sent again by a later round. The final commit of a
drain, a stop or a revoke is synchronous and covers every partition whose committable offset is
ahead of what Kafka confirmed, whether or not it moved lately, so that after a drain the group's
committed offsets equal what the worker finished.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

# A commit whose answer never came (its consumer was rebuilt meanwhile) is not waited for forever.
RESEND_AFTER_S = 5.0

Key = tuple[str, int]
"""(topic, partition)."""


@dataclass
class PartitionProgress:
    _outstanding: deque[int] = field(default_factory=deque)
    _finished: set[int] = field(default_factory=set)
    committable: int | None = None  # the next offset to read, as Kafka's commit wants it
    confirmed: int | None = None  # the last commit Kafka confirmed
    sent: int | None = None  # an asynchronous commit awaiting Kafka's answer
    sent_at: float = 0.0

    def started(self, offset: int) -> None:
        # A partition delivers offsets in increasing order, so the deque stays sorted. One at or
        # below the tail means the partition is read again from an earlier point (a rebuilt
        # consumer resumes from the committed offset): everything outstanding comes again, so the
        # partition starts afresh at this offset.
        if self._outstanding and offset <= self._outstanding[-1]:
            self._outstanding.clear()
            self._finished.clear()
        self._outstanding.append(offset)

    def finished(self, offset: int) -> None:
        if not self._outstanding or offset < self._outstanding[0]:
            return  # finished before (a redelivered outcome report): nothing moves
        self._finished.add(offset)
        while self._outstanding and self._outstanding[0] in self._finished:
            done = self._outstanding.popleft()
            self._finished.discard(done)
            # Never backwards: offsets read again below it were finished already.
            if self.committable is None or done + 1 > self.committable:
                self.committable = done + 1

    @property
    def ahead(self) -> bool:
        """Whether finished work is not yet confirmed as committed."""
        return self.committable is not None and (self.confirmed is None or self.committable > self.confirmed)

    @property
    def in_flight(self) -> int:
        """Jobs fetched and not finished."""
        return len(self._outstanding) - len(self._finished)


class Progress:
    """The watermarks of every partition this worker is assigned. One thread only (the consumer's)."""

    def __init__(self) -> None:
        self._partitions: dict[Key, PartitionProgress] = {}

    def started(self, topic: str, partition: int, offset: int) -> None:
        self._partitions.setdefault((topic, partition), PartitionProgress()).started(offset)

    def finished(self, topic: str, partition: int, offset: int) -> None:
        progress = self._partitions.get((topic, partition))
        # A partition revoked meanwhile: its new owner re-delivers this job, nothing to commit here.
        if progress is not None:
            progress.finished(offset)

    def to_commit(self, now: float) -> list[tuple[str, int, int]]:
        """(topic, partition, offset) to commit asynchronously now, each marked sent at ``now``:
        the partitions ahead of their confirmed commit, unless that very offset is already on its
        way (sent less than :data:`RESEND_AFTER_S` ago and not failed)."""
        moves = []
        for (topic, partition), progress in self._partitions.items():
            if not progress.ahead:
                continue
            assert progress.committable is not None
            if progress.sent == progress.committable and now - progress.sent_at < RESEND_AFTER_S:
                continue
            progress.sent, progress.sent_at = progress.committable, now
            moves.append((topic, partition, progress.committable))
        return moves

    def behind(self, partitions: Collection[Key] | None = None) -> list[tuple[str, int, int]]:
        """For a synchronous commit: (topic, partition, committable) of every partition (of
        ``partitions``, if given) whose finished work Kafka has not confirmed, sent or not."""
        return [
            (topic, partition, progress.committable)
            for (topic, partition), progress in self._partitions.items()
            if progress.ahead
            and progress.committable is not None
            and (partitions is None or (topic, partition) in partitions)
        ]

    def confirmed(self, topic: str, partition: int, offset: int) -> None:
        """Kafka confirmed the commit of ``offset``."""
        progress = self._partitions.get((topic, partition))
        if progress is None:
            return
        if progress.confirmed is None or offset > progress.confirmed:
            progress.confirmed = offset
        if progress.sent is not None and progress.sent <= offset:
            progress.sent = None

    def commit_failed(self, topic: str, partition: int, offset: int) -> None:
        """Kafka refused the commit of ``offset``: the next round sends it (or a later one) again."""
        progress = self._partitions.get((topic, partition))
        if progress is not None and progress.sent == offset:
            progress.sent = None

    def forget(self, topic: str, partition: int) -> None:
        self._partitions.pop((topic, partition), None)

    def forget_all(self) -> None:
        """Every partition: their consumer is gone, and the next one starts from the committed offsets."""
        self._partitions.clear()

    def in_flight(self, partitions: Collection[Key] | None = None) -> int:
        """Jobs fetched and not finished (of ``partitions``, if given)."""
        return sum(
            p.in_flight for key, p in self._partitions.items() if partitions is None or key in partitions
        )

    def lagging(self) -> int:
        """Partitions whose finished work is not yet confirmed as committed."""
        return sum(1 for p in self._partitions.values() if p.ahead)
