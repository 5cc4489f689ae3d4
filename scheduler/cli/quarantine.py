"""``scheduler quarantine``: what a component set aside with its reason instead of stopping on it."""

from __future__ import annotations

import base64

import click

from scheduler.cli.common import (
    DataTable,
    database,
    echo_json,
    known_or_named_app,
    parse_instant,
    print_table,
    shown_within,
    wiring_or_exit,
)
from scheduler.store import quarantine as store


@click.group()
def quarantine() -> None:
    """Poison set aside: outbox rows Kafka refused, outcome events PostgreSQL could not store."""


@quarantine.command("list")
@click.option("--component", type=click.Choice(["relay", "reconciler"]))
@click.option("--app")
@click.option("--since", help="ISO 8601: quarantined at or after.")
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option("--bytes", "with_bytes", is_flag=True, help="Include the original bytes (base64) in --json.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(
    component: str | None, app: str | None, since: str | None, limit: int, with_bytes: bool, as_json: bool
) -> None:
    """List quarantined items, newest first."""
    with database(wiring_or_exit()) as conn:
        # What the reconciler sets aside names the app its message named, which may not exist.
        known_or_named_app(
            conn,
            app,
            lambda name: bool(
                store.list_quarantine(conn, component=None, app=name, since=None, limit=1, with_bytes=False)
            ),
            "quarantined item",
        )
        rows = store.list_quarantine(
            conn,
            component=component,
            app=app,
            since=parse_instant(since, "--since") if since else None,
            limit=limit + 1,  # one more than shown: whether the listing is whole
            with_bytes=with_bytes and as_json,
        )
        rows = shown_within(rows, limit, "quarantined items (newest first)")
    if as_json:
        for row in rows:
            raw = row.pop("original_bytes")
            if with_bytes:
                row["original_bytes_base64"] = None if raw is None else base64.b64encode(raw).decode()
        echo_json(rows)
        return
    table = DataTable("id", "at", "component", "app", "run", "source", "bytes", "reason")
    for r in rows:
        source = (
            f"{r['source_topic']}[{r['source_partition']}]@{r['source_offset']}" if r["source_topic"] else "-"
        )
        table.add_row(
            str(r["id"]), r["quarantined_at"].isoformat(), r["component"], r["app"] or "-",
            str(r["run_id"] or "-"), source, str(r["size_bytes"] or 0), r["reason"][:100],
        )  # fmt: skip
    print_table(table)
