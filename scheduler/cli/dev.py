"""``scheduler dev``: the local PostgreSQL and Kafka as background processes."""

from __future__ import annotations

import json
import shlex

import click

from scheduler.cli.common import fail, settings_or_exit
from scheduler.devstack import LocalStack, StackError


@click.group()
def dev() -> None:
    """The local stack: real PostgreSQL and single-node Kafka (KRaft)."""


@dev.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON only (as `dev status --json`).")
def up(as_json: bool) -> None:
    """Start PostgreSQL and Kafka (idempotent); returns once both answer."""
    stack = LocalStack(settings_or_exit())
    try:
        stack.up(notice=lambda line: click.echo(f"notice: {line}", err=True))
    except StackError as exc:
        fail(str(exc))
    parts = stack.status()
    if as_json:
        click.echo(json.dumps([p.__dict__ for p in parts]))
        return
    for part in parts:
        click.echo(f"{part.name:<9} running  pid {part.pid}  port {part.port}")


@dev.command()
def down() -> None:
    """Stop exactly the processes `dev up` started."""
    stack = LocalStack(settings_or_exit())
    try:
        stack.down()
    except StackError as exc:
        fail(str(exc))
    click.echo("stopped")


@dev.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def status(as_json: bool) -> None:
    """Show each part running or stopped, with pid and port."""
    parts = LocalStack(settings_or_exit()).status()
    if as_json:
        click.echo(json.dumps([p.__dict__ for p in parts]))
        return
    for part in parts:
        state = "running" if part.running else "stopped"
        pid = f"pid {part.pid}" if part.pid else "pid -"
        click.echo(f"{part.name:<9} {state:<8} {pid:<10} port {part.port}  {part.detail}".rstrip())


@dev.command()
@click.option("--json", "as_json", is_flag=True, help="Print the variables as one JSON object.")
def env(as_json: bool) -> None:
    """Print shell `export` lines for the local stack."""
    variables = LocalStack(settings_or_exit()).env()
    if as_json:
        click.echo(json.dumps(variables))
        return
    for name, value in variables.items():
        click.echo(f"export {name}={shlex.quote(value)}")
