"""``scheduler init``: migrate the database and create the core topics, idempotently."""

from __future__ import annotations

import click
import psycopg

from scheduler.cli.common import fail, settings_or_exit
from scheduler.config import Settings
from scheduler.kafka.transport import KafkaUnavailable, TopicAdmin
from scheduler.store import connect
from scheduler.store.migrate import migrate

CORE_TOPIC_PARTITIONS = 6


def initialise(settings: Settings) -> tuple[list[str], list[str]]:
    """Apply pending migrations and create missing core topics; returns what was done now."""
    with connect(settings.database_url) as conn:
        applied = [f"{m.version:04d}_{m.name}" for m in migrate(conn)]
    created = TopicAdmin(settings.kafka_bootstrap).ensure_topics(
        settings.core_topics, partitions=CORE_TOPIC_PARTITIONS
    )
    return applied, created


@click.command()
def init() -> None:
    """Migrate the database and create the core topics (safe to run any number of times)."""
    settings = settings_or_exit()
    try:
        applied, created = initialise(settings)
    except psycopg.OperationalError as exc:
        fail(f"cannot reach PostgreSQL at {settings.database_url}: {str(exc).strip().splitlines()[0]}")
    except KafkaUnavailable as exc:
        fail(f"cannot reach Kafka at {settings.kafka_bootstrap}: {exc}")
    click.echo(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    click.echo(f"topics created: {', '.join(created) or 'none (all exist)'}")
