"""The worker's bookkeeping: commit watermarks, commits confirmed by Kafka, and outcomes owed."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from scheduler.worker.deliveries import RETRY_MAX_S, Owed, Redeliveries
from scheduler.worker.progress import RESEND_AFTER_S, Progress

T = "sched.jobs.app"


def started(progress: Progress, partition: int, offsets: range) -> None:
    for offset in offsets:
        progress.started(T, partition, offset)


# --- watermarks ---------------------------------------------------------------------------------


def test_the_watermark_is_the_end_of_the_contiguous_finished_run() -> None:
    progress = Progress()
    started(progress, 0, range(10, 15))
    for offset in (11, 12, 14):
        progress.finished(T, 0, offset)
    assert progress.behind() == []  # 10 still runs: nothing is committable
    progress.finished(T, 0, 10)
    assert progress.behind() == [(T, 0, 13)]
    assert progress.in_flight() == 1
    progress.finished(T, 0, 13)
    assert progress.behind() == [(T, 0, 15)] and progress.in_flight() == 0


def test_a_repeated_or_unknown_finish_moves_nothing() -> None:
    progress = Progress()
    started(progress, 0, range(3))
    progress.finished(T, 0, 0)
    progress.finished(T, 0, 0)
    progress.finished(T, 7, 0)  # a partition revoked meanwhile
    assert progress.behind() == [(T, 0, 1)] and progress.in_flight() == 2


@given(st.permutations(list(range(30))), st.integers(0, 30))
def test_the_watermark_never_passes_an_unfinished_offset(order: list[int], done: int) -> None:
    progress = Progress()
    started(progress, 0, range(30))
    for offset in order[:done]:
        progress.finished(T, 0, offset)
    unfinished = set(order[done:])
    expected = min(unfinished) if unfinished else 30
    assert progress.behind() == ([(T, 0, expected)] if expected else [])
    assert progress.in_flight() == 30 - done


# --- commits ------------------------------------------------------------------------------------


def test_a_commit_counts_only_once_confirmed_and_a_failed_one_is_sent_again() -> None:
    progress = Progress()
    started(progress, 0, range(5))
    started(progress, 1, range(5))
    for offset in range(5):
        progress.finished(T, 0, offset)
    progress.finished(T, 1, 0)
    assert progress.to_commit(now=0.0) == [(T, 0, 5), (T, 1, 1)]
    # On its way: not sent twice, but still behind for a synchronous commit.
    assert progress.to_commit(now=0.1) == []
    assert progress.behind() == [(T, 0, 5), (T, 1, 1)]
    progress.confirmed(T, 0, 5)
    progress.commit_failed(T, 1, 1)
    assert progress.lagging() == 1
    assert progress.to_commit(now=0.2) == [(T, 1, 1)]  # the failed one, by the next round
    progress.confirmed(T, 1, 1)
    assert progress.to_commit(now=0.3) == [] and progress.behind() == [] and progress.lagging() == 0


def test_a_commit_never_answered_is_sent_again() -> None:
    progress = Progress()
    started(progress, 0, range(1))
    progress.finished(T, 0, 0)
    assert progress.to_commit(now=0.0) == [(T, 0, 1)]
    assert progress.to_commit(now=RESEND_AFTER_S - 0.1) == []
    assert progress.to_commit(now=RESEND_AFTER_S) == [(T, 0, 1)]


def test_a_partition_that_did_not_move_lately_is_still_in_the_final_commit() -> None:
    # The failure measured in the field: a commit sent and refused during a rebalance, then nothing
    # moved on that partition, so a final commit of "what moved" left it behind for good.
    progress = Progress()
    started(progress, 0, range(8))
    started(progress, 1, range(92))
    for offset in range(8):
        progress.finished(T, 0, offset)
    for offset in range(92):
        progress.finished(T, 1, offset)
    assert progress.to_commit(now=0.0) == [(T, 0, 8), (T, 1, 92)]
    progress.commit_failed(T, 1, 92)
    progress.confirmed(T, 0, 8)
    assert progress.behind() == [(T, 1, 92)]
    assert progress.behind({(T, 0)}) == []


def test_a_later_finish_during_a_commit_is_committed_after_it() -> None:
    progress = Progress()
    started(progress, 0, range(4))
    progress.finished(T, 0, 0)
    assert progress.to_commit(now=0.0) == [(T, 0, 1)]
    progress.finished(T, 0, 1)
    assert progress.to_commit(now=0.1) == [(T, 0, 2)]
    progress.confirmed(T, 0, 1)  # the answer to the first: the second is still ahead and sent
    assert progress.to_commit(now=0.2) == [] and progress.behind() == [(T, 0, 2)]
    progress.confirmed(T, 0, 2)
    progress.confirmed(T, 0, 1)  # a late, older answer moves nothing back
    assert progress.behind() == []


def test_forgotten_partitions_are_neither_committed_nor_in_flight() -> None:
    progress = Progress()
    started(progress, 0, range(3))
    started(progress, 1, range(3))
    progress.finished(T, 0, 0)
    assert progress.in_flight({(T, 0)}) == 2 and progress.in_flight() == 5
    progress.forget(T, 0)
    progress.confirmed(T, 0, 1)
    assert progress.behind() == [] and progress.in_flight() == 3


def test_offsets_read_again_from_an_earlier_point_start_the_partition_afresh() -> None:
    progress = Progress()
    started(progress, 0, range(10))
    for offset in range(4):
        progress.finished(T, 0, offset)
    assert progress.behind() == [(T, 0, 4)] and progress.in_flight() == 6
    # A rebuilt consumer resumes from the committed offset 2: what was outstanding comes again,
    # and a finish of the old delivery of 5 still counts (its outcome was acknowledged).
    started(progress, 0, range(2, 8))
    assert progress.in_flight() == 6
    progress.finished(T, 0, 5)
    progress.finished(T, 0, 2)
    assert progress.behind() == [(T, 0, 4)]  # never backwards past what finished before
    for offset in (3, 4):
        progress.finished(T, 0, offset)
    assert progress.behind() == [(T, 0, 6)] and progress.in_flight() == 2


def test_forgetting_every_partition_leaves_nothing_to_commit() -> None:
    progress = Progress()
    started(progress, 0, range(3))
    started(progress, 1, range(3))
    progress.finished(T, 0, 0)
    progress.forget_all()
    progress.finished(T, 1, 0)
    assert progress.behind() == [] and progress.in_flight() == 0 and progress.lagging() == 0
    started(progress, 0, range(1, 3))  # delivered again by the next consumer
    progress.finished(T, 0, 1)
    assert progress.behind() == [(T, 0, 2)]


# --- outcomes owed ------------------------------------------------------------------------------


def test_a_failed_outcome_waits_a_growing_capped_backoff() -> None:
    owed = Owed("job", "sched.results", b"k", b"value")
    rng = random.Random(7)
    waits = []
    for _ in range(12):
        owed.failed(100.0, too_large=False, rng=rng)
        waits.append(owed.due - 100.0)
    assert owed.failures == 12 and owed.value == b"value"
    assert 0.25 <= waits[0] <= 0.5
    assert all(RETRY_MAX_S / 2 <= wait <= RETRY_MAX_S for wait in waits[6:])


def test_an_outcome_refused_for_its_size_goes_at_once_in_compact_form() -> None:
    owed = Owed("job", "sched.dlq", None, b"x" * 100, compact=lambda: b"x")
    owed.failed(5.0, too_large=True)
    assert (owed.value, owed.compact, owed.due) == (b"x", None, 5.0)
    owed.failed(5.0, too_large=True)  # refused again: no smaller form left, so backoff
    assert owed.value == b"x" and owed.due > 5.0


def test_redeliveries_hand_out_what_is_due() -> None:
    waiting: Redeliveries[str] = Redeliveries()
    early, late = Owed("a", "t", None, b""), Owed("b", "t", None, b"")
    early.due, late.due = 1.0, 3.0
    waiting.add(early)
    waiting.add(late)
    assert waiting.due(0.5) == [] and len(waiting) == 2
    assert waiting.due(2.0) == [early] and len(waiting) == 1
    assert waiting.due(3.0) == [late] and len(waiting) == 0
