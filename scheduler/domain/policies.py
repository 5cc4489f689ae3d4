"""Fire rules, misfire and overlap policies: which fires of a schedule become runs when the scanner
finds them.

The scanner leases a due schedule and asks :func:`fires_of` what to insert in the same
transaction: runs to dispatch, fires to record as skipped, and the schedule's new
``next_fire_at``. A one-shot (immediate or delayed) schedule fires once and is then completed; a
cron schedule is planned by :func:`plan_fires` and stops at its ``end_at``. A fire found no later
than the catch-up window is on time and simply runs; a later one is a misfire (downtime, a paused
schedule resumed) and the schedule's misfire policy decides. Every answer is bounded: downtime of
a year on an every-second schedule costs one plan of at most 100 runs and 100 skipped records,
never a storm, and a cron schedule keeps a next fire time for as long as its expression and end
bound give it one. :func:`overlap_action` then decides, per fire, what an unfinished previous run
means for it.

Look-ahead: a scan may also take the fires due within the next ``lookahead`` (its horizon is
``now + lookahead``), so that their jobs reach a worker before their instant and wait there for it.
Only schedules whose overlap policy is ``allow`` are planned ahead: ``skip`` and ``buffer_one``
decide on the previous run's state, which is known only at the fire's instant. Lateness is always
judged against the real ``now``: a fire still in the future is never a misfire.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from scheduler.domain.cron import CronSchedule, NoFireTime
from scheduler.domain.schedule import (
    DEFAULT_CATCHUP_WINDOW,
    MAX_CATCHUP_FIRES,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleKind,
    ScheduleState,
    SkipReason,
)

__all__ = [
    "FirePlan",
    "OverlapAction",
    "SkippedFire",
    "cron_fire_after",
    "fires_of",
    "lookahead_of",
    "next_fire_on_resume",
    "next_fire_under_loaded_rules",
    "overlap_action",
    "plan_fires",
]


@dataclass(frozen=True)
class SkippedFire:
    """A fire that gets a run row in state ``skipped`` instead of running."""

    scheduled_for: datetime
    reason: SkipReason


@dataclass(frozen=True)
class FirePlan:
    """What one scan does with one due schedule.

    ``fires``: create a pending run for each, oldest first. ``skipped``: record each as a skipped
    run; at most ``MAX_CATCHUP_FIRES`` of them, the oldest, and ``more_skipped`` says whether
    further missed fires may have gone unrecorded (counting them all would mean walking every
    one). ``next_fire_at``: the schedule's new next fire time, None when it fires no more (a
    one-shot that fired, a cron expression without further fire times or past its end bound): the
    schedule is then completed. It is after the scan's horizon (``now``, or ``now`` plus the
    look-ahead) except when ``fire_all`` (or an on-time backlog) hit the cap, in which case it is
    the first fire not yet run and the next scan continues from there.
    """

    fires: tuple[datetime, ...]
    skipped: tuple[SkippedFire, ...]
    more_skipped: bool
    next_fire_at: datetime | None
    misfired: bool

    @property
    def schedule_state(self) -> ScheduleState:
        """The schedule's state once the plan is applied."""
        return ScheduleState.ACTIVE if self.next_fire_at is not None else ScheduleState.COMPLETED


def fires_of(
    schedule: Schedule,
    now: datetime,
    catchup_window: timedelta = DEFAULT_CATCHUP_WINDOW,
    lookahead: timedelta = timedelta(0),
) -> FirePlan:
    """What a scan at ``now`` does with ``schedule``, an active schedule the scanner leased.

    A one-shot fires once at its ``next_fire_at``, however late, unless its misfire policy is
    ``skip`` and it is later than ``catchup_window``: then the fire is recorded as skipped. Either
    way the schedule is completed. A cron schedule follows :func:`plan_fires`, and nothing after its
    ``end_at`` fires, is recorded, or stays its next fire time. Fires up to ``now + lookahead`` are
    planned, for a schedule whose overlap policy is ``allow``; the others only up to ``now``.
    """
    due = schedule.next_fire_at
    if due is None:
        raise ValueError(f"schedule {schedule.id} has no next fire time, so nothing of it is due")
    horizon = now + lookahead_of(schedule, lookahead)
    if schedule.kind is not ScheduleKind.CRON:
        if due > horizon:
            return FirePlan(fires=(), skipped=(), more_skipped=False, next_fire_at=due, misfired=False)
        late = now - due > catchup_window
        if late and schedule.misfire_policy is MisfirePolicy.SKIP:
            missed = (SkippedFire(due, SkipReason.MISFIRE),)
            return FirePlan(fires=(), skipped=missed, more_skipped=False, next_fire_at=None, misfired=True)
        return FirePlan(fires=(due,), skipped=(), more_skipped=False, next_fire_at=None, misfired=late)
    if schedule.cron is None:
        raise ValueError(f"cron schedule {schedule.id} has no cron expression")
    cron = CronSchedule.of(schedule.cron, schedule.tz, schedule_id=schedule.id)
    plan = plan_fires(cron, due, now, schedule.misfire_policy, catchup_window, horizon=horizon)
    end = schedule.end_at
    if end is None:
        return plan
    skipped = tuple(s for s in plan.skipped if s.scheduled_for <= end)
    following = plan.next_fire_at
    return FirePlan(
        fires=tuple(at for at in plan.fires if at <= end),
        skipped=skipped,
        # Unrecorded misfires come after the recorded ones: past the end bound if any recorded was.
        more_skipped=plan.more_skipped and len(skipped) == len(plan.skipped),
        next_fire_at=following if following is not None and following <= end else None,
        misfired=plan.misfired,
    )


