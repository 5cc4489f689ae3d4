"""How the reconciler numbers a batch's copies and executions for ``apply_outcomes``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from scheduler.store.reconcile import OutcomeEvent, batch_ranks

NOW = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
RUN, OTHER = uuid.uuid4(), uuid.uuid4()


def event(event_id: str, kind: str = "started", *, run: uuid.UUID = RUN, attempt: int = 1,
          worker: str | None = "w1", started: datetime | None = NOW) -> OutcomeEvent:  # fmt: skip
    return OutcomeEvent(event_id, run, attempt, kind, worker, started, None, app="app")


def test_a_plain_batch_is_first_copies_of_first_executions() -> None:
    events = [event("a"), event("b", "succeeded"), event("c", run=OTHER), event("d", "succeeded", run=OTHER)]
    assert batch_ranks(events) == {
        "first_copies": [True] * 4,
        "exec_ranks": [1] * 4,
        "copy_ranks": [1] * 4,
    }


def test_a_copy_of_an_event_id_is_not_a_first_copy_and_numbers_nothing() -> None:
    ranks = batch_ranks([event("a"), event("a"), event("b", "succeeded")])
    assert ranks["first_copies"] == [True, False, True]
    assert ranks["exec_ranks"] == [1, 0, 1] and ranks["copy_ranks"] == [1, 0, 1]


def test_a_start_announced_again_with_a_new_id_is_the_second_copy_of_its_execution() -> None:
    ranks = batch_ranks([event("a"), event("b"), event("c")])
    assert ranks["exec_ranks"] == [1, 1, 1]
    assert ranks["copy_ranks"] == [1, 2, 3]


def test_executions_are_numbered_per_attempt_and_kind_in_the_order_they_first_came() -> None:
    later = NOW + timedelta(seconds=40)
    events = [
        event("a", worker="w2", started=later),  # the re-execution first, as a batch can have it
        event("b"),
        event("c", worker="w2", started=later),  # a copy of the first execution: no new number
        event("d", attempt=2),  # another attempt numbers its own
        event("e", "succeeded"),  # another kind too
        event("f", worker=None, started=None),
        event("g", worker=None, started=None),  # no worker and no start: one execution, as SQL groups them
    ]
    ranks = batch_ranks(events)
    assert ranks["exec_ranks"] == [1, 2, 1, 1, 1, 3, 3]
    assert ranks["copy_ranks"] == [1, 1, 2, 1, 1, 1, 2]
