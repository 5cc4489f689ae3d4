"""``scheduler run <component>``: one pipeline component in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

import click

from scheduler import metrics
from scheduler.cli.common import settings_or_exit
from scheduler.config import Settings
from scheduler.relay.relay import Relay
from scheduler.scan.scanner import Scanner


def _serve(component: str, body: Callable[[Settings, threading.Event], None]) -> None:
    settings = settings_or_exit()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {component} %(levelname)s %(message)s")
    # One line per HTTP job would drown the component's own log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger(component).info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    metrics.serve(settings.metrics_port)
    body(settings, stop)


@click.group()
def run() -> None:
    """Run a pipeline component."""


@run.command()
def scanner() -> None:
    """Turn due schedules and retries into runs and outbox rows."""
    _serve("scanner", lambda settings, stop: Scanner(settings).run(stop))


@run.command()
def relay() -> None:
    """Publish the outbox to Kafka and mark runs dispatched."""
    _serve("relay", lambda settings, stop: Relay(settings).run(stop))


@run.command()
def reconciler() -> None:
    """Apply outcome events to PostgreSQL; sweep expired leases."""
    from scheduler.reconcile.reconciler import Reconciler

    _serve("reconciler", lambda settings, stop: Reconciler(settings).run(stop))


@run.command()
def ingestor() -> None:
    """Apply schedule commands from Kafka to PostgreSQL; publish the rejected ones."""
    from scheduler.ingest.ingestor import Ingestor

    _serve("ingestor", lambda settings, stop: Ingestor(settings).run(stop))


@run.command()
@click.option("--app", required=True, help="The app whose jobs to execute.")
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=16, show_default=True)
@click.option(
    "--grace", type=float, default=30.0, show_default=True, help="Seconds to finish jobs on SIGTERM."
)
def worker(app: str, concurrency: int, grace: float) -> None:
    """Execute the jobs of one app (a consumer group member of its topic)."""
    from scheduler.worker.worker import Worker

    _serve("worker", lambda settings, stop: Worker(settings, app, concurrency, grace).run(stop))


@run.command("all")
@click.option("--app", "apps", multiple=True, help="Apps to run workers for (default: every app).")
@click.option(
    "--workers", type=click.IntRange(1, 64), default=1, show_default=True, help="Worker processes per app."
)
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=16, show_default=True)
def all_(apps: tuple[str, ...], workers: int, concurrency: int) -> None:
    """Every component as its own process; Ctrl-C or SIGTERM stops them all."""
    from scheduler.cli.common import database
    from scheduler.cli.supervise import pipeline_commands, supervise
    from scheduler.store import schedules

    settings = settings_or_exit()
    if not apps:
        with database(settings) as conn:
            apps = tuple(row["name"] for row in schedules.list_apps(conn))
    raise SystemExit(supervise(pipeline_commands(apps, workers, concurrency)))