def next_fire_on_resume(
    schedule: Schedule, now: datetime, latest_fire: datetime | None = None
) -> datetime | None:
    """The next fire time a paused schedule resumes with at ``now``; ``latest_fire`` is the
    schedule's latest fire already made (a run; with the look-ahead it may be after ``now``).

    A cron schedule's fires due while it was paused are misfires however short the pause: the
    catch-up window forgives an outage of the scanner, not a pause someone asked for. ``fire_all``
    keeps them all (the scanner runs each), ``fire_once`` only the latest (the scanner runs it at
    once), ``skip`` none (the next fire after ``now``). The fires left out are not recorded as
    skipped runs. A cron schedule with nothing missed has its next fire computed again, after
    ``now`` and ``latest_fire``: its stored one may come from zone rules that have changed since
    (a tzdata update), and the wall time is what was asked for. A one-shot keeps its time. None:
    nothing is left to fire (no fire after ``now`` within its end bound, for ``skip`` or a schedule
    with nothing missed): the schedule is completed, as the scanner completes one."""
    due = schedule.next_fire_at
    if schedule.kind is not ScheduleKind.CRON or due is None:
        return due
    if due > now:
        return next_fire_under_loaded_rules(schedule, max(now, latest_fire or now))
    if schedule.misfire_policy is MisfirePolicy.FIRE_ALL or schedule.cron is None:
        return due
    cron = CronSchedule.of(schedule.cron, schedule.tz, schedule_id=schedule.id)
    if schedule.misfire_policy is MisfirePolicy.FIRE_ONCE:
        return _latest_fire_at_or_before(cron, due, now)
    following = _next_or_none(cron, now)
    if following is None or (schedule.end_at is not None and following > schedule.end_at):
        return None
    return following


def next_fire_under_loaded_rules(schedule: Schedule, after: datetime) -> datetime | None:
    """A cron schedule's first fire after ``after`` (and from its ``start_at``) under the zone rules
    this process loaded; None when it has none within its end bound. ``after`` must be at least its
    latest fire, so that no fire is made twice."""
    if schedule.cron is None:
        raise ValueError(f"cron schedule {schedule.id} has no cron expression")
    return cron_fire_after(
        CronSchedule.of(schedule.cron, schedule.tz, schedule_id=schedule.id),
        after,
        schedule.start_at,
        schedule.end_at,
    )


def cron_fire_after(
    cron: CronSchedule, after: datetime, start_at: datetime | None, end_at: datetime | None
) -> datetime | None:
    """``cron``'s first fire after ``after``, from ``start_at`` (inclusive, as at create) and up to
    ``end_at``; None when it has none within them."""
    if start_at is not None:
        after = max(after, start_at - timedelta(microseconds=1))
    following = _next_or_none(cron, after)
    if following is None or (end_at is not None and following > end_at):
        return None
    return following


def lookahead_of(schedule: Schedule, lookahead: timedelta) -> timedelta:
    """How far ahead of its fires ``schedule`` may be planned: ``lookahead`` when its overlap policy
    is ``allow``, else none (the previous run's state decides its fires, and only at their instant)."""
    if lookahead < timedelta(0):
        raise ValueError(f"lookahead must not be negative, got {lookahead}")
    return lookahead if schedule.overlap_policy is OverlapPolicy.ALLOW else timedelta(0)


