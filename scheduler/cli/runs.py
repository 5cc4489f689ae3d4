"""``scheduler runs``: one row per fire of a schedule, with its attempts."""

from __future__ import annotations

from uuid import UUID

import click

from scheduler.cli.common import (
    SCHEDULE,
    DataTable,
    ScheduleKey,
    actor,
    database,
    echo_json,
    fail,
    known_app,
    known_schedule,
    parse_instant,
    print_table,
    shown_within,
    uuid_arg,
    wiring_or_exit,
)
from scheduler.domain.run_state import RunState
from scheduler.reconcile.replay import Replayer
from scheduler.store import runs as store
from scheduler.store.schedules import db_now

RUN_STATES = tuple(str(s) for s in RunState)


@click.group()
def runs() -> None:
    """Runs: what fired, when, and how it ended."""


@runs.command("list")
@click.option("--schedule", "schedule", type=SCHEDULE, metavar="ID|APP/KEY")
@click.option("--app")
@click.option("--state", type=click.Choice(RUN_STATES))
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(
    schedule: UUID | ScheduleKey | None, app: str | None, state: str | None, limit: int, as_json: bool
) -> None:
    """List runs, newest fire first."""
    with database(wiring_or_exit()) as conn:
        known_app(conn, app)
        schedule_id = known_schedule(conn, schedule)
        rows = shown_within(
            store.list_runs(conn, schedule_id=schedule_id, app=app, state=state, limit=limit + 1),
            limit,
            "runs (newest fire first)",
        )
    if as_json:
        echo_json(rows)
        return
    table = DataTable("run", "app", "scheduled for", "state", "attempt", "started", "worker", "error")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["app"],
            r["scheduled_for"].isoformat(),
            r["state"] + (f" ({r['skip_reason']})" if r["skip_reason"] else ""),
            str(r["attempt"]),
            r["started_at"].isoformat() if r["started_at"] else "-",
            r["worker"] or "-",
            (r["error"] or "")[:60],
        )
    print_table(table)


@runs.command("get")
@click.argument("run_id", type=uuid_arg)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only (as without it).")
def get(run_id: UUID, as_json: bool) -> None:
    """Print one run with its attempts as JSON."""
    with database(wiring_or_exit()) as conn:
        row = store.get_run(conn, run_id)
    if row is None:
        # As an unknown schedule is, and a run `dlq replay --run` does not find.
        fail(f"unknown run {run_id}: no run has that id (`scheduler runs list` lists the runs)", code=2)
    echo_json(row)


@runs.command("redispatch")
@click.option(
    "--dispatched-before",
    "before",
    required=True,
    metavar="TIME",
    help="ISO 8601: runs whose message was queued before this moment, i.e. when the topics were lost.",
)
@click.option("--app")
@click.option("--limit", type=click.IntRange(1, 10_000_000), default=100_000, show_default=True)
@click.option("--dry-run", is_flag=True, help="Print what would be sent again; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def redispatch(before: str, app: str | None, limit: int, dry_run: bool, as_json: bool) -> None:
    """Send runs whose message left the outbox but that no worker started through the pipeline
    again (after Kafka's topics were lost: their job messages went with them). Each gets a new
    attempt number and its message in the outbox; if the old message was not lost after all, its
    outcome is fenced off and counted as a duplicate."""
    moment = parse_instant(before, "--dispatched-before")
    wiring = wiring_or_exit()
    replayer = Replayer(wiring.settings, wiring.dispatcher)
    with database(wiring) as conn:
        known_app(conn, app)
        # A redispatched run is stamped with the time it is queued again: a cut-off later than now
        # would take the same runs again, batch after batch. The database's clock decides.
        with conn.transaction(force_rollback=True):  # each batch below commits on its own
            now = db_now(conn)
        if moment > now:
            fail(f"--dispatched-before {moment.isoformat()} is in the future (the database's time is "
                 f"{now.isoformat()}): give the moment Kafka's topics were lost", code=2)  # fmt: skip
        if dry_run:
            lost = replayer.lost(conn, moment, app, limit)
            rows = [
                {
                    "id": r.run.id,
                    "app": r.run.app,
                    "attempt": r.run.attempt,
                    "dispatched_at": r.run.dispatched_at,
                }
                for r in lost
            ]
            if as_json:
                echo_json(rows)
            else:
                click.echo(f"would redispatch {len(rows)} runs")
            return
        moved = 0
        while moved < limit:
            done = replayer.redispatch(conn, moment, app, min(500, limit - moved), actor())
            if not done:
                break
            moved += done
    if as_json:
        echo_json({"redispatched": moved})
    else:
        click.echo(f"redispatched {moved} runs")
