"""The life of a run: its states, which component moves it into each, and the legal moves.

A run is one fire of a schedule (DESIGN section 2). Every component that updates ``runs.state``
checks the move here first, so the state machine exists once; the store's SQL guards the same
moves with ``WHERE state = ...`` so that concurrent components cannot race past it.
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
    PENDING = "pending"
    # Set by the relay: Kafka acknowledged the dispatch message (acks=all).
    DISPATCHED = "dispatched"
    # Set by the reconciler: a worker reported the start of a long job, or a heartbeat.
    RUNNING = "running"
    # Set by the reconciler: an attempt failed retryably (or its lease expired) and
    # next_attempt_at is set; the scanner re-dispatches it, as pending, when that is due.
    RETRY_WAIT = "retry_wait"
    # Set by the reconciler: terminal.
    SUCCEEDED = "succeeded"
    # Set by the reconciler: retries exhausted or a non-retryable error; the dead letter is in
    # sched.dlq and PostgreSQL. Terminal, except that an operator's DLQ replay re-queues it.
    DEAD = "dead"
    # Set by the scanner: never run because of the misfire or overlap policy; reason recorded.
    # Terminal.
    SKIPPED = "skipped"
    # Set by the API/CLI: terminal.
    CANCELLED = "cancelled"


TERMINAL: frozenset[RunState] = frozenset(
    {RunState.SUCCEEDED, RunState.DEAD, RunState.SKIPPED, RunState.CANCELLED}
)
"""Result events for runs in these states are stale: recorded in ``attempts``, never applied."""

ACTIVE: frozenset[RunState] = frozenset(RunState) - TERMINAL
"""States in which a run still counts against the overlap policy."""

INITIAL: frozenset[RunState] = frozenset({RunState.PENDING, RunState.SKIPPED})
"""The states the scanner inserts runs in."""

# The relay marks a run dispatched only after Kafka acknowledges it, and a fast worker's events
# can reach the reconciler first; so every reconciler outcome is legal from pending, and the
# relay's pending -> dispatched must then find the run moved on and do nothing.
_OUTCOMES = frozenset({RunState.RUNNING, RunState.RETRY_WAIT, RunState.SUCCEEDED, RunState.DEAD})

TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    RunState.PENDING: _OUTCOMES | {RunState.DISPATCHED, RunState.CANCELLED},
    RunState.DISPATCHED: _OUTCOMES | {RunState.CANCELLED},
    # running -> running is a heartbeat: it extends the lease and changes nothing else.
    RunState.RUNNING: _OUTCOMES | {RunState.CANCELLED},
    # Not running: a late heartbeat or result of the attempt that failed is stale, not a move.
    RunState.RETRY_WAIT: frozenset({RunState.PENDING, RunState.CANCELLED}),
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
