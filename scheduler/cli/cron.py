"""Placeholder: `scheduler cron next` is being written."""

from __future__ import annotations

import click


@click.group()
def cron() -> None:
    """Cron expressions: preview fire times."""
