"""``scheduler audit``: every change to apps, schedules and runs, by whom (CLI, API, Kafka commands)."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC
from uuid import UUID

import click

from scheduler.cli.common import (
    SCHEDULE,
    DataTable,
    database,
    echo_json,
    known_app,
    parse_instant,
    print_table,
    schedule_id_of,
    shown_within,
    wiring_or_exit,
)
from scheduler.store import api as store


@click.group()
def audit() -> None:
    """The audit log: who changed what, with the old and new values."""


@audit.command("list")
@click.option("--app", help="Only entries about this app, its schedules and their runs.")
@click.option("--entity", type=click.Choice(["app", "schedule", "run"]))
@click.option(
    "--id",
    "entity_id",
    help="Only entries about this app name, schedule (its id, or APP/KEY) or run id.",
)
@click.option("--actor", help="Only entries by this actor (e.g. api:alice, cli:ops@host, kafka:svc).")
@click.option("--since", help="ISO 8601: at or after.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only (with the old and new values).")
def list_(
    app: str | None,
    entity: str | None,
    entity_id: str | None,
    actor: str | None,
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List audit entries, newest first."""
    with database(wiring_or_exit()) as conn:
        known_app(conn, app)
        if entity_id is not None and "/" in entity_id:
            # No app name or id holds a "/": a schedule named by its app and key, read as every
            # command reads one.
            entity_id = str(schedule_id_of(conn, SCHEDULE.convert(entity_id, None, None)))
        elif entity_id is not None:
            with contextlib.suppress(ValueError):  # else an app's name
                entity_id = str(UUID(entity_id))  # an id in any of its forms, as stored
        rows = store.audit_page(
            conn,
            apps=None if app is None else [app],
            entity=entity,
            entity_id=entity_id,
            actor=actor,
            since=parse_instant(since, "--since") if since else None,
            before_id=None,
            limit=limit + 1,  # one more than shown: whether the listing is whole
        )
        rows = shown_within(rows, limit, "audit entries (newest first)")
    if as_json:
        echo_json(rows)
        return
    table = DataTable("at (UTC)", "actor", "action", "entity", "id", "app", "new value")
    for r in rows:
        new = "" if r["new_value"] is None else json.dumps(r["new_value"], ensure_ascii=False)
        table.add_row(
            r["at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"), r["actor"], r["action"], r["entity"],
            r["entity_id"], r["app"] or "-", new[:60] + ("…" if len(new) > 60 else ""),
        )  # fmt: skip
    print_table(table)