def plan_fires(
    schedule: CronSchedule,
    next_fire_at: datetime,
    now: datetime,
    policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE,
    catchup_window: timedelta = DEFAULT_CATCHUP_WINDOW,
    limit: int = MAX_CATCHUP_FIRES,
    horizon: datetime | None = None,
) -> FirePlan:
    """Decide the runs for a cron schedule whose stored next fire time is ``next_fire_at``.

    ``now`` is the database's clock. As in Quartz, lateness is judged on the oldest due fire: if
    it is later than ``catchup_window`` the schedule has misfired and the policy applies to the
    whole backlog up to ``now``. ``horizon`` (``now`` when not given, never before it) is how far
    fires are planned: those after ``now`` and up to it are on time by definition, and run.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if catchup_window < timedelta(0):
        raise ValueError(f"catchup_window must not be negative, got {catchup_window}")
    horizon = now if horizon is None else horizon
    if horizon < now:
        raise ValueError(f"horizon {horizon} is before now {now}")
    if next_fire_at > horizon:
        return FirePlan(fires=(), skipped=(), more_skipped=False, next_fire_at=next_fire_at, misfired=False)

    # Negative for a fire still ahead: never a misfire.
    misfired = now - next_fire_at > catchup_window
    if not misfired or policy is MisfirePolicy.FIRE_ALL:
        fires, following = _due_fires(schedule, next_fire_at, horizon, limit)
        return FirePlan(
            fires=fires, skipped=(), more_skipped=False, next_fire_at=following, misfired=misfired
        )

    latest = _latest_fire_at_or_before(schedule, next_fire_at, now)
    fire_latest = policy is MisfirePolicy.FIRE_ONCE
    skipped: list[SkippedFire] = []
    more_skipped = False
    missed: datetime | None = next_fire_at
    while missed is not None and (missed < latest or (missed == latest and not fire_latest)):
        if len(skipped) == limit:
            more_skipped = True
            break
        skipped.append(SkippedFire(missed, SkipReason.MISFIRE))
        missed = _next_or_none(schedule, missed)
    runs: tuple[datetime, ...] = (latest,) if fire_latest else ()
    following = _next_or_none(schedule, now)
    if following is not None and following <= horizon and len(runs) < limit:
        # The fires after now and within the horizon are on time: they run, misfire or not.
        ahead, following = _due_fires(schedule, following, horizon, limit - len(runs))
        runs += ahead
    return FirePlan(
        fires=runs,
        skipped=tuple(skipped),
        more_skipped=more_skipped,
        next_fire_at=following,
        misfired=True,
    )


class OverlapAction(StrEnum):
    RUN = "run"  # insert the run as pending and dispatch it
    SKIP = "skip"  # insert the run as skipped, reason overlap
    BUFFER = "buffer"  # hold the fire; dispatch it when the previous run ends


def overlap_action(policy: OverlapPolicy, previous_active: bool, fire_waiting: bool) -> OverlapAction:
    """What to do with a new fire, given whether the schedule's previous run is still active
    (not terminal) and whether a buffered fire is already waiting for it.

    ``buffer_one`` keeps the first waiting fire and skips later ones, as Temporal's BufferOne does.
    """
    if not previous_active or policy is OverlapPolicy.ALLOW:
        return OverlapAction.RUN
    if policy is OverlapPolicy.BUFFER_ONE and not fire_waiting:
        return OverlapAction.BUFFER
    return OverlapAction.SKIP


def _due_fires(
    schedule: CronSchedule, first: datetime, until: datetime, limit: int
) -> tuple[tuple[datetime, ...], datetime | None]:
    """Fires from ``first`` up to ``until``, at most ``limit``, and the fire after the last one."""
    fires = [first]
    following = _next_or_none(schedule, first)
    while following is not None and following <= until and len(fires) < limit:
        fires.append(following)
        following = _next_or_none(schedule, following)
    return tuple(fires), following


def _latest_fire_at_or_before(schedule: CronSchedule, first: datetime, now: datetime) -> datetime:
    """The last fire at or before ``now``, given that ``first`` is a fire at or before it.

    Searching back from ``now`` in doubling steps, then bisecting the last step, costs a few dozen
    look-ups even after a year of downtime on an every-second schedule, or a pause from the start of
    a month of every-second fires to long after it, where walking forward fire by fire from ``first``
    (or from the first fire the doubling finds) would take millions.
    """
    # Invariant: the first fire after `low` is at or before now; none after `high` is.
    low = first - timedelta(microseconds=1)
    high = now
    step = timedelta(seconds=1)
    while now - step > first:
        probe = _next_or_none(schedule, now - step)
        if probe is not None and probe <= now:
            low = now - step
            break
        high = now - step
        step *= 2
    # Fire times are whole seconds: once the two are a second apart at most, only one fire can
    # lie after `low` and at or before now, and it is the latest.
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        probe = _next_or_none(schedule, middle)
        if probe is not None and probe <= now:
            low = middle
        else:
            high = middle
    found = _next_or_none(schedule, low)
    # `first` itself when it is no fire of the expression (stored under an older one) and no fire
    # comes between it and now.
    latest = found if found is not None and first <= found <= now else first
    while (following := _next_or_none(schedule, latest)) is not None and following <= now:
        latest = following
    return latest


def _next_or_none(schedule: CronSchedule, after: datetime) -> datetime | None:
    try:
        return schedule.next_fire_after(after)
    except NoFireTime:
        return None
