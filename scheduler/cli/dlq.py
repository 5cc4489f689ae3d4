"""``scheduler dlq``: the dead runs (retries spent, non-retryable, or lease expired for good)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from uuid import UUID

import click
import psycopg
from rich.console import Console
from rich.progress import Progress, TextColumn

from scheduler.cli.common import (
    SCHEDULE,
    DataTable,
    FiniteFloatRange,
    ScheduleKey,
    Terminated,
    actor,
    database,
    echo_json,
    fail,
    interrupted_exit_code,
    known_app,
    known_schedule,
    print_table,
    shown_within,
    sigterm_as_interrupt,
    time_range,
    uuid_arg,
    wiring_or_exit,
)
from scheduler.domain.run import Run
from scheduler.reconcile.replay import UNDECODABLE, Replayer, ReplayFilter, first_not_dead
from scheduler.store import runs as store


@click.group()
def dlq() -> None:
    """The dead-letter queue, as mirrored in PostgreSQL."""


F = TypeVar("F", bound=Callable[..., Any])


def _dead_letter_filters(command: F) -> F:
    """The filters list and replay share: app, schedule, error class, since and until."""
    for option in reversed(
        (
            click.option("--app"),
            click.option("--schedule", "schedule", type=SCHEDULE, metavar="ID|APP/KEY"),
            click.option(
                "--error-class", help="Only runs whose error is of this class (e.g. PlannedFailure, HTTP503)."
            ),
            click.option("--since", help="ISO 8601: dead at or after."),
            click.option("--until", help="ISO 8601: dead before."),
        )
    ):
        command = option(command)
    return command


@dlq.command("list")
@_dead_letter_filters
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(
    app: str | None,
    schedule: UUID | ScheduleKey | None,
    error_class: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List dead runs, newest first."""
    start, end = time_range(since, until)
    with database(wiring_or_exit()) as conn:
        known_app(conn, app)
        schedule_id = known_schedule(conn, schedule)
        rows = store.list_dead(
            conn,
            app=app,
            schedule_id=schedule_id,
            error_class=error_class,
            since=start,
            until=end,
            limit=limit + 1,  # one more than shown: whether the listing is whole
        )
        rows = shown_within(rows, limit, "dead letters (newest first)")
    if as_json:
        echo_json(rows)
        return
    table = DataTable("id", "kind", "app", "attempt", "dead at", "error")
    for r in rows:
        table.add_row(
            r["id"], r["kind"], r["app"], str(r["attempt"] or "-"),
            r["dead_at"].isoformat() if r["dead_at"] else "-", (r["error"] or "")[:80],
        )  # fmt: skip
    print_table(table)


