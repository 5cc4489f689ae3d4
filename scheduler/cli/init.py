"""``scheduler init``: migrate the database and create the core topics, idempotently."""

from __future__ import annotations

import click
import psycopg

from scheduler.cli.common import echo_json, fail, wiring_or_exit
from scheduler.kafka.topics import ensure_sized_topics
from scheduler.kafka.transport import KafkaUnavailable, TransportError
from scheduler.store import schedules
from scheduler.store.migrate import migrate
from scheduler.wiring import Wiring

CORE_TOPIC_PARTITIONS = 6


def initialise(wiring: Wiring) -> tuple[list[str], list[str]]:
    """Apply pending migrations and create missing core topics; returns what was done now."""
    applied = migrate_database(wiring)
    created, _ = prepare_topics(wiring)
    return applied, created


def migrate_database(wiring: Wiring) -> list[str]:
    with wiring.database.connect() as conn:
        return [f"{m.version:04d}_{m.name}" for m in migrate(conn)]


def prepare_topics(wiring: Wiring) -> tuple[list[str], list[str]]:
    """Create the missing core topics and the job topics of apps that lack theirs, and raise the
    message limit of topics made before it was set (an upgrade); returns (created, resized)."""
    settings = wiring.settings
    created, resized = ensure_sized_topics(wiring.admin, settings.core_topics, CORE_TOPIC_PARTITIONS)
    with wiring.database.connect() as conn:
        apps = schedules.list_apps(conn)
    # Grouped by partition count: one admin round trip per distinct count, not one per app.
    by_partitions: dict[int, list[str]] = {}
    for app in apps:
        by_partitions.setdefault(int(app["partitions"]), []).append(settings.jobs_topic(app["name"]))
    for partitions, topics in sorted(by_partitions.items()):
        made, raised = ensure_sized_topics(wiring.admin, topics, partitions)
        created += made
        resized += raised
    return created, resized


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def init(as_json: bool) -> None:
    """Migrate the database and create the core topics (safe to run any number of times)."""
    wiring = wiring_or_exit()
    try:
        applied = migrate_database(wiring)
        created, resized = prepare_topics(wiring)
    except psycopg.OperationalError as exc:
        fail(f"cannot reach PostgreSQL at {wiring.database.display}: {str(exc).strip().splitlines()[0]}")
    except KafkaUnavailable as exc:
        fail(f"cannot reach Kafka at {wiring.settings.kafka_bootstrap}: {exc}")
    except TransportError as exc:
        fail(f"Kafka refused a topic change: {exc}")
    if as_json:
        echo_json({"migrations_applied": applied, "topics_created": created, "topics_resized": resized})
        return
    click.echo(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    click.echo(f"topics created: {', '.join(created) or 'none (all exist)'}")
    if resized:
        click.echo(f"topics resized (max.message.bytes): {', '.join(resized)}")
