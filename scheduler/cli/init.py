"""``scheduler init``: migrate the database and create the core topics, idempotently."""

from __future__ import annotations

import click
import psycopg

from scheduler.cli.common import fail, wiring_or_exit
from scheduler.kafka.transport import KafkaUnavailable
from scheduler.store.migrate import migrate
from scheduler.wiring import Wiring

CORE_TOPIC_PARTITIONS = 6


def initialise(wiring: Wiring) -> tuple[list[str], list[str]]:
    """Apply pending migrations and create missing core topics; returns what was done now."""
    with wiring.database.connect() as conn:
        applied = [f"{m.version:04d}_{m.name}" for m in migrate(conn)]
    created = wiring.admin.ensure_topics(wiring.settings.core_topics, partitions=CORE_TOPIC_PARTITIONS)
    return applied, created


@click.command()
def init() -> None:
    """Migrate the database and create the core topics (safe to run any number of times)."""
    wiring = wiring_or_exit()
    try:
        applied, created = initialise(wiring)
    except psycopg.OperationalError as exc:
        fail(f"cannot reach PostgreSQL at {wiring.database.display}: {str(exc).strip().splitlines()[0]}")
    except KafkaUnavailable as exc:
        fail(f"cannot reach Kafka at {wiring.settings.kafka_bootstrap}: {exc}")
    click.echo(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    click.echo(f"topics created: {', '.join(created) or 'none (all exist)'}")
