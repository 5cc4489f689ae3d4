"""``scheduler apps``: an app owns a topic, ``<prefix>.jobs.<app>``, and the workers that consume it."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from scheduler.cli.common import actor, database, echo_json, wiring_or_exit
from scheduler.schedule import service
from scheduler.store import schedules


@click.group()
def apps() -> None:
    """Apps: each has its own job topic and worker group."""


@apps.command("create")
@click.argument("name")
@click.option("--partitions", type=click.IntRange(1, 10_000), default=6, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def create(name: str, partitions: int, as_json: bool) -> None:
    """Create an app and its topic (idempotent)."""
    wiring = wiring_or_exit()
    settings = wiring.settings
    with database(wiring) as conn:
        app = service.create_app(conn, wiring.admin, settings, name, partitions, actor())
    if as_json:
        echo_json(app | {"topic": settings.jobs_topic(name)})
    else:
        click.echo(
            f"app {app['name']}: topic {settings.jobs_topic(name)} with {app['partitions']} partitions"
        )


@apps.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(as_json: bool) -> None:
    """List apps."""
    with database(wiring_or_exit()) as conn:
        rows = schedules.list_apps(conn)
    if as_json:
        echo_json(rows)
        return
    table = Table("app", "partitions", "active schedules", "created")
    for row in rows:
        table.add_row(
            row["name"], str(row["partitions"]), str(row["active_schedules"]), row["created_at"].isoformat()
        )
    Console().print(table)
