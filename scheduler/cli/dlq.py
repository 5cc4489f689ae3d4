"""``scheduler dlq``: the dead runs (retries spent, non-retryable, or lease expired for good)."""

from __future__ import annotations

from uuid import UUID

import click
from rich.console import Console
from rich.table import Table

from scheduler.cli.common import database, echo_json, parse_instant, settings_or_exit
from scheduler.cli.runs import run_id_arg
from scheduler.store import runs as store


@click.group()
def dlq() -> None:
    """The dead-letter queue, as mirrored in PostgreSQL."""


@dlq.command("list")
@click.option("--app")
@click.option("--schedule", "schedule_id", type=run_id_arg)
@click.option("--since", help="ISO 8601: dead at or after.")
@click.option("--until", help="ISO 8601: dead before.")
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(
    app: str | None, schedule_id: UUID | None, since: str | None, until: str | None, limit: int, as_json: bool
) -> None:
    """List dead runs, newest first."""
    settings = settings_or_exit()
    with database(settings) as conn:
        rows = store.list_dead(
            conn,
            app=app,
            schedule_id=schedule_id,
            since=parse_instant(since, "--since") if since else None,
            until=parse_instant(until, "--until") if until else None,
            limit=limit,
        )
    if as_json:
        echo_json(rows)
        return
    table = Table("id", "kind", "app", "attempt", "dead at", "error")
    for r in rows:
        table.add_row(
            r["id"], r["kind"], r["app"], str(r["attempt"] or "-"),
            r["dead_at"].isoformat() if r["dead_at"] else "-", (r["error"] or "")[:80],
        )  # fmt: skip
    Console().print(table)
