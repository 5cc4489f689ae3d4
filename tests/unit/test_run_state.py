"""The run state machine: its states, its moves, and what is terminal."""

from __future__ import annotations

import pytest

from scheduler.domain.run_state import (
    ACTIVE,
    INITIAL,
    TERMINAL,
    TRANSITIONS,
    IllegalRunTransition,
    RunState,
    can_transition,
    check_transition,
)
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleState


def test_the_states_are_spelled_as_in_the_design() -> None:
    assert [s.value for s in RunState] == [
        "pending", "dispatched", "running", "retry_wait", "succeeded", "dead", "skipped", "cancelled",
    ]  # fmt: skip
    assert {RunState.SUCCEEDED, RunState.DEAD, RunState.SKIPPED, RunState.CANCELLED} == TERMINAL
    assert set(RunState) - TERMINAL == ACTIVE
    assert {RunState.PENDING, RunState.SKIPPED} == INITIAL
    assert set(TRANSITIONS) == set(RunState)


def test_schedule_enums_are_spelled_as_in_the_design() -> None:
    assert [k.value for k in ScheduleKind] == ["immediate", "delayed", "cron"]
    assert [s.value for s in ScheduleState] == ["active", "paused", "cancelled", "completed", "error"]
    assert [p.value for p in MisfirePolicy] == ["fire_once", "fire_all", "skip"]
    assert [p.value for p in OverlapPolicy] == ["allow", "skip", "buffer_one"]


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("pending", "running"),  # the worker's start: the relay writes nothing to runs
        ("pending", "succeeded"),  # start and end in one reconciler batch
        ("dispatched", "running"),  # a run an earlier version's relay marked
        ("running", "running"),  # heartbeat
        ("running", "retry_wait"),
        ("dispatched", "retry_wait"),  # lease expired
        ("retry_wait", "pending"),  # scanner re-dispatches
        ("running", "dead"),
        ("running", "succeeded"),
        ("retry_wait", "succeeded"),  # a late success of the current attempt (the sweeper gave up)
        ("retry_wait", "dead"),  # a late non-retryable error of the current attempt
        ("retry_wait", "retry_wait"),  # the worker's own retry decision after the sweeper's
        ("dead", "pending"),  # DLQ replay
        ("pending", "pending"),  # redispatch of a run whose job message was lost with Kafka
        ("dispatched", "pending"),  # the same, for a run an earlier version's relay marked
    ],
)
def test_allowed_moves(current: str, target: str) -> None:
    assert can_transition(RunState(current), RunState(target))
    check_transition(RunState(current), RunState(target))


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("succeeded", "running"),
        ("cancelled", "pending"),
        ("skipped", "pending"),
        ("dead", "succeeded"),
        ("retry_wait", "running"),  # a late heartbeat of the attempt that failed
        ("running", "pending"),  # a started run goes back only through its lease's expiry
        ("running", "dispatched"),
        ("pending", "dispatched"),  # nothing marks runs dispatched any more
        ("pending", "skipped"),
        ("pending", "cancelled"),  # no component cancels runs
        ("retry_wait", "cancelled"),
    ],
)
def test_refused_moves(current: str, target: str) -> None:
    assert not can_transition(RunState(current), RunState(target))
    with pytest.raises(IllegalRunTransition, match=f"cannot move from {current} to {target}"):
        check_transition(RunState(current), RunState(target))


def test_terminal_states_do_not_move_except_a_dead_letter_replay() -> None:
    for state in TERMINAL:
        expected = {RunState.PENDING} if state is RunState.DEAD else set()
        assert TRANSITIONS[state] == expected


def test_every_state_but_cancelled_is_reachable_from_an_initial_state() -> None:
    seen = set(INITIAL)
    frontier = list(INITIAL)
    while frontier:
        for following in TRANSITIONS[frontier.pop()]:
            if following not in seen:
                seen.add(following)
                frontier.append(following)
    # The schema admits cancelled runs, but nothing cancels one yet; dispatched is only where an
    # earlier version's relay left a run.
    assert seen == set(RunState) - {RunState.CANCELLED, RunState.DISPATCHED}
