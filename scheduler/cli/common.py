"""What every CLI command shares: settings, and the one-line error with a non-zero exit."""

from __future__ import annotations

from typing import NoReturn

import click

from scheduler.config import ConfigError, Settings, load_settings


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(code)


def settings_or_exit() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        fail(str(exc), code=2)
