"""The life of a run: its states, which component moves it into each, and the legal moves.

A run is one fire of a schedule. The moves happen in the store's SQL, each guarded by
``WHERE state ...`` so that concurrent components cannot race past one another; ``TRANSITIONS``
is the same machine in code, and ``tests/unit/test_state_literals.py`` reads every statement that
updates ``runs.state`` and fails unless the two allow exactly the same moves.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from enum import StrEnum
from typing import NewType

__all__ = [
    "ACTIVE",
    "INITIAL",
    "TERMINAL",
    "TRANSITIONS",
    "IllegalRunTransition",
    "RunId",
    "RunState",
    "can_transition",
    "check_transition",
]

RunId = NewType("RunId", uuid.UUID)


class RunState(StrEnum):
    """A run's state. Each value names the component that moves a run into it."""

    # Set by the scanner: the run row and its dispatch message in the outbox, in one transaction.
    # It stays pending until a worker reports the job's start: while its message waits in the
    # outbox, on the topic, or in a worker holding it until its instant. The relay writes nothing
    # to runs (a second write of every run cost more than the state said).
    PENDING = "pending"
    # Set by the relay of earlier versions once Kafka acknowledged the dispatch message. Nothing
    # moves a run here any more; runs left in it behave as pending ones whose message left the outbox.
    DISPATCHED = "dispatched"
    # Set by the reconciler: a worker reported the job's start, or a heartbeat. Only a running run
    # holds a lease (renewed by each report); waiting to be picked up never expires an attempt.
    RUNNING = "running"
    # Set by the reconciler (an attempt failed retryably) or, in passing, by the lease sweeper,
    # which dispatches the next attempt in the same transaction: next_attempt_at is set and the
    # scanner re-dispatches it, as pending, when that is due. Until then the attempt number is
    # unchanged, so a late outcome of that same attempt still counts.
    RETRY_WAIT = "retry_wait"
    # Set by the reconciler: terminal.
    SUCCEEDED = "succeeded"
    # Set by the reconciler, the lease sweeper, or the relay (Kafka refused the job message for
    # good): retries exhausted or a non-retryable error; the dead letter is in sched.dlq and
    # PostgreSQL. Terminal, except that an operator's DLQ replay re-queues it.
    DEAD = "dead"
    # Set by the scanner: never run because of the misfire or overlap policy; reason recorded.
    # Terminal.
    SKIPPED = "skipped"
    # Terminal. The schema admits it, but no component cancels a run yet: cancelling a schedule
    # stops its fires and leaves its runs as they are. Nothing moves a run here.
    CANCELLED = "cancelled"


TERMINAL: frozenset[RunState] = frozenset(
    {RunState.SUCCEEDED, RunState.DEAD, RunState.SKIPPED, RunState.CANCELLED}
)
"""Result events for runs in these states are stale: recorded in ``attempts``, never applied."""

ACTIVE: frozenset[RunState] = frozenset(RunState) - TERMINAL
"""States in which a run still counts against the overlap policy."""

INITIAL: frozenset[RunState] = frozenset({RunState.PENDING, RunState.SKIPPED})
"""The states the scanner inserts runs in."""

# Every reconciler outcome is legal from pending: the first event of an attempt may be its start,
# or (start and end in one batch) its end.
_OUTCOMES = frozenset({RunState.RUNNING, RunState.RETRY_WAIT, RunState.SUCCEEDED, RunState.DEAD})

TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    # pending -> pending: an operator's redispatch of a run whose job message was lost with
    # Kafka's topics (`scheduler runs redispatch`), as a new attempt, like a replay.
    RunState.PENDING: _OUTCOMES | {RunState.PENDING},
    RunState.DISPATCHED: _OUTCOMES | {RunState.PENDING},
    # running -> running is a heartbeat: it extends the lease and changes nothing else.
    RunState.RUNNING: _OUTCOMES,
    # The attempt that failed is still the run's current one until the scanner re-dispatches, and
    # the run is not terminal, so that attempt's outcomes still apply (the fencing rule): a worker
    # the sweeper gave up on, or a second execution of the same attempt (a redelivered job), may
    # yet report success, a non-retryable error, or its own retry decision (retry_wait ->
    # retry_wait, with its own next_attempt_at). Only a start or heartbeat does not revive it:
    # retry_wait -> running is refused.
    RunState.RETRY_WAIT: frozenset(
        {RunState.PENDING, RunState.RETRY_WAIT, RunState.SUCCEEDED, RunState.DEAD}
    ),
    RunState.SUCCEEDED: frozenset(),
    # DLQ replay (an operator's explicit act) dispatches a dead run again, as a new attempt: the
    # run keeps its (schedule_id, scheduled_for) identity, so it cannot be a new row.
    RunState.DEAD: frozenset({RunState.PENDING}),
    RunState.SKIPPED: frozenset(),
    RunState.CANCELLED: frozenset(),
}
"""For each state, the states a run may move to next."""


class IllegalRunTransition(ValueError):
    """A state change the run state machine does not allow."""

    def __init__(self, current: RunState, target: RunState) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (terminal)"
        super().__init__(
            f"a run cannot move from {current} to {target}; from {current} it may move to {allowed}"
        )
        self.current = current
        self.target = target


def can_transition(current: RunState, target: RunState) -> bool:
    """Whether a run in ``current`` may move to ``target``."""
    return target in TRANSITIONS[current]


def check_transition(current: RunState, target: RunState) -> None:
    """Raise :class:`IllegalRunTransition` unless a run in ``current`` may move to ``target``."""
    if not can_transition(current, target):
        raise IllegalRunTransition(current, target)
