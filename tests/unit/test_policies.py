"""Fire rules, misfire and overlap policies, as the scanner applies them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from itertools import takewhile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.domain.cron import CronSchedule
from scheduler.domain.policies import (
    OverlapAction,
    SkippedFire,
    fires_of,
    next_fire_on_resume,
    overlap_action,
    plan_fires,
)
from scheduler.domain.schedule import (
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleId,
    ScheduleKind,
    ScheduleState,
    SkipReason,
)

EVERY_10_SECONDS = CronSchedule.of("*/10 * * * * *", "UTC")
EVERY_SECOND = CronSchedule.of("* * * * * *", "UTC")
NOON = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)


def at(minutes: int, seconds: int) -> datetime:
    return NOON + timedelta(minutes=minutes, seconds=seconds)


class TestScannerStoppedForThreeMinutes:
    """next_fire_at was 12:00:10 when the scanner stopped; it is back at 12:03:05."""

    NEXT = at(0, 10)
    NOW = at(3, 5)

    def test_fire_once_runs_the_latest_missed_time_and_records_the_others(self) -> None:
        plan = plan_fires(EVERY_10_SECONDS, self.NEXT, self.NOW, MisfirePolicy.FIRE_ONCE)
        assert plan.misfired
        assert plan.fires == (at(3, 0),)
        assert [s.scheduled_for for s in plan.skipped] == [
            at(0, 10) + timedelta(seconds=10 * i) for i in range(17)
        ]
        assert {s.reason for s in plan.skipped} == {SkipReason.MISFIRE}
        assert not plan.more_skipped
        assert plan.next_fire_at == at(3, 10)

    def test_fire_all_runs_every_missed_time(self) -> None:
        plan = plan_fires(EVERY_10_SECONDS, self.NEXT, self.NOW, MisfirePolicy.FIRE_ALL)
        assert plan.fires == tuple(at(0, 10) + timedelta(seconds=10 * i) for i in range(18))
        assert plan.skipped == ()
        assert plan.next_fire_at == at(3, 10)

    def test_skip_runs_nothing_and_moves_to_the_future(self) -> None:
        plan = plan_fires(EVERY_10_SECONDS, self.NEXT, self.NOW, MisfirePolicy.SKIP)
        assert plan.fires == ()
        assert len(plan.skipped) == 18
        assert plan.next_fire_at == at(3, 10)


def test_fire_all_stops_at_100_and_continues_from_there_on_the_next_scan() -> None:
    now = at(60, 0)
    first = plan_fires(EVERY_SECOND, NOON, now, MisfirePolicy.FIRE_ALL)
    assert len(first.fires) == 100
    assert first.fires[-1] == at(1, 39)
    assert first.next_fire_at == at(1, 40)
    assert first.next_fire_at <= now
    assert first.next_fire_at is not None
    second = plan_fires(EVERY_SECOND, first.next_fire_at, now, MisfirePolicy.FIRE_ALL)
    assert second.fires[0] == at(1, 40)
    assert len(second.fires) == 100


def test_a_year_of_downtime_on_an_every_second_schedule_stays_bounded() -> None:
    now = NOON + timedelta(days=365, microseconds=500)
    for policy in (MisfirePolicy.FIRE_ONCE, MisfirePolicy.SKIP):
        plan = plan_fires(EVERY_SECOND, NOON, now, policy)
        assert len(plan.skipped) == 100
        assert plan.more_skipped
        assert plan.skipped[0].scheduled_for == NOON
        assert plan.next_fire_at == now.replace(microsecond=0) + timedelta(seconds=1)
    assert plan_fires(EVERY_SECOND, NOON, now, MisfirePolicy.FIRE_ONCE).fires == (now.replace(microsecond=0),)


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_fires_within_the_catchup_window_run_whatever_the_policy(policy: MisfirePolicy) -> None:
    plan = plan_fires(EVERY_10_SECONDS, at(0, 10), at(0, 40), policy)
    assert not plan.misfired
    assert plan.fires == (at(0, 10), at(0, 20), at(0, 30), at(0, 40))
    assert plan.skipped == ()
    assert plan.next_fire_at == at(0, 50)


def test_the_catchup_window_is_configurable() -> None:
    plan = plan_fires(EVERY_10_SECONDS, at(0, 10), at(0, 40), catchup_window=timedelta(seconds=5))
    assert plan.misfired
    assert plan.fires == (at(0, 40),)


def test_nothing_is_due_before_next_fire_at() -> None:
    plan = plan_fires(EVERY_10_SECONDS, at(0, 10), at(0, 9))
    assert plan.fires == () and plan.skipped == () and plan.next_fire_at == at(0, 10)


def test_fire_once_across_a_fall_back_fires_the_real_latest_time() -> None:
    schedule = CronSchedule.of("*/30 * * * *", "Europe/Berlin")
    next_fire_at = datetime(2026, 10, 24, 23, 30, tzinfo=UTC)
    now = datetime(2026, 10, 25, 1, 45, tzinfo=UTC)  # 02:45 CET, in the repeated hour's second pass
    plan = plan_fires(schedule, next_fire_at, now)
    assert plan.fires == (datetime(2026, 10, 25, 1, 30, tzinfo=UTC),)
    assert [s.scheduled_for.strftime("%H:%M") for s in plan.skipped] == ["23:30", "00:00", "00:30", "01:00"]
    assert plan.next_fire_at == datetime(2026, 10, 25, 2, 0, tzinfo=UTC)


# Downtimes that keep the oracle's own walk over every missed fire to about 2000 steps.
LONGEST_DOWNTIME = {
    "*/10 * * * * *": timedelta(hours=6),
    "*/7 * * * *": timedelta(days=10),
    "0 * * * *": timedelta(days=80),
    "30 2 * * *": timedelta(days=5 * 365),
    "0 0 * * mon": timedelta(days=30 * 365),
}


@settings(max_examples=75, deadline=None)
@given(
    cadence=st.sampled_from(list(LONGEST_DOWNTIME.items())),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "Australia/Lord_Howe", "America/New_York"]),
    start=st.datetimes(datetime(1990, 1, 1), datetime(2040, 1, 1), timezones=st.just(UTC)),
    fraction=st.floats(min_value=0.0, max_value=1.0),
    policy=st.sampled_from(list(MisfirePolicy)),
)
def test_plans_are_bounded_consistent_and_keep_the_schedule_alive(
    cadence: tuple[str, timedelta], zone: str, start: datetime, fraction: float, policy: MisfirePolicy
) -> None:
    expression, longest = cadence
    schedule = CronSchedule.of(expression, zone)
    next_fire_at = schedule.next_fire_after(start)
    now = next_fire_at + longest * fraction
    plan = plan_fires(schedule, next_fire_at, now, policy)

    due = list(takewhile(lambda f: f <= now, schedule.fire_times(next_fire_at - timedelta(microseconds=1))))
    skipped = [s.scheduled_for for s in plan.skipped]
    assert len(plan.fires) <= 100 and len(plan.skipped) <= 100
    assert list(plan.fires) == sorted(set(plan.fires))
    assert set(plan.fires) <= set(due) and set(skipped) <= set(due)
    assert not set(plan.fires) & set(skipped)
    assert plan.next_fire_at is not None
    capped = len(plan.fires) == 100 and plan.next_fire_at <= now
    assert plan.next_fire_at > now or capped
    if plan.fires:
        assert plan.next_fire_at == schedule.next_fire_after(plan.fires[-1]) or plan.next_fire_at > now
    if not plan.misfired or policy is MisfirePolicy.FIRE_ALL:
        assert list(plan.fires) == due[:100] and skipped == []
    else:
        assert list(plan.fires) == ([due[-1]] if policy is MisfirePolicy.FIRE_ONCE else [])
        accounted = skipped + list(plan.fires)
        assert accounted == due if not plan.more_skipped else len(skipped) == 100


@pytest.mark.parametrize(
    ("policy", "previous_active", "fire_waiting", "action"),
    [
        (OverlapPolicy.ALLOW, True, True, OverlapAction.RUN),
        (OverlapPolicy.SKIP, False, False, OverlapAction.RUN),
        (OverlapPolicy.SKIP, True, False, OverlapAction.SKIP),
        (OverlapPolicy.BUFFER_ONE, False, False, OverlapAction.RUN),
        (OverlapPolicy.BUFFER_ONE, True, False, OverlapAction.BUFFER),
        (OverlapPolicy.BUFFER_ONE, True, True, OverlapAction.SKIP),
    ],
)
def test_overlap(
    policy: OverlapPolicy, previous_active: bool, fire_waiting: bool, action: OverlapAction
) -> None:
    assert overlap_action(policy, previous_active, fire_waiting) is action


def schedule(kind: ScheduleKind, next_fire_at: datetime | None, **fields: Any) -> Schedule:
    values: dict[str, Any] = {
        "id": ScheduleId(uuid.UUID(int=7)),
        "app": "billing",
        "name": "invoices",
        "kind": kind,
        "cron": "*/10 * * * * *" if kind is ScheduleKind.CRON else None,
        "tz": "UTC",
        "run_at": next_fire_at if kind is ScheduleKind.DELAYED else None,
        "start_at": None,
        "end_at": None,
        "handler": "builtin:noop",
        "payload": {},
        "max_attempts": 3,
        "backoff_base_ms": 1000,
        "backoff_max_ms": 300_000,
        "timeout_ms": 300_000,
        "misfire_policy": MisfirePolicy.FIRE_ONCE,
        "overlap_policy": OverlapPolicy.ALLOW,
        "jitter_ms": 0,
        "state": ScheduleState.ACTIVE,
        "next_fire_at": next_fire_at,
        "version": 1,
        "created_at": NOON - timedelta(days=1),
        "updated_at": NOON - timedelta(days=1),
    }
    return Schedule(**(values | fields))


@pytest.mark.parametrize("kind", [ScheduleKind.IMMEDIATE, ScheduleKind.DELAYED])
@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_a_one_shot_on_time_fires_once_and_completes(kind: ScheduleKind, policy: MisfirePolicy) -> None:
    plan = fires_of(schedule(kind, at(0, 10), misfire_policy=policy), at(0, 40))
    assert plan.fires == (at(0, 10),) and plan.skipped == ()
    assert plan.next_fire_at is None and plan.schedule_state is ScheduleState.COMPLETED


@pytest.mark.parametrize("policy", [MisfirePolicy.FIRE_ONCE, MisfirePolicy.FIRE_ALL])
def test_a_late_one_shot_still_fires_unless_its_policy_is_skip(policy: MisfirePolicy) -> None:
    plan = fires_of(schedule(ScheduleKind.DELAYED, NOON, misfire_policy=policy), at(30, 0))
    assert plan.misfired and plan.fires == (NOON,) and plan.skipped == ()
    assert plan.schedule_state is ScheduleState.COMPLETED


def test_a_late_one_shot_under_skip_is_recorded_as_skipped_and_completes() -> None:
    plan = fires_of(schedule(ScheduleKind.DELAYED, NOON, misfire_policy=MisfirePolicy.SKIP), at(30, 0))
    assert plan.fires == () and plan.skipped == (SkippedFire(NOON, SkipReason.MISFIRE),)
    assert plan.schedule_state is ScheduleState.COMPLETED


def test_a_one_shot_within_the_catchup_window_fires_even_under_skip() -> None:
    one_shot = schedule(ScheduleKind.DELAYED, NOON, misfire_policy=MisfirePolicy.SKIP)
    assert fires_of(one_shot, at(1, 0)).fires == (NOON,)
    assert fires_of(one_shot, at(1, 0), catchup_window=timedelta(seconds=59)).fires == ()


def test_a_one_shot_not_yet_due_does_nothing() -> None:
    plan = fires_of(schedule(ScheduleKind.DELAYED, at(5, 0)), at(4, 59))
    assert plan.fires == () and plan.skipped == () and plan.next_fire_at == at(5, 0)
    assert plan.schedule_state is ScheduleState.ACTIVE


def test_a_cron_schedule_follows_its_plan_and_stays_active() -> None:
    cron = schedule(ScheduleKind.CRON, at(0, 10))
    assert fires_of(cron, at(0, 40)) == plan_fires(EVERY_10_SECONDS, at(0, 10), at(0, 40))
    assert fires_of(cron, at(0, 40)).schedule_state is ScheduleState.ACTIVE


def test_a_cron_schedule_uses_its_own_zone_and_misfire_policy() -> None:
    cron = schedule(
        ScheduleKind.CRON, at(0, 10), cron="0 9 * * *", tz="Europe/Berlin", misfire_policy=MisfirePolicy.SKIP
    )
    plan = fires_of(cron, at(0, 10) + timedelta(hours=1))
    assert plan.fires == () and [s.scheduled_for for s in plan.skipped] == [at(0, 10)]
    assert plan.next_fire_at == datetime(2027, 1, 2, 8, 0, tzinfo=UTC)  # 09:00 in Berlin (CET)


def test_nothing_after_end_at_fires_is_recorded_or_stays_due() -> None:
    cron = schedule(ScheduleKind.CRON, at(0, 10), end_at=at(0, 30), misfire_policy=MisfirePolicy.FIRE_ALL)
    plan = fires_of(cron, at(0, 40))
    assert plan.fires == (at(0, 10), at(0, 20), at(0, 30))
    assert plan.next_fire_at is None and plan.schedule_state is ScheduleState.COMPLETED


def test_misfires_after_end_at_are_not_recorded() -> None:
    cron = schedule(ScheduleKind.CRON, at(0, 10), end_at=at(0, 30), misfire_policy=MisfirePolicy.SKIP)
    plan = fires_of(cron, at(5, 0))
    assert [s.scheduled_for for s in plan.skipped] == [at(0, 10), at(0, 20), at(0, 30)]
    assert not plan.more_skipped and plan.schedule_state is ScheduleState.COMPLETED


def test_an_end_at_still_ahead_changes_nothing() -> None:
    cron = schedule(ScheduleKind.CRON, at(0, 10), end_at=at(10, 0))
    assert fires_of(cron, at(0, 40)) == plan_fires(EVERY_10_SECONDS, at(0, 10), at(0, 40))


def test_a_capped_fire_all_keeps_its_backlog_due_within_end_at() -> None:
    every_second = schedule(
        ScheduleKind.CRON, NOON, cron="* * * * * *", end_at=at(10, 0), misfire_policy=MisfirePolicy.FIRE_ALL
    )
    plan = fires_of(every_second, at(5, 0))
    assert len(plan.fires) == 100 and plan.next_fire_at == at(1, 40)
    assert plan.schedule_state is ScheduleState.ACTIVE


def test_a_schedule_without_a_next_fire_time_is_not_due() -> None:
    with pytest.raises(ValueError, match="no next fire time"):
        fires_of(schedule(ScheduleKind.CRON, None), NOON)


LOOKAHEAD = timedelta(seconds=1)


def test_with_look_ahead_a_one_shot_due_within_it_fires_now_and_one_beyond_it_waits() -> None:
    soon = fires_of(
        schedule(ScheduleKind.DELAYED, NOON + timedelta(milliseconds=500)), NOON, lookahead=LOOKAHEAD
    )
    assert soon.fires == (NOON + timedelta(milliseconds=500),) and not soon.misfired
    assert soon.schedule_state is ScheduleState.COMPLETED
    later = fires_of(
        schedule(ScheduleKind.DELAYED, NOON + timedelta(milliseconds=1500)), NOON, lookahead=LOOKAHEAD
    )
    assert later.fires == () and later.next_fire_at == NOON + timedelta(milliseconds=1500)


def test_with_look_ahead_an_every_second_cron_yields_the_fires_within_it() -> None:
    every_second = schedule(ScheduleKind.CRON, at(0, 1), cron="* * * * * *")
    plan = fires_of(every_second, at(0, 0) + timedelta(milliseconds=200), lookahead=timedelta(seconds=3))
    assert plan.fires == (at(0, 1), at(0, 2), at(0, 3))
    assert plan.next_fire_at == at(0, 4) and not plan.misfired


def test_without_look_ahead_the_same_cron_waits_for_its_fire() -> None:
    every_second = schedule(ScheduleKind.CRON, at(0, 1), cron="* * * * * *")
    plan = fires_of(every_second, at(0, 0) + timedelta(milliseconds=200))
    assert plan.fires == () and plan.next_fire_at == at(0, 1)


def test_look_ahead_leaves_the_misfire_of_past_fires_as_it_was() -> None:
    """Down three minutes: the past fires follow the misfire policy as before; the fires just ahead
    are on time and run."""
    now = at(3, 5)
    for policy in MisfirePolicy:
        without = plan_fires(EVERY_10_SECONDS, at(0, 10), now, policy)
        ahead = plan_fires(EVERY_10_SECONDS, at(0, 10), now, policy, horizon=now + timedelta(seconds=6))
        assert ahead.misfired and ahead.skipped == without.skipped
        assert ahead.fires == (*without.fires, at(3, 10))
        assert ahead.next_fire_at == at(3, 20)


def test_a_fire_in_the_future_never_counts_as_misfired() -> None:
    # No catch-up window at all, and a policy that skips every misfire: a fire ahead still runs.
    one_shot = schedule(
        ScheduleKind.DELAYED, NOON + timedelta(milliseconds=900), misfire_policy=MisfirePolicy.SKIP
    )
    plan = fires_of(one_shot, NOON, catchup_window=timedelta(0), lookahead=LOOKAHEAD)
    assert plan.fires == (NOON + timedelta(milliseconds=900),) and not plan.misfired and plan.skipped == ()
    cron = schedule(ScheduleKind.CRON, at(0, 10), misfire_policy=MisfirePolicy.SKIP)
    plan = fires_of(
        cron, at(0, 9) + timedelta(milliseconds=1), catchup_window=timedelta(0), lookahead=LOOKAHEAD
    )
    assert plan.fires == (at(0, 10),) and not plan.misfired


@pytest.mark.parametrize("overlap", [OverlapPolicy.SKIP, OverlapPolicy.BUFFER_ONE])
def test_a_schedule_whose_overlap_policy_is_not_allow_is_not_planned_ahead(overlap: OverlapPolicy) -> None:
    guarded = schedule(ScheduleKind.DELAYED, NOON + timedelta(milliseconds=500), overlap_policy=overlap)
    assert fires_of(guarded, NOON, lookahead=LOOKAHEAD).fires == ()
    assert fires_of(guarded, NOON + timedelta(milliseconds=500), lookahead=LOOKAHEAD).fires == (
        NOON + timedelta(milliseconds=500),
    )


def test_a_look_ahead_fire_all_backlog_stays_capped() -> None:
    plan = plan_fires(EVERY_SECOND, NOON, at(0, 30), MisfirePolicy.FIRE_ALL, horizon=at(5, 0))
    assert len(plan.fires) == 100 and plan.next_fire_at == at(1, 40)
    once = plan_fires(EVERY_SECOND, NOON, at(5, 0), MisfirePolicy.FIRE_ONCE, horizon=at(7, 0))
    assert (
        len(once.fires) == 100
        and once.fires[0] == at(5, 0)
        and once.fires[-1] == at(6, 39)
        and once.next_fire_at == at(6, 40)
    )


def test_a_negative_look_ahead_or_a_horizon_before_now_is_refused() -> None:
    with pytest.raises(ValueError, match="lookahead"):
        fires_of(schedule(ScheduleKind.DELAYED, NOON), NOON, lookahead=-LOOKAHEAD)
    with pytest.raises(ValueError, match="horizon"):
        plan_fires(EVERY_SECOND, NOON, NOON, horizon=NOON - LOOKAHEAD)


class TestResumedAfterAPause:
    """Paused with its next fire at 12:00:10, resumed at 12:00:35: three fires were missed, well
    within the catch-up window, yet a pause is not an outage. Its misfire policy judges them."""

    NEXT = at(0, 10)
    NOW = at(0, 35)

    def resumed(self, policy: MisfirePolicy, **fields: Any) -> datetime | None:
        paused = schedule(ScheduleKind.CRON, self.NEXT, misfire_policy=policy, **fields)
        return next_fire_on_resume(paused, self.NOW)

    def test_skip_runs_none_of_them(self) -> None:
        assert self.resumed(MisfirePolicy.SKIP) == at(0, 40)

    def test_fire_once_runs_the_latest_only(self) -> None:
        latest = self.resumed(MisfirePolicy.FIRE_ONCE)
        assert latest == at(0, 30)
        plan = fires_of(schedule(ScheduleKind.CRON, latest), self.NOW)
        assert plan.fires == (at(0, 30),) and plan.next_fire_at == at(0, 40), "the scanner runs just it"

    def test_fire_all_runs_every_one(self) -> None:
        assert self.resumed(MisfirePolicy.FIRE_ALL) == self.NEXT

    def test_nothing_missed_keeps_the_next_fire(self) -> None:
        ahead = schedule(ScheduleKind.CRON, at(0, 40), misfire_policy=MisfirePolicy.SKIP)
        assert next_fire_on_resume(ahead, self.NOW) == at(0, 40)

    def test_a_fire_still_ahead_is_computed_again_under_the_rules_loaded_now(self) -> None:
        """Stored at 12:00:45 by other zone rules (an offset 5 s apart, say), where the rules
        loaded now put the fire at 12:00:40: the wall time asked for wins."""
        stale = schedule(ScheduleKind.CRON, at(0, 45))
        assert next_fire_on_resume(stale, self.NOW) == at(0, 40)

    def test_a_fire_made_ahead_of_now_is_not_made_again(self) -> None:
        """The look-ahead leased 12:00:40 before the pause: the fire after it is the next."""
        ahead = schedule(ScheduleKind.CRON, at(0, 50))
        assert next_fire_on_resume(ahead, self.NOW, latest_fire=at(0, 40)) == at(0, 50)

    def test_a_fire_the_rules_loaded_now_put_past_its_end_leaves_nothing_to_fire(self) -> None:
        stale = schedule(ScheduleKind.CRON, at(0, 45), cron="50 * * * * *", end_at=at(0, 46))
        assert next_fire_on_resume(stale, self.NOW) is None

    def test_a_one_shot_keeps_its_time(self) -> None:
        one_shot = schedule(ScheduleKind.DELAYED, self.NEXT, misfire_policy=MisfirePolicy.SKIP)
        assert next_fire_on_resume(one_shot, self.NOW) == self.NEXT

    def test_skipping_with_no_fire_left_before_its_end_leaves_nothing_to_fire(self) -> None:
        assert self.resumed(MisfirePolicy.SKIP, end_at=at(0, 36)) is None
        assert self.resumed(MisfirePolicy.FIRE_ONCE, end_at=at(0, 36)) == at(0, 30)

    def test_a_year_of_an_every_second_pause_is_found_at_once(self) -> None:
        paused = schedule(ScheduleKind.CRON, NOON, cron="* * * * * *", misfire_policy=MisfirePolicy.FIRE_ONCE)
        later = NOON + timedelta(days=365, milliseconds=500)
        assert next_fire_on_resume(paused, later) == NOON + timedelta(days=365)