@dlq.command("replay")
@click.option(
    "--run",
    "run_ids",
    type=uuid_arg,
    metavar="ID",
    multiple=True,
    help="Only this dead run (repeat for more); the other filters still apply.",
)
@_dead_letter_filters
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000_000),
    help="At most this many runs.  [default: 100, or as many as --run names]",
)
@click.option("--dry-run", is_flag=True, help="Print what would be replayed; change nothing.")
@click.option(
    "--rate",
    type=FiniteFloatRange(0.1, 1_000_000),
    help="At most this many runs per second (0.1 to 1000000).",
)
@click.option("--force", is_flag=True, help="Also replay runs that were replayed before.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON only: the runs a --dry-run would replay, or what was replayed.",
)
def replay(
    run_ids: tuple[UUID, ...],
    app: str | None,
    schedule: UUID | ScheduleKey | None,
    error_class: str | None,
    since: str | None,
    until: str | None,
    limit: int | None,
    dry_run: bool,
    rate: float | None,
    force: bool,
    as_json: bool,
) -> None:
    """Send dead runs through the pipeline again, each with a fresh attempt budget."""
    start, end = time_range(since, until)
    named = tuple(dict.fromkeys(run_ids)) or None
    if limit is None:
        limit = len(named) if named else 100
    wiring = wiring_or_exit()
    replayer = Replayer(wiring.settings, wiring.dispatcher)
    with database(wiring) as conn:
        known_app(conn, app)
        where = ReplayFilter(
            app=app,
            schedule_id=known_schedule(conn, schedule),
            error_class=error_class,
            since=start,
            until=end,
            force=force,
            run_ids=named,
        )
        refused = first_not_dead(conn, named) if named else None
        if refused is not None and refused.state is None:
            fail(
                f"unknown run {refused.run_id}: no run has that id (`scheduler dlq list` lists dead runs)",
                code=2,
            )
        if refused is not None and refused.state == UNDECODABLE:
            fail(
                f"{refused.run_id} is an undecodable dead letter, not a run: its job could not be read, so "
                "there is nothing to replay (`scheduler dlq list` shows it with its error)",
                code=2,
            )
        if refused is not None:
            fail(f"run {refused.run_id} is {refused.state}, not dead: only dead runs are replayed", code=2)
        candidates = replayer.candidates(conn, where, limit)
        left_out = _left_out(replayer, conn, where, named, [dead.run.id for dead in candidates], limit)
        if named and not candidates and left_out and not dry_run:
            # The runs named were all left out: whoever named them did not get what they asked for.
            # A filter (an app, a schedule) whose dead runs were all replayed before replays 0 and
            # exits 0 with the note: a nightly replay must not fail until another run dies.
            for reason in left_out[:-1]:
                click.echo(f"note: {reason}", err=True)
            fail(f"nothing replayed: {left_out[-1]}")
        for reason in left_out:
            click.echo(f"note: {reason}", err=True)
        if dry_run:
            if as_json:
                echo_json([_dry_run_row(dead.run) for dead in candidates])
                return
            table = DataTable(
                "run", "app", "attempt", "dead at", "error", title=f"would replay {_runs(len(candidates))}"
            )
            for dead in candidates:
                run = dead.run
                dead_at = run.finished_at.isoformat() if run.finished_at else "-"
                table.add_row(str(run.id), run.app, str(run.attempt), dead_at, run.error or "")
            print_table(table)
            return
        started = time.monotonic()
        # Small chunks under --rate keep the pace even; without it, one transaction per 500 runs.
        chunk = max(1, min(500, int(rate / 4) if rate else 500))
        err = Console(stderr=True)  # stdout keeps only the result line
        with Progress(
            *Progress.get_default_columns(),
            TextColumn("{task.completed} runs"),
            transient=True,
            console=err,
            # Drawn on a terminal only: into a file or a pipe it left an empty line and no bar.
            disable=not err.is_terminal,
        ) as bar:
            task = bar.add_task("replaying", total=len(candidates))

            committed = 0  # the runs of the chunks committed so far

            def paced(so_far: int) -> None:
                nonlocal committed
                committed = so_far
                bar.update(task, completed=so_far)
                if rate:
                    ahead = so_far / rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)

            moved: list[UUID] | None = [] if named else None  # the runs named it replayed
            try:
                with sigterm_as_interrupt():
                    replayed = replayer.replay(
                        conn, where, limit, actor(), chunk=chunk, after_chunk=paced, moved=moved
                    )
            except KeyboardInterrupt as stop:
                # Each chunk is committed as it goes (the one under way when the signal came is not):
                # what was replayed stays replayed, and the rest is dead still, for the next replay.
                bar.stop()
                _summary(committed, time.monotonic() - started, as_json, interrupted=True)
                stopped = "terminated" if isinstance(stop, Terminated) else "interrupted"
                fail(
                    f"{stopped}: replayed {_runs(committed)} before it; the rest are dead still (the same "
                    "command replays them)",
                    code=interrupted_exit_code(stop),
                )
        # A run named and listed that the replay did not take: another command replayed or changed
        # it in between. Said as any run named and left out is: the error when none was replayed.
        taken = set(moved or ())
        raced = [dead.run.id for dead in candidates if dead.run.id not in taken] if named else []
        if raced:
            why = _changed_while_replaying(_states_now(conn, raced))
            if not replayed:
                fail(f"nothing replayed: {why}")
            click.echo(f"note: {why}", err=True)
    _summary(replayed, time.monotonic() - started, as_json)


def _summary(replayed: int, seconds: float, as_json: bool, *, interrupted: bool = False) -> None:
    """The result line on stdout: how many runs were replayed, in how long."""
    elapsed = max(seconds, 1e-6)
    if as_json:
        # The rate to a tenth: a paced replay under one run a second (--rate 0.5) is not 0 a second.
        result: dict[str, Any] = {
            "replayed": replayed,
            "seconds": round(elapsed, 3),
            "per_second": round(replayed / elapsed, 1),
        }
        echo_json(result | ({"interrupted": True} if interrupted else {}))
    else:
        click.echo(f"replayed {_runs(replayed)} in {elapsed:.1f} s ({replayed / elapsed:.1f}/s)")


