"""``scheduler apps``: an app owns a topic, ``<prefix>.jobs.<app>``, and the workers that consume it.

An app may declare the handlers its schedules may name (``--handler``, repeatable): a handler as a
schedule names it (``builtin:http``, ``billing.jobs:invoice``) or a module (``builtin``,
``billing.jobs``: each of its public functions). Then creating or updating a schedule of the app
that names anything else is refused. Builtins are handlers like the others: an app that declares
its handlers lists the builtins it uses. An app that declares nothing admits any handler, and its
workers refuse what they did not register.
"""

from __future__ import annotations

from typing import Any

import click

from scheduler.cli.common import DataTable, actor, database, echo_json, fail, print_table, wiring_or_exit
from scheduler.kafka.transport import KafkaUnavailable, TransportError
from scheduler.schedule import service
from scheduler.store import schedules


@click.group()
def apps() -> None:
    """Apps: each has its own job topic and worker group."""


def _declared(handlers: list[str] | None) -> str:
    return "any (not declared)" if handlers is None else ", ".join(handlers)


@apps.command("create")
@click.argument("name")
@click.option(
    "--partitions",
    type=click.IntRange(1, 10_000),
    help=f"Partitions of its job topic.  [default: {service.DEFAULT_APP_PARTITIONS}; an existing app's own]",
)
@click.option(
    "--handler",
    "handlers",
    multiple=True,
    help="A handler or module the app's schedules may name (repeatable); none: any registered one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def create(name: str, partitions: int | None, handlers: tuple[str, ...], as_json: bool) -> None:
    """Create an app and its topic (idempotent)."""
    wiring = wiring_or_exit()
    settings = wiring.settings
    topic = settings.jobs_topic(name)
    with database(wiring) as conn:
        try:
            app = service.create_app(
                conn, wiring.admin, settings, name, partitions, actor(), list(handlers) if handlers else None
            )
        except TransportError as exc:
            # The app's row is committed before its topic is made, and stays: say so, and what
            # makes the topic later (the relay makes the missing topic of an app that exists).
            why = (
                f"cannot reach Kafka at {settings.kafka_bootstrap}"
                if isinstance(exc, KafkaUnavailable)
                else "Kafka refused it"
            )
            fail(
                f"app {name!r} is created, but its topic {topic} is not ({why}: {exc}); `scheduler "
                f"init` or `scheduler apps create {name}` makes it later, as the relay does before it "
                "publishes a job of the app"
            )
    if as_json:
        echo_json(app | {"topic": topic})
    else:
        click.echo(
            f"app {app['name']}: topic {topic} with {app['partitions']} partitions, "
            f"handlers {_declared(app['handlers'])}"
        )


@apps.command("handlers")
@click.argument("name")
@click.argument("handlers", nargs=-1)
@click.option("--none", "undeclare", is_flag=True, help="Declare nothing: any registered handler.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def handlers_(name: str, handlers: tuple[str, ...], undeclare: bool, as_json: bool) -> None:
    """Declare the handlers (and modules) the app's schedules may name, replacing what it declared.

    Existing schedules are left as they are; new ones and updates are checked from now on.
    """
    if bool(handlers) == undeclare:
        raise click.UsageError("give the handlers to declare, or --none to declare nothing")
    with database(wiring_or_exit()) as conn:
        app: dict[str, Any] = service.set_app_handlers(conn, name, list(handlers) or None, actor())
    if as_json:
        echo_json(app)
    else:
        click.echo(f"app {app['name']}: handlers {_declared(app['handlers'])}")


@apps.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def list_(as_json: bool) -> None:
    """List apps."""
    with database(wiring_or_exit()) as conn:
        rows = schedules.list_apps(conn)
    if as_json:
        echo_json(rows)
        return
    table = DataTable("app", "partitions", "handlers", "active schedules", "in error", "created")
    for row in rows:
        table.add_row(
            row["name"],
            str(row["partitions"]),
            _declared(row["handlers"]),
            str(row["active_schedules"]),
            str(row["error_schedules"]),
            row["created_at"].isoformat(),
        )
    print_table(table)
