"""The ``scheduler`` command: one click group, one module per noun.

Errors a user can cause (bad input, a stack that is not up) print one line to stderr and exit
non-zero; ``UsageError`` exits 2, ``ClickException`` 1. An argument that is not valid UTF-8 is
such an error, for every command's text parameters at once (:func:`text_is_utf8`).

A command's spans (``schedules create`` leaves one) are exported as service ``scheduler-cli`` when
the ``OTEL_*`` variables ask for it, and flushed when the command ends, for at most
:data:`TRACE_EXPORT_TIMEOUT_S`; a collector that does not answer loses them, silently.
``scheduler run`` is left alone: each component configures tracing under its own name, and the
first configuration wins.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, NoReturn

import click
from click.exceptions import NoArgsIsHelpError

from scheduler import __version__
from scheduler.cli.apps import apps
from scheduler.cli.audit import audit
from scheduler.cli.common import UTF8_TEXT, echo_json, fail
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
from scheduler.kafka import messages
from scheduler.kafka.avro import SCHEMAS_DIR_ENV, SchemaCatalogError, default_catalog, default_schemas_dir
from scheduler.telemetry.tracing import configure_tracing, shutdown_tracing

_GIVEN_ARGS = "scheduler.given_args"  # the command line's arguments, in the root context's meta

TRACE_EXPORT_TIMEOUT_S = 1.0
"""How long a command may spend exporting its spans as it exits, retries included. The exporter's
default, OTEL_EXPORTER_OTLP_TIMEOUT's 10 s, kept a ``schedules create`` done in a second waiting
7 s more on a collector that was down (30 s with a timeout of 60 s); a collector that answers
takes milliseconds."""


class _Scheduler(click.Group):
    """The root group: a usage error anywhere below it (an unknown option, a bad value, a missing
    argument, a command's own check) is one line on stderr and exit 2, as every other bad input,
    rather than click's usage block."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        given = list(args)  # parsing takes them from the list
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except NoArgsIsHelpError:
            raise  # a bare group: click prints its help, as it should
        except click.UsageError as error:
            _one_line(error, info_name or self.name or "scheduler")
        ctx.meta[_GIVEN_ARGS] = given
        return ctx

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise
        except click.UsageError as error:
            _one_line(error, _named_command(ctx, ctx.meta.get(_GIVEN_ARGS, [])))
        except SchemaCatalogError as error:
            # SCHEDULER_SCHEMAS_DIR names a folder without the Avro schemas, or with a broken one: a
            # bad setting, said in one line (the message names the folder or file) as for any other.
            fail(str(error), code=2)


def _check_schemas() -> None:
    """A SCHEDULER_SCHEMAS_DIR of the operator's is checked before any command uses it: one that
    lacks a schema would fail every message of that record (and the scanner would set each due
    schedule aside in state error). A broken file raises SchemaCatalogError, reported by invoke."""
    names = default_catalog().names
    missing = [f"{m.SCHEMA}.avsc" for m in messages.RECORDS if m.SCHEMA not in names]
    if missing:
        fail(f"{SCHEMAS_DIR_ENV}: {default_schemas_dir()} has no {', '.join(missing)}", code=2)


def _named_command(ctx: click.Context, args: list[str]) -> str:
    """The path of the deepest command ``args`` name (``scheduler runs list``): where an error click
    raised without its context (an option missing its value) is to be looked up."""
    command: click.Command = ctx.command
    path = [ctx.command_path]
    for arg in args:
        sub = command.get_command(ctx, arg) if isinstance(command, click.Group) else None
        if sub is None:
            break
        command = sub
        path.append(arg)
    return " ".join(path)


def _one_line(error: click.UsageError, command_path: str) -> NoReturn:
    where = error.ctx.command_path if error.ctx is not None else command_path
    fail(f"{error.format_message()} (see `{where} --help`)", code=2)


@click.group(cls=_Scheduler, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kafka-pg-scheduler")
@click.pass_context
def main(ctx: click.Context) -> None:
    """A distributed job scheduler on Kafka and PostgreSQL."""
    asks_help = any(arg in ("--help", "-h") for arg in sys.argv[1:])
    if os.environ.get(SCHEMAS_DIR_ENV) and not asks_help:  # help needs no schema
        _check_schemas()
    if ctx.invoked_subcommand == run.name:
        return
    # The SDK's own lines ("Transient error … retrying in 0.81s.", "Failed to export spans batch …")
    # would go raw to stderr, which is the user's: the command's output and its one error line.
    sdk_log = logging.getLogger("opentelemetry")
    sdk_log.addHandler(logging.NullHandler())
    sdk_log.propagate = False
    configure_tracing("cli", export_timeout_s=TRACE_EXPORT_TIMEOUT_S)
    ctx.call_on_close(shutdown_tracing)


@main.command("version")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def version(as_json: bool) -> None:
    """Print the version (as --version does)."""
    if as_json:
        echo_json({"version": __version__})
    else:
        click.echo(f"scheduler, version {__version__}")


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


def text_is_utf8(group: click.Group) -> None:
    """Give every plain text parameter of ``group``'s commands, at any depth, the type that refuses
    bytes that are not UTF-8 (one line naming the parameter, exit 2): said once here, it holds for
    every command, new ones included. Parameters with a type of their own (choices, ids, paths,
    ``ANY_TEXT``) keep it."""
    for command in group.commands.values():
        for param in command.params:
            if param.type is click.STRING:
                param.type = UTF8_TEXT
        if isinstance(command, click.Group):
            text_is_utf8(command)


text_is_utf8(main)