def _left_out(
    replayer: Replayer,
    conn: psycopg.Connection[dict[str, Any]],
    where: ReplayFilter,
    named: tuple[UUID, ...] | None,
    listed: list[UUID],
    limit: int,
) -> list[str]:
    """Why runs that match are left out of those ``listed`` for the replay to take, one line each,
    the one --force answers last."""
    reasons = []
    replayed_before = replayer.left_out_as_replayed(conn, where)
    # Dead when the command began, and no longer: another command replayed or changed them since.
    # (One listed that changes is told after the replay, which leaves it out.)
    taken_ids = set(listed)
    others = [run_id for run_id in named or () if run_id not in taken_ids]
    now = _states_now(conn, others)
    changed = [(run_id, state) for run_id, state in now if state != "dead"]
    # Dead still, but held by another command's transaction (a replay's chunk not yet committed):
    # the listing skips a locked run.
    with conn.transaction(force_rollback=True):
        held = store.runs_held(conn, [run_id for run_id, state in now if state == "dead"])
    # Every named run left out is one replayed before, one changed or held, or one outside the
    # other filters; or, when --limit cut the list, one past it.
    taken = len(listed)
    outside = len(named) - replayed_before - len(changed) - len(held) - taken if named else 0
    if outside > 0 and taken < limit:
        reasons.append(f"{outside} of the runs named {_is(outside)} left out: outside the other filters")
    elif outside > 0:
        reasons.append(
            f"{outside} of the runs named {_is(outside)} left out: past --limit {limit}, or outside the "
            "other filters"
        )
    if changed:
        reasons.append(_changed_while_replaying(changed))
    if len(held) == 1:
        reasons.append(
            f"run {next(iter(held))} is left out: another command is replaying or changing it right now"
        )
    elif held:
        reasons.append(
            f"{len(held)} of the runs named are left out: another command is replaying or changing them "
            "right now"
        )
    cancelled = replayer.left_out_as_cancelled(conn, where)
    if cancelled == 1:
        reasons.append(
            "1 dead run of a cancelled schedule matches and is left out; name the schedule (--schedule) "
            "or the run (--run) to replay it"
        )
    elif cancelled:
        reasons.append(
            f"{cancelled} dead runs of cancelled schedules match and are left out; name the schedule "
            "(--schedule) or the runs (--run) to replay them"
        )
    if replayed_before and named is not None and len(named) == 1:
        reasons.append(
            f"run {named[0]} was replayed before (and died again) and is left out; --force takes it too"
        )
    elif replayed_before:
        one = replayed_before == 1
        which = "of the runs named" if named else ("dead run that matches" if one else "dead runs that match")
        reasons.append(
            f"{replayed_before} {which} {'was' if one else 'were'} replayed before (and died again) and "
            f"{_is(replayed_before)} left out; --force takes {'it' if one else 'them'} too, within --limit"
        )
    return reasons


def _states_now(
    conn: psycopg.Connection[dict[str, Any]], run_ids: Sequence[UUID]
) -> list[tuple[UUID, str | None]]:
    """The state of each run now (None for one that no longer exists: the history retention's)."""
    if not run_ids:
        return []
    with conn.transaction():
        found = store.states_of_runs(conn, run_ids)
    return [(run_id, found[run_id]["state"] if run_id in found else None) for run_id in run_ids]


def _changed_while_replaying(runs: list[tuple[UUID, str | None]]) -> str:
    """Why runs named, dead when listed, were not replayed: another command got there first."""
    if len(runs) > 1:
        return (
            f"{len(runs)} of the runs named changed while replaying (another command replayed or changed "
            "them since they were listed)"
        )
    run_id, state = runs[0]
    now = {None: "it no longer exists: ", "dead": ""}.get(state, f"it is {state} now: ")
    return (
        f"run {run_id} changed while replaying ({now}another command replayed or changed it since it "
        "was listed)"
    )


def _is(count: int) -> str:
    return "is" if count == 1 else "are"


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


DRY_RUN_FIELDS = ("id", "schedule_id", "app", "scheduled_for", "attempt", "error")


def _dry_run_row(run: Run) -> dict[str, Any]:
    """A run a dry run would replay, its time of death named ``dead_at`` as `dlq list` names it
    (the run's finished_at): a script reads the same field from either listing."""
    return {k: getattr(run, k) for k in DRY_RUN_FIELDS} | {"dead_at": run.finished_at}
