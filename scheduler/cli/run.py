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
