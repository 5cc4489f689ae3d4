"""The ``scheduler`` command: one click group, one module per noun.

Errors a user can cause (bad input, a stack that is not up) print one line to stderr and exit
non-zero; ``UsageError`` exits 2, ``ClickException`` 1.

A command's spans (``schedules create`` leaves one) are exported as service ``scheduler-cli`` when
the ``OTEL_*`` variables ask for it, and flushed when the command ends. ``scheduler run`` is left
alone: each component configures tracing under its own name, and the first configuration wins.
"""

from __future__ import annotations

import click

from scheduler.cli.apps import apps
from scheduler.cli.audit import audit
from scheduler.cli.cron import cron
from scheduler.cli.demo import demo
from scheduler.cli.dev import dev
from scheduler.cli.dlq import dlq
from scheduler.cli.init import init
from scheduler.cli.migrations import migrations
from scheduler.cli.produce import produce
from scheduler.cli.quarantine import quarantine
from scheduler.cli.run import run
from scheduler.cli.runs import runs
from scheduler.cli.schedules import schedules
from scheduler.telemetry.tracing import configure_tracing, shutdown_tracing


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kafka-pg-scheduler")
@click.pass_context
def main(ctx: click.Context) -> None:
    """A distributed job scheduler on Kafka and PostgreSQL."""
    if ctx.invoked_subcommand == run.name:
        return
    configure_tracing("cli")
    ctx.call_on_close(shutdown_tracing)


main.add_command(apps)
main.add_command(audit)
main.add_command(cron)
main.add_command(dev)
main.add_command(init)
main.add_command(migrations)
main.add_command(schedules)
main.add_command(runs)
main.add_command(run)
main.add_command(dlq)
main.add_command(quarantine)
main.add_command(demo)
main.add_command(produce)
