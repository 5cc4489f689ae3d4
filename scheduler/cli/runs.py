"""``scheduler runs``: one row per fire of a schedule, with its attempts."""

from __future__ import annotations

from uuid import UUID

import click
from rich.console import Console
from rich.table import Table

from scheduler.cli.common import database, echo_json, fail, uuid_arg, wiring_or_exit
from scheduler.domain.run_state import RunState
from scheduler.store import runs as store

RUN_STATES = tuple(str(s) for s in RunState)


@click.group()
def runs() -> None:
    """Runs: what fired, when, and how it ended."""


@runs.command("list")
@click.option("--schedule", "schedule_id", type=uuid_arg)
@click.option("--app")
@click.option("--state", type=click.Choice(RUN_STATES))
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(schedule_id: UUID | None, app: str | None, state: str | None, limit: int, as_json: bool) -> None:
    """List runs, newest fire first."""
    with database(wiring_or_exit()) as conn:
        rows = store.list_runs(conn, schedule_id=schedule_id, app=app, state=state, limit=limit)
    if as_json:
        echo_json(rows)
        return
    table = Table("run", "app", "scheduled for", "state", "attempt", "dispatched", "worker", "error")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["app"],
            r["scheduled_for"].isoformat(),
            r["state"] + (f" ({r['skip_reason']})" if r["skip_reason"] else ""),
            str(r["attempt"]),
            r["dispatched_at"].isoformat() if r["dispatched_at"] else "-",
            r["worker"] or "-",
            (r["error"] or "")[:60],
        )
    Console().print(table)


@runs.command("get")
@click.argument("run_id", type=uuid_arg)
def get(run_id: UUID) -> None:
    """Print one run with its attempts as JSON."""
    with database(wiring_or_exit()) as conn:
        row = store.get_run(conn, run_id)
    if row is None:
        fail(f"no run {run_id}")
    echo_json(row)
